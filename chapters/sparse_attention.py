"""
Sparse attention: DeepSeek Sparse Attention (DeepSeek-V3.2, 2025; GLM-5). A lightning indexer scores every past
token for each query cheaply (its own few small query heads, one key per token, ReLU'd dot products weighted per
head), and the layer's attention reads only the index_topk highest, so a decoding step reads k entries instead
of the whole context. The indexer learns from its own loss (the KL divergence to the main attention's
distribution, on detached inputs); index_stage='dense' is the warm-up that trains it while attention still reads
every key. GLM-5's IndexCache (index_share): layers marked 'S' reuse the nearest earlier indexer's picks.
Indexers go on the global attention layers of every kind (with MHA or MLA), but those index_dense_layers marks 'D'
(MiniMax-M3 mixes dense and sparse layers). MiniMax-M3's scorer (index_score='dot_per_group'): each indexer head's
plain dot product of RMS-normed queries and keys, each head picking the keys of its own K/V group. Qwen4-Exp's QSA
indexer (with block_sparse's pooled blocks) differs from DeepSeek's in three switches: an RMSNorm on its query
heads (index_q_norm), an RMSNorm, not a LayerNorm, on its keys (index_k_norm='rms'), and every head counted once
instead of weighted per token (index_head_weights=False).
"""

import sys
from dataclasses import dataclass

import torch
import torch.nn as nn

from chapters.attention import bias_of
from model import BOOL, FEATURES, LAYER_KINDS, NON_NEGATIVE_NUMBER, OPTIONAL_POSITIVE_INT, POSITIVE_INT, Feature, \
    apply_rope, changed, flag_list, is_number, kinds, mean_and_reset, one_of

INDEX_STAGES = ('dense', 'sparse')
INDEX_SCORES = ('weighted_relu', 'dot_per_group')
INDEX_K_NORMS = ('layernorm', 'rms')
# with index_topk only
INDEX_FIELDS = ('index_n_heads', 'index_head_dim', 'index_stage', 'index_loss_coef', 'index_share', 'index_norm_eps',
                'index_score', 'index_dense_layers', 'index_q_norm', 'index_k_norm', 'index_head_weights')


def indexed_kinds():
    """The layer kinds an indexer goes on: global softmax attention."""
    return [letter for letter, kind in LAYER_KINDS.items() if kind.attention and kind.full]


def _indexed(c):
    """Per layer, whether it has an indexer (or shares one): a global attention layer index_dense_layers leaves
    sparse."""
    return [kind in indexed_kinds() and not dense for kind, dense in zip(c.layer_kinds, c.index_dense)]


def _unshared(c):
    """The first layer marked 'S' in index_share with no indexer before it to share, or on a layer without one."""
    indexed = _indexed(c)
    for i, shares in enumerate(c.index_shares):
        if shares and (not indexed[i] or not any(indexed[j] and not c.index_shares[j] for j in range(i))):
            return i
    return None


@dataclass
class Config:
    index_topk: int | None = None  # each query of a global attention layer reads only the k past tokens its indexer scores highest; None: all (dense)
    index_n_heads: int = 4  # the indexer's query heads (DeepSeek-V3.2: 64)
    index_head_dim: int = 32  # width of the indexer's query heads and of its one key per token; the first rope_dim dims rotate (DeepSeek-V3.2: 128)
    index_stage: str = 'sparse'  # 'dense': warm-up, attention reads every past token while the indexer learns to score them; 'sparse': it reads the top-k
    index_loss_coef: float = 1.0  # the indexer's KL loss toward the main attention, times this, joins the training loss; 0: the indexer does not learn
    index_norm_eps: float = 1e-6  # the epsilon of the LayerNorm on the indexer's keys (DeepSeek-V3.2: 1e-6; HY-V4: its rms_norm_eps)
    index_share: str | None = None  # IndexCache (GLM-5), tiled over the layers: 'F' a layer's own indexer, 'S' reuses the top-k of the nearest earlier indexer (no weights of its own); None: all 'F'
    index_dense_layers: str | None = None  # tiled over the layers: 'D' a global layer without an indexer, reading every key; 'I' one with (MiniMax-M3's full_attention and sparse layers); None: all 'I'
    index_score: str = 'weighted_relu'  # 'weighted_relu': sum over heads of w_h(t) * ReLU(q_h.k) / sqrt(D), one pick for all heads (DeepSeek-V3.2); 'dot_per_group': each head's plain q_h.k, queries and keys RMS-normed, head g picking for K/V group g (MiniMax-M3)
    index_q_norm: bool = False  # an RMSNorm (index_norm_eps) on each of the indexer's query heads before they rotate (Qwen4-Exp's QSA)
    index_k_norm: str = 'layernorm'  # the norm on the indexer's keys: 'layernorm' with a bias (DeepSeek-V3.2) or 'rms' (Qwen4-Exp's QSA)
    index_head_weights: bool = True  # each head's ReLU'd scores weighted per token by a learned projection (DeepSeek-V3.2); False: every head counted once (Qwen4-Exp's QSA)

    FIELD_TYPES = {
        'index_topk': OPTIONAL_POSITIVE_INT,
        **kinds('index_n_heads index_head_dim', POSITIVE_INT),
        'index_stage': one_of(INDEX_STAGES),
        'index_loss_coef': NON_NEGATIVE_NUMBER,
        'index_norm_eps': (lambda v, c: is_number(v) and v > 0, 'a positive number'),
        **kinds('index_q_norm index_head_weights', BOOL),
        'index_k_norm': one_of(INDEX_K_NORMS),
        'index_share': (lambda v, c: v is None or (isinstance(v, str) and v and not set(v) - set('FS')
                                                   and len(v) <= c.n_layer),
                        lambda c: f"None or a string of 'F' (own indexer) and 'S' (shares an earlier one's top-k) at "
                                  f"most n_layer={c.n_layer} long, tiled over the layers"),
        'index_dense_layers': (lambda v, c: v is None or (isinstance(v, str) and v and not set(v) - set('DI')
                                                          and len(v) <= c.n_layer),
                               lambda c: f"None or a string of 'D' (no indexer) and 'I' (an indexer) at most "
                                         f"n_layer={c.n_layer} long, tiled over the layers"),
        'index_score': one_of(INDEX_SCORES),
    }
    CHECKS = [
        (lambda c: changed(c, INDEX_FIELDS) and c.index_topk is None,
         lambda c: f"{flag_list(c, changed(c, INDEX_FIELDS))} apply to sparse attention only: set index_topk (the "
                   f"keys each query reads) or leave them at their defaults"),
        (lambda c: c.index_topk is not None and not set(indexed_kinds()) & set(c.layer_kinds),
         lambda c: f"index_topk={c.index_topk} picks keys in global attention layers "
                   f"({', '.join(map(repr, indexed_kinds()))}) and layers={c.layers!r} has none: add one or set "
                   f"--index_topk=None"),
        (lambda c: c.index_topk is not None and not any(_indexed(c)),
         lambda c: f"index_dense_layers={c.index_dense_layers!r} leaves no global layer an indexer: mark one 'I' or set "
                   f"--index_topk=None"),
        (lambda c: c.index_topk is not None and c.index_share is not None and _unshared(c) is not None,
         lambda c: f"index_share={c.index_share!r} marks layer {_unshared(c)} 'S' but it has no earlier global layer "
                   f"with an indexer of its own to share (or is no global layer with an indexer): make it 'F'"),
        (lambda c: c.index_score == 'dot_per_group' and (c.attn != 'mha' or c.index_n_heads != c.kv_heads),
         lambda c: f"index_score='dot_per_group' picks keys per K/V group, one indexer head each: index_n_heads "
                   f"({c.index_n_heads}) must equal the K/V heads ({c.kv_heads}) of attn='mha', got attn={c.attn!r}"),
        (lambda c: c.index_topk is not None and c.pos == 'rope' and c.index_head_dim < c.rope_dim,
         lambda c: f"index_head_dim ({c.index_head_dim}) must be at least the rotated width of a head ({c.rope_dim}): "
                   f"the indexer rotates its first dims with the attention's tables"),
    ]

    @property
    def index_shares(self):
        """Per layer, whether it reuses an earlier layer's top-k (index_share 'S')."""
        pattern = self.index_share or 'F'
        return [pattern[i % len(pattern)] == 'S' for i in range(self.n_layer)]

    @property
    def index_dense(self):
        """Per layer, whether index_dense_layers leaves it without an indexer ('D')."""
        pattern = self.index_dense_layers or 'I'
        return [pattern[i % len(pattern)] == 'D' for i in range(self.n_layer)]

    @property
    def index_selection(self):
        """What an indexer picks: a key of SELECTIONS ('token': single tokens; block_sparse picks blocks)."""
        return 'token'


RUNTIME_FLAGS = ('index_stage', 'index_loss_coef')
TRAINING_FLAGS = ('index_loss_coef',)  # a loss term's weight


def visible_keys(mask, T, S, device):
    """attend's mask as a boolean (T, S) tensor (or the (1, S) of a decoding step): which keys each query sees."""
    if isinstance(mask, torch.Tensor):
        return mask
    if mask is False or (mask is None and T == 1):
        return torch.ones(T, S, dtype=torch.bool, device=device)
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)  # causal: query i is key S - T + i


def top_k_earliest(scores, k, hidden=None):
    """(..., S) bool: each row's k highest scores, of equal scores the earliest (top_k_earliest_indices)."""
    return picked_mask(top_k_earliest_indices(scores, k, hidden), scores)


def picked_mask(picks, scores):
    """(..., S) bool shaped as scores: True at each row's picked positions picks (..., k)."""
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, picks, True)


def top_k_earliest_indices(scores, k, hidden=None):
    """(..., k): the positions of each row's k highest scores, of equal scores the earliest (a stable descending
    sort's first k), in no order; where hidden (broadcastable to scores) is True, a score counts as -inf. One topk
    over int64 keys that hold a score's order in their high half and its position, reversed, in their low: a sort
    took a decoding step's time at 8k positions, and a topk of the scores then a pass to move ties to the earliest
    took 1.4x as long as this at 8 x 256 x 256 on a CPU."""
    S = scores.size(-1)
    if scores.element_size() == 8:  # a 64-bit score leaves no room for the position: the stable sort
        scores = scores if hidden is None else scores.masked_fill(hidden, float('-inf'))
        return scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    floats = scores.float() + 0.0  # a copy of our own, in which -0.0 becomes 0.0, which it equals as a float
    if hidden is not None:
        floats.masked_fill_(hidden, float('-inf'))
    bits = floats.view(torch.int32)
    # the int64 keys made of two int32 halves (one made by a shift and an add took 1.5x as long): the high one
    # ints in the floats' order (a negative's magnitude bits flipped), the low one S - 1 - position, so of tied
    # scores the earlier key is the higher
    high = bits ^ (bits >> 31).bitwise_and_(0x7FFFFFFF)
    low = torch.arange(S - 1, -1, -1, dtype=torch.int32, device=scores.device).expand_as(high)
    halves = torch.stack((low, high) if sys.byteorder == 'little' else (high, low), dim=-1)
    return halves.view(torch.int64).squeeze(-1).topk(k, dim=-1, sorted=False).indices


class WeightedReluScores(torch.autograd.Function):
    """sum over heads h of w_h(t) * ReLU(q_h(t).k(s) * scale), (B, T, S), from the queries as rows token by token
    (B, T * H, D), one key per token (B, S, D) and the heads' weights (B, T, H), as transformers computes it: the
    dots scaled, ReLU'd in place, the heads summed by a matmul with their weights. The backward takes the ReLU'd dots
    alone (autograd kept a copy per step: the dots, ReLU'd, scaled, weighted, each (T * H x S))."""

    @staticmethod
    def forward(ctx, q, k, w, scale):
        B, T, H = w.shape
        dots = torch.bmm(q, k.transpose(1, 2)).mul_(scale).relu_()  # (B, T * H, S)
        ctx.save_for_backward(q, k, w, dots)
        ctx.scale = scale
        return torch.bmm(w.reshape(B * T, 1, H), dots.view(B * T, H, -1)).view(B, T, -1)

    @staticmethod
    def backward(ctx, grad):
        q, k, w, dots = ctx.saved_tensors
        B, T, H = w.shape
        grad = grad.reshape(B * T, 1, -1)
        dw = torch.bmm(dots.view(B * T, H, -1), grad.transpose(1, 2)).view(B, T, H)
        # the ReLU's gradient of grad broadcast over the heads, one pass over (B * T, H, S): each row's factor
        # w * scale goes to the matmuls' small sides instead (a product over (B * T, H, S) less)
        passed = torch.ops.aten.threshold_backward(grad.expand(-1, H, -1), dots.view(B * T, H, -1), 0)
        # in q's dtype: under autocast the forward's matmuls, and so dots and grad, were in half precision
        passed, weights = passed.view(B, T * H, -1).to(q.dtype), (w * ctx.scale).reshape(B, T * H, 1)
        return torch.bmm(passed, k).mul_(weights), torch.bmm(passed.transpose(1, 2), q * weights), dw, None


class LightningIndexer(nn.Module):
    """DeepSeek Sparse Attention's indexer (DeepSeek-V3.2): a cheap score of every past token for each query, so
    the layer's attention reads only the index_topk highest. Its own small query heads (from the queries' input),
    one key per token (LayerNorm'd), the first rope_dim dims of both rotated; score(query t, token s) = sum over
    its heads h of w_h(t) * ReLU(q_h(t).k(s)), the weights w from the token too. A cache keeps its keys.

    It learns from its own loss (learn): the KL divergence from the main attention's distribution (summed over
    heads, renormalized, outside the gradient) to the softmax of its scores, over the keys the attention reads.
    Its inputs are detached, so the loss moves the indexer alone and the language-model loss the rest.
    index_stage='dense' is the warm-up: the attention reads every past token while the indexer learns to score
    them; 'sparse' reads the top-k.

    index_score='dot_per_group' (MiniMax-M3): queries and keys RMS-normed (per head) before the rotation, no head
    weights, score_h(t, s) = q_h(t).k(s) alone; head g picks the keys of K/V group g. Its scores and picks keep the
    groups folded into the batch, (B * G, T, S), so one selection code serves both; `grouped` unfolds them."""

    def __init__(self, config, query_width, positions='rope'):
        super().__init__()
        self.n_head, self.head_dim, self.topk = config.index_n_heads, config.index_head_dim, config.index_topk
        self.dense, self.loss_coef = config.index_stage == 'dense', config.index_loss_coef
        self.per_group = config.index_score == 'dot_per_group'
        self.group = config.n_head // self.n_head  # query heads per indexer head (per_group: per K/V group)
        self.wq = nn.Linear(query_width, self.n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(config.n_embd, self.head_dim, bias=False)
        eps, per_group = config.index_norm_eps, self.per_group
        # DeepSeek's: a LayerNorm with a bias on the keys, none on the queries, head weights per token; Qwen4-Exp's
        # and MiniMax-M3's: RMSNorms on both (MiniMax-M3's without head weights either)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if config.index_q_norm or per_group else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if config.index_k_norm == 'rms' or per_group else \
            nn.LayerNorm(self.head_dim, eps=eps)
        self.weights = nn.Linear(config.n_embd, self.n_head, bias=False) \
            if config.index_head_weights and not per_group else None
        self.register_buffer('losses', torch.zeros(2), persistent=False)  # KL summed, forwards
        self.loss = None  # what this forward adds to the training loss (times index_loss_coef)
        self._scores = self._reads = self._picks = None  # this forward's, for learn (the picks when sparse)

    def cache_entries(self):
        return {'index_k': (1, self.head_dim)}

    def flops(self, seq_len, qk_width):
        """Its scores over seq_len keys (forward and backward), and the main attention's q.k once more for the
        loss's target (forward only); the attention itself reads every key in training (masked). GPT counts 6 per
        weight of every Linear: the indexer's inputs are detached, so its Linears take no input gradient (4 per
        weight), and without its loss (index_loss_coef=0) nothing of it runs backward (2)."""
        learns = bool(self.loss_coef)
        weights = sum(m.weight.numel() for m in (self.wq, self.wk, self.weights) if m is not None)
        target = 2 * qk_width * seq_len if learns else 0
        return self.score_flops(seq_len) + target - (2 if learns else 4) * weights

    def score_flops(self, keys):
        """Its scores of a query over `keys` keys, forward (and backward, learning): the heads' dots and, weighted,
        their sum, a matmul too, whose backward is one more for the weights (WeightedReluScores)."""
        passes, weighted = (3, 2) if self.loss_coef else (1, 1)
        return 2 * self.n_head * (passes * self.head_dim + (not self.per_group) * weighted) * keys

    def scores(self, x, q_in, rope, cache):
        """(B, T, S): every new query's score of every key it may see (a cache's too)."""
        q, w = self.queries(x, q_in, rope)
        return self.weigh(q, w, self.keys(x, rope, cache))

    def queries(self, x, q_in, rope):
        """Its query heads (B, H, T, D), (normalized and) rotated, and their weights per token (B, T, H; None per
        group)."""
        B, T, _ = x.shape
        q = self.wq(q_in.detach()).view(B, T, self.n_head, self.head_dim)
        q = (q if self.q_norm is None else self.q_norm(q)).transpose(1, 2)
        if rotates(rope):  # the tables' width: the first rope_dim dims turn, the rest pass
            q = apply_rope(q, *rope)
        if self.per_group:
            return q, None
        if self.weights is None:  # Qwen4-Exp: the heads' ReLU'd scores summed as they are
            return q, q.new_ones(B, T, self.n_head, dtype=torch.float32)
        return q, self.weights(x.detach()).float() * self.n_head ** -0.5

    def keys(self, x, rope, cache):
        """Its one key per token (B, 1, S, D), rotated, a cache's keys before the new ones."""
        k = self.k_norm(self.wk(x.detach())).unsqueeze(1)  # (B, 1, T, D): one key for all heads
        if rotates(rope):
            k = apply_rope(k, *rope)
        if cache is not None:
            k, = cache.update(index_k=k)
        return k

    def weigh(self, q, w, k):
        """(B, T, S): sum over heads h of w_h(t) * ReLU(q_h(t).k(s)) / sqrt(D), for keys k (B, 1, S, D); per group
        (B * H, T, S): each head's q_h(t).k(s), its group folded into the batch."""
        B, H, T, D = q.shape
        if self.per_group:
            return (q.float() @ k.float().transpose(-1, -2)).flatten(0, 1)
        # the heads' queries as rows of one matrix per sequence (a broadcast over heads would copy the keys)
        rows = q.float().transpose(1, 2).reshape(B, T * H, D)
        return WeightedReluScores.apply(rows, k.float().squeeze(1), w, D ** -0.5)

    def narrow(self, x, q_in, rope, mask, cache, *keys):
        """The attention's mask for the picked keys, and its keys (B, heads, S, dim): as they are, or in a
        decoding step (one query, a cache) only the index_topk picked, so the step reads k entries, not S."""
        self.selection = self.select(x, q_in, rope, mask, cache)  # what layers sharing it read too
        return read_selected(self.selection, keys)

    def grouped(self, mask, slots=None):
        """A selection as the attention reads it. Per group, its picks come folded ((B * G, 1, ...)): the mask
        unfolded to each query head (B, n_head, T, S), the slots to each K/V head (B, G, n, 1)."""
        if not self.per_group:
            return mask, slots
        unfold = lambda t: t.unflatten(0, (-1, self.n_head)).flatten(1, 2)
        return unfold(mask).repeat_interleave(self.group, dim=1), None if slots is None else unfold(slots)

    def select(self, x, q_in, rope, mask, cache):
        """(the attention's mask, None), or in a decoding step (the mask of the k picked, their slots (B, 1, k, 1))."""
        scores = self.scores(x, q_in, rope, cache)
        B, T, S = scores.shape
        reads = visible_keys(mask, T, S, x.device)
        self._scores, self._reads, self._picks = scores, reads, None
        if self.dense or self.topk >= S:  # every visible key is picked: the dense attention, as it is
            return mask, None
        # the k best; of equal scores (ReLU makes zeros common) the earliest keys, so a decoding step over the
        # cache's slots picks what a forward over the sequence picks (a key's slot is its position)
        picks = top_k_earliest_indices(scores, self.topk, hidden=~reads)  # (B, T, k)
        if T == 1 and cache is not None:  # the k picked slots, in order
            slots = picks[:, 0].sort(dim=-1).values
            seen = reads.expand(B, S).gather(1, slots)  # a pick among unwritten slots sees nothing
            return self.grouped(seen[:, None, None, :], slots[:, None, :, None])
        self._picks = picks
        self._reads = picked_mask(picks, scores) & reads
        return self.grouped(self._reads[:, None])

    def learn(self, q, k, scale):
        """In training, the KL loss of this forward (self.loss) from the main attention's queries q (B, H, T, dim)
        and keys k (B, H or fewer, S, dim), over the keys the attention read. When it read the top-k, over the k
        picked alone (gathered): both distributions are zero elsewhere, and their softmaxes, entropy and product
        over every key had taken 8% of a DSA training step on a CPU (23 of 283 ms; 6 ms gathered)."""
        self.loss = None
        if not (self.training and self.loss_coef):
            return
        picks, scores, reads = self._picks, self._scores.float(), self._reads
        if picks is not None:
            scores, reads = scores.gather(-1, picks), reads.gather(-1, picks)  # (B[*G], T, k)
        # the keys not read pushed to a finite floor: their log-probability times the target's 0 there is then 0,
        # with no second mask to keep it from being nan
        unread = bias_of(reads, torch.float32)  # in fp32, as the scores are without autocast
        log_index = (scores + unread).log_softmax(-1)
        with torch.no_grad():
            k = k.repeat_interleave(q.size(1) // k.size(1), dim=1) if k.size(1) != q.size(1) else k
            q = q.float() * (q.size(-1) ** -0.5 if scale is None else scale)  # scaled here, not the (T x S) logits
            # fp32 after the matmul too: autocast runs it in half precision, where the floor would be -inf
            logits = (q @ k.float().transpose(-1, -2)).float()
            if picks is not None:  # each head's logits of its selection's picks
                logits = logits.gather(-1, self.head_reads(picks).expand(-1, q.size(1), -1, -1))
            target = self.head_sum(logits.add_(self.head_reads(unread)).softmax(-1))
            target /= target.sum(-1, keepdim=True)
            entropy = torch.xlogy(target, target).sum(-1)  # the KL's constant part: no gradient to take
        kl = (entropy - (target * log_index).sum(-1)).mean()
        self.losses += torch.stack((kl.detach(), torch.ones_like(kl.detach())))
        self.loss = kl

    def head_reads(self, reads):
        """The keys each query head read (a mask or its bias), broadcastable to (B, n_head, T, S), from the (T, S) or
        (B[*G], T, S) kept."""
        return self.grouped(reads[:, None])[0] if self.per_group and reads.dim() == 3 else reads.unsqueeze(-3)

    def head_sum(self, target):
        """The main attention's weights (B, n_head, T, S) summed over the heads each selection serves: all of them,
        (B, T, S), or per group each group's, folded as the scores are, (B * G, T, S)."""
        if self.per_group:
            return target.unflatten(1, (self.n_head, self.group)).sum(2).flatten(0, 1)
        return target.sum(1)


def rotates(rope):
    """Whether a layer's tables turn its indexer's queries and keys: rotary (cos, sin), not None or Llama 4's query
    scales (its NoPE layers')."""
    return isinstance(rope, tuple)


def read_selected(selection, keys):
    """An indexer's selection applied: (its mask, the keys as they are or, in a decoding step, the picked slots)."""
    mask, slots = selection
    if slots is not None and slots.size(1) > 1:  # picked per K/V head (index_score='dot_per_group')
        return (mask, *[t.gather(2, slots.expand(-1, -1, -1, t.size(-1))) for t in keys])
    if slots is not None:  # index_select per sequence: 2.6x (batch 1) to 13x (batch 8) faster than one advanced
        # index or a gather expanded over heads and dims, on a CPU at 8k slots
        pick = lambda t, b: t[b].index_select(1, slots[b, 0, :, 0])
        keys = [pick(t, 0)[None] if t.size(0) == 1 else torch.stack([pick(t, b) for b in range(t.size(0))])
                for t in keys]  # one sequence: no stack, which would copy the picked entries once more
    return (mask, *keys)


class SharedIndex(nn.Module):
    """GLM-5's IndexCache: a layer with no indexer of its own reads the keys the nearest earlier indexer picked
    for the same queries (index_share 'S'); its cache keeps no indexer keys, and it adds no loss."""

    def __init__(self):
        super().__init__()
        self.source = []  # [the earlier layer's LightningIndexer] (a list: not a submodule, its weights not ours)

    def cache_entries(self):
        return {}

    def flops(self, seq_len, qk_width):
        return 0

    def narrow(self, x, q_in, rope, mask, cache, *keys):
        return read_selected(self.source[0].selection, keys)

    def learn(self, q, k, scale):
        pass


SELECTIONS = {'token': LightningIndexer}  # what an indexer picks (config.index_selection): the indexer's class


def indexers(model):
    """The model's own indexers (a SharedIndex reads another's)."""
    return [block.attn.indexer for block in model.transformer.h
            if isinstance(getattr(block.attn, 'indexer', None), LightningIndexer)]


def index_loss_and_reset(model):
    """The indexers' mean KL loss over the training forwards since the last call (None if none), then the counts
    restart: what train.py logs apart from the main loss."""
    return mean_and_reset([m.losses for m in indexers(model)])


class Indexers(Feature):
    """An indexer on every global attention layer (a SharedIndex on those index_share marks 'S', reading the
    nearest earlier one's picks), and their KL losses in the training loss."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.index_topk is not None

    def build(self, model):
        config, last = self.config, None
        q_width = (config.mla_dims['q_latent'] if config.attn == 'mla' else 0) or config.n_embd
        for layer, (kind, block) in enumerate(zip(config.layer_kinds, model.transformer.h)):
            if kind not in indexed_kinds() or config.index_dense[layer]:  # a dense layer reads every key
                continue
            if config.index_shares[layer]:
                block.attn.indexer = SharedIndex()
                block.attn.indexer.source[:] = [last]
            else:
                block.attn.indexer = last = SELECTIONS[config.index_selection](config, q_width, block.attn.positions)

    def loss(self, model, idx, h, targets):
        losses = [m.loss for m in indexers(model) if m.loss is not None]
        if not losses:  # the indexers learn from their own loss alone (their inputs are detached)
            return None
        return self.config.index_loss_coef * sum(losses) / len(losses)

    def objective(self, model):
        if self.config.index_loss_coef and indexers(model):
            return f"index_loss_coef ({self.config.index_loss_coef}) times the indexers' KL loss"
        return None

    def figures(self, model):
        return {'index_loss': index_loss_and_reset(model)}


FEATURES.append(Indexers)
