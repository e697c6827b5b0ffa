"""Tests for chapters/block_sparse.py, the lightning indexer picking blocks of keys (index_block_size): which keys
each query reads, written out on small score tables for each pooling and tail rule (a forward's mask and a decoding
step's slots), the pooled keys written out, the recent blocks and the tail always read, causality, a decoding step
reading the chosen blocks' slots only, cached == uncached and compiled == eager decoding, block size 1 being token
selection, the KL loss over blocks, FLOPs as torch counts them, the cache's entries, bad settings and export (tiny
random models)."""
import pytest
import torch
import torch.nn.functional as F

import generate as G
import model as M
from chapters import block_sparse, sparse_attention
from test_sparse_attention import dense_twin, tokens
from tiny_models import (BLOCK, assert_close, build, check_autocast_backward, check_causal, counted_training_flops,
                         rope_tables, tiny_config)

pytestmark = pytest.mark.usefixtures('single_thread')

# each family's settings (with the token indexer's scorer); 'max-keep' is no family's, a mix of the rules
FAMILIES = {
    'minimax_m3': dict(index_block_pool='max', index_tail='score', index_local_blocks=1),
    'qwen4_exp': dict(index_block_pool='mean', index_tail='keep', index_local_blocks=0),
    'glm5_next': dict(index_block_pool='learned', index_tail='keep', index_local_blocks=0),
    'max-keep': dict(index_block_pool='max', index_tail='keep', index_local_blocks=1),
}
SPARSE = dict(index_topk=4, index_block_size=2, index_n_heads=2, index_head_dim=16)  # two blocks of 2 per query
KINDS = {'gqa': dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2),
         'mla': dict(pos='rope', attn='mla', q_lora_rank=8), 'learned': dict()}


def blocky(family, kind='gqa', seed=0, **overrides):
    return build(seed, **{**KINDS[kind], **SPARSE, **FAMILIES[family], **overrides})


def read_width(family):
    """The keys a decoding step reads: index_topk, and a kept tail's block - 1."""
    return SPARSE['index_topk'] + (SPARSE['index_block_size'] - 1 if FAMILIES[family]['index_tail'] == 'keep' else 0)


# ----------------------------------------------------------------------------- the selection, written out

TOKEN_SCORES = [5., 0., 1., 7., 2., 2., 9., 3.]  # each key's score, whatever the query (max-pooled per block)
POOLED_SCORES = [3., 1., 2., 0.]  # each finished block's (pooled keys)
# (pooling, tail, recent blocks) -> the keys query t = 0..7 reads, in blocks of 2, two blocks per query
READS = {
    # MiniMax-M3: a block's score is its best visible token's; the query's own block always read
    ('max', 'score', 1): [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [2, 3, 4], [2, 3, 4, 5], [2, 3, 6], [2, 3, 6, 7]],
    # without it, query 4 and 5 read the two best earlier blocks and not themselves
    ('max', 'score', 0): [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [2, 3, 6], [2, 3, 6, 7]],
    # the tail kept: finished blocks only are scored, the unfinished one read beyond them (query 5 finishes
    # block 2, which then competes, and loses)
    ('max', 'keep', 0): [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3], [0, 1, 2, 3, 6],
                         [2, 3, 6, 7]],
    ('max', 'keep', 1): [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], [2, 3, 4, 5], [2, 3, 4, 5, 6],
                         [2, 3, 6, 7]],
    # Qwen4-Exp, GLM-5.3-Flash: pooled keys score the finished blocks 3, 1, 2, 0
    ('mean', 'keep', 0): [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 4, 5], [0, 1, 4, 5, 6],
                          [0, 1, 4, 5]],
    ('learned', 'keep', 1): [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 4, 5], [0, 1, 4, 5, 6],
                             [0, 1, 6, 7]],
}


def fixed_scores(pool):
    """An indexer's weigh giving the table's scores to every query: a key's ('max'), a finished block's."""
    table = torch.tensor(TOKEN_SCORES if pool == 'max' else POOLED_SCORES)
    return lambda q, w, k: table[:k.size(2)].expand(q.size(0), q.size(2), -1)


@torch.no_grad()
@pytest.mark.parametrize('pool, tail, local', READS)
def test_each_query_reads_the_blocks_written_out(pool, tail, local):
    """A forward's mask, a decoding step's slots over a cache's written positions (generate's general path) and
    over all of its slots (the compiled step's): the same keys, the table's."""
    model = build(**SPARSE, index_block_pool=pool, index_tail=tail, index_local_blocks=local)
    attn = model.transformer.h[0].attn
    attn.indexer.weigh = fixed_scores(pool)
    x = torch.randn(1, 8, 32)
    mask, _ = attn.indexer.narrow(x, x, None, True, None, torch.zeros(1, 1, 8, 1))
    assert [row.nonzero().flatten().tolist() for row in mask[0, 0]] == READS[pool, tail, local]
    for full in (False, True):
        cache = G.KVCache(model, 1, 8, torch.float32, torch.device('cpu'))
        for t in range(8):
            step = G.DecodingStep(cache.stores, cache.position, cache.features) if full else cache
            S = 8 if full else t + 1
            seen, slots = attn.indexer.narrow(x[:, t:t + 1], x[:, t:t + 1], None, step.mask(0, attn, 1, x.device),
                                              step[0], torch.arange(float(S)).view(1, 1, S, 1))
            seen = torch.ones(S, dtype=torch.bool) if seen is None else seen.flatten()  # None: every key (k >= S)
            read = slots.flatten().long()[seen].tolist()
            assert read == READS[pool, tail, local][t], (full, t)
            cache.advance(1)


@torch.no_grad()
@pytest.mark.parametrize('family', ['qwen4_exp', 'glm5_next'])
def test_pooled_keys_are_written_out(family):
    """'mean': the tokens' projected keys averaged, then the indexer's norm; 'learned': per channel, a softmax over
    the block of the gate plus the position term weighs the normalized keys; both turned at the block's first
    position (the first rope_dim = 8 of their 16 dims)."""
    model = blocky(family)
    indexer = model.transformer.h[0].attn.indexer
    g = torch.Generator().manual_seed(3)
    for p in [indexer.k_norm.weight, indexer.k_norm.bias] + ([indexer.pool_pos] if family == 'glm5_next' else []):
        p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(1, 9, 32, generator=g)
    cos, sin = rope_tables(model.transformer.wpe, 0, 9)
    keys = indexer.finished_keys(indexer.ingredients(x, (cos, sin), None), torch.arange(9), None, False)
    assert keys.shape == (1, 1, 4, 16)  # four finished blocks of the nine tokens
    norm = lambda k: F.layer_norm(k, (16,), indexer.k_norm.weight, indexer.k_norm.bias, 1e-6)
    for b in range(4):
        tokens_ = x[0, 2 * b:2 * b + 2]
        if family == 'qwen4_exp':
            key = norm(indexer.wk(tokens_).mean(0))
        else:
            weights = (tokens_ @ indexer.pool_gate.weight.T + indexer.pool_pos).softmax(0)
            key = (weights * norm(indexer.wk(tokens_))).sum(0)
        c, s = cos[2 * b], sin[2 * b]  # pairs (i, i + 4) of the first 8 dims turn
        turned = torch.cat((key[:8] * c + torch.cat((-key[4:8], key[:4])) * s, key[8:]))
        assert_close(keys[0, 0, b], turned, atol=1e-6)


QSA = dict(index_q_norm=True, index_k_norm='rms', index_head_weights=False, index_n_heads=4)


@torch.no_grad()
@pytest.mark.parametrize('seed', [0, 1])
def test_qsa_picks_as_transformers_qwen4_exp_indexer(seed):
    """Qwen4-Exp's QSA (index_block_pool='mean', index_tail='keep', index_q_norm, index_k_norm='rms', no head
    weights): the keys each query reads equal Qwen4ExpTextQSAIndexer's on the same weights (its index_qk_proj
    our wq and wk stacked, its norms' gains 1 + w), the first rope_dim of 16 dims rotated; and each of the three
    switches, undone, changes the picks."""
    transformers = pytest.importorskip('transformers')
    from transformers.models.qwen4_exp import modeling_qwen4_exp as Q4
    model = blocky('qwen4_exp', seed=seed, **QSA, index_norm_eps=1e-5)
    indexer = model.transformer.h[0].attn.indexer
    g = torch.Generator().manual_seed(seed + 20)
    for p in indexer.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() > 1 else 1.0))
    config = transformers.Qwen4ExpTextConfig(
        hidden_size=32, head_dim=8, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4, indexer_compress_ratio=2,
        num_experts=2, num_experts_per_tok=1)
    theirs = Q4.Qwen4ExpTextQSAIndexer(config, layer_idx=0)
    theirs.index_qk_proj.weight.copy_(torch.cat((indexer.wq.weight, indexer.wk.weight)))
    theirs.q_layernorm.weight.copy_(indexer.q_norm.weight - 1)
    theirs.k_layernorm.weight.copy_(indexer.k_norm.weight - 1)
    B, T = 2, 24
    x = torch.randn(B, T, 32, generator=g)
    _, (cos, sin) = model.transformer.wpe(x, 0)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = theirs(x, (cos.expand(B, -1, -1), sin.expand(B, -1, -1)), causal.expand(B, 1, T, T), None)
    mask, _ = indexer.narrow(x, x, (cos, sin), True, None, torch.zeros(B, 1, T, 1))
    assert expected.any(-1).all() and torch.equal(mask, expected)
    for undone in (dict(index_q_norm=False), dict(index_k_norm='layernorm'), dict(index_head_weights=True)):
        other = blocky('qwen4_exp', seed=seed, **{**QSA, **undone}, index_norm_eps=1e-5)
        other_indexer = other.transformer.h[0].attn.indexer
        other_indexer.load_state_dict(indexer.state_dict(), strict=False)
        if 'index_head_weights' in undone:
            other_indexer.weights.weight.copy_(torch.randn(other_indexer.weights.weight.shape, generator=g))
        assert not torch.equal(other_indexer.narrow(x, x, (cos, sin), True, None, torch.zeros(B, 1, T, 1))[0],
                               expected), undone


# ----------------------------------------------------------------------------- the rules, on learned scores

@torch.no_grad()
@pytest.mark.parametrize('family', FAMILIES)
def test_recent_blocks_and_the_tail_are_always_read_and_nothing_later(family):
    model = blocky(family, n_layer=1)
    indexer, rules = model.transformer.h[0].attn.indexer, FAMILIES[family]
    x = torch.randn(2, BLOCK, 32)
    mask, _ = indexer.narrow(x, x, None, True, None, torch.zeros(2, 1, BLOCK, 1))
    reads, keep, local = mask[:, 0], rules['index_tail'] == 'keep', rules['index_local_blocks']
    assert not reads.triu(1).any()  # causal
    for t in range(BLOCK):
        finished = (t + 1) // 2
        always = set(range(2 * finished, t + 1)) if keep else set()  # the unfinished block
        last = finished - 1 if keep else t // 2  # the latest block it scores
        always |= {s for b in range(max(0, last - local + 1), last + 1) for s in (2 * b, 2 * b + 1) if s <= t}
        for row in reads[:, t]:
            read = set(row.nonzero().flatten().tolist())
            assert always <= read and len(read) <= read_width(family)
    check_causal(model)


@torch.no_grad()
@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('kind', KINDS)
def test_cached_decoding_equals_uncached_past_block_size(family, kind):
    model = blocky(family, kind)
    prompt = tokens(2, 5, 2)
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0),
                       model.generate(prompt, 3 * BLOCK, temperature=0, use_cache=False))


@torch.no_grad()
@pytest.mark.parametrize('family', FAMILIES)
def test_a_decoding_step_reads_the_chosen_blocks_and_gives_the_full_forwards_logits(family, monkeypatch):
    model = blocky(family, 'mla' if family == 'glm5_next' else 'gqa')
    seq = tokens(2, BLOCK, 3)
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    model(seq[:, :5], cache=cache)  # a prefill that ends inside a block
    read, attend = [], M.attend
    monkeypatch.setattr(M, 'attend', lambda q, k, *a, **kw: read.append(k.size(2)) or attend(q, k, *a, **kw))
    for i in range(5, BLOCK):
        logits = G.decode_step(model, seq[:, i:i + 1], cache.position, cache.stores, cache.features)
        cache.advance(1)
        assert read[-2:] == [read_width(family)] * 2  # each layer reads the blocks' slots, of the BLOCK cached
        assert_close(logits, model(seq[:, :i + 1])[0][:, -1], atol=2e-5)


@torch.no_grad()
@pytest.mark.parametrize('family', ['minimax_m3', 'glm5_next'])
def test_shared_layers_read_the_blocks_the_earlier_indexer_picked(family):
    model = blocky(family, n_layer=3, index_share='FS')
    assert type(model.transformer.h[1].attn.indexer).__name__ == 'SharedIndex'
    prompt = tokens(2, 5, 9)
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0),
                       model.generate(prompt, 3 * BLOCK, temperature=0, use_cache=False))


@torch.no_grad()
@pytest.mark.parametrize('family', FAMILIES)
def test_index_topk_at_least_the_length_is_dense_attention(family):
    model = blocky(family, index_topk=BLOCK)
    idx = tokens(2, BLOCK, 1)
    dense = dense_twin(model)(idx)[0]
    assert torch.equal(model(idx)[0], dense)
    assert not torch.allclose(blocky(family)(idx)[0], dense, atol=1e-3)


@torch.no_grad()
def test_blocks_of_one_token_are_token_selection():
    """Max-pooled blocks of 1, no block always read, the tail scored: the token indexer's picks, bit for bit."""
    blocks = build(**KINDS['gqa'], **{**SPARSE, 'index_block_size': 1, 'index_local_blocks': 0})
    token = build(**KINDS['gqa'], **{k: v for k, v in SPARSE.items() if k != 'index_block_size'})
    assert type(blocks.transformer.h[0].attn.indexer) is block_sparse.BlockIndexer
    idx = tokens(2, BLOCK, 4)
    assert torch.equal(blocks(idx)[0], token(idx)[0])
    assert torch.equal(blocks.generate(idx[:, :5], 2 * BLOCK, temperature=0),
                       token.generate(idx[:, :5], 2 * BLOCK, temperature=0))


@pytest.mark.parametrize('family', ['minimax_m3', 'glm5_next'])
def test_compiled_decoding_of_block_selection_is_one_graph(family):
    """compile_decoding: eager's tokens past a context shift from one graph, the blocks picked, pooled and read
    inside it."""
    from test_generate import assert_compiled_decoding_is_one_graph
    assert_compiled_decoding_is_one_graph(blocky(family))


# ----------------------------------------------------------------------------- training, accounting, settings

def block_kl_reference(model, idx, layer):
    """The KL from the main attention's head-summed distribution, summed over each finished block read and
    renormalized, to the softmax of the indexer's block scores over those blocks, query by query; the mean over
    the queries that read a finished block."""
    captured = {}
    attn = model.transformer.h[layer].attn
    learn = attn.indexer.learn

    def capture(q, k, scale):
        captured.update(q=q, k=k, reads=attn.indexer._reads, blocks=attn.indexer._block_reads,
                        scores=attn.indexer._block_scores)
        return learn(q, k, scale)
    attn.indexer.learn = capture
    model(idx, idx)
    del attn.indexer.learn
    q, k, reads = captured['q'], captured['k'].repeat_interleave(2, dim=1), captured['reads']
    p = ((q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5).masked_fill(~reads[:, None], float('-inf')).softmax(-1)
    p = p.sum(1)
    total, rows = 0.0, 0
    for b in range(q.size(0)):
        for t in range(q.size(2)):
            read = captured['blocks'][b, t].nonzero().flatten().tolist()
            if not read:
                continue
            mass = torch.stack([p[b, t, 2 * j:2 * j + 2].sum() for j in read])
            mass = mass / mass.sum()
            log_q = captured['scores'][b, t, read].log_softmax(-1)
            total, rows = total + (mass * (mass.log() - log_q)).sum(), rows + 1
    return total / rows


@pytest.mark.parametrize('family', ['qwen4_exp', 'glm5_next'])
def test_the_kl_loss_over_blocks_joins_training_and_moves_the_indexer_alone(family):
    idx = tokens(2, BLOCK, 5)
    grads = {}
    for coef in (0.0, 0.5):
        model = blocky(family, index_loss_coef=coef)
        model.train()
        logits, loss = model(idx, idx)
        kls = [m.loss for m in sparse_attention.indexers(model)]
        if coef:
            assert_close(kls[1].detach(), block_kl_reference(model, idx, 1).detach(), atol=1e-5)
        loss.backward()
        grads[coef] = {n: p.grad for n, p in model.named_parameters()}
    for name, grad in grads[0.0].items():
        if '.indexer.' in name:  # the pool's gate and position term learn from the KL too
            assert grad is None and grads[0.5][name].abs().sum() > 0, name
        else:
            assert torch.equal(grad, grads[0.5][name]), name


def test_training_the_pooled_indexer_lowers_its_kl():
    def kl_after(coef, steps=20):
        torch.manual_seed(0)
        model = blocky('glm5_next', seed=0, index_loss_coef=coef)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = tokens(4, BLOCK + 1, 6)
        for _ in range(steps):
            model(data[:, :-1], data[:, 1:])[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for m in sparse_attention.indexers(model):
            m.loss_coef = 1.0
        sparse_attention.index_loss_and_reset(model)
        model(data[:, :-1], data[:, 1:])
        return sparse_attention.index_loss_and_reset(model)
    assert kl_after(1.0) < 0.5 * kl_after(0.0)


@pytest.mark.parametrize('family, kind, coef', [(f, 'gqa', 1.0) for f in FAMILIES] + [
    ('minimax_m3', 'gqa', 0.0), ('glm5_next', 'gqa', 0.0), ('qwen4_exp', 'mla', 1.0)])
def test_flops_per_token_counts_the_block_scores(family, kind, coef, monkeypatch):
    """torch's count over 13 tokens: max-pooling scores 13 tokens a query, pooled keys the 6 finished blocks."""
    model = blocky(family, kind, index_loss_coef=coef)
    idx = tokens(2, 13, 4)
    assert model.flops_per_token(seq_len=13) * 2 * 13 == counted_training_flops(model, idx, monkeypatch)


def test_the_cache_keeps_what_blocks_are_pooled_from():
    D = SPARSE['index_head_dim']
    entries = lambda model: model.transformer.h[0].attn.indexer.cache_entries()
    assert entries(blocky('minimax_m3')) == {'index_k': (1, D)}  # the token indexer's keys
    assert entries(blocky('qwen4_exp')) == {'index_k': (1, D), 'index_rot': (1, 8), 'index_pool': (1, D)}
    assert entries(blocky('glm5_next')) == {'index_k': (1, D), 'index_gate': (1, D), 'index_rot': (1, 8),
                                            'index_pool': (1, D)}
    nope = blocky('glm5_next', layers='N')  # GLM-5.3-Flash's: nothing turns, no rotation kept
    assert entries(nope) == {'index_k': (1, D), 'index_gate': (1, D), 'index_pool': (1, D)}
    token = build(**KINDS['gqa'], **{k: v for k, v in SPARSE.items() if k != 'index_block_size'})
    extra = 2 * BLOCK * 2 * (2 * D + 8) * 4  # batch 2, BLOCK positions, 2 layers, fp32: gate, rotation, pool
    assert blocky('glm5_next').kv_cache_bytes(2, BLOCK) == token.kv_cache_bytes(2, BLOCK) + extra


@pytest.mark.parametrize('flags, fragment', [
    (dict(index_block_pool='mean'), "index_block_pool='mean' apply to block selection only: set index_block_size"),
    (dict(index_block_size=4), "index_block_size=4 picks blocks of the keys sparse attention reads: set index_topk"),
    (dict(index_topk=6, index_block_size=4), "index_topk=6 must be a multiple of index_block_size=4"),
    (dict(index_topk=8, index_block_size=4, index_local_blocks=3), "index_local_blocks=3 is more than the 2 blocks"),
    (dict(index_topk=8, index_block_size=4, index_block_pool='learned'),
     "index_block_pool='learned' pools the keys of finished blocks, so the unfinished one has no key to score"),
    (dict(index_topk=8, index_block_size=0), "index_block_size must be None or a positive int, got 0"),
    (dict(index_topk=8, index_block_size=4, index_block_pool='min'), "index_block_pool must be one of 'max', 'mean'"),
    (dict(index_topk=8, index_block_size=4, index_tail='drop'), "index_tail must be one of 'score', 'keep'"),
    (dict(index_topk=8, index_block_size=4, index_local_blocks=-1), "index_local_blocks must be an int >= 0"),
])
def test_bad_block_settings_are_one_line_each(flags, fragment):
    with pytest.raises(ValueError) as e:
        tiny_config(**flags)
    assert fragment in str(e.value) and '\n' not in str(e.value)


def test_export_refuses_block_selection_but_where_glm5_next_minimax_m3_and_qwen4_exp_carry_it():
    from hf import HF_FAMILIES
    config = tiny_config(**KINDS['gqa'], **SPARSE)
    for name, family in HF_FAMILIES.items():
        carried = name in ('glm5_next', 'minimax_m3_vl_text', 'qwen4_exp_text')
        assert ('index_block_size=2' in family.blocking(config)) == (not carried), name


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('family', FAMILIES)
def test_a_block_indexed_model_trains_under_half_precision_autocast(family, dtype):
    """The KL loss over blocks in fp32 whatever autocast gives its matmul: in fp16 the clamp's 1e-30 was 0, and the
    queries that read no finished block yet (the first ones, with the tail kept) made the loss nan."""
    check_autocast_backward(build(**KINDS['gqa'], **SPARSE, **FAMILIES[family]), dtype)
