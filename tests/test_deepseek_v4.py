"""Tests for chapters/deepseek_v4.py: the shared key-value attention (attn='shared_kv') against its formula written
out and against transformers' DeepseekV4Attention on the same weights, its output's relative positions (inverse
RoPE), the grouped output projection, the sqrt-softplus router and the clamped SwiGLU against their formulas; a
DeepSeek-V4-shaped model's gradients, causality, decoding through the cache past block_size, FLOPs as torch counts
them, training; the checks."""
import math

import pytest
import torch
import torch.nn.functional as F

import model as M
from chapters import deepseek_v4 as v4, moe
from tiny_models import (BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, build, check_backward, check_cache_logits,
                         check_causal, check_generate_cache, config_id, counted_training_flops, losses_fall,
                         rope_tables, tiny_config, train_a_few_steps)

pytestmark = pytest.mark.usefixtures('single_thread')

HEAD = 12  # heads wider than n_embd / n_head = 8, half of each rotated
ATTN = dict(attn='shared_kv', head_dim=HEAD, q_rank=16, o_groups=2, o_lora_rank=8, attn_sinks=True, pos='rope',
            rope_fraction=0.5, norm='rms', bias=False)
# DeepSeek-V4's block: the attention above, a window shorter than BLOCK on every layer, its MoE (sqrt-softplus
# router with the balancing bias, a shared expert, the SwiGLU clamped where it acts) and 4 copies of the stream
V4 = dict(ATTN, sliding_window=5, mlp='moe', n_expert=4, n_expert_active=2, moe_hidden=16, n_shared_expert=1,
          router='sigmoid', router_score='sqrtsoftplus', routed_scaling=1.5, swiglu_limit=0.5, swiglu_form='plain',
          hc_mult=4)


def randomized(module, seed, scale=0.3):
    """Every parameter and buffer away from its init (sinks, gains, the balancing bias), so a wrong formula shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]:
            t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype) * (scale if t.dim() > 1 else 1.0))
    return module


# ----------------------------------------------------------------------------- the attention

def attention_written_out(attn, x, cos, sin, window):
    """The shared key-value attention one query at a time in float64: q from the bottleneck, each head scaled to unit
    RMS; the one head normalised with its gain; both rotated (first rope dims, halves); softmax of q.k / sqrt(head)
    over the window's keys with the head's sink; the output's rotated dims turned back; grouped, then projected."""
    H, hs, eps = attn.n_head, attn.head_size, attn.eps
    r = cos.size(-1)

    def rms(v, gain=None):
        v = v / torch.sqrt(v.square().mean(-1, keepdim=True) + eps)
        return v if gain is None else v * gain

    def rotate(v, c, s):  # pairs (i, i + r/2) of the first r dims turned by the angles
        a, b = v[..., :r // 2], v[..., r // 2:r]
        return torch.cat((a * c[:r // 2] - b * s[:r // 2], b * c[:r // 2] + a * s[:r // 2], v[..., r:]), -1)

    B, T, _ = x.shape
    q = rms((rms(x @ attn.q_a.weight.T, attn.q_a_norm.weight) @ attn.q_b.weight.T).view(B, T, H, hs))
    kv = rms(x @ attn.c_kv.weight.T, attn.kv_norm.weight)
    out = torch.empty(B, T, H * hs, dtype=x.dtype)
    for b in range(B):
        keys = torch.stack([rotate(kv[b, s], cos[s], sin[s]) for s in range(T)])
        for t in range(T):
            seen = range(max(0, t - window + 1), t + 1)
            for h in range(H):
                qh = rotate(q[b, t, h], cos[t], sin[t])
                logits = torch.stack([qh @ keys[s] for s in seen]) / math.sqrt(hs)
                p = torch.softmax(torch.cat((logits, attn.sinks[h:h + 1])), 0)[:-1]
                y = sum(p_s * keys[s] for p_s, s in zip(p, seen))
                out[b, t, h * hs:(h + 1) * hs] = rotate(y, cos[t], -sin[t])
    groups, width = attn.c_group.groups, attn.c_group.in_features
    w = attn.c_group.weight.view(groups, -1, width)
    grouped = torch.cat([out[..., g * width:(g + 1) * width] @ w[g].T for g in range(groups)], -1)
    return grouped @ attn.c_proj.weight.T


@torch.no_grad()
def test_shared_kv_attention_is_the_formula_written_out():
    model = build(**ATTN, sliding_window=5)
    attn = randomized(model.transformer.h[0].attn, 1).double()
    x = torch.randn(2, 9, N_EMBD, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cos, sin = (t.double() for t in rope_tables(model.transformer.wpe, 0, 9))
    mask = M.causal_mask(9, 5, x.device)
    assert_close(attn(x, (cos, sin), mask), attention_written_out(attn, x, cos, sin, window=5), atol=1e-10)
    assert attn.cache_entries() == {'kv': (1, HEAD)}  # one head, key and value


@torch.no_grad()
def test_with_keys_as_values_the_output_depends_only_on_relative_positions():
    """The values are rotated with the keys; turning the output back by the query's position leaves each value's
    contribution a function of how far back it is: the same tokens at positions 0.. and 7.. give the same output."""
    model = build(**ATTN)
    attn = randomized(model.transformer.h[0].attn, 3)
    x = torch.randn(1, 6, N_EMBD, generator=torch.Generator().manual_seed(4))
    at_start, later = (attn(x, rope_tables(model.transformer.wpe, start, 6)) for start in (0, 7))
    assert_close(later, at_start, atol=1e-5)
    # without the turn back the output would depend on the absolute positions
    plain = build(**{**ATTN, 'pos': 'none'}).transformer.h[0].attn
    plain.load_state_dict(attn.state_dict())
    assert not torch.allclose(plain(x, None), at_start, atol=1e-3)


@torch.no_grad()
def test_shared_kv_attention_is_transformers_deepseek_v4_attention_on_the_same_weights():
    """The same weights in transformers' layout (the last rotated dims, in pairs: hf/deepseek_v4.py's reordering)."""
    transformers = pytest.importorskip('transformers')
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as V4
    from hf import HF_FAMILIES
    from hf.engine import _TRANSFORMS
    model = build(**ATTN, sliding_window=5, norm_eps=1e-6)
    attn = randomized(model.transformer.h[0].attn, 5)
    theirs_config = transformers.DeepseekV4Config(
        hidden_size=N_EMBD, num_attention_heads=N_HEAD, head_dim=HEAD, q_lora_rank=16, o_groups=2, o_lora_rank=8,
        sliding_window=5, partial_rotary_factor=0.5, num_hidden_layers=1, layer_types=['sliding_attention'],
        mlp_layer_types=['moe'], rms_norm_eps=1e-6, attn_implementation='eager')
    theirs = V4.DeepseekV4Attention(theirs_config, 0).eval()
    rows = {ours.split('attn.')[1]: (hf.split('self_attn.')[1], how) for ours, hf, how in
            HF_FAMILIES['deepseek_v4'].names if '.attn.' in ours}
    theirs.load_state_dict({rows[k][0]: _TRANSFORMS[rows[k][1]][1](v, model.config) if rows[k][1] else v
                            for k, v in attn.state_dict().items()})
    x = torch.randn(2, 9, N_EMBD, generator=torch.Generator().manual_seed(6))
    positions = torch.arange(9)[None]
    rotary = V4.DeepseekV4RotaryEmbedding(theirs_config)
    mask = torch.zeros(1, 1, 9, 9).masked_fill(~M.causal_mask(9, 5, x.device), float('-inf'))
    expected, _ = theirs(x, {'main': rotary(x, positions, 'main')}, positions, mask)
    assert_close(attn(x, rope_tables(model.transformer.wpe, 0, 9), M.causal_mask(9, 5, x.device)), expected,
                 atol=1e-6)


@torch.no_grad()
def test_the_grouped_projection_is_a_block_diagonal_matrix():
    layer = randomized(v4.GroupedLinear(12, 6, 3), 7, scale=1.0)
    assert layer.weight.shape == (6, 4)
    blocks = torch.block_diag(*layer.weight.view(3, 2, 4))  # (6, 12): group g's rows read its 4 inputs only
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(8))
    assert_close(layer(x), x @ blocks.T, atol=1e-6)


# ----------------------------------------------------------------------------- the experts

@torch.no_grad()
def test_the_sqrt_softplus_router_and_clamped_swiglu_are_their_formulas():
    """Per token: the experts are the top k of sqrt(softplus(logit)) + bias, weighted by their scores over the chosen
    ones' sum times routed_scaling; every expert and the shared one compute silu(min(g, L)) * clamp(u, -L, L)."""
    model = build(**V4)
    layer = randomized(model.transformer.h[0].mlp, 9)
    assert type(layer) is v4.DeepseekV4MoE and type(layer.experts) is v4.ClampedExperts
    L, k = 0.5, 2
    x = torch.randn(7, N_EMBD, generator=torch.Generator().manual_seed(10))

    def swiglu(w_fc, w_proj, token):
        gate, up = (w_fc @ token).chunk(2)
        return w_proj @ (F.silu(gate.clamp(max=L)) * up.clamp(-L, L))

    expected = torch.empty_like(x)
    for n, token in enumerate(x):
        scores = F.softplus(layer.router.weight @ token).sqrt()
        chosen = (scores + layer.expert_bias).topk(k).indices
        weights = scores[chosen] / scores[chosen].sum() * 1.5
        expected[n] = sum(w * swiglu(layer.experts.c_fc[e], layer.experts.c_proj[e], token)
                          for w, e in zip(weights, chosen))
        expected[n] += swiglu(layer.shared.c_fc.weight, layer.shared.c_proj.weight, token)
    assert_close(layer(x), expected, atol=1e-5)
    # the clamp acts at this limit, and the choice is not the sigmoid's
    unclamped = build(**{**V4, 'swiglu_limit': 100.0}).transformer.h[0].mlp
    unclamped.load_state_dict(layer.state_dict())
    assert not torch.allclose(unclamped(x), expected, atol=1e-3)
    logits = layer.router(x)
    assert not torch.equal((F.softplus(logits).sqrt() + layer.expert_bias).topk(k).indices,
                           (logits.sigmoid() + layer.expert_bias).topk(k).indices)


@torch.no_grad()
def test_hash_routing_is_its_formula():
    """Per token: the experts are its id's row of the frozen table (k distinct, a saved buffer), weighted by their
    sqrt-softplus scores over the chosen ones' sum times routed_scaling; no balancing bias, no balancing loss."""
    model = build(**V4, hash_moe_layers=1)
    layer = randomized(model.transformer.h[0].mlp, 13)
    assert type(layer) is v4.HashMoE and layer.inputs == 'tokens' and not hasattr(layer, 'expert_bias')
    assert type(model.transformer.h[1].mlp) is v4.DeepseekV4MoE  # only the first MoE layer
    table = layer.tid2eid
    assert table.shape == (VOCAB, 2) and table.dtype == torch.long and (table[:, 0] != table[:, 1]).all()
    assert 'transformer.h.0.mlp.tid2eid' in model.state_dict() and set(table.flatten().tolist()) == set(range(4))
    L = 0.5
    x = torch.randn(2, 4, N_EMBD, generator=torch.Generator().manual_seed(14))
    tokens = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(15))

    def swiglu(w_fc, w_proj, token):
        gate, up = (w_fc @ token).chunk(2)
        return w_proj @ (F.silu(gate.clamp(max=L)) * up.clamp(-L, L))

    expected = torch.empty_like(x)
    for b in range(2):
        for t in range(4):
            token = x[b, t]
            scores = F.softplus(layer.router.weight @ token).sqrt()
            chosen = table[tokens[b, t]]
            weights = scores[chosen] / scores[chosen].sum() * 1.5
            expected[b, t] = sum(w * swiglu(layer.experts.c_fc[e], layer.experts.c_proj[e], token)
                                 for w, e in zip(weights, chosen))
            expected[b, t] += swiglu(layer.shared.c_fc.weight, layer.shared.c_proj.weight, token)
    layer.train()
    assert_close(layer(x, tokens), expected, atol=1e-5)
    assert layer.loss is None
    # the same weights choosing by score give another output
    learned = build(**V4).transformer.h[0].mlp
    learned.load_state_dict({k: v for k, v in layer.state_dict().items() if k != 'tid2eid'}, strict=False)
    assert not torch.allclose(learned(x), expected, atol=1e-3)


def test_a_hash_routed_layer_has_the_learned_layers_parameters_and_flops():
    """The table is a buffer, not a weight: a hash-routed layer has the parameters of a learned one less nothing
    (the balancing bias is a buffer too), active or not, and a token multiplies the same weights."""
    hashed, learned = build(**V4, hash_moe_layers=2), build(**V4)
    assert hashed.get_num_params() == learned.get_num_params()
    assert hashed.get_num_params(active=True) == learned.get_num_params(active=True)
    assert hashed.flops_per_token() == learned.flops_per_token()


def test_the_clamp_alone_keeps_the_routers_own_score():
    """swiglu_form='plain' without router_score: the router's sigmoid or softmax, the clamped SwiGLU."""
    model = build(**{**V4, 'router_score': None, 'router': 'softmax'})
    layer = model.transformer.h[0].mlp
    assert type(layer) is v4.DeepseekV4MoE and not layer.sqrt_softplus
    assert type(layer.shared) is v4.ClampedGatedMLP
    assert type(build(**{**V4, 'router_score': None, 'swiglu_form': 'gpt-oss'}).transformer.h[0].mlp) is moe.MoE


# ----------------------------------------------------------------------------- the model

@pytest.mark.parametrize('overrides', [{}, {'pos': 'learned', 'sliding_window': None, 'hc_mult': 1},
                                       {'q_rank': None, 'o_groups': 1, 'o_lora_rank': None, 'attn_sinks': False},
                                       {'hash_moe_layers': 1}, {'hash_moe_layers': 2, 'router_score': None}],
                         ids=['v4', 'learned-global', 'plain-projections', 'hash', 'hash-sigmoid'])
def test_a_deepseek_v4_model_learns_is_causal_and_decodes_through_the_cache(overrides):
    model = randomized(build(**{**V4, **overrides}), 11, scale=0.2)
    for p in model.parameters():  # at a scale the copies of the stream survive
        p.data.mul_(0.5)
    check_backward(model)
    check_causal(model)
    check_cache_logits(model)
    check_generate_cache(model)  # 40 new tokens: past block_size, and the window's ring around many times
    if overrides == {}:  # the cache keeps the window of the one key-value head
        assert model.kv_cache_bytes(1, BLOCK) == 2 * 5 * HEAD * 4


@pytest.mark.parametrize('overrides', [{}, {'q_rank': None, 'o_groups': 1, 'o_lora_rank': None},
                                       {'hash_moe_layers': 1}],
                         ids=['v4', 'plain-projections', 'hash'])
def test_flops_per_token_equals_the_counted_flops(overrides, monkeypatch):
    model = build(**{**V4, **overrides})
    T = 5  # the window: the explicit attention computes what a window masks
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(12))
    assert model.flops_per_token(seq_len=T) * 2 * T == counted_training_flops(model, idx, monkeypatch)


def test_a_deepseek_v4_model_trains():
    assert losses_fall(train_a_few_steps(build(**V4)))


@pytest.mark.parametrize('overrides, fragment', [
    (dict(q_rank=8), "q_rank=8 apply to attn='shared_kv' only"),
    (dict(o_lora_rank=8, o_groups=2), "o_groups=2, o_lora_rank=8 apply to attn='shared_kv' only"),
    (dict(attn='shared_kv', n_kv_head=2), "--n_kv_head=None"),
    (dict(attn='shared_kv', qk_norm=True), "qk_norm=True cannot apply"),
    (dict(attn='shared_kv', o_groups=2), 'set o_lora_rank'),
    (dict(attn='shared_kv', o_groups=3, o_lora_rank=4), 'o_groups (3) must divide n_head (4)'),
    (dict(router_score='sqrtsoftplus', mlp='moe'), "set mlp='moe' and router='sigmoid'"),
    (dict(router_score='sqrtsoftplus', mlp='moe', router='sigmoid', n_expert_group=2), 'set n_expert_group=1'),
    (dict(swiglu_form='plain', mlp='moe'), 'set swiglu_limit'),
    (dict(router_score='softplus'), "router_score must be one of None, 'sqrtsoftplus'"),
    (dict(hash_moe_layers=1), "hash_moe_layers=1 routes MoE layers by the token id: set mlp='moe'"),
    (dict(hash_moe_layers=2, mlp='moe', first_dense_layers=1), "hash_moe_layers=2 is more than the model's 1 MoE"),
    (dict(hash_moe_layers=-1), 'hash_moe_layers must be an int >= 0'),
], ids=config_id)
def test_bad_deepseek_v4_settings_are_one_line(overrides, fragment):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert fragment in str(e.value) and '\n' not in str(e.value), str(e.value)
