"""Tests for chapters/deltanet.py, linear attention: Gated DeltaNet ('D') and Kimi Delta Attention ('K'), their
chunked and recurrent forms, OLMo hybrid's variant, the fla kernels' adapters (checked on a CPU against references
of fla's contract), and a Kimi Linear run through train.py resuming exactly."""
from functools import partial

import pytest
import torch

import generate as G
from chapters import deltanet, mamba2
from common.checkpoints import load_checkpoint
from test_train import iter_losses, run, workdir  # noqa: F401 (fixtures)
from tiny_models import (BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, build, check_backward, check_cache_logits,
                         check_causal, config_id, counted_training_flops, generate_recording_logits, reference_greedy,
                         tiny_config)

pytestmark = pytest.mark.usefixtures('single_thread')


# ----------------------------------------------------------------------------- Gated DeltaNet ('D')

@pytest.mark.parametrize('B, H, T, dk, dv, chunk', [(2, 3, 13, 8, 6, 4), (1, 2, 7, 4, 5, 64), (2, 2, 16, 6, 8, 8),
                                                      (1, 1, 1, 4, 4, 3)])
def test_gated_delta_chunked_equals_recurrent(B, H, T, dk, dv, chunk):
    """The chunked form (training, prefill) and the token-by-token one (decoding) compute the same outputs and
    final state, from zeros or from a carried state, whether or not the length is a multiple of the chunk."""
    gen = torch.Generator().manual_seed(B * 100 + T)
    q = deltanet.l2_normalize(torch.randn(B, H, T, dk, generator=gen)) * dk ** -0.5
    k = deltanet.l2_normalize(torch.randn(B, H, T, dk, generator=gen))
    v = torch.randn(B, H, T, dv, generator=gen)
    g = -2 * torch.rand(B, H, T, generator=gen)
    beta = torch.rand(B, H, T, generator=gen)
    for state in (None, torch.randn(B, H, dk, dv, generator=gen)):
        chunked, chunked_state = deltanet.gated_delta_chunked(q, k, v, g, beta, chunk, state, final=True)
        recurrent, recurrent_state = deltanet.gated_delta_recurrent(q, k, v, g, beta, state)
        assert_close(chunked, recurrent, atol=1e-5)
        assert_close(chunked_state, recurrent_state, atol=1e-5)


def test_gated_delta_matches_the_rule_written_out():
    """One head, two tokens, by hand: S1 = k1 (b1 v1)^T; S2 = e^g2 S1 + k2 (b2 (v2 - (e^g2 S1)^T k2))^T; o = S^T q."""
    gen = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, 1, 2, 3, generator=gen), deltanet.l2_normalize(torch.randn(1, 1, 2, 3, generator=gen))
    v, g, beta = torch.randn(1, 1, 2, 2, generator=gen), -torch.rand(1, 1, 2, generator=gen), torch.rand(1, 1, 2, generator=gen)
    S1 = torch.outer(k[0, 0, 0], beta[0, 0, 0] * v[0, 0, 0]) * 1.0  # from zeros, e^g1 decays nothing
    decayed = g[0, 0, 1].exp() * S1
    S2 = decayed + torch.outer(k[0, 0, 1], beta[0, 0, 1] * (v[0, 0, 1] - decayed.T @ k[0, 0, 1]))
    expected = torch.stack((S1.T @ q[0, 0, 0], S2.T @ q[0, 0, 1]))
    for out, state in (deltanet.gated_delta_chunked(q, k, v, g, beta, 2, final=True), deltanet.gated_delta_recurrent(q, k, v, g, beta)):
        assert_close(out[0, 0], expected, atol=1e-6)
        assert_close(state[0, 0], S2, atol=1e-6)


@torch.no_grad()
def test_deltanet_decoding_past_block_size_matches_the_reference():
    """All 'D' layers: greedy decoding with the cache, through several context shifts (the state is rebuilt
    from the kept half, not carried over), equals full forwards over the same windows, logits included."""
    model = build(pos='rope', layers='D', linear_n_value_head=8, linear_chunk_size=3)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(8))
    cached, cached_logits = generate_recording_logits(model, prompt, 40, use_cache=True)
    plain, plain_logits = generate_recording_logits(model, prompt, 40, use_cache=False)
    assert torch.equal(cached, reference_greedy(model, prompt, 40)) and torch.equal(cached, plain)
    assert_close(cached_logits, plain_logits, atol=1e-5)


@pytest.mark.parametrize('overrides,field', [
    (dict(layers='DG', linear_n_value_head=6), 'linear_n_value_head'),  # 6 value heads over 4 key heads (n_head)
    (dict(layers='DG', linear_n_key_head=2, linear_n_value_head=3), 'linear_n_value_head'),
    (dict(layers='DG', linear_conv_kernel=0), 'linear_conv_kernel'),
    (dict(layers='DG', linear_chunk_size=0), 'linear_chunk_size'),
    (dict(layers='DG', linear_key_dim=0), 'linear_key_dim'),
    (dict(linear_chunk_size=8), 'linear_chunk_size'),  # no 'D' layer
], ids=config_id)
def test_invalid_configs_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


# ----------------------------------------------------------------------------- Kimi Delta Attention ('K')

def kda_inputs(B, H, T, dk, dv, seed):
    """q, k, v, a decay per key channel and beta, as a 'K' layer makes them."""
    gen = torch.Generator().manual_seed(seed)
    q = deltanet.l2_normalize(torch.randn(B, H, T, dk, generator=gen)) * dk ** -0.5
    k = deltanet.l2_normalize(torch.randn(B, H, T, dk, generator=gen))
    v = torch.randn(B, H, T, dv, generator=gen)
    g = -3 * torch.rand(B, H, T, dk, generator=gen)  # some channels keep almost all, others forget fast
    beta = torch.rand(B, H, T, generator=gen)
    return q, k, v, g, beta, torch.randn(B, H, dk, dv, generator=gen)


@pytest.mark.parametrize('B, H, T, dk, dv, chunk', [(2, 3, 13, 8, 6, 4), (1, 2, 7, 4, 5, 64), (2, 2, 17, 6, 8, 8),
                                                      (1, 1, 1, 4, 4, 3), (1, 2, 75, 4, 6, 32), (1, 1, 40, 4, 4, 48),
                                                      (2, 1, 31, 4, 4, 64)])
def test_kimi_delta_chunked_equals_recurrent_with_a_decay_per_channel(B, H, T, dk, dv, chunk):
    """A decay per key channel: the chunked form and the recurrent one agree on outputs and final state, from
    zeros or a carried state, at odd lengths and chunks that do not divide them, chunks of one sub-chunk or of
    several (32, 48: sub-chunks of 8, a key factored through its query's sub-chunk start, decays summed to -70),
    and sequences shorter than the chunk padded up to whole sub-chunks (7 and 31 tokens in chunks of 64)."""
    q, k, v, g, beta, carried = kda_inputs(B, H, T, dk, dv, B * 100 + T)
    for state in (None, carried):
        chunked, chunked_state = deltanet.gated_delta_chunked(q, k, v, g, beta, chunk, state, final=True)
        recurrent, recurrent_state = deltanet.gated_delta_recurrent(q, k, v, g, beta, state)
        assert_close(chunked, recurrent, atol=1e-5)
        assert_close(chunked_state, recurrent_state, atol=1e-5)


@pytest.mark.parametrize('per_channel, T, chunk', [(False, 13, 4), (False, 16, 8), (True, 17, 8), (True, 40, 16),
                                                   (True, 40, 32)])
def test_chunked_gradients_are_the_recurrent_forms(per_channel, T, chunk):
    """The chunked form's gradients (parts of its backward written out: DecayedDots, ChannelDecayedDots) equal
    autograd's through the recurrent form, for q, k, v, the decays, beta and a carried state, in fp64: a decay per
    head and per channel, a chunk of one sub-chunk, of two and of four."""
    q, k, v, g, beta, state = (t.double() for t in kda_inputs(2, 2, T, 8, 6, T))
    g = g if per_channel else g[..., 0]
    inputs = [t.requires_grad_() for t in (q, k, v, g, beta, state)]
    weights = torch.randn(2, 2, T, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    grads = []
    for form in (partial(deltanet.gated_delta_chunked, chunk=chunk, final=True), deltanet.gated_delta_recurrent):
        out, final = form(*inputs[:5], state=inputs[5])
        grads.append(torch.autograd.grad((out * weights).sum() + final.square().sum(), inputs))
    for chunked, recurrent in zip(*grads):
        assert_close(chunked, recurrent, atol=1e-9)


def test_l2_normalize_has_autograds_gradient():
    """L2Normalize's backward written out, against torch's numerical gradient in fp64, with and without a scale."""
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(7), requires_grad=True)
    for scale in (1.0, 0.3):
        assert torch.autograd.gradcheck(lambda t: deltanet.l2_normalize(t, 1e-3, scale), (x,))
    y = deltanet.l2_normalize(x.detach(), 1e-6, 0.3)
    assert_close(y.norm(dim=-1), torch.full(y.shape[:-1], 0.3, dtype=torch.float64), atol=1e-6)


def test_checkpoints_holding_the_old_chunk_default_take_todays():
    """Every checkpoint held linear_chunk_size=64 before its default became 32 (models without 'D' or 'K' layers
    too, which refuse a changed value): a saved 64 reads as today's default, any other value as saved."""
    from configurator import upgrade_args
    assert 'linear_chunk_size' not in upgrade_args({'n_layer': 2, 'linear_chunk_size': 64})
    assert upgrade_args({'layers': 'DG', 'linear_chunk_size': 16})['linear_chunk_size'] == 16
    assert tiny_config(**upgrade_args({'linear_chunk_size': 64})).linear_chunk_size == 32


def test_kimi_delta_decays_each_channel_of_the_state_at_its_own_rate():
    """One head, two tokens, by hand: row c of the state decays by e^g_c before the second write; and a decay
    equal over the channels is the per-head rule."""
    q, k, v, g, beta, _ = kda_inputs(1, 1, 2, 3, 2, 9)
    S1 = torch.outer(k[0, 0, 0], beta[0, 0, 0] * v[0, 0, 0])
    decayed = g[0, 0, 1].exp()[:, None] * S1
    S2 = decayed + torch.outer(k[0, 0, 1], beta[0, 0, 1] * (v[0, 0, 1] - decayed.T @ k[0, 0, 1]))
    expected = torch.stack((S1.T @ q[0, 0, 0], S2.T @ q[0, 0, 1]))
    for out, state in (deltanet.gated_delta_chunked(q, k, v, g, beta, 2, final=True), deltanet.gated_delta_recurrent(q, k, v, g, beta)):
        assert_close(out[0, 0], expected, atol=1e-6)
        assert_close(state[0, 0], S2, atol=1e-6)
    per_head = g[..., 0]
    assert_close(deltanet.gated_delta_chunked(q, k, v, per_head[..., None].expand_as(g), beta, 2)[0],
                 deltanet.gated_delta_chunked(q, k, v, per_head, beta, 2)[0], atol=1e-6)


KDA = dict(layers='KG', pos='none', attn='mla', norm='rms', mlp='swiglu', linear_chunk_size=5)  # Kimi Linear's shape


def test_a_kda_model_trains_and_every_part_gets_a_gradient():
    model = build(**KDA)
    attn = model.transformer.h[0].attn
    assert type(attn) is deltanet.KimiDeltaAttention and not hasattr(attn, 'in_proj_z') and not hasattr(attn, 'in_proj_a')
    assert attn.dt_bias.shape == (N_HEAD * (N_EMBD // N_HEAD),) and attn.A_log.shape == (N_HEAD,)
    check_backward(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, VOCAB, (4, BLOCK + 1), generator=torch.Generator().manual_seed(3))
    losses = []
    for _ in range(8):
        _, loss = model(data[:, :-1], data[:, 1:])
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < losses[0] - 0.5


@torch.no_grad()
def test_kda_decoding_matches_full_forwards_past_block_size():
    """'K' layers under MLA without positions: each cached step's logits are a full forward's (prefill, a chunk,
    single tokens), and greedy decoding through context shifts equals decoding without the cache."""
    model = build(**KDA, kda_rank=4, linear_n_key_head=2, linear_n_value_head=4, linear_key_dim=6)
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(8))
    cached, cached_logits = generate_recording_logits(model, prompt, 40, use_cache=True)
    plain, plain_logits = generate_recording_logits(model, prompt, 40, use_cache=False)
    assert torch.equal(cached, reference_greedy(model, prompt, 40)) and torch.equal(cached, plain)
    assert_close(cached_logits, plain_logits, atol=1e-5)


@pytest.mark.parametrize('chunk, T', [(5, 12), (32, 40), (64, 13)])  # one sub-chunk per chunk; four of 8 and
def test_kda_flops_per_token_equals_the_counted_flops(chunk, T, monkeypatch):  # a padded chunk; 13 padded to 16
    """The per-channel scores' matmuls (across sub-chunks; inside one the products are elementwise) at the chunk
    length the chunked form runs: what torch counts."""
    model = build(**{**KDA, 'linear_chunk_size': chunk}, block_size=T)
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(40))
    assert model.flops_per_token(seq_len=T) * 2 * T == counted_training_flops(model, idx, monkeypatch)


def test_kda_cache_is_the_deltanets_whatever_the_length():
    """A 'K' layer keeps what a 'D' layer of the same widths keeps: conv inputs and the state, at any length."""
    kimi, delta = build(**KDA), build(**{**KDA, 'layers': 'DG'})
    for seq_len in (3, 9, BLOCK):
        assert kimi.kv_cache_bytes(2, seq_len) == delta.kv_cache_bytes(2, seq_len)
        cache = G.KVCache(kimi, 2, seq_len, torch.float32, torch.device('cpu'))
        assert sum(t.numel() * t.element_size() for layer in cache.layers for t in layer.stores.values()) \
            == kimi.kv_cache_bytes(2, seq_len)
    only_kda = build(**{**KDA, 'layers': 'K'})
    assert only_kda.kv_cache_bytes(2, 3) == only_kda.kv_cache_bytes(2, BLOCK) > 0  # the MLA layer's grows


@pytest.mark.parametrize('overrides, field', [
    (dict(kda_rank=4), 'kda_rank'),  # no 'K' layer
    (dict(layers='DG', kda_rank=4), 'kda_rank'),
    (dict(layers='KG', kda_rank=-1), 'kda_rank'),
    (dict(layers='KG', linear_n_key_head=2, linear_n_value_head=3), 'linear_n_value_head'),
    (dict(layers='KG', pos='bogus'), 'pos'),
])
def test_bad_kda_settings_are_one_line_naming_the_field(overrides, field):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert field in str(e.value) and '\n' not in str(e.value)
    tiny_config(layers='KG', linear_chunk_size=8, kda_rank=4)  # linear_* settings apply to 'K' layers too



@torch.no_grad()
def test_the_safe_gate_bounds_each_decay_and_is_its_formula():
    """kda_lower_bound=L (BailingHybrid, GLM-5.3-Flash): g = L sigmoid(A (f(x) + dt_bias)) per key channel, so no
    step forgets more than e^L, however large f; the model still decodes through the cache as without it."""
    model = build(layers='KG', pos='none', norm='rms', mlp='swiglu', kda_lower_bound=-5.0, linear_chunk_size=8)
    layer = model.transformer.h[0].attn
    with torch.no_grad():
        layer.decay_b.weight.mul_(400.0)  # f far from zero both ways: the bound must hold
    x = torch.randn(2, 9, N_EMBD, generator=torch.Generator().manual_seed(31))
    f = (layer.decay_b(layer.decay_a(x)) + layer.dt_bias).view(2, 9, layer.v_heads, layer.k_dim)
    expected = -5.0 * torch.sigmoid(layer.A_log.exp()[:, None] * f)
    assert_close(layer.decay(x), expected.transpose(1, 2), atol=1e-6)
    assert layer.decay(x).min() >= -5.0 and layer.decay(x).min() < -4.0 and layer.decay(x).max() <= 0
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(32))
    assert torch.equal(model.generate(prompt, 2 * BLOCK, temperature=0), reference_greedy(model, prompt, 2 * BLOCK))
    with pytest.raises(ValueError, match="kda_lower_bound=-5.0 is the safe gate"):
        tiny_config(layers='DG', kda_lower_bound=-5.0)
    with pytest.raises(ValueError, match='kda_lower_bound must be None or a negative number'):
        tiny_config(layers='KG', pos='none', kda_lower_bound=2.0)

@torch.no_grad()
def test_kda_rank_zero_projects_decay_and_gate_at_full_rank():
    """kda_rank=0 (BailingHybrid): no bottleneck, decay_b and gate_b read the token itself (n_embd -> heads * key
    dim), with the safe gate or without; it decodes through the cache as full forwards do."""
    for bound in (None, -5.0):
        model = build(**KDA, kda_rank=0, kda_lower_bound=bound)
        layer = model.transformer.h[0].attn
        assert layer.decay_a is None and layer.gate_a is None
        assert layer.decay_b.weight.shape == (layer.v_heads * layer.k_dim, N_EMBD) == layer.gate_b.weight.shape
        x = torch.randn(2, 6, N_EMBD, generator=torch.Generator().manual_seed(33))
        f = (layer.decay_b(x) + layer.dt_bias).view(2, 6, layer.v_heads, layer.k_dim)
        rate = layer.A_log.exp()[:, None]
        expected = -rate * torch.nn.functional.softplus(f) if bound is None else bound * torch.sigmoid(rate * f)
        assert_close(layer.decay(x), expected.transpose(1, 2), atol=1e-6)
        assert_close(layer.output_gate(x), torch.sigmoid(layer.gate_b(x)), atol=1e-6)
        check_cache_logits(model)


def test_kimi_delta_chunked_stays_finite_where_decays_are_strong():
    """Decays summing to -1000 inside a chunk: no factor e^-G overflows (NaN), and the forms still agree."""
    q, k, v, g, beta, state = kda_inputs(1, 2, 40, 4, 4, 11)
    g = g * 10  # -30 per token at most: e^-G over a chunk of 32 would be e^960
    chunked, chunked_state = deltanet.gated_delta_chunked(q, k, v, g, beta, 32, state, final=True)
    recurrent, recurrent_state = deltanet.gated_delta_recurrent(q, k, v, g, beta, state)
    assert torch.isfinite(chunked).all()
    assert_close(chunked, recurrent, atol=1e-5)
    assert_close(chunked_state, recurrent_state, atol=1e-5)


# ----------------------------------------------------------------------------- Kimi Linear through train.py

# Kimi Linear's shape through train.py (Kimi Delta Attention 'K' layers and MLA without positions): it trains,
# and a resumed run continues exactly as one that never stopped, under Muon (the matrices, the low-rank gate
# projections among them) and AdamW (the rest: A_log, dt_bias, the convolution, the norms).
KIMI = ['--layers=KG', '--pos=none', '--attn=mla', '--norm=rms', '--mlp=swiglu', '--bias=False',
        '--linear_chunk_size=5']


def test_a_kda_run_resumes_exactly(workdir, run):  # noqa: F811
    args = [*KIMI, '--optimizer=muon', '--eval_interval=4']
    straight = run(workdir, *args, '--max_iters=8', '--out_dir=a')
    run(workdir, *args, '--max_iters=4', '--out_dir=b')
    resumed = run(workdir, *args, '--max_iters=8', '--out_dir=b', '--init_from=resume')
    a, b = iter_losses(straight.stdout), iter_losses(resumed.stdout)
    assert sorted(b) == list(range(5, 9)) and {k: a[k] for k in b} == b
    assert float(a[8]) < float(a[1])
    final_a = load_checkpoint(str(workdir / 'a' / 'ckpt.pt'))
    final_b = load_checkpoint(str(workdir / 'b' / 'ckpt.pt'))
    assert final_a['model_args']['pos'] == 'none' and final_a['model_args']['layers'] == 'KG'
    for k in final_a['model']:
        assert torch.equal(final_a['model'][k], final_b['model'][k]), k


# ----------------------------------------------------------------------------- OLMo hybrid's Gated DeltaNet

@pytest.mark.parametrize('per_channel', [False, True])
def test_delta_rule_forms_agree_with_negative_eigenvalues(per_channel):
    """beta in [0, 2] (linear_neg_eigval): I - beta k k^T may flip a direction; the chunked and recurrent forms
    still agree (chunks of 4 over 13 tokens, a carried state)."""
    q, k, v, g, beta, state = kda_inputs(2, 2, 13, 6, 5, 12)
    g = g if per_channel else g[..., 0]
    beta = 2 * beta
    chunked, chunked_state = deltanet.gated_delta_chunked(q, k, v, g, beta, 4, state, final=True)
    recurrent, recurrent_state = deltanet.gated_delta_recurrent(q, k, v, g, beta, state)
    assert_close(chunked, recurrent, atol=1e-5)
    assert_close(chunked_state, recurrent_state, atol=1e-5)


OLMO_HYBRID = dict(layers='DG', pos='rope', norm='rms', mlp='swiglu', bias=False, norm_position='after', qk_norm=True,
                   qk_norm_all_heads=True, linear_neg_eigval=True, linear_norm_eps=1e-5, linear_norm_position='pre',
                   linear_chunk_size=5)


@torch.no_grad()
def test_olmo_hybrid_blocks_place_norms_by_kind_double_beta_and_decode_exactly(monkeypatch):
    """linear_norm_position: the 'D' block pre-norm, the attention block as norm_position says; the 'D' layer's
    output norm has its own epsilon and beta doubled (its write strengths reach past 1); cached decoding equals
    full forwards past block_size."""
    model = build(**OLMO_HYBRID)
    linear_block, attention_block = model.transformer.h
    assert linear_block.norm_position == 'pre' and attention_block.norm_position == 'after'
    assert linear_block.attn.eps == 1e-5 and linear_block.attn.beta_scale == 2.0
    betas, original = [], deltanet.gated_delta_chunked

    def recording(q, k, v, g, beta, *args, **kwargs):
        betas.append(beta)
        return original(q, k, v, g, beta, *args, **kwargs)
    monkeypatch.setattr(deltanet, 'gated_delta_chunked', recording)
    model(torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(5)))
    monkeypatch.undo()
    assert betas[0].max() > 1 and betas[0].min() >= 0
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(8))
    cached = model.generate(prompt, 2 * BLOCK, temperature=0.0)
    assert torch.equal(cached, reference_greedy(model, prompt, 2 * BLOCK))


@pytest.mark.parametrize('overrides, field', [
    (dict(linear_neg_eigval=True), 'linear_neg_eigval'),  # no 'D' or 'K' layer
    (dict(layers='DG', linear_neg_eigval=1), 'linear_neg_eigval'),
    (dict(layers='DG', linear_norm_eps=0.0), 'linear_norm_eps'),
    (dict(layers='DG', linear_norm_position='middle'), 'linear_norm_position'),
    (dict(layers='DG', linear_norm_position='post'), 'linear_norm_position'),  # only some blocks ending in a norm
    (dict(layers='DG', norm_position='post', linear_norm_position='pre'), 'linear_norm_position'),
])
def test_bad_olmo_hybrid_settings_are_one_line_naming_the_field(overrides, field):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert field in str(e.value) and '\n' not in str(e.value)


# ----------------------------------------------------------------------------- the fla kernels' adapters, on a CPU

# flash-linear-attention's contract as its docstrings state it, written out token by token in its layout
# (batch, T, heads, dim): the adapters in chapters/deltanet.py must turn our forms' tensors into it and back
def _fla_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """chunk_gated_delta_rule (g (B, T, H)) or chunk_kda (g (B, T, H, K)), state (B, H, K, V)."""
    B, T, H, K = q.shape
    S = initial_state.clone() if initial_state is not None else q.new_zeros(B, H, K, v.shape[-1])
    decay = (g if g.dim() == 4 else g[..., None].expand(B, T, H, K)).exp()
    out = []
    for t in range(T):
        S = S * decay[:, t, :, :, None]
        kt = k[:, t]
        S = S + kt[..., None] * (beta[:, t, :, None] * (v[:, t] - torch.einsum('bhk,bhkv->bhv', kt, S)))[..., None, :]
        out.append(scale * torch.einsum('bhk,bhkv->bhv', q[:, t], S))
    return torch.stack(out, dim=1), (S if output_final_state else None)


def _fla_simple_gla(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, state_v_first=False):
    """chunk_simple_gla: S = e^g_t S + k_t v_t^T, o_t = scale q_t^T S; state (B, H, V, K) when state_v_first."""
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else (
        initial_state.transpose(-1, -2) if state_v_first else initial_state).clone()
    out = []
    for t in range(T):
        S = S * g[:, t, :, None, None].exp() + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(scale * torch.einsum('bhk,bhkv->bhv', q[:, t], S))
    final = (S.transpose(-1, -2) if state_v_first else S) if output_final_state else None
    return torch.stack(out, dim=1), final


@pytest.mark.parametrize('per_channel', [False, True], ids=['gated-deltanet', 'kda'])
def test_fla_delta_adapter_keeps_the_chunked_forms_contract(per_channel):
    """Through fla's layout (a reference of its stated contract), the adapter gives gated_delta_chunked's outputs
    and final state, from zeros and from a carried state."""
    gen = torch.Generator().manual_seed(31)
    B, H, T, dk, dv = 2, 3, 11, 4, 5
    q, k = (deltanet.l2_normalize(torch.randn(B, H, T, dk, generator=gen)) for _ in range(2))
    v, beta = torch.randn(B, H, T, dv, generator=gen), torch.rand(B, H, T, generator=gen)
    g = -torch.rand(*((B, H, T, dk) if per_channel else (B, H, T)), generator=gen)
    for state in (None, torch.randn(B, H, dk, dv, generator=gen)):
        expected = deltanet.gated_delta_chunked(q, k, v, g, beta, 4, state, final=True)
        got = deltanet._fla_delta(_fla_delta_rule, q, k, v, g, beta, 4, state, final=True)
        assert_close(got[0], expected[0], atol=1e-5)
        assert_close(got[1], expected[1], atol=1e-5)


def test_fla_ssd_adapter_keeps_the_chunked_forms_contract():
    """Mamba-2's SSD as fla's simple GLA (queries C, keys B, values dt x, log-decay dt A, state (P, N)): the
    adapter gives ssd_chunked's outputs and final state, from zeros and from a carried state."""
    gen = torch.Generator().manual_seed(32)
    batch, H, T, P, N = 2, 3, 9, 4, 5
    x, dt, A = torch.randn(batch, H, T, P, generator=gen), torch.rand(batch, H, T, generator=gen), \
        -2 * torch.rand(H, generator=gen)
    Bm, C = torch.randn(batch, H, T, N, generator=gen), torch.randn(batch, H, T, N, generator=gen)
    for state in (None, torch.randn(batch, H, P, N, generator=gen)):
        expected = mamba2.ssd_chunked(x, dt, A, Bm, C, 4, state, final=True)
        got = mamba2._fla_ssd(_fla_simple_gla, x, dt, A, Bm, C, 4, state, final=True)
        assert_close(got[0], expected[0], atol=1e-5)
        assert_close(got[1], expected[1], atol=1e-5)


def test_layers_take_the_fla_kernels_where_offered_and_not_for_a_decoding_step(monkeypatch):
    """With fla offered (here the references of its contract, as on CUDA with it installed), the 'D', 'K' and 'S'
    layers run it for training and prefill, with the same logits and cached decoding as the PyTorch forms; a
    decoding step stays the recurrent form. On a CPU, or without fla, nothing is offered."""
    assert deltanet.fla_kernel('gated_delta', torch.zeros(1)) is None
    fakes = {'gated_delta': _fla_delta_rule, 'kda': _fla_delta_rule, 'ssd': _fla_simple_gla}
    calls = []

    def offered(form, x):
        calls.append((form, x.size(2)))
        return partial(deltanet.FLA_ADAPTERS[form], fakes[form])
    idx = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(3))
    for layers in ('DG', 'KG', 'SG'):
        chunk = {'ssm_chunk_size': 4} if layers == 'SG' else {'linear_chunk_size': 4}
        model = build(layers=layers, norm='rms', mlp='swiglu', pos='rope', **chunk)
        expected, _ = model(idx, targets=idx)
        monkeypatch.setattr(deltanet, 'fla_kernel', offered)
        monkeypatch.setattr(mamba2, 'fla_kernel', offered)
        calls.clear()
        got, _ = model(idx, targets=idx)
        assert_close(got, expected, atol=2e-5)
        assert [c[0] for c in calls] == (['ssd'] if layers == 'SG' else ['kda' if layers == 'KG' else 'gated_delta'])
        calls.clear()
        torch.manual_seed(0)
        fast = model.generate(idx[:, :5], 4, temperature=0)
        assert all(T > 1 for _, T in calls) and len(calls) == 1  # the prefill only
        monkeypatch.undo()
        assert torch.equal(fast, model.generate(idx[:, :5], 4, temperature=0))
