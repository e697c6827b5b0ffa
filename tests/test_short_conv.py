"""Tests for chapters/short_conv.py, the gated short convolution ('V': LFM2)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from chapters import short_conv
from tiny_models import (BLOCK, N_EMBD, VOCAB, assert_close, build, check_cache_logits, check_causal,
                         generate_recording_logits, reference_greedy, tiny_config, train_steps)

pytestmark = pytest.mark.usefixtures('single_thread')


@torch.no_grad()
def test_short_conv_is_lfm2s_formula_written_out():
    """One 'V' mixer against the formula with torch's own convolution: B, C, x = in_proj(h);
    y = c_proj(C * conv(B * x)), conv causal and depthwise (zeros before the first token), bias included."""
    mixer = short_conv.ShortConv(tiny_config(layers='V', short_conv_kernel=4)).eval()
    for p in (mixer.conv1d.bias, mixer.in_proj.bias):
        p.normal_()  # away from zero, so a bias left out shows
    h = torch.randn(2, 9, N_EMBD, generator=torch.Generator().manual_seed(70))
    b, c, x = mixer.in_proj(h).chunk(3, dim=-1)
    conv = F.conv1d((b * x).transpose(1, 2), mixer.conv1d.weight, mixer.conv1d.bias, padding=3, groups=N_EMBD)
    expected = mixer.c_proj(c * conv[:, :, :9].transpose(1, 2))
    assert_close(mixer(h), expected, atol=1e-6)


def test_the_shifted_products_are_torchs_depthwise_convolution_and_its_gradients():
    """shifted_products (the convolution of 'V', 'S', 'D' and 'K' layers) against F.conv1d in fp64: the outputs
    and both gradients (its backward is written out), kernels 1 to 4, dilations 1 and 2 (Engram's), a sequence
    shorter than the kernel included."""
    gen = torch.Generator().manual_seed(72)
    for kernel, T, dilation in ((1, 5, 1), (2, 7, 1), (3, 2, 1), (4, 9, 1), (3, 5, 2), (4, 2, 2)):
        x = torch.randn(2, 6, T + (kernel - 1) * dilation, dtype=torch.float64, generator=gen, requires_grad=True)
        w = torch.randn(6, 1, kernel, dtype=torch.float64, generator=gen, requires_grad=True)
        grad = torch.randn(2, 6, T, dtype=torch.float64, generator=gen)
        ours = short_conv.shifted_products(x.transpose(1, 2), w, dilation).transpose(1, 2)  # it takes (B, T, channels)
        theirs = F.conv1d(x, w, groups=6, dilation=dilation)
        assert ours.shape == theirs.shape == (2, 6, T)
        assert_close(ours, theirs, atol=1e-12)
        for a, b in zip(torch.autograd.grad(ours, (x, w), grad), torch.autograd.grad(theirs, (x, w), grad)):
            assert_close(a, b, atol=1e-12)


@torch.no_grad()
def test_a_short_conv_layer_sees_its_kernel_and_no_further():
    """One 'V' layer (the MLP works per token): the logits at t move with tokens t-k+1..t, not with t-k."""
    k, T = 3, 10
    model = build(n_layer=1, layers='V', short_conv_kernel=k)
    idx = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(71))
    base = model(idx)[0][0, -1]
    for back, seen in ((0, True), (k - 1, True), (k, False), (k + 2, False)):
        changed = idx.clone()
        changed[0, T - 1 - back] = (changed[0, T - 1 - back] + 1) % VOCAB
        assert ((model(changed)[0][0, -1] - base).abs().max() > 1e-6) == seen, back


def test_short_conv_layers_train_decode_through_the_cache_and_count():
    """LFM2's pattern ('VVG' with the modern block): the loss falls in a few steps, the model is causal, a
    cache's logits (prefill, a chunk, single tokens) are a full forward's, greedy decoding past block_size
    (context shifts restart the cache) equals full forwards; the cache keeps the last k-1 gated inputs per 'V'
    layer and the FLOPs count the convolution's weights as a Linear's."""
    flags = dict(n_layer=3, layers='VVG', pos='rope', norm='rms', mlp='swiglu', n_kv_head=2, bias=False)
    model = build(**flags)
    losses = train_steps(model, seed=72)
    assert losses[-1] < losses[0] - 0.5
    assert model.transformer.h[0].attn.conv1d.weight.grad.abs().sum() > 0
    model.eval()
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(73))
    with torch.no_grad():
        cached, cached_logits = generate_recording_logits(model, prompt, 3 * BLOCK, use_cache=True)
        plain, plain_logits = generate_recording_logits(model, prompt, 3 * BLOCK, use_cache=False)
    assert torch.equal(cached, plain) and torch.equal(cached, reference_greedy(model, prompt, 3 * BLOCK))
    assert_close(cached_logits, plain_logits, atol=1e-5)

    attention_only = build(**{**flags, 'layers': 'GGG'})
    conv_inputs = 2 * (3 - 1) * N_EMBD * 4  # two sequences, kernel 3, fp32
    for seq_len in (3, BLOCK):
        assert model.kv_cache_bytes(2, seq_len) == attention_only.kv_cache_bytes(2, seq_len) // 3 + 2 * conv_inputs
    linears = sum(6 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert model.flops_per_token() == linears + model.transformer.h[2].attn.token_flops(BLOCK) + 2 * 6 * N_EMBD * 3


@pytest.mark.parametrize('overrides, message', [
    (dict(layers='VG', short_conv_kernel=0), 'short_conv_kernel must be an int >= 1, got 0'),
    (dict(layers='VG', short_conv_kernel=2.5), 'short_conv_kernel must be an int >= 1'),
    (dict(short_conv_kernel=4), "short_conv_kernel=4 applies to gated short convolution ('V') layers"),
    (dict(layers='VX'), 'gated short convolution'),  # the letters allowed, each in words
])
def test_bad_short_conv_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)
