"""bench_decode.py (bench.py --vs_hf=True): the dtype reaching both sides, the bytes a step reads, a bad dtype."""
import json
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import bench_decode  # noqa: E402
from chapters import GPT, GPTConfig, swap_flags  # noqa: E402
from test_bench import bench, expect_one_error  # noqa: E402

TINY = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=65, bias=False)


def test_vs_hf_dtype_reaches_our_model_and_hugging_faces(monkeypatch):
    """Both sides decode in bfloat16: every weight of ours, of the copy compile_decoding would compile and of HF's
    (not compiled here: the dtype is what is checked, and a compile takes tens of seconds)."""
    pytest.importorskip('transformers')
    seen = []
    make_decoders = bench_decode._decoders

    def recording(ours, fast, hf, idx, new_tokens):
        seen.append({name: {p.dtype for p in m.parameters()} for name, m in
                     (('ours', ours), ('fast', fast), ('hf', hf))})
        return make_decoders(ours, fast, hf, idx, new_tokens)
    monkeypatch.setattr(bench_decode, '_decoders', recording)
    monkeypatch.setattr(GPT, 'compile_decoding', lambda self: self)
    cfg = GPTConfig(**TINY, **swap_flags('modern', TINY))
    rows = bench_decode.compare_with_hf([('modern', cfg)], [2], 1, 3, 1, 'cpu', 0, dtypes=('bfloat16',))
    assert seen == [{'ours': {torch.bfloat16}, 'fast': {torch.bfloat16}, 'hf': {torch.bfloat16}}]
    assert [(r['dtype'], r['hf_class'], r['new_tokens_total']) for r in rows] == [('bfloat16', 'LlamaForCausalLM', 6)]
    assert set(rows[0]['matching_tokens']) == {'ours eager', 'ours compiled', 'HF generate'}
    assert rows[0]['matching_tokens']['HF generate'] == 6


def test_a_variant_no_family_carries_is_skipped_with_a_note_before_anything_is_measured(monkeypatch, tmp_path, capsys):
    """issue #44: --variants=modern,kda measured modern, then died exporting kda (its rows lost, no JSON). Now kda is
    skipped with one note naming why, first; modern is measured and written."""
    pytest.importorskip('transformers')
    monkeypatch.setattr(GPT, 'compile_decoding', lambda self: self)  # the dtype test says why
    modern = swap_flags('modern', TINY)
    configs = [('modern', GPTConfig(**TINY, **modern)), ('kda', GPTConfig(**TINY, **modern, layers='K'))]
    rows = bench_decode.compare_with_hf(configs, [1], 1, 2, 1, 'cpu', 0, json_path=str(tmp_path / 'vs_hf.json'))
    out = capsys.readouterr().out.splitlines()
    notes = [line for line in out if line.startswith('note:')]
    assert len(notes) == 1 and notes[0].startswith('note: skipping kda: ') and 'kimi_linear' in notes[0], out
    assert out.index(notes[0]) < min(i for i, line in enumerate(out) if 'greedy decoding' in line)  # before measuring
    assert [r['variant'] for r in rows] == ['modern']
    assert [r['variant'] for r in json.loads((tmp_path / 'vs_hf.json').read_text())['rows']] == ['modern']
    assert bench_decode.compare_with_hf(configs[1:], [1], 1, 2, 1, 'cpu', 0) == []  # nothing left: nothing measured


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_step_bytes_are_the_weights_a_step_multiplies_by_and_the_whole_cache(dtype):
    """GPT-2's block without biases, counted from its shapes: per layer two norms, the qkv and output projections
    (4 C^2) and the MLP (8 C^2); the final norm; the head, which is the token table (tied): the table is read whole
    once, the position table only a row (left out). The cache: keys and values of every layer at every position."""
    C, L, V, B, T = TINY['n_embd'], TINY['n_layer'], TINY['vocab_size'], 3, 10
    model = GPT(GPTConfig(**TINY)).to(dtype)
    weights, cache = bench_decode.step_bytes(model, B, T)
    size = torch.empty((), dtype=dtype).element_size()
    assert weights == (L * (2 * C + 12 * C * C) + C + V * C) * size
    assert cache == 2 * L * B * T * C * size


def test_step_bytes_count_an_untied_head_and_grouped_keys_once():
    """The modern block: an untied head is read, the token table it is not tied to is a lookup; GQA's cache holds
    its n_kv_head heads only."""
    cfg = GPTConfig(**TINY, **swap_flags('modern', TINY), tie_embeddings=False)
    model = GPT(cfg)
    weights, cache = bench_decode.step_bytes(model, 2, 8)
    every = sum(p.numel() for p in model.parameters()) * 4
    assert weights == every - model.transformer.wte.weight.numel() * 4
    assert cache == 2 * TINY['n_layer'] * 2 * 8 * cfg.kv_heads * (TINY['n_embd'] // TINY['n_head']) * 4


def test_a_bad_vs_hf_dtype_is_one_error_line():
    expect_one_error(bench('--vs_hf=True', '--vs_hf_dtype=float32,int8', cwd=REPO_ROOT), 'vs_hf_dtype',
                     "'float32,int8'", 'bfloat16')


def test_partings_name_each_rows_first_difference_and_the_fp32_models_margin_there():
    """A row whose new tokens differ from HF's from the 3rd on: that row, that token, the fp32 model's top-2 gap on
    the shared prefix, and which side fp32 picks; bf16's rounding step there is between 2^-8 and 2^-7 of the logit."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY)).eval()
    with torch.no_grad():
        ours = model.generate(torch.tensor([[1], [2]]), 5, temperature=0)
        logits = model(ours[1:, :3])[0][0, -1]
    other = ours.clone()
    other[1, 3:] = (ours[1, 3:] + 1) % TINY['vocab_size']  # HF's row 1 parts at its 3rd new token
    top = logits.topk(2).values
    for tokens, hf_tokens, picks in ((ours, other, 'ours'), (other, ours, 'HF')):
        [part] = bench_decode.partings(model, tokens, hf_tokens, 1, 'bfloat16')
        assert (part['row'], part['new_token'], part['fp32_picks']) == (1, 3, picks)
        assert part['gap'] == pytest.approx(float(top[0] - top[1]))
        assert 2 ** -8 * abs(float(top[0])) < part['step'] <= 2 ** -7 * abs(float(top[0]))
    assert bench_decode.partings(model, ours, ours.clone(), 1, 'bfloat16') == []


@pytest.mark.parametrize('family', ['moe', 'gemma4', 'deepseek_v4_hash'])
def test_unread_bytes_are_the_experts_no_token_of_a_step_picked(family):
    """One token a step picks k of E experts, so each step leaves E - k experts of every MoE layer unread, whatever
    the router reads (Gemma 4's normalized input, DeepSeek-V4's token ids); eight tokens leave fewer, and a model
    without experts leaves nothing."""
    from chapters import moe
    from test_deepseek_v4 import V4
    from test_gemma4 import GEMMA4_MOE
    from tiny_models import build
    model = {'moe': lambda: GPT(GPTConfig(**TINY, **{**swap_flags('modern', TINY), **moe.VARIANT})).eval(),
             'gemma4': lambda: build(**GEMMA4_MOE),
             'deepseek_v4_hash': lambda: build(**V4, hash_moe_layers=1)}[family]()
    layers = [m for m in model.modules() if isinstance(m, moe.MoE)]
    with torch.no_grad():  # Gemma 4's router reads x scaled per channel: ones would pick as an unscaled x does
        for m in layers:
            if hasattr(m, 'router_scale'):
                m.router_scale.uniform_(-2, 2, generator=torch.Generator().manual_seed(2))
    expert_bytes = sum(p[0].numel() for p in layers[0].experts.parameters()) * 4
    vocab = model.config.vocab_size
    idx = torch.randint(vocab, (1, 3), generator=torch.Generator().manual_seed(0))
    E, k = model.config.n_expert, model.config.n_expert_active
    assert bench_decode.unread_bytes(model, idx, 4) == len(layers) * (E - k) * expert_bytes
    rows = torch.randint(vocab, (8, 3), generator=torch.Generator().manual_seed(1))
    assert 0 <= bench_decode.unread_bytes(model, rows, 4) < len(layers) * (E - k) * expert_bytes
    assert bench_decode.unread_bytes(GPT(GPTConfig(**TINY)).eval(), idx, 4) == 0
    # what unread_params counts is the routing each layer's forward hands its experts
    handed, routed = [], []
    hooks = [m.experts.register_forward_pre_hook(lambda module, args: handed.append(args[1])) for m in layers]
    hooks += [m.register_forward_pre_hook(lambda module, args: routed.append(
        module.route(args[0].reshape(-1, args[0].size(-1)), *args[1:])[2])) for m in layers]
    with torch.no_grad():
        model(rows)
    for h in hooks:
        h.remove()
    assert len(handed) == len(layers) and all(torch.equal(a, b) for a, b in zip(handed, routed))
