"""Qwen3-Next and Qwen3.5 (text) (hf/qwen3_next.py), both ways."""

import pytest
import torch

from common.checkpoints import load_checkpoint, model_from_checkpoint, new_checkpoint, save_checkpoint
from export import to_hf
from hf import HF_FAMILIES
from hf_tiny import GPT, NEW, PROMPT, VOCAB, check_parity, randomized, transformers
from hf.tiny import qwen3_next, qwen3_5_text

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_qwen3_next_deltanet_layers_gated_attention_and_shared_expert(moe, tmp_path):
    extra = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                 mlp_only_layers=[0], norm_topk_prob=True) if moe else {}
    torch.manual_seed(0)
    hf = randomized(transformers.Qwen3NextForCausalLM(qwen3_next(**extra)), seed=8)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layers == 'DDG' and cfg.attn_gate and cfg.qk_norm and cfg.rope_dim == 4
    assert cfg.linear_dims == {'k_heads': 2, 'v_heads': 4, 'k_dim': 8, 'v_dim': 6}
    if moe:
        assert cfg.mlp == 'moe' and cfg.first_dense_layers == 1 and cfg.n_shared_expert == 1 and cfg.shared_expert_gate


def tiny_qwen3_5():
    """A tiny Qwen3_5ForCausalLM: the family whose flags Qwen3-Next (tried first) carries too."""
    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(
        **qwen3_5_text(layer_types=['linear_attention', 'full_attention', 'linear_attention']))
    return randomized(transformers.Qwen3_5ForCausalLM(config), seed=9)


def test_qwen3_5_text_deltanet_layers_in_separate_projections(tmp_path):
    ours = check_parity(tiny_qwen3_5(), tmp_path)  # back to Qwen3.5, though Qwen3-Next could carry it too
    assert ours.config.layer_kinds == ['D', 'G', 'D'] and ours.config.mlp == 'swiglu' and ours.config.linear_dims['v_heads'] == 4
    assert type(to_hf(ours, family='qwen3_next')) is transformers.Qwen3NextForCausalLM
    # a model built here with the same flags has no family of its own: the first that can carry it
    assert type(to_hf(GPT(ours.config))) is transformers.Qwen3NextForCausalLM


def test_a_qwen3_5_checkpoint_exports_back_to_qwen3_5(tmp_path):
    """The family a model was loaded from survives a checkpoint (train.py's saves write common.new_checkpoint)."""
    tiny_qwen3_5().save_pretrained(tmp_path / 'hf')
    ckpt = str(tmp_path / 'ckpt.pt')
    save_checkpoint(new_checkpoint(GPT.from_pretrained(str(tmp_path / 'hf'))), ckpt)
    restored = model_from_checkpoint(load_checkpoint(ckpt), ckpt)
    assert type(to_hf(restored)) is transformers.Qwen3_5ForCausalLM


def test_a_qwen3_5_vision_language_checkpoint_loads_its_text_model(tmp_path):
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32)
    torch.manual_seed(0)
    full = randomized(transformers.Qwen3_5ForConditionalGeneration(
        transformers.Qwen3_5Config(text_config=qwen3_5_text(), vision_config=vision)), seed=10)
    full.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    assert ours.config.layers == 'DDG'
    idx = torch.randint(0, VOCAB, (2, PROMPT + NEW), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], full(idx).logits, atol=1e-4, rtol=0)
    assert type(to_hf(ours)) is transformers.Qwen3_5ForCausalLM  # its text model's class


@pytest.mark.parametrize('change, match', [
    (dict(attention_bias=True), 'attention_bias'),
    (dict(num_experts=4, mlp_only_layers=[1]), 'mlp_only_layers'),
    (dict(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24), 'shared_expert_intermediate_size'),
], ids=['attention_bias', 'dense-later-layer', 'shared-not-a-multiple'])
def test_qwen3_next_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        HF_FAMILIES['qwen3_next'].read_config(qwen3_next(**change))
