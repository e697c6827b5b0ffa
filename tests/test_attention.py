"""Tests for chapters/attention.py, attention's switches: sinks, the output gate, QK-norm over all heads and after
RoPE, partial RoPE, the value norm (the softmax scale: test_small_swaps.py's embedding-scale test)."""
import pytest
import torch

import model as M
from chapters import attention
from tiny_models import BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, build, config_id, explicit_attend, tiny_config

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('mask', [True, False, 'window', 'after a cache'])
@pytest.mark.parametrize('n_kv', [4, 2])
@pytest.mark.parametrize('scale', [0.3, None])
def test_attention_sinks_are_a_logit_column_in_each_softmax(mask, n_kv, scale):
    """attend's sinks (on a CPU the fused kernel's log-sum-exp, SinkAttention; elsewhere an extra key for SDPA,
    with_sink: both taken here) against the written-out softmax with a sink column, values and gradients; a very
    negative sink is no sink, and a large one takes weight from every key. scale None: the head width's, not the
    width of SDPA's padded queries. After a cache: 3 queries, the last 3 of 7 positions."""
    g = torch.Generator().manual_seed(41)
    T = 3 if mask == 'after a cache' else 7
    q = torch.randn(2, 4, T, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(2, n_kv, 7, 8, generator=g).requires_grad_() for _ in range(2))
    sinks = torch.randn(4, generator=g).requires_grad_()
    mask = {'window': M.causal_mask(7, 3, "cpu"), 'after a cache': True}.get(mask, mask)
    expected = explicit_attend(q, k, v, mask, scale=scale, sinks=sinks)
    wants = torch.autograd.grad(expected.square().sum(), (q, k, v, sinks))
    padded = M.attend(*attention.with_sink(q, k, v, mask, sinks, scale or 8 ** -0.5), scale=scale or 8 ** -0.5)
    for out in attention.attend_with_sinks(q, k, v, mask, scale=scale, sinks=sinks), padded:
        assert_close(out, expected, atol=1e-5)
        for got, want in zip(torch.autograd.grad(out.square().sum(), (q, k, v, sinks)), wants):
            assert_close(got, want, atol=1e-5)
    with torch.no_grad():
        assert_close(attention.attend_with_sinks(q, k, v, mask, scale=scale, sinks=torch.full((4,), -1e4)),
                     explicit_attend(q, k, v, mask, scale=scale), atol=1e-6)
        assert attention.attend_with_sinks(q, k, v, mask, scale=scale, sinks=torch.full((4,), 50.0)).abs().max() < 1e-6


@pytest.mark.parametrize('mask', [True, 'picks'])
@pytest.mark.parametrize('sinks', [False, True])
def test_values_narrower_than_the_keys_are_padded_for_the_fused_kernel(mask, sinks, monkeypatch):
    """MLA's values (narrower than its queries and keys) go to SDPA's fused CPU kernel padded with zeros, the output
    cut back: values and gradients as the written-out softmax's, with a causal mask or scattered picks, with sinks
    or not; model.attend sees values as wide as the keys."""
    g = torch.Generator().manual_seed(43)
    q, k = (torch.randn(2, 4, 7, 12, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(2, 4, 7, 8, generator=g, requires_grad=True)
    sink = torch.randn(4, generator=g).requires_grad_() if sinks else None
    if mask == 'picks':
        mask = torch.rand(2, 1, 7, 7, generator=g) < 0.5
        mask[..., 0] = True
    widths = []
    real = M.attend
    monkeypatch.setattr(M, 'attend', lambda q, k, v, *a, **kw: widths.append(v.size(-1)) or real(q, k, v, *a, **kw))
    out = attention.attend_with_sinks(q, k, v, mask, scale=0.3, sinks=sink)
    expected = explicit_attend(q, k, v, mask, scale=0.3, sinks=sink)
    assert out.shape == (2, 4, 7, 8)
    assert widths == ([] if sinks else [12])  # with sinks, SinkAttention's own call of the kernel (as wide too)
    assert_close(out, expected, atol=1e-5)
    inputs = (q, k, v) + ((sink,) if sinks else ())
    for got, want in zip(torch.autograd.grad(out.square().sum(), inputs),
                         torch.autograd.grad(expected.square().sum(), inputs)):
        assert_close(got, want, atol=1e-5)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
def test_bias_of_a_mask_is_a_masked_softmax_when_added(dtype):
    torch.manual_seed(0)
    mask = torch.rand(3, 5, 7) > 0.6
    mask[..., 0] = True  # every row reads a key
    logits = (torch.randn(3, 5, 7) * 10).to(dtype)
    bias = attention.bias_of(mask, dtype)
    assert bias.dtype == dtype and torch.isfinite(bias).all() and (bias[mask] == 0).all()
    want = logits.float().masked_fill(~mask, float('-inf')).softmax(-1)
    torch.testing.assert_close((logits + bias).float().softmax(-1), want)
    # a row reading nothing is finite (uniform), not nan
    assert torch.isfinite((logits + attention.bias_of(torch.zeros_like(mask), dtype)).float().softmax(-1)).all()


def test_partial_rope_rotates_the_first_dims_and_passes_the_rest():
    model = build(pos='rope', rope_fraction=0.5)
    hs = N_EMBD // N_HEAD
    assert model.transformer.wpe.dim == hs // 2
    cos, sin = model.transformer.wpe(torch.zeros(1, 5, N_EMBD), 0)[1]
    x = torch.randn(2, N_HEAD, 5, hs, generator=torch.Generator().manual_seed(55))
    out = M.apply_rope(x, cos, sin)
    assert torch.equal(out[..., hs // 2:], x[..., hs // 2:])
    assert_close(out[..., :hs // 2], M.apply_rope(x[..., :hs // 2].contiguous(), cos, sin), atol=0)


@torch.no_grad()
def test_qk_norm_over_all_heads_normalizes_each_tokens_whole_query():
    model = build(qk_norm=True, qk_norm_all_heads=True, n_kv_head=2)
    attn = model.transformer.h[0].attn
    assert attn.q_norm.weight.shape == (N_EMBD,) and attn.k_norm.weight.shape == (2 * N_EMBD // N_HEAD,)
    x = torch.randn(1, 3, N_EMBD, generator=torch.Generator().manual_seed(56))
    q = attn.c_attn(x)[..., :N_EMBD]
    assert_close(attn.q_norm(q), q / q.pow(2).mean(-1, keepdim=True).add(attn.q_norm.eps).sqrt() * attn.q_norm.weight,
                 atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize('rope_qk_norm', [True, False])
def test_rope_qk_norm_makes_rope_layers_blind_to_the_scale_of_q_and_k(rope_qk_norm):
    """Queries and keys scaled to unit RMS per head: scaling their projections changes nothing on RoPE layers;
    a layer without RoPE is left alone."""
    model = build(pos='rope', layers='GN', rope_qk_norm=rope_qk_norm, norm_eps=1e-10)  # eps: no say in the RMS
    assert [b.attn.rope_qk_norm for b in model.transformer.h] == [rope_qk_norm, False]
    idx = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(7))
    base = model(idx)[0]
    model.transformer.h[0].attn.c_attn.weight[:2 * N_EMBD] *= 7.0  # q and k (MHA: n_embd rows each)
    assert torch.allclose(model(idx)[0], base, atol=1e-5) == rope_qk_norm


@torch.no_grad()
def test_the_output_gate_scales_each_heads_output_by_a_sigmoid_of_the_input():
    gated, plain = build(attn_gate=True, bias=False), build(bias=False)
    gated.load_state_dict(plain.state_dict(), strict=False)  # the same weights but the gate's
    attn = gated.transformer.h[0].attn
    x = torch.randn(1, 5, N_EMBD, generator=torch.Generator().manual_seed(57))
    attn.c_gate.weight.zero_()  # sigmoid(0) = 1/2 on every dim: half of the ungated output
    assert_close(attn(x), plain.transformer.h[0].attn(x) / 2, atol=1e-6)
    attn.c_gate.weight.normal_(0, 1.0)
    assert (attn(x) - plain.transformer.h[0].attn(x) / 2).abs().max() > 1e-3


@torch.no_grad()
def test_v_norm_makes_attention_blind_to_the_scale_of_each_value_head():
    """v_norm: each value head at unit RMS, no gain (no parameter added): scaling the V projection changes
    nothing with it and changes the output without it."""
    outputs = {}
    for v_norm in (False, True):
        model = build(pos='rope', v_norm=v_norm, norm_eps=1e-12)  # eps would weigh on the small values
        idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(102))
        before = model(idx)[0]
        for block in model.transformer.h:
            block.attn.c_attn.weight[2 * N_EMBD:] *= 3.0  # the V rows
        outputs[v_norm] = (before, model(idx)[0])
    assert_close(*outputs[True], atol=1e-5)
    assert (outputs[False][0] - outputs[False][1]).abs().max() > 1e-3
    assert build(pos='rope', v_norm=True).get_num_params() == build(pos='rope').get_num_params()


@pytest.mark.parametrize('overrides,field', [
    (dict(qk_norm='yes'), 'qk_norm'),
    (dict(qkv_bias=1), 'qkv_bias'),
    (dict(pos='rope', rope_fraction=0.0), 'rope_fraction'),
    (dict(pos='rope', rope_fraction=1.5), 'rope_fraction'),
    (dict(pos='rope', rope_fraction=0.1), 'rope'),  # under two of the 8 dims rotate
    (dict(qk_norm_all_heads=True), 'qk_norm'),
    (dict(attn_scale=0.0), 'attn_scale'),
], ids=config_id)
def test_invalid_configs_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)
