"""Tests for chapters/gemma4.py: K/V sharing (kv_shared_layers), K = V, per-layer embeddings, the layer scalar, global
layers' shapes and proportional RoPE, the MoE block (moe_dense_mlp)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import generate as G
import model as M
from chapters import gemma4, moe
from tiny_models import (BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, assert_steps_equal_full_forwards, build,
                         check_cache_logits, check_causal, reference_greedy, tiny_config, train_steps)

pytestmark = pytest.mark.usefixtures('single_thread')


# ----------------------------------------------------------------------------- K/V sharing (kv_shared_layers)

# local and global layers, the last two sharing: layer 2 ('L') reads layer 0's keys and values, layer 3 ('G') layer 1's
KV_SHARING = dict(n_layer=4, layers='LG', sliding_window=5, pos='rope', norm='rms', mlp='swiglu', n_kv_head=2,
                  qk_norm=True, bias=False, kv_shared_layers=2)


def test_kv_sharing_layers_read_the_keys_and_values_of_the_last_earlier_layer_of_their_kind():
    assert [gemma4.kv_source(tiny_config(**KV_SHARING), i) for i in range(4)] == [None, None, 0, 1]
    config = tiny_config(n_layer=6, layers='LLG', sliding_window=5, pos='rope', kv_shared_layers=3)
    assert [gemma4.kv_source(config, i) for i in range(6)] == [None, None, None, 1, 1, 2]  # the last 'L' before: 1


@torch.no_grad()
def test_a_kv_sharing_layer_attends_over_its_source_layers_keys_and_values():
    """Two global layers, the second sharing (learned positions, no QK-norm: the attention written out): its
    queries are its own, its keys and values the first layer's; it has no K/V projection."""
    model = build(n_layer=2, kv_shared_layers=1, n_kv_head=2)
    first, second = model.transformer.h
    assert second.attn.c_attn.weight.shape == (N_EMBD, N_EMBD) and second.attn.cache_entries() == {}
    idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(90))
    x, _ = model.embed(idx)

    def heads(t, n):
        return t.view(2, BLOCK, n, -1).transpose(1, 2)

    def attention_out(attn, q, k, v):
        k, v = (t.repeat_interleave(N_HEAD // 2, dim=1) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attn.c_proj(y.transpose(1, 2).reshape(2, BLOCK, N_EMBD))

    q, k, v = first.attn.c_attn(first.ln_1(x)).split([N_EMBD, N_EMBD // 2, N_EMBD // 2], dim=2)
    q, k, v = heads(q, N_HEAD), heads(k, 2), heads(v, 2)
    x = x + attention_out(first.attn, q, k, v)
    x = x + first.mlp(first.ln_2(x))
    x = x + attention_out(second.attn, heads(second.attn.c_attn(second.ln_1(x)), N_HEAD), k, v)
    x = x + second.mlp(second.ln_2(x))
    assert_close(model(idx)[0], model.lm_head(model.transformer.ln_f(x)), atol=1e-5)


def test_kv_sharing_trains_decodes_through_the_cache_and_counts():
    """The loss falls; a cache's logits are a full forward's, greedy decoding past block_size equals full forwards;
    the cache holds only the unshared layers, and the sharing layers' FLOPs lose their K/V projections' (their
    attention's stay)."""
    model = build(**KV_SHARING)
    losses = train_steps(model, seed=91)
    assert losses[-1] < losses[0] - 0.5
    model.eval()
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(92))
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0.0), reference_greedy(model, prompt, 3 * BLOCK))
    unshared = build(**{**KV_SHARING, 'kv_shared_layers': 0})
    kv_projection = 2 * 2 * (N_EMBD // N_HEAD) * N_EMBD  # k and v of 2 heads
    for seq_len in (3, BLOCK):
        assert model.kv_cache_bytes(2, seq_len) == unshared.kv_cache_bytes(2, seq_len) // 2
        assert model.flops_per_token(seq_len) == unshared.flops_per_token(seq_len) - 2 * 6 * kv_projection
    assert model.get_num_params() == unshared.get_num_params() - 2 * (kv_projection + N_EMBD // N_HEAD)  # k_norm


@pytest.mark.parametrize('overrides, message', [
    (dict(kv_shared_layers=2), 'kv_shared_layers must be an int in [0, n_layer-1=1], got 2'),
    (dict(kv_shared_layers=-1), 'kv_shared_layers must be an int in [0, n_layer-1=1], got -1'),
    (dict(kv_shared_layers=1, attn='mla', pos='rope'), "kv_shared_layers=1 shares keys and values of attn='mha' only"),
    (dict(kv_shared_layers=1, layers='GD'), "covers layers of kinds 'D'; only attention layers"),
    (dict(n_layer=3, kv_shared_layers=1, layers='GGL', sliding_window=4), "the shared layers' kinds 'L' have no "
                                                                          "earlier layer to share from"),
])
def test_bad_kv_sharing_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)


# ----------------------------------------------------------------------------- K = V (attn_k_eq_v)

@torch.no_grad()
def test_k_eq_v_values_are_the_keys_projection_normalized_without_a_gain_and_not_rotated():
    """attn_k_eq_v on a global layer (RoPE, QK-norm, GQA), the attention written out: one projection gives the keys
    (normalized, rotated) and the values (normalized without a gain, not rotated); a local layer keeps its own V."""
    model = build(n_layer=2, layers='LG', sliding_window=4, pos='rope', qk_norm=True, n_kv_head=2, attn_k_eq_v=True)
    local, block = model.transformer.h
    assert local.attn.c_attn.weight.shape == (2 * N_EMBD, N_EMBD) and block.attn.c_attn.weight.shape == (
        N_EMBD + N_EMBD // 2, N_EMBD)
    x = torch.randn(2, BLOCK, N_EMBD, generator=torch.Generator().manual_seed(95))
    _, tables = model.embed(torch.zeros(2, BLOCK, dtype=torch.long))
    attn, hs = block.attn, N_EMBD // N_HEAD
    q, k = attn.c_attn(x).split([N_EMBD, N_EMBD // 2], dim=2)
    q, k = q.view(2, BLOCK, N_HEAD, hs).transpose(1, 2), k.view(2, BLOCK, 2, hs).transpose(1, 2)
    v = k / k.pow(2).mean(-1, keepdim=True).add(model.config.norm_eps).sqrt()
    q, k = M.apply_rope(attn.q_norm(q), *tables['rope']), M.apply_rope(attn.k_norm(k), *tables['rope'])
    k, v = (t.repeat_interleave(N_HEAD // 2, dim=1) for t in (k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, BLOCK, N_EMBD)
    assert_close(attn(x, tables['rope']), attn.c_proj(y), atol=1e-5)


def test_k_eq_v_with_kv_sharing_trains_decodes_through_the_cache_and_counts():
    """K = V on the global layers and the last two layers sharing: the loss falls, cached decoding equals full
    forwards past block_size; the cache is as without K = V (keys and values both kept), and each global layer
    that projects its own loses its V projection's parameters and FLOPs."""
    model = build(**KV_SHARING, attn_k_eq_v=True)
    losses = train_steps(model, seed=96)
    assert losses[-1] < losses[0] - 0.5
    model.eval()
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(97))
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0.0), reference_greedy(model, prompt, 3 * BLOCK))
    separate = build(**KV_SHARING)
    v_projection = 2 * (N_EMBD // N_HEAD) * N_EMBD  # layer 1's, the one global layer that projects
    assert model.kv_cache_bytes(2, BLOCK) == separate.kv_cache_bytes(2, BLOCK)
    assert model.flops_per_token() == separate.flops_per_token() - 6 * v_projection
    assert model.get_num_params() == separate.get_num_params() - v_projection


@pytest.mark.parametrize('overrides, message', [
    (dict(attn_k_eq_v=1), 'attn_k_eq_v must be True or False, got 1'),
    (dict(attn_k_eq_v=True, attn='mla', pos='rope'), "attn_k_eq_v=True makes the values of attn='mha' from its keys"),
    (dict(attn_k_eq_v=True, layers='L', sliding_window=4), "attn_k_eq_v=True applies to global layers ('G', 'N') and "
                                                           "layers='L' has none"),
])
def test_bad_k_eq_v_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)


# ----------------------------------------------------------------------------- per-layer embeddings (per_layer_embd)

PER_LAYER = dict(n_layer=3, pos='rope', norm='rms', mlp='geglu', bias=False, embed_scale=True, per_layer_embd=8)


@torch.no_grad()
def test_per_layer_embeddings_add_each_layers_own_vector_after_its_mlp():
    """One layer, written out: the layer's vector is the average (times 1/sqrt(2)) of its slice of the narrow table
    (times sqrt(8)) and of the normalized projection of the scaled main embedding (times n_embd**-0.5); after the
    block, x + norm(c_proj(gelu(c_fc(x)) * vector))."""
    model = build(**{**PER_LAYER, 'n_layer': 1})
    t, block = model.transformer, model.transformer.h[0]
    idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(98))
    embedded = t.wte.weight[idx] * N_EMBD ** 0.5  # wte itself is the scaled embedding
    vector = (t.wte_per_layer(idx) * 8 ** 0.5 + t.per_layer_norm(t.per_layer_proj(embedded) / N_EMBD ** 0.5)) / 2 ** 0.5
    _, tables = model.embed(idx)
    x = block(embedded, tables['rope'], True)
    x = x + block.per_layer.ln(block.per_layer.c_proj(F.gelu(block.per_layer.c_fc(x), approximate='tanh') * vector))
    assert_close(model(idx)[0], model.lm_head(t.ln_f(x)), atol=1e-5)


def test_per_layer_embeddings_train_decode_through_the_cache_and_count():
    """The loss falls and reaches the narrow table; a cache's logits are a full forward's, greedy decoding past
    block_size equals full forwards, and so does a decoding step; the cache is unchanged; the FLOPs count the
    projections (the table is a lookup), the parameters the table too."""
    model = build(**PER_LAYER)
    losses = train_steps(model, seed=99)
    assert losses[-1] < losses[0] - 0.5
    assert model.transformer.wte_per_layer.weight.grad.abs().sum() > 0
    model.eval()
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(100))
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0.0), reference_greedy(model, prompt, 3 * BLOCK))
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(101))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert_steps_equal_full_forwards(model, seq, cache, 3)
    plain, width = build(**{**PER_LAYER, 'per_layer_embd': 0}), 3 * 8
    assert model.kv_cache_bytes(2, BLOCK) == plain.kv_cache_bytes(2, BLOCK)
    projections = N_EMBD * width + 3 * 2 * N_EMBD * 8  # the main embedding's, and each layer's gate and up
    assert model.flops_per_token() == plain.flops_per_token() + 6 * projections
    assert model.get_num_params() == plain.get_num_params() + projections + VOCAB * width + 8 + 3 * N_EMBD  # norms


@pytest.mark.parametrize('overrides, message', [
    (dict(per_layer_embd=-1), 'per_layer_embd must be an int >= 0, got -1'),
    (dict(per_layer_embd=None), 'per_layer_embd must be an int >= 0, got None'),
])
def test_bad_per_layer_embeddings_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)


# ----------------------------------------------------------------------------- the layer scalar

@torch.no_grad()
def test_the_layer_scalar_multiplies_each_layers_output_and_is_saved_not_trained():
    model = build(pos='rope', norm='rms', layer_scalar=True, per_layer_embd=4)
    model.transformer.h[0].layer_scalar.fill_(3.0)
    model.transformer.h[1].layer_scalar.fill_(0.5)
    assert 'transformer.h.0.layer_scalar' in model.state_dict()
    assert not [n for n, _ in model.named_parameters() if 'layer_scalar' in n]
    idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(103))
    x, tables = model.embed(idx)
    for block, scale in zip(model.transformer.h, (3.0, 0.5)):
        x = block.per_layer(block(x, tables['rope'], True), tables['per_layer']) * scale
    assert_close(model(idx)[0], model.lm_head(model.transformer.ln_f(x)), atol=1e-5)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(104))
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0.0), reference_greedy(model, prompt, 3 * BLOCK))


@pytest.mark.parametrize('overrides, message', [
    (dict(v_norm=1), 'v_norm must be True or False, got 1'),
    (dict(layer_scalar='yes'), "layer_scalar must be True or False, got 'yes'"),
    (dict(v_norm=True, attn='mla', pos='rope'), "v_norm=True normalizes the values of attn='mha', got attn='mla'"),
])
def test_bad_value_norm_and_layer_scalar_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)


# ----------------------------------------------------------------------------- global layers' shapes and RoPE

# local layers of 4 heads of 8 sharing 2 K/V heads; global ones of 4 heads of 16 sharing 1, a quarter of pairs turning
GLOBAL_SHAPES = dict(n_layer=4, layers='LG', sliding_window=5, pos='rope', rope_local_theta=100.0, qk_norm=True,
                     n_kv_head=2, global_head_dim=16, global_n_kv_head=1, rope_proportion=0.25, norm='rms',
                     mlp='geglu', bias=False)


def test_global_layers_have_their_own_head_shapes_and_proportional_rope():
    """Global layers with wider heads and fewer K/V heads, and proportional RoPE: their projections and cache have
    those shapes, the rotary tables of global layers are 16 wide with only the first 2 pairs of 8 turning; the
    loss falls, a cache's logits and greedy decoding past block_size are full forwards', so is a decoding step."""
    model = build(**GLOBAL_SHAPES)
    assert [tuple(b.attn.c_attn.weight.shape) for b in model.transformer.h[:2]] == [(64, 32), (96, 32)]
    assert model.transformer.h[1].attn.c_proj.weight.shape == (N_EMBD, 64)
    cos, sin = model.transformer.wpe(torch.zeros(1, BLOCK, N_EMBD), 0)[1]
    assert cos.shape == (BLOCK, 16) and torch.equal(sin[:, 2:8], torch.zeros(BLOCK, 6))  # 2 of the 8 pairs turn
    assert (sin[1:, :2] != 0).all() and torch.equal(cos[:, :8], cos[:, 8:])
    assert model.rope_local(torch.zeros(1, BLOCK, N_EMBD), 0)[1][0].shape == (BLOCK, 8)
    # per sequence position: the 2 local layers keep at most 5 of 2 K/V heads of 8, the 2 global ones 1 head of 16
    for seq_len in (3, BLOCK):
        assert model.kv_cache_bytes(1, seq_len) == 4 * 2 * (2 * min(seq_len, 5) * 2 * 8 + 2 * seq_len * 1 * 16)
    losses = train_steps(model, seed=105)
    assert losses[-1] < losses[0] - 0.5
    model.eval()
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(106))
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0.0), reference_greedy(model, prompt, 3 * BLOCK))
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(107))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert_steps_equal_full_forwards(model, seq, cache, 3)


@pytest.mark.parametrize('overrides, message', [
    (dict(global_head_dim=0), 'global_head_dim must be None or a positive int, got 0'),
    (dict(global_n_kv_head=5), 'global_n_kv_head must be None or an int in [1, n_head=4], got 5'),
    (dict(global_n_kv_head=3), 'n_head (4) must be divisible by global_n_kv_head (3)'),
    (dict(rope_proportion=1.5, pos='rope'), 'rope_proportion must be None or in (0, 1], got 1.5'),
    (dict(global_head_dim=16, attn='mla', pos='rope'), "global_head_dim=16 apply to attn='mha' only"),
    (dict(global_n_kv_head=2, layers='L', sliding_window=4), "global_n_kv_head=2 apply to global layers ('G', 'N')"),
    (dict(rope_proportion=0.25, pos='rope', layers='LG', sliding_window=4), 'local (\'L\') layers then need tables of '
                                                                           'their own, set rope_local_theta'),
    (dict(global_head_dim=16, pos='rope', layers='CG', attention_chunk_size=4), "which chunked ('C') layers share"),
    (dict(rope_proportion=0.25), "rope_proportion=0.25 needs pos='rope' without rope_scaling and rope_fraction=1"),
    (dict(global_head_dim=9, pos='rope'), "global_head_dim=9 with pos='rope' needs an even number of rotated dims"),
])
def test_bad_global_layer_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)


# ----------------------------------------------------------------------------- the MoE block (moe_dense_mlp)

GEMMA4_MOE = dict(n_layer=2, pos='rope', norm='rms', norm_position='sandwich', bias=False, mlp='moe', n_expert=4,
                  n_expert_active=2, moe_hidden=16, ffn_hidden=48, moe_dense_mlp=True, moe_activation='gelu')


@torch.no_grad()
def test_the_moe_block_adds_a_dense_mlp_and_experts_routed_from_the_stream():
    """Written out: each branch normalized on both sides, the router reading x / RMS(x) * scale / sqrt(n_embd),
    softmax top-2 renormalized and times each chosen expert's scale, GEGLU experts (one at a time)."""
    model = build(**GEMMA4_MOE, norm_eps=1e-6)
    layer = model.transformer.h[0].mlp
    assert isinstance(model.transformer.h[0].ln_2, nn.Identity) and moe.moe_layers(model) == [
        b.mlp for b in model.transformer.h]
    for p in (layer.router_scale, layer.expert_scale):
        p.copy_(1 + 0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(108)))
    x = torch.randn(2, 5, N_EMBD, generator=torch.Generator().manual_seed(109))
    flat = x.reshape(-1, N_EMBD)
    scores = layer.router(F.rms_norm(flat, (N_EMBD,), eps=1e-6) * layer.router_scale / N_EMBD ** 0.5).softmax(-1)
    weights, chosen = scores.topk(2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True) * layer.expert_scale[chosen]
    routed_in, experts = layer.ln_experts(flat), torch.zeros_like(flat)
    for t in range(flat.size(0)):
        for w, e in zip(weights[t], chosen[t]):
            gate, up = (layer.experts.c_fc[e] @ routed_in[t]).chunk(2)
            experts[t] += w * (layer.experts.c_proj[e] @ (F.gelu(gate, approximate='tanh') * up))
    dense_in = layer.ln(x)
    gate, up = layer.dense.c_fc(dense_in).chunk(2, dim=-1)
    dense = layer.dense.c_proj(F.gelu(gate, approximate='tanh') * up)
    expected = layer.ln_dense_out(dense) + layer.ln_experts_out(experts).view(x.shape)
    assert_close(layer(x), expected, atol=1e-5)


def test_the_moe_block_trains_decodes_through_the_cache_and_counts():
    model = build(**GEMMA4_MOE)
    losses = train_steps(model, seed=110)
    assert losses[-1] < losses[0] - 0.5
    assert model.transformer.h[0].mlp.expert_scale.grad.abs().sum() > 0
    model.eval()
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(111))
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0.0), reference_greedy(model, prompt, 3 * BLOCK))
    # a token goes through the dense MLP and 2 of the 4 experts
    assert model.get_num_params() - model.get_num_params(active=True) == 2 * 2 * 3 * 16 * N_EMBD  # per layer 2 of 4
    assert model.flops_per_token() == build(**{**GEMMA4_MOE, 'moe_dense_mlp': False}).flops_per_token() \
        + 2 * 6 * 3 * 48 * N_EMBD  # a plain MoE's, and each layer's dense GEGLU


@pytest.mark.parametrize('overrides, message', [
    (dict(moe_dense_mlp=True), "moe_dense_mlp=True apply to mlp='moe' only, got mlp='gelu'"),
    (dict(moe_activation='gelu'), "moe_activation='gelu' apply to mlp='moe' only"),
    (dict(mlp='moe', moe_activation='relu'), "moe_activation must be 'silu' or 'gelu', got 'relu'"),
    (dict(mlp='moe', moe_dense_mlp=True, router='sigmoid'), "moe_dense_mlp=True routes as Gemma 4 does (softmax, no "
                                                            "groups, no shared experts, no scaling, every layer): "
                                                            "router='sigmoid' cannot apply"),
])
def test_bad_moe_block_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)
