"""export.py: our GPT -> transformers, logits equal in fp32, for both families, and the CLI."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault('HF_HUB_OFFLINE', '1')
transformers = pytest.importorskip('transformers')

import common  # noqa: E402
from export import hf_family, to_hf  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(block_size=32, vocab_size=100, n_layer=2, n_head=4, n_embd=32)
MODERN = dict(norm='rms', mlp='swiglu', pos='rope', bias=False)


def perturbed(**flags):
    """A small model whose norm gains and biases are not their init values, so a mis-mapped one shows."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, **flags)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize('flags, family', [
    ({}, 'GPT2LMHeadModel'),
    ({'bias': False}, 'GPT2LMHeadModel'),
    ({'tie_embeddings': False, 'ffn_hidden': 48}, 'GPT2LMHeadModel'),
    ({**MODERN, 'n_kv_head': 2, 'rope_theta': 500000.0, 'norm_eps': 1e-6}, 'LlamaForCausalLM'),
    ({**MODERN, 'n_kv_head': 1, 'tie_embeddings': False, 'ffn_hidden': 80}, 'LlamaForCausalLM'),
    ({**MODERN, 'bias': True}, 'LlamaForCausalLM'),
])
def test_export_logits_match_and_round_trip(tmp_path, flags, family):
    model = perturbed(**flags)
    hf = to_hf(model)
    assert type(hf).__name__ == family
    idx = torch.randint(0, 100, (2, 24))
    with torch.no_grad():
        ours = model(idx)[0]
        torch.testing.assert_close(hf(idx).logits, ours, atol=1e-4, rtol=0)
        hf.save_pretrained(tmp_path / 'hf')
        back = GPT.from_pretrained(str(tmp_path / 'hf')).eval()
        torch.testing.assert_close(back(idx)[0], ours, atol=1e-4, rtol=0)
    assert back.config.kv_heads == model.config.kv_heads
    assert back.config.tie_embeddings == model.config.tie_embeddings
    assert back.config.hidden_size == model.config.hidden_size
    assert back.config.rope_theta == model.config.rope_theta


@pytest.mark.parametrize('flags, named', [
    ({'norm': 'rms'}, ["norm='rms'", "mlp='gelu'", "pos='learned'"]),
    ({'prenorm': False}, ['prenorm=False']),
    ({'mlp': 'geglu', 'pos': 'rope'}, ["mlp='geglu'"]),
    ({'n_kv_head': 2}, ['n_kv_head=2']),
])
def test_unrepresentable_configs_name_the_blocking_flags(flags, named):
    with pytest.raises(ValueError) as e:
        hf_family(GPTConfig(**SMALL, **flags))
    for fragment in named:
        assert fragment in str(e.value)


def test_export_cli(tmp_path):
    model = perturbed(**MODERN, n_kv_head=2)
    (tmp_path / 'out').mkdir()
    common.save_checkpoint(common.new_checkpoint(model, config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    run = lambda *args: subprocess.run([sys.executable, str(REPO / 'export.py'), *args], cwd=tmp_path,
                                       capture_output=True, text=True, timeout=120,
                                       env={**os.environ, 'HF_HUB_OFFLINE': '1'})
    result = run('--out_dir=out', '--hf_dir=hf')
    assert result.returncode == 0, result.stderr
    assert 'LlamaForCausalLM' in result.stdout
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf').eval()
    idx = torch.randint(0, 100, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0], atol=1e-4, rtol=0)

    blocked = perturbed(norm='rms')
    common.save_checkpoint(common.new_checkpoint(blocked, config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    for args, fragment in [(['--out_dir=out', '--hf_dir=hf2'], "norm='rms'"),
                           (['--out_dir=nowhere', '--hf_dir=hf2'], 'nowhere/ckpt.pt'),
                           (['--out_dir=out'], 'hf_dir')]:
        result = run(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith('error:'), result.stderr
        assert fragment in lines[0]
    assert not (tmp_path / 'hf2').exists()
