"""Tests for chapters/mla.py, multi-head latent attention (attn='mla'): against the attention written out, absorbed
decoding, the latent cache, MLA without positions."""
import math

import pytest
import torch

import model as M
from chapters import mla
from tiny_models import (N_EMBD, N_HEAD, VOCAB, assert_close, build, check_cache_logits, config_id,
                         generate_recording_logits, rope_tables, tiny_config)

pytestmark = pytest.mark.usefixtures('single_thread')


def mla_reference(attn, x, tables):
    """MLA written out per head in float64: queries (through the bottleneck when there is one), keys and
    values rebuilt from the normalized latent, the rotated parts, causal softmax at scale 1/sqrt(dn + dr); with
    sinks, each head's sink one more logit in its softmax (with no value); with the gate, the heads' output times
    sigmoid(c_gate(x)) before c_proj."""
    x = x.double()
    H, dn, dr, dv, r = attn.n_head, attn.nope_dim, attn.rope_dim, attn.v_dim, attn.latent_dim
    rms = lambda t, w: t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    lin = lambda t, layer: t @ layer.weight.double().T + (layer.bias.double() if layer.bias is not None else 0)
    q = lin(rms(lin(x, attn.q_a), attn.q_a_norm.weight), attn.q_b) if attn.q_proj is None else lin(x, attn.q_proj)
    kv_a = lin(x, attn.kv_a)
    latent, k_rope = rms(kv_a[..., :r], attn.kv_norm.weight), kv_a[..., r:]
    kv = lin(latent, attn.kv_b)
    B, T, _ = x.shape
    cos, sin = (t.double() for t in tables)
    rotate = lambda t: t * cos + torch.cat((-t[..., dr // 2:], t[..., :dr // 2]), -1) * sin
    heads = []
    for h in range(H):
        qh = q[..., h * (dn + dr):(h + 1) * (dn + dr)]
        kh, vh = kv[..., h * (dn + dv):h * (dn + dv) + dn], kv[..., h * (dn + dv) + dn:(h + 1) * (dn + dv)]
        qh = torch.cat((qh[..., :dn], rotate(qh[..., dn:])), -1)
        kh = torch.cat((kh, rotate(k_rope)), -1)
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(dn + dr)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf'))
        if attn.sinks is not None:
            sink = attn.sinks[h].double().expand(*scores.shape[:-1], 1)
            heads.append(torch.cat((scores, sink), -1).softmax(-1)[..., :T] @ vh)
        else:
            heads.append(scores.softmax(-1) @ vh)
    y = torch.cat(heads, -1)
    if attn.c_gate is not None:
        y = y * torch.sigmoid(lin(x, attn.c_gate))
    return lin(y, attn.c_proj).float()


@pytest.mark.parametrize('q_lora, switches', [(None, {}), (12, {}), (12, dict(attn_sinks=True, attn_gate=True))],
                         ids=['direct', 'bottleneck', 'sinks+gate'])
def test_latent_attention_matches_the_written_out_reference(q_lora, switches):
    cfg = tiny_config(attn='mla', pos='rope', q_lora_rank=q_lora, v_head_dim=6, bias=True, **switches)
    torch.manual_seed(70)
    attn = mla.LatentAttention(cfg).eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if 'norm' in name else 0.0))
    x = torch.randn(2, 9, N_EMBD)
    tables = rope_tables(M.Rotary(cfg), 0, 9)
    with torch.no_grad():
        assert_close(attn(x, tables), mla_reference(attn, x, tables), atol=1e-4)


@torch.no_grad()
def test_the_head_gate_scales_each_heads_output_and_decodes_absorbed():
    """mla_head_gate (Ling 3): each head's output times sigmoid(c_gate(x)), one per head and token, before
    c_proj: the ungated layer's heads, scaled; cached (absorbed) decoding equals full forwards."""
    model = build(attn='mla', pos='rope', norm='rms', q_lora_rank=16, mla_head_gate=True)
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 7, N_EMBD, generator=torch.Generator().manual_seed(72))
    tables = rope_tables(M.Rotary(model.config), 0, 7)
    gated = attn(x, tables)
    c_gate, c_proj = attn.c_gate, attn.c_proj
    assert c_gate.weight.shape == (N_HEAD, N_EMBD)
    attn.c_gate, attn.c_proj = None, torch.nn.Identity()
    heads = attn(x, tables).view(2, 7, N_HEAD, -1)  # each head's ungated output
    attn.c_gate, attn.c_proj = c_gate, c_proj
    expected = c_proj((heads * torch.sigmoid(c_gate(x))[..., None]).flatten(2))
    assert_close(gated, expected, atol=1e-6)
    assert (gated - c_proj(heads.flatten(2))).abs().max() > 1e-3  # the gate does something
    check_cache_logits(model)


@torch.no_grad()
@pytest.mark.parametrize('switches', [{}, dict(attn_sinks=True, attn_gate=True)], ids=['plain', 'sinks+gate'])
def test_absorbed_decoding_equals_rebuilding_keys_and_values(switches):
    """The absorbed step (each head a query row of one shared head, its sink that row's) decodes what rebuilding
    every key and value does; the sinks here away from zero, so a sink on the wrong row would show."""
    model = build(attn='mla', pos='rope', norm='rms', q_lora_rank=16, **switches)
    for block in model.transformer.h:
        if block.attn.sinks is not None:
            block.attn.sinks.copy_(torch.linspace(-2.0, 2.0, block.attn.sinks.numel()))
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(71))
    absorbed = generate_recording_logits(model, prompt, 30, use_cache=True)
    for block in model.transformer.h:
        block.attn.absorb = False
    rebuilt = generate_recording_logits(model, prompt, 30, use_cache=True)
    assert torch.equal(absorbed[0], rebuilt[0])
    assert_close(absorbed[1], rebuilt[1], atol=1e-5)


def test_latent_cache_is_the_latent_and_one_rotated_key_whatever_the_heads():
    for n_head in (2, 4, 8):
        model = build(attn='mla', pos='rope', n_head=n_head, kv_lora_rank=20, qk_rope_head_dim=6)
        assert model.kv_cache_bytes(3, 10) == 2 * 3 * 10 * (20 + 6) * 4  # layers, batch, positions, floats
    assert build(attn='mla', pos='learned', kv_lora_rank=20).kv_cache_bytes(1, 10) == 2 * 10 * 20 * 4


@torch.no_grad()
@pytest.mark.parametrize('rope_width', [0, 4])
def test_mla_without_positions_is_blind_to_order_and_decodes(rope_width):
    """pos='none': no table, no rotation; MLA's shared key part (width 0, or 4 and not rotated) carries no
    position, so permuting earlier tokens changes nothing; cached decoding (the absorbed form) is exact."""
    model = build(n_layer=1, pos='none', attn='mla', qk_rope_head_dim=rope_width)  # one layer: causality below
    assert model.config.mla_dims['rope'] == rope_width and not list(model.transformer.wpe.parameters())  # would tell
    idx = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(54))
    swapped = idx.clone()
    swapped[0, [3, 5]] = idx[0, [5, 3]]
    assert_close(model(swapped)[0][0, -1], model(idx)[0][0, -1], atol=1e-5)
    check_cache_logits(model)


@pytest.mark.parametrize('overrides,field', [
    (dict(attn='mla', n_kv_head=2), 'n_kv_head'),
    (dict(attn='mla', pos='rope', qk_norm=True), 'qk_norm'),
    (dict(attn='mla', head_dim=16), 'head_dim'),
    (dict(attn='mla', qkv_bias=True), 'qkv_bias'),
    (dict(kv_lora_rank=16), 'kv_lora_rank'),  # with attn='mha'
    (dict(attn='mla', qk_rope_head_dim=4), 'qk_rope_head_dim'),  # with learned positions
    (dict(attn='mla', pos='rope', qk_rope_head_dim=5), 'qk_rope_head_dim'),
    (dict(attn='mla', kv_lora_rank=0), 'kv_lora_rank'),
    (dict(mla_head_gate=True), 'mla_head_gate'),  # with attn='mha'
    (dict(attn='mla', pos='rope', attn_gate=True, mla_head_gate=True), 'mla_head_gate'),  # one gate or the other
], ids=config_id)
def test_invalid_configs_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)
