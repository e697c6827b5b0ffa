"""bench.py --vs_hf_families (bench_decode.compare_with_hf's families): the flag's checks, hf.tiny.sized, and
families raced end to end at tiny sizes, their tokens identical to Hugging Face generate's in fp32."""
import json
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from test_bench import bench, expect_one_error  # noqa: E402

transformers = pytest.importorskip('transformers')

import bench_decode  # noqa: E402
from chapters import GPT  # noqa: E402
from hf import tiny  # noqa: E402


@pytest.mark.parametrize('args, fragments', [
    (['--vs_hf_families=llama,nope'], ["unknown vs_hf_families 'nope'", 'choose from all, gpt2, llama']),
    (['--vs_hf_families=llama', '--n_embd=48'], ['n_embd must be a multiple of 32, got 48']),
])
def test_a_bad_family_or_width_is_one_error_before_anything_runs(tmp_path, args, fragments):
    expect_one_error(bench('--vs_hf=True', *args, cwd=tmp_path), *fragments)


def test_sized_grows_the_layers_and_widths_and_keeps_the_patterns():
    """Qwen3-Next's 'linear, linear, full' tiled over 5 layers; Kimi Linear's dense first MLP stays the only dense
    one; widths its builder chose scale with the hidden size (head_dim 16 at 32 -> 32 at 64), positions as asked."""
    config = tiny.sized(tiny.qwen3_next(), n_layer=5, n_embd=64, block=128)
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim, config.max_position_embeddings) == \
        (5, 64, 32, 128)
    assert config.layer_types == ['linear_attention', 'linear_attention', 'full_attention'] * 1 + \
        ['linear_attention', 'linear_attention']
    kimi = tiny.sized(tiny.kimi_linear(), n_layer=5)
    assert kimi.mlp_layer_types == ['dense'] + ['sparse'] * 4
    assert tiny.sized(tiny.qwen3_next(), n_layer=2).num_hidden_layers == 3  # sized up only


def test_families_race_with_tokens_identical_to_generate(monkeypatch, tmp_path, capsys):
    """An MoE family and a hybrid one imported from their tiny models (4 layers) and raced at two batch sizes:
    a row each, variant the family, tokens identical to HF's in fp32 for ours eager and compiled (compiled by AOT
    autograd without code generation here: inductor's compile takes a minute), in the table and the JSON."""
    compile_decoding = GPT.compile_decoding
    monkeypatch.setattr(GPT, 'compile_decoding', lambda self: compile_decoding(self, backend='aot_eager'))
    torch._dynamo.reset()
    rows = bench_decode.compare_with_hf([], [1, 3], 2, 6, 1, 'cpu', 0, json_path=str(tmp_path / 'vs_hf.json'),
                                        families=['mixtral', 'qwen3_next'],
                                        sizes={'n_layer': 4, 'n_embd': 32, 'block': 16})
    torch._dynamo.reset()
    assert [(r['variant'], r['hf_class'], r['batch']) for r in rows] == [
        ('mixtral', 'MixtralForCausalLM', 1), ('mixtral', 'MixtralForCausalLM', 3),
        ('qwen3_next', 'Qwen3NextForCausalLM', 1), ('qwen3_next', 'Qwen3NextForCausalLM', 3)]
    for r in rows:
        assert r['tokens_identical'] and r['dtype'] == 'float32'
        assert r['matching_tokens'] == dict.fromkeys(bench_decode.DECODERS, r['batch'] * 6)
        assert all(r[k] > 0 for k in bench_decode.DECODERS)
    assert [r['variant'] for r in json.loads((tmp_path / 'vs_hf.json').read_text())['rows']] == \
        ['mixtral'] * 2 + ['qwen3_next'] * 2
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| mixtral')]
    assert len(table) == 2 and all(line.endswith('| yes |') for line in table)
