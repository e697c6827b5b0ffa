"""
Block-sparse selection (index_block_size): the lightning indexer (sparse_attention) picks whole blocks of
consecutive keys instead of single tokens, index_topk / index_block_size blocks per query, as three families of
2026 do (transformers 5.24): MiniMax-M3 max-pools its token scores over each block and always keeps the query's
own block; Qwen4-Exp's QSA scores one key per finished block, its tokens' keys averaged, normalized and rotated at
the block's start; GLM-5.3-Flash's KPool pools each finished block's keys with learned softmax weights. Both of
those read the unfinished last block whatever the scores. A block is a stretch of cache slots, so a decoding
step reads the chosen blocks' slots only, a few contiguous runs; pooled keys make the indexer's scoring cheaper
by the block's size too (a pooled key per block, kept in the cache when the block is finished).
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters.sparse_attention import SELECTIONS, LightningIndexer, rotates, top_k_earliest, visible_keys
from model import OPTIONAL_POSITIVE_INT, apply_rope, changed, flag_list, is_int, one_of

POOLS = ('max', 'mean', 'learned')
TAILS = ('score', 'keep')
BLOCK_FIELDS = ('index_block_pool', 'index_local_blocks', 'index_tail')  # with index_block_size only


@dataclass
class Config:
    index_block_size: int | None = None  # the indexer picks blocks of this many consecutive keys (from position 0), index_topk / this of them per query; None: single tokens
    index_block_pool: str = 'max'  # a block's score: 'max' of its tokens' scores (MiniMax-M3); or the score of one key per block, its tokens' keys pooled: 'mean' (Qwen4-Exp's QSA), 'learned' softmax weights (GLM-5.3-Flash's KPool)
    index_local_blocks: int = 1  # the most recent of the blocks a query scores are always read, within its index_topk (MiniMax-M3: 1, the query's own)
    index_tail: str = 'score'  # the unfinished last block: 'score' it on its tokens so far, like any other (MiniMax-M3); 'keep' read it always, beyond index_topk, only finished blocks scored (GLM-5.3-Flash, Qwen4-Exp)

    FIELD_TYPES = {
        'index_block_size': OPTIONAL_POSITIVE_INT,
        'index_block_pool': one_of(POOLS),
        'index_local_blocks': (lambda v, c: is_int(v, 0), 'an int >= 0'),
        'index_tail': one_of(TAILS),
    }
    CHECKS = [
        (lambda c: changed(c, BLOCK_FIELDS) and c.index_block_size is None,
         lambda c: f"{flag_list(c, changed(c, BLOCK_FIELDS))} apply to block selection only: set index_block_size (the "
                   f"keys per block) or leave them at their defaults"),
        (lambda c: c.index_block_size is not None and c.index_topk is None,
         lambda c: f"index_block_size={c.index_block_size} picks blocks of the keys sparse attention reads: set "
                   f"index_topk too (the keys each query reads, a multiple of it)"),
        (lambda c: c.index_block_size is not None and c.index_topk is not None and c.index_topk % c.index_block_size,
         lambda c: f"index_topk={c.index_topk} must be a multiple of index_block_size={c.index_block_size}: each "
                   f"query reads index_topk / index_block_size whole blocks (GLM-5.3-Flash and Qwen4-Exp require it)"),
        (lambda c: c.index_block_size is not None and c.index_topk is not None and
         c.index_local_blocks > c.index_topk // c.index_block_size,
         lambda c: f"index_local_blocks={c.index_local_blocks} is more than the {c.index_topk // c.index_block_size} "
                   f"blocks each query reads (index_topk / index_block_size): lower it or raise index_topk"),
        (lambda c: c.index_block_size is not None and c.index_block_pool != 'max' and c.index_score != 'weighted_relu',
         lambda c: f"index_score={c.index_score!r} scores tokens per group, which index_block_pool="
                   f"{c.index_block_pool!r} does not pool: set --index_block_pool=max (MiniMax-M3's)"),
        (lambda c: c.index_block_size is not None and c.index_block_pool != 'max' and c.index_tail == 'score',
         lambda c: f"index_block_pool={c.index_block_pool!r} pools the keys of finished blocks, so the unfinished one "
                   f"has no key to score: set --index_tail=keep (GLM-5.3-Flash, Qwen4-Exp) or "
                   f"--index_block_pool=max (MiniMax-M3)"),
    ]

    @property
    def index_selection(self):
        return 'block' if self.index_block_size is not None else super().index_selection


RUNTIME_FLAGS = ('index_local_blocks', 'index_tail')  # which blocks are read, not what is learned or kept


class BlockIndexer(LightningIndexer):
    """The lightning indexer picking blocks: blocks of `block` consecutive positions from position 0; each query
    reads the index_topk / block of them its block scores rank highest (of equal scores the earliest), the
    `local` most recent of those it scores always among them; with the tail kept, also the unfinished last
    block's tokens, which are never scored (at most block - 1 more keys).

    A block's score: 'max', the highest of its visible tokens' scores (the token indexer's); 'mean' and 'learned',
    the token indexer's score of one key per finished block: its tokens' keys (projected, before the norm)
    averaged, then normalized ('mean'), or its tokens' normalized keys weighted per channel by a softmax over the
    block of a gate (a Linear of the token) plus a learned term per position in the block ('learned'); then
    rotated at the block's first position. A cache keeps what a block's key is made of per token (its key, its
    gate, its position's rotation) and each finished block's key, at its last slot, so a decoding step pools
    only its own block's tokens and scores one key per finished block.

    It learns as the token indexer: the KL divergence from the main attention to the softmax of its scores, over
    the keys read; with pooled keys, over the finished blocks read (the attention's weight on a block, its tokens'
    summed; the unscored tail left out), the mean over the queries that read one."""

    def __init__(self, config, query_width, positions='rope'):
        super().__init__(config, query_width, positions)
        self.block, self.pool, self.local = config.index_block_size, config.index_block_pool, config.index_local_blocks
        self.keep_tail, self.blocks = config.index_tail == 'keep', self.topk // self.block
        # a pooled key turns at its block's start: the rotation of each position is kept (cos and sin, whose two
        # halves are equal in the half-split layout), on layers that rotate
        self.rot_width = config.rope_dim if positions == 'rope' and config.pos == 'rope' and self.pool != 'max' else 0
        if self.pool == 'learned':  # GLM-5.3-Flash's compress gate and position term ("ape"), per channel
            self.pool_gate = nn.Linear(config.n_embd, self.head_dim, bias=False)
            self.pool_pos = nn.Parameter(torch.zeros(self.block, self.head_dim))
        self._block_scores = self._block_reads = None  # this forward's, for learn (pooled keys)

    def cache_entries(self):
        if self.pool == 'max':  # the token indexer's keys
            return super().cache_entries()
        entries = {'index_k': (1, self.head_dim)}  # per token: what its block's key is pooled from
        if self.pool == 'learned':
            entries['index_gate'] = (1, self.head_dim)
        if self.rot_width:
            entries['index_rot'] = (1, self.rot_width)
        return {**entries, 'index_pool': (1, self.head_dim)}  # a finished block's key, at its last slot

    def flops(self, seq_len, qk_width):
        """Max-pooling scores every token (the token indexer's count: the max multiplies nothing); pooled keys score
        seq_len / block keys per query (forward and backward), the pooling itself elementwise (not counted, as
        no softmax is), and the gate a Linear without an input gradient, as the indexer's others."""
        if self.pool == 'max':
            return super().flops(seq_len, qk_width)
        learns = bool(self.loss_coef)
        weights = sum(m.weight.numel() for m in (self.wq, self.wk, self.weights, getattr(self, 'pool_gate', None))
                      if m is not None)
        target = 2 * qk_width * seq_len if learns else 0
        return self.score_flops(seq_len // self.block) + target - (2 if learns else 4) * weights

    # ------------------------------------------------------------------------- the blocks

    def geometry(self, visible):
        """From what each query sees (T, S; a global layer: every position up to its own): its position (T,), the
        blocks it has finished (T,), and over the blocks (T, nb) those it may pick and those it always reads."""
        S = visible.size(-1)
        pos = visible.sum(-1) - 1
        finished = (pos + 1) // self.block
        nb = S // self.block if self.keep_tail else -(-S // self.block)  # kept tails: finished blocks only
        blocks = torch.arange(nb, device=visible.device)
        if self.keep_tail:
            candidates, last = blocks < finished[:, None], finished - 1
        else:  # every block with a visible token, the query's own so far
            candidates, last = blocks * self.block <= pos[:, None], pos // self.block
        return pos, finished, candidates, candidates & (blocks > (last - self.local)[:, None])

    def ingredients(self, x, rope, cache):
        """What blocks' keys are pooled from, per token (B, 1, S, dim), a cache's tokens before the new ones."""
        x = x.detach()
        k = self.wk(x)
        parts = {'index_k': (k if self.pool == 'mean' else self.k_norm(k)).unsqueeze(1)}
        if self.pool == 'learned':
            parts['index_gate'] = self.pool_gate(x).unsqueeze(1)
        if self.rot_width and rotates(rope):
            cos, sin = rope  # (T, width), the same for every sequence
            half = self.rot_width // 2
            rot = torch.cat((cos[..., :half], sin[..., :half]), dim=-1)
            parts['index_rot'] = rot.to(k.dtype).expand(x.size(0), 1, *rot.shape[-2:])
        if cache is not None:
            parts = dict(zip(parts, cache.update(**parts)))
        return parts

    def pool_keys(self, parts, starts):
        """The keys (B, 1, n, D) of the blocks starting at slots starts (n,): pooled, normalized, rotated."""
        S, n = parts['index_k'].size(2), starts.size(0)
        slots = (starts[:, None] + torch.arange(self.block, device=starts.device)).clamp(max=S - 1).flatten()
        group = lambda name: parts[name][:, 0].index_select(1, slots).unflatten(1, (n, self.block))  # (B, n, block, D)
        k = group('index_k')
        if self.pool == 'mean':  # QSA: averaged in fp32, then normalized
            key = self.k_norm(k.float().mean(2).to(k.dtype))
        else:  # KPool: per channel, a softmax over the block's tokens of gate + position term
            logits = group('index_gate').float() + self.pool_pos.float()
            key = (logits.softmax(2) * k.float()).sum(2).to(k.dtype)
        key = key.unsqueeze(1)
        if 'index_rot' in parts:  # at the block's first position
            c, s = parts['index_rot'][:, :, starts].chunk(2, dim=-1)
            key = apply_rope(key, torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1))
        return key

    def finished_keys(self, parts, pos, cache, step):
        """The keys of the blocks finished in the slots (B, 1, S // block, D; the later ones not yet finished). A
        forward pools them all; with a cache, each new token that finishes a block keeps that block's key at its
        slot, so that a decoding step pools only its own block (so far) and reads the others' kept."""
        S = parts['index_k'].size(2)
        if step:
            key = self.pool_keys(parts, pos - pos % self.block)
            kept, = cache.update(index_pool=key)
            return kept[:, :, self.block - 1::self.block]
        n = S // self.block
        keys = self.pool_keys(parts, torch.arange(n, device=pos.device) * self.block)
        if cache is not None:  # a prefill: the key of the block each new token finishes, else zeros
            ends = ((pos + 1) % self.block == 0)[:, None]
            which = (pos // self.block).clamp(max=max(n - 1, 0))
            done = keys[:, :, which] if n else keys.new_zeros(*keys.shape[:2], pos.size(0), keys.size(-1))
            cache.update(index_pool=torch.where(ends, done, torch.zeros_like(done)))
        return keys

    def select(self, x, q_in, rope, mask, cache):
        """(the attention's mask, None), or in a decoding step (the mask of the slots read, the slots (B, 1, n, 1)):
        the chosen blocks' slots in order, then the tail's."""
        B, T, _ = x.shape
        step = T == 1 and cache is not None
        q, w = self.queries(x, q_in, rope)
        if self.pool == 'max':
            k = self.keys(x, rope, cache)
            S = k.size(2)
            visible = visible_keys(mask, T, S, x.device)
            pos, finished, candidates, forced = self.geometry(visible)
            self._scores = tokens = self.weigh(q, w, k)  # (B, T, S), what it learns from; per group (B * G, T, S)
            B, nb = tokens.size(0), candidates.size(-1)  # the unseen tokens out, the slots padded (or cut) to whole blocks
            tokens = F.pad(tokens.masked_fill(~visible, float('-inf')), (0, nb * self.block - S), value=float('-inf'))
            scores = tokens.view(B, T, nb, self.block).amax(-1)
        else:
            parts = self.ingredients(x, rope, cache)
            S = parts['index_k'].size(2)
            visible = visible_keys(mask, T, S, x.device)
            pos, finished, candidates, forced = self.geometry(visible)
            self._block_scores = scores = self.weigh(q, w, self.finished_keys(parts, pos, cache, step))
            nb = candidates.size(-1)
        if self.dense or self.topk >= S:  # every visible key is read: the dense attention, as it is
            self._reads, self._block_reads = visible, candidates
            return mask, None
        ranked = scores.masked_fill(~candidates, float('-inf')).masked_fill(forced, float('inf'))
        picked = top_k_earliest(ranked, min(self.blocks, nb)) & candidates  # (B, T, nb)
        self._block_reads = picked
        if step:
            return self.grouped(*self.slots(picked[:, 0], pos, finished, S))
        positions = torch.arange(S, device=x.device)
        of_block = positions // self.block
        reads = picked.gather(-1, of_block.clamp(max=nb - 1).expand(B, T, S)) & (of_block < nb) & visible
        if self.keep_tail:
            reads = reads | (visible & (positions >= (finished * self.block)[:, None]))
        self._reads = reads
        return self.grouped(reads[:, None])

    def slots(self, picked, pos, finished, S):
        """A decoding step's read: the picked blocks' slots in order (B, n * block), then the tail's (block - 1),
        and which of them it sees (a pick among the blocks not yet written, the slots past its position)."""
        B, nb = picked.shape
        blocks, offsets = torch.arange(nb, device=picked.device), torch.arange(self.block, device=picked.device)
        chosen = torch.where(picked, blocks, blocks + nb).topk(min(self.blocks, nb), largest=False).indices
        slots = (chosen[..., None] * self.block + offsets).flatten(1)
        seen = picked.gather(1, chosen).repeat_interleave(self.block, dim=1) & (slots <= pos)
        if self.keep_tail and self.block > 1:
            tail = (finished * self.block + offsets[:-1]).expand(B, -1)
            slots, seen = torch.cat((slots, tail), dim=1), torch.cat((seen, tail <= pos), dim=1)
        slots = slots.clamp(max=S - 1)  # past the cache's end: never seen
        return seen[:, None, None, :], slots[:, None, :, None]

    def learn(self, q, k, scale):
        """The token indexer's KL loss ('max': its scores are the tokens'), or over the finished blocks read."""
        if self.pool == 'max':
            return super().learn(q, k, scale)
        self.loss = None
        if not (self.training and self.loss_coef):
            return
        reads, blocks = self._reads, self._block_reads
        nb = blocks.size(-1)
        with torch.no_grad():
            k = k.repeat_interleave(q.size(1) // k.size(1), dim=1) if k.size(1) != q.size(1) else k
            # fp32 after the matmul too: under autocast it gives half precision, where the clamp's 1e-30 is 0
            logits = (q.float() @ k.float().transpose(-1, -2)).float()
            logits *= q.size(-1) ** -0.5 if scale is None else scale
            target = logits.masked_fill(~reads.unsqueeze(-3), float('-inf')).softmax(-1).sum(1)
            target = target[..., :nb * self.block].unflatten(-1, (nb, self.block)).sum(-1) * blocks
            target = target / target.sum(-1, keepdim=True).clamp_min(1e-30)
        scored = blocks.any(-1)  # queries that read a finished block (the first block - 1 read only the tail)
        log_index = self._block_scores.float().masked_fill(~blocks, float('-inf'))
        log_index = torch.where(scored[..., None], log_index, torch.zeros_like(log_index)).log_softmax(-1)
        rows = (torch.xlogy(target, target) - target * log_index.masked_fill(~blocks, 0.0)).sum(-1)
        scored = scored.expand_as(rows)
        kl = (rows * scored).sum() / scored.sum().clamp_min(1)
        self.losses += torch.stack((kl.detach(), torch.ones_like(kl.detach())))
        self.loss = kl


SELECTIONS['block'] = BlockIndexer
