"""Tests for chapters/mamba2.py, the selective state-space layer ('S': Mamba-2): the chunked SSD against the
recurrence, training, decoding and accounting."""
import pytest
import torch
import torch.nn as nn

from chapters import mamba2
from tiny_models import (BLOCK, VOCAB, assert_close, build, check_cache_logits, check_causal, generate_recording_logits,
                         reference_greedy, tiny_config, train_steps)

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('batch, H, T, P, N, chunk', [(2, 3, 13, 4, 5, 4), (1, 2, 7, 3, 6, 64), (2, 2, 16, 4, 4, 8),
                                                       (1, 1, 1, 2, 2, 3)])
def test_ssd_chunked_equals_recurrent(batch, H, T, P, N, chunk):
    """The chunked form (training, prefill) and the token-by-token one (decoding) give the same outputs and
    final state, from zeros or from a carried state, whether or not the chunk divides the length."""
    gen = torch.Generator().manual_seed(batch * 100 + T)
    x, dt, A = torch.randn(batch, H, T, P, generator=gen), torch.rand(batch, H, T, generator=gen), \
        -2 * torch.rand(H, generator=gen)
    B, C = torch.randn(batch, H, T, N, generator=gen), torch.randn(batch, H, T, N, generator=gen)
    for state in (None, torch.randn(batch, H, P, N, generator=gen)):
        chunked, chunked_state = mamba2.ssd_chunked(x, dt, A, B, C, chunk, state, final=True)
        recurrent, recurrent_state = mamba2.ssd_recurrent(x, dt, A, B, C, state)
        assert_close(chunked, recurrent, atol=1e-5)
        assert_close(chunked_state, recurrent_state, atol=1e-5)


@pytest.mark.parametrize('groups, T, chunk', [(1, 13, 4), (2, 16, 8), (4, 9, 64)])
def test_ssd_chunked_gradients_are_the_recurrent_forms(groups, T, chunk):
    """The chunked form's gradients (its decayed scores' backward written out: deltanet.DecayedDots, the scores a
    group's broadcast over its heads' decays) equal autograd's through the recurrence, in fp64, for x, dt, A, B,
    C and a carried state, with 1, 2 and 4 groups for 4 heads."""
    gen = torch.Generator().manual_seed(T)
    H, P, N = 4, 3, 5
    inputs = [torch.randn(2, H, T, P, generator=gen), torch.rand(2, H, T, generator=gen),
              -2 * torch.rand(H, generator=gen), torch.randn(2, groups, T, N, generator=gen),
              torch.randn(2, groups, T, N, generator=gen), torch.randn(2, H, P, N, generator=gen)]
    inputs = [t.double().requires_grad_() for t in inputs]
    x, dt, A, B, C, state = inputs
    weights = torch.randn(2, H, T, P, dtype=torch.float64, generator=gen)
    chunked = mamba2.ssd_chunked(x, dt, A, B, C, chunk, state, final=True)
    per_head = [t.repeat_interleave(H // groups, dim=1) for t in (B, C)]
    recurrent = mamba2.ssd_recurrent(x, dt, A, *per_head, state)
    grads = [torch.autograd.grad((out * weights).sum() + final.square().sum(), inputs)
             for out, final in (chunked, recurrent)]
    for ours, reference in zip(*grads):
        assert_close(ours, reference, atol=1e-9)


def test_ssd_keeps_fp32_precision_over_a_long_sequence():
    """4,096 tokens in 256 chunks with weak decays (log-decay summed to -2,048 by the end): the states passed from
    chunk to chunk keep fp32's precision against the recurrence in fp64 (1.2e-7 of the output's scale). Their decays
    taken as differences of running sums over the sequence read 1.2e-6: fp32 keeps few digits of -2,048."""
    gen = torch.Generator().manual_seed(0)
    T = 4096
    x, B, C = (torch.randn(1, 2, T, n, generator=gen, dtype=torch.float64) for n in (3, 4, 4))
    dt, A = torch.full((1, 2, T), 0.5, dtype=torch.float64), torch.tensor([-1.0, -0.3], dtype=torch.float64)
    reference, reference_state = mamba2.ssd_recurrent(x, dt, A, B, C)
    ours, state = mamba2.ssd_chunked(*(t.float() for t in (x, dt, A, B, C)), 16, final=True)
    assert (ours.double() - reference).abs().max() < 4e-7 * reference.abs().max()
    assert (state.double() - reference_state).abs().max() < 4e-7 * reference_state.abs().max()


def test_ssd_matches_the_recurrence_written_out():
    """One head, two tokens, by hand: S1 = dt1 x1 B1^T; S2 = e^(dt2 A) S1 + dt2 x2 B2^T; y = S C."""
    gen = torch.Generator().manual_seed(74)
    x, B, C = (torch.randn(1, 1, 2, n, generator=gen) for n in (3, 2, 2))
    dt, A = torch.rand(1, 1, 2, generator=gen), -torch.rand(1, generator=gen)
    S1 = torch.outer(dt[0, 0, 0] * x[0, 0, 0], B[0, 0, 0])
    S2 = (dt[0, 0, 1] * A).exp() * S1 + torch.outer(dt[0, 0, 1] * x[0, 0, 1], B[0, 0, 1])
    expected = torch.stack((S1 @ C[0, 0, 0], S2 @ C[0, 0, 1]))
    for out, state in (mamba2.ssd_chunked(x, dt, A, B, C, 2, final=True), mamba2.ssd_recurrent(x, dt, A, B, C)):
        assert_close(out[0, 0], expected, atol=1e-6)
        assert_close(state[0, 0], S2, atol=1e-6)


def test_mamba2_layers_train_decode_through_the_cache_and_count():
    """'SSG' with grouped B/C (2 groups of 4 heads) and chunks of 5: the loss falls, the model is causal, a
    cache's logits are a full forward's, greedy decoding past block_size equals full forwards, and the
    cache keeps the same conv inputs and fp32 states at any length."""
    flags = dict(n_layer=3, layers='SSG', pos='rope', norm='rms', mlp='swiglu', n_kv_head=2, bias=False,
                 ssm_state_dim=6, ssm_n_groups=2, ssm_chunk_size=5)
    model = build(**flags)
    attn = model.transformer.h[0].attn
    assert (attn.heads, attn.head_dim) == (8, 8)  # 2 * n_embd / the head width
    losses = train_steps(model, seed=75)
    assert losses[-1] < losses[0] - 0.5
    assert attn.A_log.grad.abs().sum() > 0 and attn.conv1d.weight.grad.abs().sum() > 0
    model.eval()
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(76))
    with torch.no_grad():
        cached, cached_logits = generate_recording_logits(model, prompt, 3 * BLOCK, use_cache=True)
        plain, plain_logits = generate_recording_logits(model, prompt, 3 * BLOCK, use_cache=False)
    assert torch.equal(cached, plain) and torch.equal(cached, reference_greedy(model, prompt, 3 * BLOCK))
    assert_close(cached_logits, plain_logits, atol=1e-5)

    attention_only = build(**{**flags, 'layers': 'GGG', 'ssm_state_dim': 64, 'ssm_n_groups': 1, 'ssm_chunk_size': 64})
    conv_inputs = (4 - 1) * (8 * 8 + 2 * 2 * 6)  # kernel 4; x (8 heads of 8), B and C (2 groups of 6)
    states = 8 * 8 * 6  # per head (head dim, state dim)
    for seq_len in (3, BLOCK):
        assert model.kv_cache_bytes(2, seq_len) == attention_only.kv_cache_bytes(2, seq_len) // 3 \
            + 2 * 2 * 4 * (conv_inputs + states)  # two layers, two sequences, fp32
    assert model.kv_cache_bytes(2, BLOCK, torch.bfloat16) == attention_only.kv_cache_bytes(2, BLOCK, torch.bfloat16) \
        // 3 + 2 * 2 * (2 * conv_inputs + 4 * states)  # the states stay fp32
    linears = sum(6 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    chunks = -(-BLOCK // 5)  # of 5 tokens, the last padded: the scores C.B per group of 6, times x per head of 8
    scores = chunks * (2 * 2 * 5 * 5 * 6 + 8 * 2 * 5 * 5 * 8)
    state_io = (chunks - 1) * 8 * 2 * 2 * 5 * 8 * 6  # each head's state read and written between chunks
    assert model.flops_per_token() == linears + model.transformer.h[2].attn.token_flops(BLOCK) \
        + 2 * (6 * attn.conv1d.weight.numel() + 3 * (scores + state_io) / BLOCK)

    pytest.importorskip('transformers')
    from export import to_hf
    with pytest.raises(ValueError) as refused:  # no family has Mamba-2 layers beside rotating attention
        to_hf(model)
    assert "layers='SSG'" in str(refused.value) and '\n' not in str(refused.value)


@pytest.mark.parametrize('overrides, message', [
    (dict(layers='SG', ssm_n_groups=3), "ssm_n_groups (3) must divide the 'S' layers' heads (8)"),
    (dict(layers='SG', ssm_state_dim=0), 'ssm_state_dim must be an int >= 1, got 0'),
    (dict(layers='SG', ssm_n_head=0), 'ssm_n_head must be None or a positive int, got 0'),
    (dict(layers='SG', ssm_chunk_size=0), 'ssm_chunk_size must be an int >= 1, got 0'),
    (dict(ssm_state_dim=16, ssm_conv_kernel=2), "ssm_state_dim, ssm_conv_kernel apply to Mamba-2 ('S') layers"),
])
def test_bad_mamba2_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)
