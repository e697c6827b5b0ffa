"""Tests for chapters/sparse_attention.py, DeepSeek Sparse Attention (index_topk): the lightning indexer's scores
and its causal top-k, k >= the length being dense attention, decoding through the cache that reads k entries a
step, the indexer's KL loss (the indexer alone learns from it), its log in log.jsonl, resume, accounting, bad
settings and export (tiny random models); GLM-5's IndexCache (index_share)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import generate as G
import model as M
from chapters import sparse_attention  # noqa: E402
from chapters import GPT, GPTConfig
from tiny_models import (BLOCK, VOCAB, assert_close, build, check_autocast_backward, check_causal, counted_training_flops,
                         tiny_config)
from test_train import MODERN, iter_losses, log_records, run, workdir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures('single_thread')

# DSA over each attention it combines with: MHA, GQA, MLA with a query bottleneck (DeepSeek's and GLM's) and
# without one; a top-k well below BLOCK, so the choice matters
KINDS = {'mha': dict(pos='rope'), 'gqa': dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2),
         'mla': dict(pos='rope', attn='mla', q_lora_rank=8), 'mla-direct': dict(pos='rope', attn='mla'),
         'learned': dict()}
SPARSE = dict(index_topk=4, index_n_heads=2, index_head_dim=16)


def test_weighted_relu_scores_backward_is_autograds():
    """WeightedReluScores' backward written out: a gradcheck in float64, and against autograd's through the plain
    form (dots scaled, ReLU'd, weighted, summed over heads) with a query row whose dots are exactly 0 (ReLU's kink,
    where both take the gradient 0); the forward equal to the plain form."""
    g = torch.Generator().manual_seed(3)
    B, T, H, S, D = 2, 3, 2, 5, 4
    q = torch.randn(B, T * H, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, S, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    scores = lambda q, k, w: sparse_attention.WeightedReluScores.apply(q, k, w, 0.5)
    assert torch.autograd.gradcheck(scores, (q, k, w))
    plain = lambda q, k, w: (F.relu(q @ k.transpose(1, 2) * 0.5).view(B, T, H, S) * w.unsqueeze(-1)).sum(2)
    kinked = q.detach().clone()
    kinked[0, 0] = 0
    kinked.requires_grad_()
    out = torch.randn(B, T, S, generator=g, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad((scores(kinked, k, w) * out).sum(), (kinked, k, w)),
                         torch.autograd.grad((plain(kinked, k, w) * out).sum(), (kinked, k, w))):
        assert_close(got, want, atol=1e-12)
    assert_close(scores(q, k, w), plain(q, k, w), atol=1e-12)


def test_weighted_relu_scores_backward_under_bf16_autocast():
    """Under autocast (bf16 on a CPU) the forward's matmuls run in half precision while q, k and w stay fp32: the
    backward hands each its gradient, in its dtype, close to autograd's through the plain form under autocast."""
    g = torch.Generator().manual_seed(4)
    B, T, H, S, D = 2, 3, 2, 5, 4
    q, k, w = (torch.randn(*shape, generator=g, requires_grad=True) for shape in ((B, T * H, D), (B, S, D), (B, T, H)))
    plain = lambda q, k, w: (F.relu(q @ k.transpose(1, 2) * 0.5).view(B, T, H, S) * w.unsqueeze(-1)).sum(2)
    out = torch.randn(B, T, S, generator=g)
    grads = []
    for scores in (lambda q, k, w: sparse_attention.WeightedReluScores.apply(q, k, w, 0.5), plain):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            loss = (scores(q, k, w).float() * out).sum()
        grads.append(torch.autograd.grad(loss, (q, k, w)))
    for got, want, t in zip(*grads, (q, k, w)):
        assert got.dtype == t.dtype
        torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)


def sparse(kind, seed=0, **overrides):
    return build(seed, **{**KINDS[kind], **SPARSE, **overrides})


def dense_twin(model):
    """The same model without indexers: the dense attention of the same weights."""
    flags = {k: v for k, v in vars(model.config).items() if not k.startswith('index_')}
    twin = GPT(GPTConfig(**flags)).eval()
    missing, unexpected = twin.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all('.indexer.' in k for k in unexpected)
    return twin


def tokens(B, T, seed):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
@pytest.mark.parametrize('kind', KINDS)
def test_top_k_at_least_the_length_is_dense_attention_and_less_is_not(kind):
    model = sparse(kind, index_topk=BLOCK)
    idx = tokens(2, BLOCK, 1)
    dense = dense_twin(model)(idx)[0]
    assert torch.equal(model(idx)[0], dense)
    model = sparse(kind)
    assert not torch.allclose(model(idx)[0], dense, atol=1e-3)
    # the first index_topk queries see no more than k keys: sparse or not, the same
    assert torch.equal(model(idx)[0][:, :SPARSE['index_topk']], dense[:, :SPARSE['index_topk']])


def indexer_reference(indexer, x, q_in, cos, sin):
    """score(t, s) = sum_h w_h(t) ReLU(q_h(t).k(s)) / sqrt(D), written out token by token."""
    H, D = indexer.n_head, indexer.head_dim
    q = indexer.wq(q_in).view(*q_in.shape[:2], H, D)
    k = F.layer_norm(indexer.wk(x), (D,), indexer.k_norm.weight, indexer.k_norm.bias, 1e-6)
    r = cos.size(-1)

    def rotate(v, t):  # pairs (i, i + r/2) of the first r dims
        half = torch.cat((-v[..., r // 2:r], v[..., :r // 2]), dim=-1)
        return torch.cat((v[..., :r] * cos[t] + half * sin[t], v[..., r:]), dim=-1)
    w = indexer.weights(x) * H ** -0.5
    B, T, _ = x.shape
    out = torch.zeros(B, T, T)
    for b in range(B):
        for t in range(T):
            for s in range(T):
                dots = torch.stack([rotate(q[b, t, h], t) @ rotate(k[b, s], s) for h in range(H)])
                out[b, t, s] = (w[b, t] * F.relu(dots * D ** -0.5)).sum()
    return out


@torch.no_grad()
def test_indexer_scores_are_weighted_relu_dot_products_with_partial_rope():
    model = sparse('mla', qk_rope_head_dim=4)
    indexer = model.transformer.h[0].attn.indexer
    x, q_in = torch.randn(1, 5, 32), torch.randn(1, 5, 8)
    cos, sin = model.transformer.wpe(x, 0)[1]
    assert cos.size(-1) == 4 < indexer.head_dim  # the indexer rotates only its first dims
    assert_close(indexer.scores(x, q_in, (cos, sin), None), indexer_reference(indexer, x, q_in, cos, sin), atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize('kind', ['gqa', 'mla'])
def test_each_query_reads_its_top_k_past_keys_only(kind):
    model = sparse(kind)
    attn = model.transformer.h[1].attn
    x, T, k = torch.randn(2, BLOCK, 32), BLOCK, SPARSE['index_topk']
    q_in = attn.q_a_norm(attn.q_a(x)) if kind == 'mla' else x
    mask, _ = attn.indexer.narrow(x, q_in, None, True, None, torch.zeros(2, 1, T, 1))
    reads = mask[:, 0]
    assert not reads.triu(1).any()  # causal
    assert reads.sum(-1).tolist() == [[min(t + 1, k) for t in range(T)]] * 2
    scores = attn.indexer.scores(x, q_in, None, None).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(),
                                                                   float('-inf'))
    for b, t in zip(range(2), range(k, T)):  # the keys read are the k best of the past
        assert scores[b, t][reads[b, t]].min() >= scores[b, t][~reads[b, t]].max()
    check_causal(model)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize('k', [1, 3, 8, 20])
def test_top_k_picks_what_a_stable_sort_picks_ties_to_the_earliest(k, dtype):
    """Scores with many ties (ReLU zeros, -0.0 beside 0.0, masked keys' -inf, rounded values of both signs, +inf):
    the k picked per row are a stable descending sort's first k, also when fewer than k keys score above -inf."""
    g = torch.Generator().manual_seed(k)
    scores = torch.randn(3, 7, 20, generator=g).mul(2).round() * (torch.rand(3, 7, 20, generator=g) < 0.5)
    scores = scores.masked_fill(torch.rand(3, 7, 20, generator=g) < 0.3, float('-inf')).to(dtype)
    scores[0, 0, :] = float('-inf')  # a row with nothing to read
    scores[1, 1, 3], scores[1, 2, 5:9] = float('inf'), -0.0
    assert (scores == 0).any() and torch.signbit(scores[scores == 0]).any()  # some zeros are -0.0
    picked = sparse_attention.top_k_earliest(scores, k)
    expected = torch.zeros_like(picked).scatter_(-1, scores.sort(dim=-1, descending=True, stable=True).indices[..., :k],
                                                 True)
    assert torch.equal(picked, expected) and (picked.sum(-1) == k).all()
    indices = sparse_attention.top_k_earliest_indices(scores, k).sort(-1).values
    assert torch.equal(indices, picked.nonzero()[:, -1].view(3, 7, k))
    hidden = torch.rand(7, 20, generator=g) < 0.4  # broadcast over the batch, as a causal mask is
    expected = sparse_attention.top_k_earliest(scores.masked_fill(hidden, float('-inf')), k)
    assert torch.equal(sparse_attention.top_k_earliest(scores, k, hidden=hidden), expected)
    assert k == scores.size(-1) or not torch.equal(expected, picked)  # else the hidden scores would be picked


@torch.no_grad()
@pytest.mark.parametrize('kind', KINDS)
def test_cached_decoding_equals_uncached_past_block_size(kind):
    model = sparse(kind)
    prompt = tokens(2, 5, 2)
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0),
                       model.generate(prompt, 3 * BLOCK, temperature=0, use_cache=False))


@torch.no_grad()
@pytest.mark.parametrize('kind', ['gqa', 'mla'])
def test_a_decoding_step_reads_k_entries_and_gives_the_full_forwards_logits(kind, monkeypatch):
    model = sparse(kind)
    seq = tokens(2, BLOCK, 3)
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    model(seq[:, :3], cache=cache)
    read = []
    attend = M.attend
    monkeypatch.setattr(M, 'attend', lambda q, k, *a, **kw: read.append(k.size(2)) or attend(q, k, *a, **kw))
    for i in range(3, BLOCK):
        logits = G.decode_step(model, seq[:, i:i + 1], cache.position, cache.stores, cache.features)
        cache.advance(1)
        assert read[-2:] == [SPARSE['index_topk']] * 2  # each layer reads k of the BLOCK slots
        assert_close(logits, model(seq[:, :i + 1])[0][:, -1], atol=2e-5)


@torch.no_grad()
def test_an_indexer_on_nope_layers_with_llama4s_temperature_rotates_nothing():
    """'N' layers with nope_temperature read query scales, not rotary tables: their indexer turns nothing (it once
    took the scales for tables and failed)."""
    model = sparse('mha', layers='NG', nope_temperature=0.1, nope_temperature_floor=4)
    x = torch.randn(1, 6, 32)
    indexer = model.transformer.h[0].attn.indexer
    assert torch.equal(indexer.scores(x, x, torch.full((6,), 2.0), None), indexer.scores(x, x, None, None))
    check_causal(model)
    prompt = tokens(2, 5, 2)
    assert torch.equal(model.generate(prompt, 2 * BLOCK, temperature=0),
                       model.generate(prompt, 2 * BLOCK, temperature=0, use_cache=False))


def test_the_cache_keeps_the_indexers_keys():
    model = sparse('gqa')
    dense = dense_twin(model)
    extra = 2 * BLOCK * 2 * SPARSE['index_head_dim'] * 4  # batch 2, BLOCK positions, 2 layers, fp32
    assert model.kv_cache_bytes(2, BLOCK) == dense.kv_cache_bytes(2, BLOCK) + extra
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert cache.stores[0]['index_k'].shape == (2, 1, BLOCK, SPARSE['index_head_dim'])


@pytest.mark.parametrize('kind, coef', [('gqa', 1.0), ('mla', 1.0), ('gqa', 0.0)])
def test_flops_per_token_counts_the_indexer(kind, coef, monkeypatch):
    model = sparse(kind, index_loss_coef=coef)
    idx = tokens(2, 12, 4)
    assert model.flops_per_token(seq_len=12) * 2 * 12 == counted_training_flops(model, idx, monkeypatch)
    assert model.flops_per_token(seq_len=12) > dense_twin(model).flops_per_token(seq_len=12)


def kl_reference(model, idx, layer):
    """The KL from the main attention's head-summed distribution to the indexer's, over the keys read, by hand."""
    captured = {}
    attn = model.transformer.h[layer].attn
    learn = attn.indexer.learn

    def capture(q, k, scale):
        captured.update(q=q, k=k, reads=attn.indexer._reads, scores=attn.indexer._scores)
        return learn(q, k, scale)
    attn.indexer.learn = capture
    model(idx, idx)
    del attn.indexer.learn
    q, k, reads = captured['q'], captured['k'].repeat_interleave(2, dim=1), captured['reads']
    p = ((q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5).masked_fill(~reads[:, None], float('-inf')).softmax(-1)
    p = p.sum(1) / p.sum(1).sum(-1, keepdim=True)
    log_q = captured['scores'].masked_fill(~reads, float('-inf')).log_softmax(-1)
    terms = torch.where(reads & (p > 0), p * (p.log() - log_q), torch.zeros_like(p))
    return terms.sum(-1).mean()


def test_the_indexers_kl_loss_joins_training_and_moves_the_indexer_alone():
    idx = tokens(2, BLOCK, 5)
    grads = {}
    for coef in (0.0, 0.5):
        model = sparse('gqa', index_loss_coef=coef)
        model.train()
        logits, loss = model(idx, idx)
        main = F.cross_entropy(logits.view(-1, VOCAB), idx.view(-1))
        kls = [m.loss for m in sparse_attention.indexers(model)]
        if coef:
            assert_close(kls[1].detach(), kl_reference(model, idx, 1).detach(), atol=1e-6)
            assert_close(loss, main + coef * sum(kls) / 2, atol=1e-6)
        else:
            assert kls == [None, None] and torch.equal(loss, main)
        loss.backward()
        grads[coef] = {n: p.grad for n, p in model.named_parameters()}
    for name, grad in grads[0.0].items():
        if '.indexer.' in name:  # without its loss the indexer does not learn; with it, only the indexer moves
            assert grad is None and grads[0.5][name].abs().sum() > 0, name
        else:
            assert torch.equal(grad, grads[0.5][name]), name
    model.eval()
    model(idx, idx)
    assert all(m.loss is None for m in sparse_attention.indexers(model))  # evaluation: the main loss alone


def trained(coef, stage, steps=25):
    """A tiny DSA model after some AdamW steps on a fixed batch, and its losses."""
    torch.manual_seed(0)
    model = GPT(tiny_config(**KINDS['gqa'], **SPARSE, index_stage=stage, index_loss_coef=coef))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = tokens(4, BLOCK + 1, 6)
    losses = []
    for _ in range(steps):
        _, loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    for m in sparse_attention.indexers(model):  # measure the KL of either model
        m.loss_coef = 1.0
    sparse_attention.index_loss_and_reset(model)
    model(data[:, :-1], data[:, 1:])
    return losses, sparse_attention.index_loss_and_reset(model)


@pytest.mark.parametrize('stage', ['dense', 'sparse'])
def test_training_lowers_the_loss_and_the_indexer_learns_the_attention(stage):
    losses, kl = trained(1.0, stage)
    untrained_losses, untrained_kl = trained(0.0, stage)
    assert losses[-1] < losses[0] - 1.0 and untrained_losses[-1] < untrained_losses[0] - 1.0
    assert kl < 0.5 * untrained_kl


@torch.no_grad()
def test_the_dense_stage_reads_every_key():
    model = sparse('gqa', index_stage='dense')
    idx = tokens(2, BLOCK, 7)
    assert torch.equal(model(idx)[0], dense_twin(model)(idx)[0])


def straight_and_resumed(workdir, run, *args):
    """train.py for 8 iterations into a, and for 4 then resumed for 4 more into b: the same losses at every
    iteration (asserted); the log records of a and of b."""
    straight = run(workdir, '--eval_interval=4', *MODERN, *args, '--max_iters=8', '--out_dir=a')
    run(workdir, '--eval_interval=4', *MODERN, *args, '--max_iters=4', '--out_dir=b')
    resumed = run(workdir, '--eval_interval=4', *MODERN, *args, '--max_iters=8', '--out_dir=b', '--init_from=resume')
    a, b = iter_losses(straight.stdout), iter_losses(resumed.stdout)
    assert sorted(b) == list(range(5, 9)) and {k: a[k] for k in b} == b
    return log_records(workdir / 'a'), log_records(workdir / 'b')


def test_training_logs_the_index_loss_apart_and_resumes_exactly(workdir, run):
    records, resumed = straight_and_resumed(workdir, run, '--index_topk=4', '--index_n_heads=2', '--index_head_dim=16')
    assert 'index_loss' not in records[0] and all(r['index_loss'] > 0 for r in records[1:])
    assert records[-1]['index_loss'] == resumed[-1]['index_loss']


@pytest.mark.parametrize('flags, fragment', [
    (dict(index_n_heads=8), "index_n_heads=8 apply to sparse attention only: set index_topk"),
    (dict(index_topk=0), "index_topk must be None or a positive int, got 0"),
    (dict(index_topk=4, index_stage='warm'), "index_stage must be one of 'dense', 'sparse', got 'warm'"),
    (dict(index_topk=4, index_loss_coef=-1.0), "index_loss_coef must be a number >= 0, got -1.0"),
    (dict(index_topk=4, index_head_dim=4, pos='rope', head_dim=16), "index_head_dim (4) must be at least the rotated"),
    (dict(index_topk=4, layers='L', sliding_window=4), "index_topk=4 picks keys in global attention layers"),
    (dict(index_norm_eps=1e-5), "index_norm_eps=1e-05 apply to sparse attention only: set index_topk"),
    (dict(index_topk=4, index_norm_eps=0.0), "index_norm_eps must be a positive number, got 0.0"),
])
def test_bad_sparse_settings_are_one_line_each(flags, fragment):
    with pytest.raises(ValueError) as e:
        tiny_config(**flags)
    assert fragment in str(e.value) and '\n' not in str(e.value)


@torch.no_grad()
def test_the_key_norms_epsilon_is_index_norm_eps():
    """The indexer's key LayerNorm takes index_norm_eps (HY-V4 gives it the model's rms_norm_eps): on keys
    projected tiny, where the epsilon dominates the variance, its keys and scores are not the default's."""
    model, default = sparse('gqa', index_norm_eps=1e-2), sparse('gqa')
    assert {block.attn.indexer.k_norm.eps for block in model.transformer.h} == {1e-2}
    indexer, other = model.transformer.h[0].attn.indexer, default.transformer.h[0].attn.indexer
    other.load_state_dict(indexer.state_dict())
    x = torch.randn(1, 6, model.config.n_embd, generator=torch.Generator().manual_seed(5))
    indexer.wk.weight.mul_(1e-2)
    other.wk.weight.mul_(1e-2)
    assert (indexer.keys(x, None, None) - other.keys(x, None, None)).abs().max() > 0.1


def test_export_refuses_sparse_attention_where_no_family_carries_it():
    from hf import HF_FAMILIES
    config = tiny_config(**KINDS['gqa'], **SPARSE)
    for family in HF_FAMILIES.values():
        if 'index_topk' not in family.carries:
            assert 'index_topk=4' in family.blocking(config)


# ----------------------------------------------------------------------------- GLM-5's IndexCache (index_share)

@torch.no_grad()
@pytest.mark.parametrize('kind', ['gqa', 'mla'])
def test_shared_layers_read_the_keys_the_earlier_indexer_picked(kind, monkeypatch):
    model = sparse(kind, n_layer=3, index_share='FS')  # tiled: F S F
    assert [type(b.attn.indexer).__name__ for b in model.transformer.h] == ['LightningIndexer', 'SharedIndex',
                                                                            'LightningIndexer']
    assert not any(k.startswith('transformer.h.1.attn.indexer') for k in model.state_dict())
    masks = []
    attend = M.attend
    monkeypatch.setattr(M, 'attend', lambda q, k, v, mask, *a, **kw: masks.append(mask) or attend(q, k, v, mask, *a, **kw))
    model(tokens(2, BLOCK, 8))
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    # the shared layer keeps no indexer keys
    own = sparse(kind, n_layer=3)
    assert own.kv_cache_bytes(2, BLOCK) - model.kv_cache_bytes(2, BLOCK) == 2 * BLOCK * SPARSE['index_head_dim'] * 4
    monkeypatch.setattr(M, 'attend', attend)
    prompt = tokens(2, 5, 9)
    assert torch.equal(model.generate(prompt, 3 * BLOCK, temperature=0),
                       model.generate(prompt, 3 * BLOCK, temperature=0, use_cache=False))


def test_shared_layers_add_no_index_loss():
    model = sparse('gqa', n_layer=3, index_share='FS')
    model.train()
    model(tokens(2, BLOCK, 10), tokens(2, BLOCK, 11))
    assert len(sparse_attention.indexers(model)) == 2 and all(m.loss is not None for m in sparse_attention.indexers(model))


@pytest.mark.parametrize('flags, fragment', [
    (dict(index_share='FS'), "index_share='FS' apply to sparse attention only"),
    (dict(index_topk=4, index_share='FX'), "index_share must be None or a string of 'F' (own indexer) and 'S'"),
    (dict(index_topk=4, index_share='SF'), "index_share='SF' marks layer 0 'S' but it has no earlier global layer"),
    (dict(index_topk=4, index_share='FS', layers='GL', sliding_window=4), "marks layer 1 'S'"),
])
def test_bad_index_share_is_one_line(flags, fragment):
    with pytest.raises(ValueError) as e:
        tiny_config(**flags)
    assert fragment in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('kind', ['gqa', 'mla'])
def test_compiled_decoding_of_sparse_attention_is_one_graph(kind):
    """compile_decoding: eager's tokens past a context shift from one graph, the top-k picked and read inside it."""
    from test_generate import assert_compiled_decoding_is_one_graph
    assert_compiled_decoding_is_one_graph(sparse(kind))


# MiniMax-M3's scorer (index_score='dot_per_group') and its dense layers (index_dense_layers), token and block picks
PER_GROUP = dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2, n_layer=3, index_score='dot_per_group',
                 index_dense_layers='DI')
PICKS = {'token': {}, 'block': dict(index_block_size=2)}


@torch.no_grad()
@pytest.mark.parametrize('picks', PICKS)
def test_per_group_picks_each_k_v_group_its_own_keys_through_the_cache(picks, monkeypatch):
    """Each indexer head's plain q.k of normed queries and keys picks for its K/V group: the groups' picks differ;
    a 'D' layer has no indexer; a decoding step reads k entries per K/V head and gives the full forward's logits."""
    model = sparse('gqa', **PER_GROUP, **PICKS[picks])
    assert [b.attn.indexer is None for b in model.transformer.h] == [True, False, True]
    indexer = model.transformer.h[1].attn.indexer
    assert indexer.weights is None and isinstance(indexer.k_norm, nn.RMSNorm) and isinstance(indexer.q_norm, nn.RMSNorm)
    seq = tokens(2, BLOCK, 3)
    model(seq)
    reads = indexer._reads.unflatten(0, (2, 2))  # (B, G, T, S)
    assert not torch.equal(reads[:, 0], reads[:, 1])
    if picks == 'token':  # blocks: a query at its block's start reads 1 key fewer
        assert (reads.sum(-1)[..., 8:] == SPARSE['index_topk']).all()
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    model(seq[:, :3], cache=cache)
    read = []
    attend = M.attend
    monkeypatch.setattr(M, 'attend', lambda q, k, *a, **kw: read.append(tuple(k.shape[1:3])) or attend(q, k, *a, **kw))
    for i in range(3, BLOCK):
        logits = G.decode_step(model, seq[:, i:i + 1], cache.position, cache.stores, cache.features)
        cache.advance(1)
        assert read[-2] == (2, SPARSE['index_topk'])  # the sparse layer: k slots of each K/V head
        assert_close(logits, model(seq[:, :i + 1])[0][:, -1], atol=2e-5)
    prompt = tokens(2, 5, 2)
    assert torch.equal(model.generate(prompt, BLOCK, temperature=0),
                       model.generate(prompt, BLOCK, temperature=0, use_cache=False))


def test_per_group_indexers_learn_from_their_groups_attention():
    """The KL loss of per-group scores joins training and moves the indexer (its inputs detached)."""
    model = sparse('gqa', **PER_GROUP).train()
    idx = tokens(2, BLOCK, 4)
    _, loss = model(idx, idx)
    loss.backward()
    indexer = model.transformer.h[1].attn.indexer
    assert indexer.loss is not None and indexer.wq.weight.grad.abs().sum() > 0


@pytest.mark.parametrize('flags, fragment', [
    (dict(index_topk=4, n_kv_head=2, index_n_heads=4, index_score='dot_per_group'),
     "index_n_heads (4) must equal the K/V heads (2) of attn='mha'"),
    (dict(index_topk=4, index_dense_layers='D'), "index_dense_layers='D' leaves no global layer an indexer"),
    (dict(index_topk=4, index_dense_layers='DX'), "index_dense_layers must be None or a string of 'D'"),
    (dict(index_score='dot_per_group'), "index_score='dot_per_group' apply to sparse attention only"),
    (dict(index_topk=4, n_kv_head=2, index_n_heads=2, index_score='dot_per_group', index_block_size=2,
          index_block_pool='mean', index_tail='keep'), "index_score='dot_per_group' scores tokens per group"),
])
def test_bad_per_group_settings_are_one_line_each(flags, fragment):
    with pytest.raises(ValueError) as e:
        tiny_config(**flags)
    assert fragment in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('kind', ['gqa', 'mla'])
def test_an_indexed_model_trains_under_half_precision_autocast(kind, dtype):
    """The KL loss's floor for the keys not read is finite in every dtype (a fixed -1e30 could not be fp16) and
    the indexer's backward hands fp32 gradients from half-precision matmuls."""
    check_autocast_backward(build(**KINDS[kind], **SPARSE), dtype)


@pytest.mark.parametrize('flags', [{}, PER_GROUP], ids=['weighted', 'per-group'])
def test_the_kl_over_the_picks_is_the_kl_over_every_key(flags, monkeypatch):
    """The sparse stage's KL, gathered to the k picked keys, equals it over all S keys with the rest masked, in
    value and in its gradient to the indexer's scores: both distributions are zero off the picks."""
    learn, pairs = sparse_attention.LightningIndexer.learn, []

    def both(self, q, k, scale):
        learn(self, q, k, scale)
        gathered, picks = self.loss, self._picks
        self._picks = None  # the same reads as a (B, T, S) mask
        learn(self, q, k, scale)
        self._picks = picks
        pairs.append((gathered, self.loss, self._scores))

    monkeypatch.setattr(sparse_attention.LightningIndexer, 'learn', both)
    model = sparse('gqa', **flags).train()
    idx = tokens(2, BLOCK, 8)
    model(idx, idx)
    assert len(pairs) == len(sparse_attention.indexers(model))  # every indexer learned, in its sparse stage
    for gathered, full, scores in pairs:
        assert gathered is not None
        assert_close(gathered, full, atol=1e-6)
        assert_close(*(torch.autograd.grad(kl, scores, retain_graph=True)[0] for kl in (gathered, full)), atol=1e-7)
