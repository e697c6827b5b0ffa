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
import generate as G
from tiny_models import (BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, assert_steps_equal_full_forwards, build,
                         check_autocast_backward, check_backward, check_cache_logits, check_causal, check_generate_cache, config_id,
                         counted_training_flops, losses_fall, rope_tables, tiny_config, train_a_few_steps)

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

def rms(v, eps, gain=None):
    v = v / torch.sqrt(v.square().mean(-1, keepdim=True) + eps)
    return v if gain is None else v * gain


def rotate(v, c, s):
    """Pairs (i, i + r/2) of the first r dims (the tables' width) turned by the angles."""
    r = c.size(-1)
    a, b = v[..., :r // 2], v[..., r // 2:r]
    return torch.cat((a * c[:r // 2] - b * s[:r // 2], b * c[:r // 2] + a * s[:r // 2], v[..., r:]), -1)


def attention_written_out(attn, x, cos, sin, window, extra=None):
    """The shared key-value attention one query at a time in float64: q from the bottleneck, each head scaled to unit
    RMS; the one head normalised with its gain; both rotated (first rope dims, halves); softmax of q.k / sqrt(head)
    over the window's keys (and extra(b, t)'s, the compressed entries a query reads) with the head's sink; the
    output's rotated dims turned back; grouped, then projected."""
    H, hs, eps = attn.n_head, attn.head_size, attn.eps
    B, T, _ = x.shape
    q = rms((rms(x @ attn.q_a.weight.T, eps, attn.q_a_norm.weight) @ attn.q_b.weight.T).view(B, T, H, hs), eps)
    kv = rms(x @ attn.c_kv.weight.T, eps, attn.kv_norm.weight)
    out = torch.empty(B, T, H * hs, dtype=x.dtype)
    for b in range(B):
        keys = torch.stack([rotate(kv[b, s], cos[s], sin[s]) for s in range(T)])
        for t in range(T):
            seen = [keys[s] for s in range(T) if (window is None or s > t - window) and s <= t]
            seen += extra(b, t) if extra is not None else []
            for h in range(H):
                qh = rotate(q[b, t, h], cos[t], sin[t])
                logits = torch.stack([qh @ k for k in seen]) / math.sqrt(hs)
                p = torch.softmax(torch.cat((logits, attn.sinks[h:h + 1])), 0)[:-1]
                y = sum(p_s * k for p_s, k in zip(p, seen))
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


# ----------------------------------------------------------------------------- the compressed layers

# DeepSeek-V4's compressed layers on its block: heavily compressed (an entry per 3 tokens), compressed sparse (an entry
# per 2 tokens pooled over 4, its indexer of 3 heads of 8 keeping 2 of them: fewer than BLOCK's 8), and the three
# kinds together, the first MoE layer hash-routed
HCA = dict(V4, layers='LH', hca_rate=3)
CSA_FLAGS = dict(csa_rate=2, csa_topk=2, csa_index_heads=3, csa_index_dim=8)
CSA = dict(V4, layers='LI', **CSA_FLAGS)
COMPRESSED = dict(HCA, **CSA_FLAGS, layers='LHI', n_layer=3, hash_moe_layers=1)


def compressor_written_out(comp, x, cos, sin):
    """A compressor one complete window at a time in float64: the window's candidates (overlapping: the first halves
    of the window before, then its own second halves) weighted per channel by the softmax of their gates plus the
    bias of their place in their window, RMS-normalised with the gain, rotated at the window's first position."""
    m, w, bias = comp.rate, comp.width, comp.position_bias
    kv, gate = x @ comp.c_kv.weight.T, x @ comp.c_gate.weight.T
    B, T, _ = x.shape
    out = torch.empty(B, T // m, w, dtype=x.dtype)
    for b in range(B):
        for win in range(T // m):
            own = range(win * m, (win + 1) * m)
            if comp.overlap:
                slots = [(kv[b, s, :w], gate[b, s, :w] + bias[s % m, :w]) for s in range((win - 1) * m, win * m)
                         if s >= 0]
                slots += [(kv[b, s, w:], gate[b, s, w:] + bias[s % m, w:]) for s in own]
            else:
                slots = [(kv[b, s], gate[b, s] + bias[s % m]) for s in own]
            weights = torch.softmax(torch.stack([g for _, g in slots]), 0)
            pooled = sum(weight * c for weight, (c, _) in zip(weights, slots))
            out[b, win] = rotate(rms(pooled, comp.norm.eps, comp.norm.weight), cos[win * m], sin[win * m])
    return out


def picks_written_out(indexer, x, q_in, cos, sin):
    """The indexer's keys (its compressor's entries) and, per sequence and query, the entries it reads: of those
    whose windows are complete, the csa_topk highest by sum over heads of weight * ReLU(q.k) / sqrt(dim), the
    queries rotated, the weights a projection of the token over sqrt(heads); of equal scores the earliest."""
    keys = compressor_written_out(indexer.compress, x, cos, sin)
    H, D, m = indexer.n_head, indexer.head_dim, indexer.compress.rate
    B, T, _ = x.shape
    q = (q_in @ indexer.wq.weight.T).view(B, T, H, D)
    w = x @ indexer.weights.weight.T * H ** -0.5
    picks = []
    for b in range(B):
        picks.append([])
        for t in range(T):
            complete = range((t + 1) // m)
            scores = {e: sum(w[b, t, h] * F.relu(rotate(q[b, t, h], cos[t], sin[t]) @ keys[b, e]) for h in range(H))
                      / math.sqrt(D) for e in complete}
            picks[b].append(sorted(complete, key=lambda e: (-scores[e], e))[:indexer.topk])
    return keys, picks


@torch.no_grad()
@pytest.mark.parametrize('layer', [1, 2], ids=['hca', 'csa'])
def test_a_compressed_layer_is_the_formula_written_out(layer):
    """Each compressor against its formula, then the layer: a query reads its window's keys and, in the same softmax
    with the sinks, the entries of its complete windows (HCA all of them; CSA the csa_topk its indexer scores
    highest, fewer than it may see), each entry key and value."""
    model = build(**COMPRESSED)
    attn = randomized(model.transformer.h[layer].attn, 21).double()
    T, m = 13, attn.rate
    x = torch.randn(2, T, N_EMBD, generator=torch.Generator().manual_seed(22), dtype=torch.float64)
    cos, sin = (t.double() for t in rope_tables(model.transformer.wpe, 0, T))
    entries = compressor_written_out(attn.compress, x, cos, sin)
    assert_close(attn.compress(x, (cos, sin)), entries, atol=1e-10)
    if attn.indexer is None:
        picks = [[list(range((t + 1) // m)) for t in range(T)]] * 2
    else:
        q_in = rms(x @ attn.q_a.weight.T, attn.eps, attn.q_a_norm.weight)
        keys, picks = picks_written_out(attn.indexer, x, q_in, cos, sin)
        assert_close(attn.indexer.compress(x, (cos, sin)), keys, atol=1e-10)
        assert max(len(p) for p in picks[0]) == 2 < T // m  # fewer than the last queries may see
    expected = attention_written_out(attn, x, cos, sin, 5, extra=lambda b, t: [entries[b, e] for e in picks[b][t]])
    assert_close(attn(x, (cos, sin, cos, sin), M.causal_mask(T, 5, x.device)), expected, atol=1e-10)
    assert not torch.allclose(expected, attention_written_out(attn, x, cos, sin, 5), atol=1e-3)  # the entries count


@pytest.mark.parametrize('flags', [HCA, CSA, COMPRESSED, dict(V4, layers='HI', sliding_window=None, hca_rate=3,
                                                              **CSA_FLAGS),
                                   dict(CSA, pos='learned', hc_mult=1)],
                         ids=['hca', 'csa', 'three-kinds', 'no-window', 'learned-positions'])
def test_a_compressed_model_learns_is_causal_and_decodes_through_the_cache(flags):
    """Gradients everywhere (the indexer's from its own loss), causality, and the cache: a prefill, a chunk and single
    tokens, decoding steps one at a time (the windows' pending tokens and the entries kept in the cache), and greedy
    generation far past block_size, each equal to full forwards."""
    model = randomized(build(**flags), 11, scale=0.2)
    for p in model.parameters():  # at a scale the copies of the stream survive
        p.data.mul_(0.5)
    check_backward(model)
    check_causal(model)
    check_cache_logits(model)
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(23))
    assert_steps_equal_full_forwards(model, seq, G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu')), 4)
    check_generate_cache(model)


@torch.no_grad()
@pytest.mark.parametrize('flags', [HCA, CSA], ids=['hca', 'csa'])
def test_a_sequence_shorter_than_a_window_reads_no_entry(flags):
    """Fewer tokens than a window (a short prompt run without a cache) make no entry: CSA's overlapping pool once
    died there on a window's first halves with nothing to join; each layer is then its window alone."""
    model = build(**flags)
    rate = model.transformer.h[1].attn.rate
    idx = torch.randint(0, VOCAB, (2, rate - 1))
    logits, _ = model(idx, idx)
    assert logits.shape == (2, rate - 1, VOCAB) and torch.isfinite(logits).all()
    assert model.transformer.h[1].attn.compress(model.transformer.wte(idx), None).shape[1] == 0


def test_a_compiled_decoding_step_of_compressed_layers_is_one_graph():
    """The decoding step writes its window's slot and entry in place at tensor positions: dynamo traces it whole (its
    'eager' backend: the graph without inductor's code), one graph for every position, and it decodes what the eager
    step does, past block_size."""
    import torch._dynamo
    model = randomized(build(**ATTN, **CSA_FLAGS, sliding_window=5, layers='LHI', n_layer=3, hca_rate=3,
                             mlp='swiglu', hc_mult=4), 26, scale=0.2)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(27))
    eager = model.generate(prompt, 2 * BLOCK, temperature=0.0)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.compile_decoding(backend='eager')  # without experts: a full graph (an MoE reads its counts on the host)
        assert torch.equal(model.generate(prompt, 2 * BLOCK, temperature=0.0), eager)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
    finally:
        torch._dynamo.reset()


def test_the_cache_keeps_the_window_the_entries_and_the_pending_tokens():
    """Per sequence and layer, in numbers: a sliding layer its window W of the one head (hs); an HCA layer that, an
    entry per m tokens and the m pending tokens' candidates and gates; a CSA layer that, its entries and the
    indexer's (d wide), both halves of the pending tokens' and the last complete window's first halves:
    W hs + ceil(L / m) (hs + d) + 6 m (hs + d)."""
    model = build(**COMPRESSED)
    hs, W, d = HEAD, 5, 8
    for B, L in ((1, BLOCK), (2, 9)):
        sliding, hca = W * hs, W * hs + math.ceil(L / 3) * hs + 2 * 3 * hs
        csa = W * hs + math.ceil(L / 2) * (hs + d) + 6 * 2 * (hs + d)
        assert model.kv_cache_bytes(B, L) == B * 4 * (sliding + hca + csa)


def test_the_indexer_learns_from_its_own_loss_alone():
    """Its inputs are detached: the KL loss moves the indexer and nothing else, the language model's loss
    everything but the indexer (whose picks have no gradient)."""
    grads = {}
    for coef in (0.0, 1.0):
        model = randomized(build(**{**CSA, 'csa_index_loss_coef': coef}), 24, scale=0.2).train()
        idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(25))
        model(idx, idx)[1].backward()
        grads[coef] = {n: p.grad for n, p in model.named_parameters()}
    indexer = [n for n in grads[0.0] if '.indexer.' in n]
    assert indexer and all(grads[0.0][n] is None and grads[1.0][n].abs().sum() > 0 for n in indexer)
    for n, g in grads[0.0].items():
        if n not in indexer:
            assert_close(grads[1.0][n], g, atol=0)


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
                                       {'hash_moe_layers': 1}, HCA, CSA, dict(CSA, csa_index_loss_coef=0.0),
                                       dict(CSA, q_rank=None)],
                         ids=['v4', 'plain-projections', 'hash', 'hca', 'csa', 'csa-indexer-not-learning',
                              'csa-plain-queries'])
def test_flops_per_token_equals_the_counted_flops(overrides, monkeypatch):
    """As torch counts them: the compressed layers' entries (all of a sequence's, as training reads them, masked),
    CSA's indexer forward and, learning, backward and its target."""
    model = build(**{**V4, **overrides})
    T = 5  # the window: the explicit attention computes what a window masks
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(12))
    assert model.flops_per_token(seq_len=T) * 2 * T == counted_training_flops(model, idx, monkeypatch)


@pytest.mark.parametrize('flags', [V4, COMPRESSED], ids=['sliding', 'three-kinds'])
def test_a_deepseek_v4_model_trains(flags):
    assert losses_fall(train_a_few_steps(build(**flags)))


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
    (dict(hca_rate=4), "hca_rate=4 apply to heavily compressed layers ('H') and layers=None has none"),
    (dict(csa_topk=8), "csa_topk=8 apply to compressed sparse layers ('I')"),
    (dict(layers='LH', sliding_window=4), "has compressed layers ('H', 'I'), which pool DeepSeek-V4's one key-value "
                                          "head: set attn='shared_kv'"),
    (dict(ATTN, layers='I', csa_index_dim=4), 'csa_index_dim (4) must be at least the rotated width of a head (6)'),
    (dict(hca_rate=0), 'hca_rate must be a positive int'),
    # a rate past block_size forms no entry: the layer would be plain windowed attention, its compressor untrained
    (dict(ATTN, layers='HG'), "hca_rate=128 is above block_size (16): the heavily compressed layers ('H') would "
                              "never complete a window"),
    (dict(ATTN, layers='IG', csa_rate=64), "csa_rate=64 is above block_size (16)"),
    (dict(csa_index_loss_coef=float('inf')), 'csa_index_loss_coef must be a number >= 0'),
], ids=config_id)
def test_bad_deepseek_v4_settings_are_one_line(overrides, fragment):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert fragment in str(e.value) and '\n' not in str(e.value), str(e.value)


@torch.no_grad()
def test_gpt_oss_all_clamps_the_shared_experts_and_dense_mlps_in_gpt_oss_form():
    """swiglu_form='gpt-oss_all' (MiniMax-M3): the routed experts as moe.py's, and the shared experts and the dense
    first layer's MLP with gpt-oss's clamp: g * sigmoid(1.702 g) * (clamp(up) + 1), g = min(gate, L)."""
    model = build(0, norm='rms', pos='rope', bias=False, mlp='moe', n_expert=4, n_expert_active=2,
                  n_shared_expert=1, first_dense_layers=1, swiglu_limit=0.5, swiglu_form='gpt-oss_all')
    dense, mlp = model.transformer.h[0].mlp, model.transformer.h[1].mlp
    assert type(dense) is v4.ClampedGatedMLP and type(mlp) is v4.DeepseekV4MoE
    assert type(mlp.shared) is v4.ClampedGatedMLP and type(mlp.experts) is moe.Experts
    x = torch.randn(3, N_EMBD)
    gate, up = dense.c_fc(x).chunk(2, dim=-1)
    g = gate.clamp(max=0.5)
    torch.testing.assert_close(dense(x), dense.c_proj(g * torch.sigmoid(1.702 * g) * (up.clamp(-0.5, 0.5) + 1)))


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
def test_compressed_layers_train_under_half_precision_autocast(dtype):
    """CSA's indexer loss takes the attention's logits over the entries in fp32 after autocast's half-precision
    matmul: in fp16 the floor of the entries not read overflowed to -inf, a row reading none was nan, and so the
    loss; HCA, CSA, hash routing and the V4 MoE under both half precisions."""
    check_autocast_backward(build(**COMPRESSED), dtype)
