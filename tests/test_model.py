"""Tests for model.py, the lesson: every flag combination over every registry (with its KV cache), the four swaps
(norm, mlp, n_kv_head, pos) against attention/RoPE/norm references, init and tying, optimizer groups, accounting,
config validation of the lesson's fields, Hugging Face interop (tiny random models, no network), and model.py run
alone. Each later chapter's tests are tests/test_<chapter>.py; the decoding engine's, tests/test_generate.py."""
import ast
import itertools
import math
import os
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import model as M
from chapters import GPT, GPTConfig, attention, long_context
from tiny_models import (BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, build, check_backward, check_cache_logits,
                         check_causal, check_generate_cache, config_id, counted_training_flops, rope_tables,
                         reference_greedy, tiny_config)

pytestmark = pytest.mark.usefixtures('single_thread')


# ----------------------------------------------------------------------------- 1 + 9: every flag combination

# One dimension per kind of part (read from model.py's dicts, so a new kind is tested without editing this
# file) and per switch; each entry is a set of flags.
DIMENSIONS = [
    [{'norm': n} for n in M.NORMS],
    [{'mlp': m} for m in M.MLPS],
    [{'attn': a} for a in M.ATTENTIONS if a != 'mha'] + [{'attn': 'mha', 'n_kv_head': k} for k in (None, 2, 1)],
    [{'pos': p} for p in M.POSITIONS],
    [{'norm_position': p} for p in M.NORM_POSITIONS],
    # an original length shorter than the test sequences, so each scaling acts; but 'dynamic' changes every
    # angle with the length, so a KV cache is exact only within its original length (test_dynamic_* below)
    [{}] + [{'rope_scaling': k, 'rope_factor': 4.0, 'rope_original_length': None if k == 'dynamic' else 6}
            for k in long_context.ROPE_SCALINGS if k] + [{'rope_scaling': 'yarn', 'rope_factor': 4.0, 'rope_original_length': 6,
                                               'yarn_truncate': False}],
    # windows shorter than BLOCK (the cache keeps a ring of 5) on every layer, or per layer with the other
    # kinds: a global layer, one without RoPE, local layers with their own RoPE base
    [{}, {'sliding_window': 5}, {'layers': 'LG', 'sliding_window': 5}, {'layers': 'NG'},
     {'layers': 'GL', 'sliding_window': 5, 'rope_local_theta': 100.0},
     # a Gated DeltaNet layer, two key heads for four value heads, chunks of 5 (prefills of 5, 4 and 12 tokens)
     {'layers': 'DG', 'linear_n_key_head': 2, 'linear_key_dim': 6, 'linear_chunk_size': 5}],
    [{}, {'qk_norm': True}, {'qk_norm': True, 'qk_norm_all_heads': True}],
    [{}, {'attn_sinks': True}, {'attn_gate': True}, {'attn_sinks': True, 'attn_gate': True, 'attn_scale': 0.5}],
    [{}, {'rope_fraction': 0.5}],
    [{}, {'embed_scale': True, 'logit_softcap': 3.0}],
    [{}, {'moe_bias': True, 'swiglu_limit': 1.0}],  # gpt-oss's experts (MoE only)
    [{}, {'qkv_bias': True, 'bias': False}],
    [{}, {'head_dim': 12}],  # heads wider than n_embd / n_head = 8
    # DeepSeek's MoE (what an MoE layer does with it; other MLPs ignore it): sigmoid router and groups, a
    # shared expert, a dense first layer
    [{}, {'router': 'sigmoid', 'n_expert_group': 2, 'topk_group': 1, 'n_shared_expert': 1, 'first_dense_layers': 1,
          'routed_scaling': 2.5}, {'n_shared_expert': 1, 'shared_expert_gate': True}],  # Qwen3-Next's gated shared expert
    [{}, {'q_lora_rank': 16, 'v_head_dim': 6}],  # MLA's query bottleneck and a value width of its own
]


def valid(flags):
    try:
        tiny_config(**flags)
        return True
    except ValueError:  # a combination that cannot apply (e.g. rope scaling with learned positions)
        return False


def all_pairs(dimensions, draws=4000, seed=0):
    """Flag sets in which every value of each dimension meets every value of every other dimension (where a
    valid model has both): all-pairs coverage, far fewer models than the full product."""
    rng = random.Random(seed)
    combos, covered = [], set()
    for _ in range(draws):
        picks = [rng.randrange(len(d)) for d in dimensions]
        flags = {k: v for d, i in zip(dimensions, picks) for k, v in d[i].items()}
        pairs = set(itertools.combinations(enumerate(picks), 2))
        if pairs - covered and valid(flags):
            combos.append(flags)
            covered |= pairs
    return combos


COMBOS = all_pairs(DIMENSIONS, seed=5)  # a seed whose draws cover every pair (MLA has few valid partners)


def combo_id(flags):
    return '-'.join(f"{v}" if k in ('norm', 'mlp', 'attn', 'pos') else f"{k}={v}" for k, v in flags.items())


def test_all_pairs_covers_every_kind_and_the_full_product_is_larger():
    seen = {(k, v) for flags in COMBOS for k, v in flags.items()}
    for dimension in DIMENSIONS:
        for flags in dimension:
            assert set(flags.items()) <= seen, flags
    assert len(COMBOS) < math.prod(len(d) for d in DIMENSIONS)


@pytest.mark.parametrize('flags', COMBOS, ids=[combo_id(c) for c in COMBOS])
def test_flag_combination(flags):
    model = build(**flags)
    cfg = model.config
    # the flags really select the parts
    block = model.transformer.h[-1]
    assert type(block.ln_1) is M.NORMS[cfg.norm] and type(model.transformer.wpe) is M.POSITIONS[cfg.pos]
    assert type(block.mlp) is M.MLPS[cfg.mlp] and type(block.attn) is M.ATTENTIONS[cfg.attn]
    if cfg.attn == 'mha':
        assert block.attn.c_attn.out_features == (N_HEAD + 2 * cfg.kv_heads) * cfg.head_size
    check_backward(model)
    check_causal(model)
    check_cache_logits(model)
    check_generate_cache(model)


@pytest.mark.parametrize('norm', ['layernorm', 'rms'])
@pytest.mark.parametrize('position', M.NORM_POSITIONS)
def test_block_norm_placement(position, norm):
    cfg = tiny_config(norm_position=position, norm=norm)
    torch.manual_seed(31)
    block = M.Block(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
        x = torch.randn(2, 7, N_EMBD) * 2
        if position == 'pre':  # x + f(norm(x)): the residual stream itself is never normalized
            h = x + block.attn(block.ln_1(x))
            expected = h + block.mlp(block.ln_2(h))
        elif position == 'post':  # norm(x + f(x)), as in the 2017 Transformer
            h = block.ln_1(x + block.attn(x))
            expected = block.ln_2(h + block.mlp(h))
        elif position == 'sandwich':  # Gemma: x + norm(f(norm(x)))
            h = x + block.ln_1_out(block.attn(block.ln_1(x)))
            expected = h + block.ln_2_out(block.mlp(block.ln_2(h)))
        else:  # OLMo 2: x + norm(f(x))
            h = x + block.ln_1(block.attn(x))
            expected = h + block.ln_2(block.mlp(h))
        assert_close(block(x), expected, atol=1e-5)
    model = build(norm_position=position, norm=norm)
    # post-norm blocks end in a norm; the others leave the stream to a final one
    assert isinstance(model.transformer.ln_f, nn.Identity) == (position == 'post')
    assert sum(isinstance(m, M.NORMS[norm]) for m in model.transformer.h[0].modules()) == \
        (4 if position == 'sandwich' else 2)


def tanh_gelu(h):
    """GPT-2's tanh approximation of GELU (Gemma's GEGLU uses it too)."""
    return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))


def erf_gelu(h):
    """The exact GELU, x * Phi(x): nanoGPT's nn.GELU()."""
    return 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))


@pytest.mark.parametrize('mlp', ['gelu', 'gelu-tanh', 'relu', 'relu2', 'swiglu', 'geglu'])
def test_mlp_formulas(mlp):
    mlp, _, tanh = mlp.partition('-')
    cfg = tiny_config(mlp=mlp, ffn_hidden=24, bias=True, **({'gelu': 'tanh'} if tanh else {}))
    torch.manual_seed(32)
    module = M.MLPS[mlp](cfg).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        x = torch.randn(3, 5, N_EMBD)
        fc, proj = module.c_fc, module.c_proj
        h = x @ fc.weight.T + fc.bias
        if mlp in ('swiglu', 'geglu'):
            assert fc.out_features == 2 * 24
            gate, up = h[..., :24], h[..., 24:]  # [gate | up] along the output
            act = gate * torch.sigmoid(gate) if mlp == 'swiglu' else tanh_gelu(gate)
            h = act * up
        elif mlp == 'relu':
            h = h.clamp_min(0)
        elif mlp == 'relu2':
            h = h.clamp_min(0) ** 2
        else:  # the default is nanoGPT's exact GELU; 'tanh' GPT-2's own form (its weights import with it)
            h = tanh_gelu(h) if tanh else erf_gelu(h)
            assert_close(h, (erf_gelu if tanh else tanh_gelu)(x @ fc.weight.T + fc.bias), atol=1e-2)
            assert (h - (erf_gelu if tanh else tanh_gelu)(x @ fc.weight.T + fc.bias)).abs().max() > 1e-5
        expected = h @ proj.weight.T + proj.bias
        assert_close(module(x), expected, atol=1e-5)


@pytest.mark.parametrize('overrides', [dict(bias=False), dict(bias=False, norm='rms', mlp='swiglu', n_kv_head=1,
                                                               pos='rope', tie_embeddings=False)],
                         ids=['vanilla-nobias', 'llama-nobias-untied'])
def test_no_bias_and_untied_models(overrides):
    model = build(**overrides)
    assert not any(name.endswith('bias') for name, _ in model.named_parameters())
    check_backward(model)
    check_causal(model)
    check_cache_logits(model)
    check_generate_cache(model)


# ----------------------------------------------------------------------------- 2: forward outputs

@pytest.mark.parametrize('overrides', [dict(), dict(norm='rms', mlp='swiglu', n_kv_head=1, pos='rope'),
                                       dict(norm_position='post', mlp='relu')], ids=['vanilla', 'llama', 'postnorm'])
def test_forward_outputs_and_initial_loss(overrides):
    model = build(**overrides)
    torch.manual_seed(5)
    idx = torch.randint(0, VOCAB, (3, 11))
    targets = torch.randint(0, VOCAB, (3, 11))
    with torch.no_grad():
        out = model(idx)
        assert isinstance(out, tuple) and len(out) == 2
        logits, loss = out
        assert loss is None
        assert logits.shape == (3, 11, VOCAB)
        logits2, loss = model(idx, targets)
    assert_close(logits2, logits, atol=0.0)
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(math.log(VOCAB), abs=0.05)
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_loss_ignores_targets_of_minus_one():
    model = build()
    torch.manual_seed(6)
    idx = torch.randint(0, VOCAB, (2, 8))
    targets = torch.randint(0, VOCAB, (2, 8))
    masked = targets.clone()
    masked[:, 4:] = -1
    with torch.no_grad():
        logits, loss = model(idx, masked)
    expected = F.cross_entropy(logits[:, :4].reshape(-1, VOCAB), targets[:, :4].reshape(-1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


# ----------------------------------------------------------------------------- 3: norms

@pytest.mark.parametrize('eps', [1e-5, 0.5])
def test_rmsnorm_matches_formula(eps):
    torch.manual_seed(7)
    norm = M.RMSNorm(N_EMBD, tiny_config(norm_eps=eps))
    with torch.no_grad():
        norm.weight.copy_(torch.randn(N_EMBD) * 0.5 + 1.0)
    x = torch.randn(3, 5, N_EMBD) * 0.3  # small enough that eps matters when it is 0.5
    expected = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * norm.weight
    assert_close(norm(x), expected, atol=1e-5)
    assert [name for name, _ in norm.named_parameters()] == ['weight']


def test_make_norm_rms_uses_config_eps_and_has_no_bias():
    norm = M.make_norm(tiny_config(norm='rms', norm_eps=0.25, bias=True))
    assert isinstance(norm, M.RMSNorm)
    assert [name for name, _ in norm.named_parameters()] == ['weight']
    torch.manual_seed(8)
    x = torch.randn(2, N_EMBD) * 0.2
    expected = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + 0.25)
    assert_close(norm(x), expected, atol=1e-5)


@pytest.mark.parametrize('bias', [True, False])
def test_layernorm_bias_flag_and_formula(bias):
    norm = M.make_norm(tiny_config(bias=bias, norm_eps=1e-3))
    assert isinstance(norm, M.LayerNorm)
    names = sorted(name for name, _ in norm.named_parameters())
    assert names == (['bias', 'weight'] if bias else ['weight'])
    torch.manual_seed(9)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(N_EMBD))
        if bias:
            norm.bias.copy_(torch.randn(N_EMBD))
    x = torch.randn(4, N_EMBD) * 3 + 1
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, unbiased=False, keepdim=True)
    expected = (x - mean) / torch.sqrt(var + 1e-3) * norm.weight
    if bias:
        expected = expected + norm.bias
    assert_close(norm(x), expected, atol=1e-5)


# ----------------------------------------------------------------------------- 4: attention vs explicit reference

def rope_reference(x, positions, theta):
    """Rotate the pairs (i, i + hs/2) of x (..., T, hs) by position * theta**(-2i/hs), in float64."""
    hs = x.size(-1)
    half = hs // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / hs)
    angle = positions.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def attention_reference(attn, x, n_head, n_kv, rope_theta=None):
    B, T, C = x.shape
    hs = C // n_head
    qkv = x @ attn.c_attn.weight.T
    if attn.c_attn.bias is not None:
        qkv = qkv + attn.c_attn.bias
    q = qkv[..., :n_head * hs].reshape(B, T, n_head, hs).transpose(1, 2)
    k = qkv[..., n_head * hs:(n_head + n_kv) * hs].reshape(B, T, n_kv, hs).transpose(1, 2)
    v = qkv[..., (n_head + n_kv) * hs:].reshape(B, T, n_kv, hs).transpose(1, 2)
    assert qkv.size(-1) == (n_head + 2 * n_kv) * hs
    if rope_theta is not None:
        q = rope_reference(q, torch.arange(T), rope_theta)
        k = rope_reference(k, torch.arange(T), rope_theta)
    k = k.repeat_interleave(n_head // n_kv, dim=1)
    v = v.repeat_interleave(n_head // n_kv, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future, float('-inf'))
    y = scores.softmax(dim=-1) @ v
    y = y.transpose(1, 2).reshape(B, T, C)
    return attn.c_proj(y)


@pytest.mark.parametrize('sdpa_gqa', [True, False], ids=['sdpa-gqa', 'repeat-fallback'])
@pytest.mark.parametrize('rope', [False, True], ids=['norope', 'rope'])
@pytest.mark.parametrize('n_kv', [1, 2, 4])
def test_attention_matches_explicit_reference(n_kv, rope, sdpa_gqa, monkeypatch):
    monkeypatch.setattr(M, '_sdpa_shares_heads', lambda q: sdpa_gqa)
    theta = 10000.0
    cfg = tiny_config(n_kv_head=n_kv, bias=True, pos='rope' if rope else 'learned', rope_theta=theta)
    torch.manual_seed(10)
    attn = M.CausalSelfAttention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, 12, N_EMBD)
    tables = rope_tables(M.Rotary(cfg), 0, 12) if rope else None
    with torch.no_grad():
        got = attn(x, tables)
        expected = attention_reference(attn, x, N_HEAD, n_kv, theta if rope else None)
    assert_close(got, expected, atol=1e-5)


@pytest.mark.parametrize('n_kv', [1, 2])
def test_gqa_fallback_path_matches_sdpa_gqa_in_model_and_cache(n_kv, monkeypatch):
    model = build(n_kv_head=n_kv, pos='rope', norm='rms', mlp='swiglu')
    torch.manual_seed(11)
    idx = torch.randint(0, VOCAB, (2, BLOCK))
    prompt = idx[:, :5]
    with torch.no_grad():
        logits_native = model(idx)[0]
        gen_native = model.generate(prompt, 30, temperature=0.0, use_cache=True)
        monkeypatch.setattr(M, '_sdpa_shares_heads', lambda q: False)
        logits_fallback = model(idx)[0]
        gen_fallback = model.generate(prompt, 30, temperature=0.0, use_cache=True)
    assert_close(logits_fallback, logits_native, atol=1e-5)
    assert torch.equal(gen_fallback, gen_native)
    check_cache_logits(model)  # still under the fallback path


def one_query_reference(q, k, v, mask, scale=None, sinks=None):
    """Softmax attention of one query per head, written out in fp64 from the half-precision inputs: keys repeated
    for GQA, the mask broadcast over (B, H, 1, S), a sink's logit joining the denominator."""
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * (q.size(-1) ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float('-inf'))
    if sinks is not None:
        scores = torch.cat((scores, sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)), dim=-1)
    probs = scores.softmax(-1)
    return probs[..., :v.size(2)] @ v


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('n_kv, mask_shape', [(6, None), (3, (1, 9)), (1, (2, 1, 1, 9)), (3, (2, 6, 1, 9)),
                                              (2, (1, 6, 1, 9))])
def test_one_query_attention_in_half_precision_is_softmax_attention_in_fp32(dtype, n_kv, mask_shape):
    """A decoding step's attention on a CPU in bf16/fp16 (written out, in fp32): the fp64 reference rounded once, for
    GQA groups, masks shared or per batch row or per head, an explicit scale, values of another width and sinks
    (with the masks the sinks take: shared ones)."""
    gen = torch.Generator().manual_seed(n_kv)
    q, k = torch.randn(2, 6, 1, 8, generator=gen), torch.randn(2, n_kv, 9, 8, generator=gen)
    v = torch.randn(2, n_kv, 9, 5, generator=gen)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    mask = None if mask_shape is None else torch.rand(*mask_shape, generator=gen) < 0.6
    if mask is not None:
        mask[..., 0] = True  # every query sees a key
    sinks = torch.randn(6, generator=gen)
    for scale, sinks in ((None, None), (0.3, None)) + (((0.3, sinks),) if mask is None or mask.dim() == 2 else ()):
        got = attention.attend_with_sinks(q, k, v, mask, scale=scale, sinks=sinks)
        expected = one_query_reference(q, k, v, mask, scale, sinks)
        assert got.dtype == dtype and got.shape == (2, 6, 1, 5)
        # fp32 arithmetic rounded once to the half type: within a unit in its last place
        torch.testing.assert_close(got.double(), expected, rtol=torch.finfo(dtype).eps, atol=1e-6)


def test_attend_writes_out_only_a_half_precision_single_query_on_a_cpu(monkeypatch):
    """The written-out form is for one query in bf16/fp16 without dropout or SDPA's top-left causal flag; fp32,
    prefill and training keep SDPA."""
    taken = []
    monkeypatch.setattr(M, '_attend_one_query', lambda q, k, v, mask, scale: taken.append(q.dtype) or q)
    def call(dtype, T=1, mask=None, dropout_p=0.0):
        q = torch.randn(1, 2, T, 4, dtype=dtype)
        M.attend(q, torch.randn(1, 2, T, 4, dtype=dtype), torch.randn(1, 2, T, 4, dtype=dtype), mask, dropout_p)
    call(torch.bfloat16), call(torch.float16), call(torch.bfloat16, mask=torch.ones(1, 1, dtype=torch.bool))
    assert taken == [torch.bfloat16, torch.float16, torch.bfloat16]
    call(torch.float32), call(torch.bfloat16, T=3), call(torch.bfloat16, mask=True), call(torch.bfloat16, dropout_p=0.1)
    assert len(taken) == 3


# ----------------------------------------------------------------------------- 5: RoPE

def make_rotary(head_size, theta, length):
    return M.Rotary(GPTConfig(n_embd=head_size, n_head=1, pos='rope', rope_theta=theta, block_size=length))


def rotate(rotary, vec, pos):
    cos, sin = rope_tables(rotary, 0, pos + 1)
    return M.apply_rope(vec.view(1, 1, 1, -1), cos[pos:pos + 1], sin[pos:pos + 1]).view(-1)


def test_rope_dot_product_depends_only_on_relative_position():
    hs = 16
    rotary = make_rotary(hs, 10000.0, 64)
    torch.manual_seed(12)
    for _ in range(5):
        q, k = torch.randn(hs), torch.randn(hs)
        for m, n, s in ((3, 1, 7), (0, 10, 20), (12, 12, 30), (5, 9, 41)):
            a = rotate(rotary, q, m) @ rotate(rotary, k, n)
            b = rotate(rotary, q, m + s) @ rotate(rotary, k, n + s)
            assert a.item() == pytest.approx(b.item(), abs=1e-4)
        # and it does depend on the relative position (the rotation is not the identity)
        d0 = rotate(rotary, q, 4) @ rotate(rotary, k, 4)
        d3 = rotate(rotary, q, 7) @ rotate(rotary, k, 4)
        assert abs(d0.item() - (q @ k).item()) < 1e-4
        assert abs(d3.item() - d0.item()) > 1e-3


def test_apply_rope_matches_pairwise_rotation_and_preserves_norm():
    hs, T = 8, 20
    cos, sin = rope_tables(make_rotary(hs, 500.0, T), 0, T)
    assert cos.shape == sin.shape == (T, hs)
    assert cos.dtype == torch.float32
    torch.manual_seed(13)
    x = torch.randn(2, 3, T, hs)
    y = M.apply_rope(x, cos, sin)
    assert_close(y, rope_reference(x, torch.arange(T), 500.0), atol=1e-5)
    assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert_close(y[:, :, 0], x[:, :, 0], atol=0.0)  # position 0 is not rotated


def test_rotary_table_grows_to_match_a_longer_table():
    hs = 8
    small = make_rotary(hs, 10000.0, 16)
    before_cos, before_sin = [t.clone() for t in rope_tables(small, 0, 16)]
    cos, sin = rope_tables(small, 10, 30)  # needs positions up to 40 > 16
    assert cos.shape == sin.shape == (30, hs)
    big = make_rotary(hs, 10000.0, 100)
    big_cos, big_sin = rope_tables(big, 10, 30)
    assert_close(cos, big_cos, atol=1e-6)
    assert_close(sin, big_sin, atol=1e-6)
    assert_close(rope_tables(small, 0, 16)[0], before_cos, atol=0.0)
    assert_close(rope_tables(small, 0, 16)[1], before_sin, atol=0.0)
    assert_close(rope_tables(small, 0, 100)[0], rope_tables(big, 0, 100)[0], atol=1e-6)


def test_rope_model_extrapolates_and_learned_model_refuses():
    rope = build(pos='rope')
    torch.manual_seed(14)
    idx = torch.randint(0, VOCAB, (2, 3 * BLOCK))
    with torch.no_grad():
        logits, _ = rope(idx)
        short, _ = rope(idx[:, :BLOCK])
    assert logits.shape == (2, 3 * BLOCK, VOCAB)
    assert torch.isfinite(logits).all()
    assert_close(logits[:, :BLOCK], short, atol=1e-5)  # causal: the prefix is unchanged
    learned = build(pos='learned')
    with torch.no_grad():
        learned(idx[:, :BLOCK])  # exactly block_size is fine
        with pytest.raises(ValueError, match='block_size'):
            learned(idx[:, :BLOCK + 1])


# ----------------------------------------------------------------------------- 6: init and tying

@pytest.mark.parametrize('mlp', ['gelu', 'relu', 'swiglu', 'geglu'])
def test_init_statistics(mlp):
    torch.manual_seed(15)
    n_layer = 4
    model = GPT(GPTConfig(block_size=32, vocab_size=128, n_layer=n_layer, n_head=4, n_embd=256, mlp=mlp, bias=True))
    scaled = 0.02 / math.sqrt(2 * n_layer)
    seen_proj = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            expected = scaled if name.endswith('c_proj') else 0.02
            seen_proj += name.endswith('c_proj')
            std = module.weight.std().item()
            assert abs(std - expected) < 0.1 * expected, f"{name}.weight std {std}, expected {expected}"
            assert abs(module.weight.mean().item()) < 0.1 * expected
            if module.bias is not None:
                assert torch.count_nonzero(module.bias) == 0, f"{name}.bias is not zero"
        elif isinstance(module, nn.Embedding):
            std = module.weight.std().item()
            assert abs(std - 0.02) < 0.1 * 0.02, f"{name}.weight std {std}"
        elif isinstance(module, M.LayerNorm):
            assert torch.equal(module.weight, torch.ones_like(module.weight))
            assert torch.count_nonzero(module.bias) == 0
    assert seen_proj == 2 * n_layer  # attention and MLP projections of every layer


def test_tied_and_untied_embeddings():
    tied = build(tie_embeddings=True)
    untied = build(tie_embeddings=False)
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()
    assert not torch.equal(untied.lm_head.weight, untied.transformer.wte.weight)
    assert untied.get_num_params() - tied.get_num_params() == VOCAB * N_EMBD
    with torch.no_grad():
        tied.lm_head.weight[3, 0] = 7.0
    assert tied.transformer.wte.weight[3, 0].item() == 7.0


# ----------------------------------------------------------------------------- 7: optimizer groups

@pytest.mark.parametrize('overrides', [dict(), dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2,
                                                    bias=False, tie_embeddings=False),
                                       dict(norm_position='post')], ids=['vanilla', 'llama', 'postnorm'])
def test_configure_optimizers_groups(overrides):
    model = build(**overrides)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-4, betas=(0.9, 0.95), device_type='cpu')
    assert isinstance(opt, torch.optim.AdamW)
    decay = [g for g in opt.param_groups if g['weight_decay'] == 0.1]
    no_decay = [g for g in opt.param_groups if g['weight_decay'] == 0.0]
    assert len(decay) == 1 and len(no_decay) == 1 and len(opt.param_groups) == 2
    decay_ids = [id(p) for p in decay[0]['params']]
    no_decay_ids = [id(p) for p in no_decay[0]['params']]
    assert all(p.dim() == 2 for p in decay[0]['params'])
    assert all(p.dim() == 1 for p in no_decay[0]['params'])
    all_ids = decay_ids + no_decay_ids
    model_ids = [id(p) for p in model.parameters()]
    assert len(all_ids) == len(set(all_ids)), "a parameter is in the optimizer twice"
    assert sorted(all_ids) == sorted(model_ids)
    names = {id(p): name for name, p in model.named_parameters()}
    for pid in no_decay_ids:
        assert names[pid].endswith(('bias', 'ln_1.weight', 'ln_2.weight', 'ln_f.weight')), names[pid]
    assert id(model.transformer.wte.weight) in decay_ids
    assert id(model.lm_head.weight) in decay_ids
    assert no_decay_ids, "norm weights must be in the no-decay group"
    assert decay[0]['lr'] == 3e-4 and decay[0]['betas'] == (0.9, 0.95)
    # and it steps
    torch.manual_seed(16)
    model.train()
    _, loss = model(torch.randint(0, VOCAB, (2, 8)), torch.randint(0, VOCAB, (2, 8)))
    loss.backward()
    before = model.transformer.h[0].attn.c_attn.weight.clone()
    opt.step()
    assert not torch.equal(before, model.transformer.h[0].attn.c_attn.weight)


def test_muon_takes_the_hidden_matrices_and_each_expert_as_a_matrix():
    """Muon gets every matrix inside the blocks (a stack of experts as E matrices) and nothing else; a step moves
    each expert exactly as torch's Muon moves that expert's matrix alone."""
    model = build(norm='rms', mlp='moe', n_expert=4, n_expert_active=2, moe_hidden=16, pos='rope', n_kv_head=2,
                  tie_embeddings=False)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu', optimizer='muon', muon_lr=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g['params']}
    assert adamw == {n for n, p in model.named_parameters() if not n.startswith('transformer.h.') or p.dim() == 1}
    assert 'lm_head.weight' in adamw and 'transformer.wte.weight' in adamw
    stacks = [p for n, p in model.named_parameters() if n.endswith(('experts.c_fc', 'experts.c_proj'))]
    matrices = [p for n, p in model.named_parameters() if n.startswith('transformer.h.') and p.dim() == 2]
    muon = opt.muon.param_groups[0]
    assert len(muon['params']) == len(matrices) + sum(p.size(0) for p in stacks)
    assert muon['lr'] == 0.05 and 'ns_steps' in muon and all(g['lr'] == 1e-3 for g in opt.adamw.param_groups)
    # one expert alone under torch's Muon: the reference for what the stack's step does to it
    expert = stacks[0]
    alone = nn.Parameter(expert.detach()[1].clone())
    reference = torch.optim.Muon([alone], lr=0.05, momentum=0.95, weight_decay=0.1)
    model.train()
    for step in range(2):
        torch.manual_seed(step)
        _, loss = model(torch.randint(0, VOCAB, (2, 8)), torch.randint(0, VOCAB, (2, 8)))
        loss.backward()
        alone.grad = expert.grad[1].clone()
        before = expert.detach().clone()
        opt.step()
        reference.step()
        opt.zero_grad()
        assert expert.grad is None and all(p.grad is None for g in opt.param_groups for p in g['params'])
        assert not torch.equal(before[1], expert[1])
        torch.testing.assert_close(expert.detach()[1], alone.detach(), rtol=0, atol=1e-6)
    # its state saves and loads into a fresh pair
    again = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu', optimizer='muon', muon_lr=0.05)
    again.load_state_dict(opt.state_dict())
    assert torch.equal(again.muon.state_dict()['state'][0]['momentum_buffer'],
                       opt.muon.state_dict()['state'][0]['momentum_buffer'])
    with pytest.raises(ValueError, match="Muon's and AdamW's"):
        again.load_state_dict(model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu').state_dict())


# ----------------------------------------------------------------------------- 8: accounting

def test_gpt2_124m_param_count():
    with torch.device('meta'):
        model = GPT(GPTConfig(vocab_size=50257))
    assert model.get_num_params() == 124_439_808
    assert model.get_num_params(non_embedding=True) == 124_439_808 - 1024 * 768


def test_gated_mlp_hidden_sizes_and_param_counts():
    def count(module):
        return sum(p.numel() for p in module.parameters())

    with torch.device('meta'):
        gelu = M.MLP(GPTConfig(n_embd=768, bias=False))
        swiglu = M.GatedMLP(GPTConfig(n_embd=768, mlp='swiglu', bias=False))
    assert GPTConfig(n_embd=768, mlp='swiglu').mlp_width == 2048
    assert GPTConfig(n_embd=768).mlp_width == 3072
    assert count(gelu) == count(swiglu) == 2 * 768 * 3072
    assert GPTConfig(n_embd=128, n_head=4, mlp='swiglu').mlp_width == 384
    assert GPTConfig(n_embd=128, n_head=4, mlp='geglu').mlp_width == 384
    assert GPTConfig(n_embd=128, n_head=4, mlp='relu').mlp_width == 512
    assert GPTConfig(n_embd=128, n_head=4, mlp='swiglu', ffn_hidden=100).mlp_width == 100
    small = M.GatedMLP(GPTConfig(n_embd=128, n_head=4, mlp='swiglu', bias=False))
    assert count(small) == 3 * 128 * 384


@pytest.mark.parametrize('flags', COMBOS, ids=[combo_id(c) for c in COMBOS])
def test_flops_per_token_equals_the_counted_flops(flags, monkeypatch):
    """6 per weight a token multiplies (fwd 2, bwd 4) plus attention's matmuls: what torch counts."""
    model = build(**flags)
    T = min(12, model.config.sliding_window or 12)  # the explicit attention computes what a window masks
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(40))
    assert model.flops_per_token(seq_len=T) * 2 * T == counted_training_flops(model, idx, monkeypatch)


def test_estimate_mfu_is_counted_flops_over_time_and_peak(monkeypatch):
    model = build(norm='rms', mlp='swiglu', n_kv_head=2, pos='rope')
    idx = torch.randint(0, VOCAB, (1, BLOCK), generator=torch.Generator().manual_seed(41))
    per_sequence = counted_training_flops(model, idx, monkeypatch)
    fwdbwd, dt, peak = 5, 0.25, 1e12
    assert model.estimate_mfu(fwdbwd, dt, peak) == pytest.approx(per_sequence * fwdbwd / dt / peak, rel=1e-9)


def test_gqa_saves_the_flops_of_the_removed_kv_heads(monkeypatch):
    mha, gqa = build(bias=False), build(bias=False, n_kv_head=1)
    hs = N_EMBD // N_HEAD
    removed_weights = 2 * 2 * (N_HEAD - 1) * hs * N_EMBD  # 2 layers, K and V
    assert mha.flops_per_token() - gqa.flops_per_token() == 6 * removed_weights


# ----------------------------------------------------------------------------- 11: config validation

@pytest.mark.parametrize('overrides,field', [
    (dict(norm='batchnorm'), 'norm'),
    (dict(mlp='tanh'), 'mlp'),
    (dict(pos='alibi'), 'pos'),
    (dict(n_embd=30), 'n_embd'),
    (dict(n_kv_head=3), 'n_kv_head'),
    (dict(n_kv_head=0), 'n_kv_head'),
    (dict(n_kv_head=8), 'n_kv_head'),
    (dict(n_embd=12, pos='rope'), 'rope'),
    (dict(dropout=1.0), 'dropout'),
    (dict(dropout=-0.1), 'dropout'),
    (dict(n_layer=0), 'n_layer'),
    (dict(block_size=-1), 'block_size'),
    (dict(vocab_size=0), 'vocab_size'),
    (dict(n_head=0), 'n_head'),
    (dict(attn='mqa'), 'attn'),
    (dict(pos='rope', head_dim=7), 'head_dim'),  # odd with rope
    (dict(head_dim=0), 'head_dim'),
    (dict(layers='LGX', sliding_window=4), 'layers'),  # an unknown letter
    (dict(layers='LGLG', sliding_window=4), 'layers'),  # longer than the 2 layers
    (dict(layers=''), 'layers'),
    (dict(norm_position='middle'), 'norm_position'),
    (dict(rope_theta=float('inf')), 'rope_theta'),  # a number is finite: 1e999 on a command line reads as inf
    (dict(norm_eps=float('nan')), 'norm_eps'),
    (dict(moe_aux_loss_coef=float('inf')), 'moe_aux_loss_coef'),
], ids=config_id)
def test_invalid_configs_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


@pytest.mark.parametrize('overrides, fix', [
    (dict(attn='mla', n_kv_head=2), '--n_kv_head=None'),
    (dict(attn='mla', pos='rope', qk_norm=True, head_dim=16), '--head_dim=None --qk_norm=False'),
    (dict(kv_lora_rank=16), '--kv_lora_rank=None'),
    (dict(rope_scaling='yarn'), '--pos=rope'),
    (dict(attn='mla', qk_rope_head_dim=4), '--pos=rope'),
])
def test_a_config_error_says_the_fix(overrides, fix):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert fix in str(e.value), str(e.value)


def test_layer_kinds_tile_the_pattern_and_default_to_the_window():
    assert tiny_config(n_layer=5, pos='rope', layers='LLG', sliding_window=4).layer_kinds == list('LLGLL')
    assert tiny_config(n_layer=3).layer_kinds == list('GGG')
    assert tiny_config(n_layer=3, sliding_window=4).layer_kinds == list('LLL')  # one window for all, as before
    cfg = tiny_config(n_layer=4, pos='rope', layers='LGNG', sliding_window=4)
    assert [cfg.window_of(i) for i in range(4)] == [4, None, None, None]
    # checkpoints saved before norm_position said prenorm
    from configurator import upgrade_args
    assert upgrade_args({'prenorm': False, 'n_layer': 2, 'gelu': 'erf'}) == \
        {'norm_position': 'post', 'n_layer': 2, 'gelu': 'erf'}
    assert upgrade_args({'prenorm': True, 'norm_position': 'sandwich'})['norm_position'] == 'sandwich'
    # and before the gelu field, when a GELU MLP computed the tanh form: they give the logits they gave
    assert upgrade_args({'n_layer': 2})['gelu'] == upgrade_args({'mlp': 'gelu'})['gelu'] == 'tanh'
    assert 'gelu' not in upgrade_args({'mlp': 'swiglu'})  # the field changes nothing there: its default


def test_every_field_is_checked_by_a_table():
    """GPTConfig's checks are tables: each field has its type and range (the FIELD_TYPES of the lesson's config or of
    its chapter's) or names a kind of part (a registry's key); layers, a string of LAYER_KINDS' letters, has its rule
    in CHECKS."""
    from dataclasses import fields
    tables = [vars(cls).get('FIELD_TYPES', {}) for cls in GPTConfig.__mro__]
    typed = [name for table in tables for name in table]
    assert len(typed) == len(set(typed))  # each field in one table
    checked = set(typed) | set(M._registries()) | {'layers'}
    assert {f.name for f in fields(GPTConfig)} == checked
    assert not set(typed) & set(M._registries())


def test_valid_edge_configs():
    assert tiny_config(n_kv_head=N_HEAD).kv_heads == N_HEAD
    assert tiny_config(n_kv_head=None).kv_heads == N_HEAD
    assert tiny_config(dropout=0.0).dropout == 0.0
    assert tiny_config(n_embd=12, pos='learned').head_size == 3  # odd head size is fine without rope


# ----------------------------------------------------------------------------- 12: Hugging Face interop

def perturb_1d_params(hf_model, seed):
    """Norm gains away from 1 and biases away from 0, so a wrong mapping of either shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if p.dim() == 1:
                noise = torch.randn(p.shape, generator=g)
                if name.endswith('bias'):
                    p.copy_(0.1 * noise)
                else:
                    p.copy_(1.0 + 0.3 * noise)


@pytest.fixture(scope='module')
def hf_gpt2_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(25)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=32, vocab_size=100,
                                    bos_token_id=0, eos_token_id=0))
    perturb_1d_params(hf, 26)
    hf.eval()
    path = tmp_path_factory.mktemp('hf_gpt2')
    hf.save_pretrained(path)
    return path, hf


def test_from_pretrained_gpt2_parity(hf_gpt2_dir):
    path, hf = hf_gpt2_dir
    ours = GPT.from_pretrained(str(path))
    ours.eval()
    cfg = ours.config
    assert (cfg.norm, cfg.mlp, cfg.pos, cfg.n_kv_head, cfg.norm_position) == ('layernorm', 'gelu', 'learned', None, 'pre')
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size) == (2, 4, 32, 32, 100)
    assert cfg.bias and cfg.tie_embeddings
    assert ours.lm_head.weight is ours.transformer.wte.weight
    torch.manual_seed(27)
    idx = torch.randint(0, 100, (2, 20))
    with torch.no_grad():
        expected = hf(idx).logits
        got, _ = ours(idx)
    assert_close(got, expected, atol=1e-4)


def test_from_pretrained_override_args(hf_gpt2_dir):
    path, _ = hf_gpt2_dir
    model = GPT.from_pretrained(str(path), override_args={'dropout': 0.1})
    assert model.config.dropout == 0.1
    assert model.transformer.drop.p == 0.1
    assert model.transformer.h[0].attn.dropout == 0.1
    with pytest.raises(ValueError, match='override_args'):
        GPT.from_pretrained(str(path), override_args={'n_layer': 3})
    with pytest.raises(ValueError, match='override_args'):
        GPT.from_pretrained(str(path), override_args={'dropout': 0.1, 'bias': False})


@pytest.mark.parametrize('tie,bias', [(False, False), (True, False), (False, True)],
                         ids=['untied', 'tied', 'untied-bias'])
def test_from_pretrained_llama_parity(tie, bias, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    hf_cfg = LlamaConfig(hidden_size=32, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=100, max_position_embeddings=64, rms_norm_eps=1e-6,
                         rope_parameters={'rope_type': 'default', 'rope_theta': 500000.0},
                         tie_word_embeddings=tie, attention_bias=bias, mlp_bias=bias,
                         bos_token_id=0, eos_token_id=0, pad_token_id=None)
    torch.manual_seed(28)
    hf = LlamaForCausalLM(hf_cfg)
    perturb_1d_params(hf, 29)
    hf.eval()
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path))
    ours.eval()
    cfg = ours.config
    assert (cfg.norm, cfg.mlp, cfg.pos, cfg.n_kv_head, cfg.ffn_hidden) == ('rms', 'swiglu', 'rope', 2, 80)
    assert cfg.norm_eps == 1e-6 and cfg.rope_theta == 500000.0
    assert cfg.tie_embeddings is tie and cfg.bias is bias
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size) == (2, 4, 32, 64, 100)
    assert (ours.lm_head.weight is ours.transformer.wte.weight) == tie
    assert torch.equal(ours.transformer.h[1].ln_2.weight, hf.model.layers[1].post_attention_layernorm.weight)
    torch.manual_seed(30)
    idx = torch.randint(0, 100, (2, 20))
    with torch.no_grad():
        expected = hf(idx).logits
        got, _ = ours(idx)
    assert_close(got, expected, atol=1e-4)


def test_rope_tables_stay_fp32_when_the_model_is_cast():
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=4, n_embd=32, pos='rope'))
    model = model.to(torch.bfloat16)
    cos, sin = rope_tables(model.transformer.wpe, 0, 40)  # grows past block_size after the cast
    fresh_cos, fresh_sin = rope_tables(make_rotary(8, 10000.0, 80), 0, 40)
    assert cos.dtype == torch.float32 and sin.dtype == torch.float32
    torch.testing.assert_close(cos, fresh_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, fresh_sin, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- the lesson alone

LESSON_ALONE = '''
import torch
from model import GPT, GPTConfig, SWAPS, swap_flags
for modern in (False, True):
    flags = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64)
    config = GPTConfig(**flags, **swap_flags('modern', flags, modern=modern))
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        _, loss = model(data[:, :-1], data[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(config.norm, config.mlp, config.kv_heads, config.pos, losses[0] > losses[-1], model(data[:, :-1])[0].shape[-1])
    torch.manual_seed(0)
    model = GPT(config).eval()  # untrained, so the test's own process can build the same weights
    print(model.generate(data[:2, :5], 20, temperature=0.0).tolist())  # past block_size: the window slides
    print(model.generate(data[:2, :5], 4, temperature=0.8, top_k=5).shape)
'''


def test_model_py_runs_alone_in_an_empty_folder(tmp_path):
    """model.py copied by itself into an empty folder: the vanilla and the modern block build and train there (AdamW
    steps lower the loss) and sample, with the plain loop (no generate.py on the path): its greedy tokens are the
    engine's, here, on the same weights."""
    import shutil
    import subprocess
    import sys
    shutil.copy(os.path.join(os.path.dirname(__file__), '..', 'model.py'), tmp_path)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    result = subprocess.run([sys.executable, '-c', LESSON_ALONE], cwd=tmp_path, capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split('\n')
    assert lines[0::3][:2] == ['layernorm gelu 4 learned True 64', 'rms swiglu 2 rope True 64']
    assert lines[2::3][:2] == ['torch.Size([2, 9])'] * 2
    data = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(1))
    for modern, alone in zip((False, True), lines[1::3]):
        flags = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64)
        torch.manual_seed(0)
        model = M.GPT(M.GPTConfig(**flags, **M.swap_flags('modern', flags, modern=modern))).eval()
        engine = model.generate(data[:2, :5], 20, temperature=0.0, use_cache=False)
        plain = torch.tensor(ast.literal_eval(alone))
        # the engine drops the oldest half of an overflowing window, nanoGPT's loop the oldest token: alike
        # until the context first passes block_size (16 tokens: 11 new ones after the prompt of 5)
        assert torch.equal(plain[:, :17], engine[:, :17]), (modern, plain, engine)


# ----------------------------------------------------------------------------- an MLP reading the tokens

class TokenBiasMLP(M.GatedMLP):
    """A test MLP that reads the token ids beside x (inputs='tokens'): SwiGLU plus a row of a table per token."""
    inputs = 'tokens'

    def __init__(self, config, hidden=None):
        super().__init__(config, hidden)
        self.rows = nn.Embedding(config.vocab_size, config.n_embd)

    def forward(self, x, tokens):
        return super().forward(x) + self.rows(tokens)


@torch.no_grad()
def test_an_mlp_reads_the_tokens_it_declares_in_training_prefill_and_decoding(monkeypatch):
    """An MLP declaring inputs='tokens' gets the ids of the tokens it sees (GPT.embed's tables['tokens']): its rows
    move the logits, and decoding through the cache, a step at a time, computes what full forwards do."""
    monkeypatch.setitem(M.MLPS, 'token_bias', TokenBiasMLP)
    model = build(mlp='token_bias', pos='rope', norm='rms')
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(71))
    before = model(idx)[0]
    for block in model.transformer.h:
        block.mlp.rows.weight.normal_(generator=torch.Generator().manual_seed(72))
    assert (model(idx)[0] - before).abs().max() > 1e-2
    check_cache_logits(model)
    prompt = idx[:, :4]
    assert torch.equal(model.generate(prompt, 2 * BLOCK, temperature=0), reference_greedy(model, prompt, 2 * BLOCK))
