"""
Multi-token prediction (mtp_depth; Gloeckle et al. 2024, DeepSeek-V3's sequential form): extra modules after the
model, the k-th predicting the token k+1 ahead with the shared head, trained beside the main head (their mean
loss times mtp_loss_coef). At inference they are drafters for self-speculative decoding (generate.py's
generate_speculative): the model verifies their drafts in one forward.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from generate import KVCache, cache_dtype
from model import FEATURES, GPT, NON_NEGATIVE_NUMBER, Block, Feature, causal_mask, changed, is_int, make_norm, \
    mean_and_reset


@dataclass
class Config:
    mtp_depth: int = 0  # extra modules after the model, the k-th predicting the token k+1 ahead with the shared head; 0: none
    mtp_loss_coef: float = 0.3  # their mean loss, times this, joins the training loss (DeepSeek-V3: 0.3, later 0.1); 0: not computed

    FIELD_TYPES = {'mtp_depth': (lambda v, c: is_int(v, 0), 'an int >= 0'), 'mtp_loss_coef': NON_NEGATIVE_NUMBER}
    CHECKS = [
        (lambda c: changed(c, ('mtp_loss_coef',)) and not c.mtp_depth,
         lambda c: f"mtp_loss_coef={c.mtp_loss_coef} applies to multi-token prediction only: set mtp_depth >= 1 or "
                   f"leave it at its default"),
        (lambda c: c.mtp_depth and c.index_topk is not None,
         lambda c: f"mtp_depth={c.mtp_depth} with sparse attention (index_topk={c.index_topk}) is not supported yet: "
                   f"set one of them off"),
    ]


RUNTIME_FLAGS = ('mtp_loss_coef',)
TRAINING_FLAGS = ('mtp_loss_coef',)  # a loss term's weight


class MTPModule(nn.Module):
    """One depth of DeepSeek-V3's multi-token prediction: the previous depth's hidden state of token i (the main
    model's at the first) and the embedding of token i + k, both normalized, concatenated and projected, pass one
    block (the last layer's kind) and a norm; the shared head then predicts token i + k + 1."""

    def __init__(self, config, features=()):
        super().__init__()
        self.norm_h, self.norm_e, self.norm = make_norm(config), make_norm(config), make_norm(config)
        self.proj = nn.Linear(2 * config.n_embd, config.n_embd, bias=False)
        self.block = Block(config, config.n_layer - 1)
        for feature in features:  # the model's features give its block what they give the last layer's
            feature.build_block(self.block, config.n_layer - 1)
        self.apply(GPT._init_weights)
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):  # GPT-2's scaled init, as the model's blocks
                nn.init.normal_(p, mean=0.0, std=0.0 if config.zero_init else 0.02 / math.sqrt(2 * config.n_layer))
        self.register_buffer('losses', torch.zeros(2), persistent=False)  # loss summed, forwards

    def forward(self, h, embedded, tables):
        """h, embedded (B, L, n_embd) -> this depth's hidden states (B, L, n_embd), before its norm."""
        x = self.proj(torch.cat((self.norm_h(h), self.norm_e(embedded)), dim=-1))
        mixer = self.block.attn
        mask = causal_mask(x.size(1), mixer.window, x.device)
        return self.block(x, tables[mixer.positions], x.size(1) > 1 if mask is None else mask, None, tables)


def mtp_flops(model, T):
    """Training FLOPs of the MTP modules per token of a T-token sequence: depth k runs over T - k tokens (its
    Linears, its block's mixer and experts, the shared head); none at weight 0 (not computed)."""
    if not model.config.mtp_loss_coef:
        return 0
    flops = 0
    for k, module in enumerate(model.mtp, start=1):
        L = T - k
        if L < 1:
            break
        per_token = 6 * model.lm_head.weight.numel()
        for part in module.modules():
            if isinstance(part, nn.Linear):
                per_token += 6 * part.weight.numel()
            elif hasattr(part, 'token_flops'):
                per_token += part.token_flops(L)
        flops += per_token * L
    return flops / T


def layer_tables(model, tokens, embedded):
    """The tables the model's layers read at positions 0.. of tokens (rotary tables by kind), as GPT.embed makes
    them; the embeddings themselves are the MTP module's input."""
    tables = {'rope': model.transformer.wpe(embedded, 0)[1], None: None, 'cache': None, 'tokens': tokens}
    for feature in model.features:
        feature.embed(model, tokens, embedded, 0, tables)
    return tables


def mtp_states(model, module, h, tokens):
    """One depth's hidden states (B, L, n_embd) from the previous depth's h and the tokens (B, L) one further on."""
    embedded = model.transformer.wte(tokens)
    return module(h, embedded, layer_tables(model, tokens, embedded))


def mtp_loss(model, idx, h, targets):
    """The mean over depths of each MTP module's loss: at depth k, position i reads the input token i + k and
    predicts the next (targets' i + k); the sequence shortens by one a depth. The inputs are the tokens
    themselves, known whatever a task's mask leaves unscored in the targets."""
    T = targets.size(1)
    losses = []
    for k, module in enumerate(model.mtp, start=1):
        L = T - k
        if L < 1:
            break
        h = mtp_states(model, module, h[:, :L], idx[:, k:T])
        logits = model.logits(module.norm(h))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets[:, k:].reshape(-1), ignore_index=-1)
        module.losses += torch.stack((loss.detach(), torch.ones_like(loss.detach())))
        losses.append(loss)
    return sum(losses) / len(losses)


def mtp_loss_and_reset(model):
    """The MTP modules' mean loss over the training forwards since the last call (None if none); then the counts
    restart: what train.py logs apart from the main loss."""
    return mean_and_reset([m.losses for m in model.mtp] if model.config.mtp_depth else [])


class MultiTokenPrediction(Feature):
    """model.mtp, made after the main model's init and on a fork of the RNG, so the main model trains as it would
    without them; their loss in training, their FLOPs apart (they run over shorter sequences)."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.mtp_depth > 0

    def init(self, model):
        with torch.random.fork_rng(devices=[]):
            model.mtp = nn.ModuleList([MTPModule(self.config, model.features) for _ in range(self.config.mtp_depth)])

    def loss(self, model, idx, h, targets):
        if self.config.mtp_loss_coef and model.training:
            return self.config.mtp_loss_coef * mtp_loss(model, idx, h, targets)
        return None

    def objective(self, model):
        if self.config.mtp_loss_coef:
            return f"mtp_loss_coef ({self.config.mtp_loss_coef}) times the MTP modules' loss"
        return None

    def figures(self, model):
        return {'mtp_loss': mtp_loss_and_reset(model)}

    def flops(self, model, seq_len):
        return mtp_flops(model, seq_len)


# ----------------------------------------------------------------------------- self-speculative decoding

def speculation_problem(model):
    """Why the model cannot decode speculatively, in one line; None when it can."""
    if not model.config.mtp_depth:
        return "speculative decoding drafts with the MTP modules: this model has none (train with mtp_depth >= 1)"
    taken_back = [i for i, block in enumerate(model.transformer.h)
                  if block.attn.window is not None or block.attn.cache_states() or block.attn.cache_blocks()]
    if taken_back:
        return (f"speculative decoding takes drafted tokens back out of the cache, which layer {taken_back[0]} "
                f"cannot (a sliding window's ring, a recurrent state or entries per block of positions): every layer "
                f"must be global attention")
    if model.config.positions_follow_length:
        return "speculative decoding with rope_scaling='dynamic' is not supported (its angles follow the length)"
    kept = [name for feature in model.features for name in feature.cache_states()]
    if kept:
        return (f"speculative decoding takes drafted tokens back out of the cache, which the states of this model's "
                f"features ({', '.join(kept)}: a last token) cannot be: decode without --speculative")
    return None


def speculative_cache_length(model):
    """Positions of the cache speculative decoding keeps: block_size, and room for a round's drafts past a row's end
    (a row drafting fewer than the batch's longest pads its forward; those entries are never read)."""
    return model.config.block_size + model.config.mtp_depth


def speculative_cache_bytes(model, batch_size, dtype=torch.float32):
    """Bytes of the cache generate_speculative allocates for batch_size rows."""
    return KVCache.bytes_for(model, batch_size, speculative_cache_length(model), dtype)


def rows_apart(model):
    """Whether one forward can take rows at positions of their own (RowCache's tensor of positions): the position
    tables are indexed per row (learned, rotary, none) and no feature makes tables of its own from the position
    (Llama 4's NoPE temperature does: its rows then go one forward per position)."""
    return model.config.pos in ('learned', 'rope', 'none') and all(
        type(feature).embed is Feature.embed for feature in model.features)


class RowCache:
    """A KVCache's stores (generate.py) as one forward of some of its rows sees them when each row is at a position
    of its own (speculative decoding: each row keeps the drafts it accepted, so the rows part). Row r's T new tokens
    go to its slots pos[r].., each at its own position; each query sees the slots up to its own position, so a
    rejected draft's entry past it is masked, and written over before any query could see it. rows: the stores'
    rows this forward continues (a LongTensor), or None for all of them."""

    features = {}  # no feature's state (speculation refuses models whose features keep one)

    def __init__(self, model, stores, rows, pos, T):
        self.stores, self.rows = stores, rows
        self.positions = pos[:, None] + torch.arange(T, device=pos.device)  # (b, T): each new token's slot and position
        self.keys = int(pos.max()) + T  # the slots any query here may see
        if bool((pos == pos[0]).all()):  # one position for all: the model's own tables, built as a prefill builds them
            self.start = int(pos[0])
        else:  # a tensor of positions, (b, 1, T) for rotary tables (as the heads' dims); a padding token past
            # block_size reads a table's last row: its output is never read
            at = self.positions.clamp(max=model.config.block_size - 1)
            self.start = at if model.config.pos == 'learned' else at[:, None]

    def __getitem__(self, layer):
        return RowLayer(self, self.stores[layer])

    def mask(self, layer, mixer, T, device):
        if T == 1 and isinstance(self.start, int):
            return None  # one query a row, all at one position: every slot written so far
        return (torch.arange(self.keys, device=device) <= self.positions[:, :, None])[:, None]  # (b, 1, T, keys)

    def advance(self, T):
        pass  # the caller moves each row by what it kept


class RowLayer:
    """A layer's part of a RowCache: what its mixer writes to and reads from."""
    fresh = False  # (a recurrent state's question: speculation refuses those layers)

    def __init__(self, cache, stores):
        self.cache, self.stores = cache, stores

    def update(self, **new):
        c, out = self.cache, []
        for name, value in new.items():
            store = self.stores[name]
            if c.rows is None and isinstance(c.start, int):  # all rows, one position: slices
                store[:, :, c.start:c.start + value.size(2)] = value
                out.append(store[:, :, :c.keys])
                continue
            rows = torch.arange(store.size(0), device=store.device) if c.rows is None else c.rows
            store[rows[:, None], :, c.positions] = value.transpose(1, 2).to(store.dtype)  # (b, T, heads, dim)
            out.append(store[:, :, :c.keys] if c.rows is None else store[rows, :, :c.keys])
        return out


def forward_rows(model, stores, rows, tokens, pos, together):
    """The final hidden states (b, T, n_embd) of tokens (b, T) continuing the stores' rows (None: all) each at its
    own position pos (b,): one forward, or where the model cannot take rows apart in one (together False), one per
    position."""
    if together or bool((pos == pos[0]).all()):
        return model.hidden_states(tokens, RowCache(model, stores, rows, pos, tokens.size(1)))
    rows = torch.arange(len(pos), device=pos.device) if rows is None else rows
    h = None
    for p in pos.unique():
        at = (pos == p).nonzero().squeeze(1)
        part = model.hidden_states(tokens[at], RowCache(model, stores, rows[at], pos[at], tokens.size(1)))
        h = part.new_empty(len(pos), *part.shape[1:]) if h is None else h
        h[at] = part
    return h


def draft(model, hidden, window, cached, n):
    """n tokens drafted greedily for each row by the first n MTP modules (b, n). Row r's window (right-padded)
    holds its cached[r] tokens and the pending one, hidden (b, max(cached), n_embd) the final hidden states of the
    cached ones (right-padded): depth k reads, at each position i, the previous depth's state and token i + k (the
    window's, then the drafts), so row r's last cached position predicts its token cached[r] + k. The padding comes
    after a row's positions, which causal attention keeps from seeing it."""
    b, L = hidden.shape[:2]
    rows = torch.arange(b, device=window.device)
    last = (cached - 1).clamp(min=0)  # a row with nothing cached drafts nothing (its n is 0): any position will do
    seq = torch.cat((window, window.new_zeros(b, L + 1 + n - window.size(1))), dim=1)
    h, drafts = hidden, []
    for k, module in enumerate(model.mtp[:n], start=1):
        h = mtp_states(model, module, h, seq[:, k:k + L])
        token = model.logits(module.norm(h[rows, last][:, None]))[:, 0].argmax(dim=-1)
        seq[rows, cached + k] = token  # row r's token cached[r] + k, read by the next depth
        drafts.append(token)
    return torch.stack(drafts, dim=1)


class SpeculativeRows:
    """What each row of a speculative batch holds: its window (its tokens in the cache, then the pending one;
    right-padded), its cached tokens' final hidden states, its window's length, the tokens made so far and
    whether its cache is empty (the start, a context shift)."""

    def __init__(self, idx, block_size, length, max_new_tokens):
        B, device = idx.size(0), idx.device
        self.keep = max(1, block_size // 2)
        window = idx if idx.size(1) <= block_size else idx[:, -self.keep:]
        self.windows = torch.cat((window, window.new_zeros(B, length + 1 - window.size(1))), dim=1)
        self.hidden = None  # (B, length, n_embd) once a forward gives the dtype
        self.lengths = torch.full((B,), window.size(1), device=device)
        self.made = torch.zeros(B, dtype=torch.long, device=device)
        self.fresh = torch.ones(B, dtype=torch.bool, device=device)
        self.out = idx.new_zeros(B, max_new_tokens)

    def store_hidden(self, rows, positions, h):
        if self.hidden is None:
            self.hidden = h.new_zeros(self.windows.size(0), self.windows.size(1) - 1, h.size(-1))
        self.hidden[rows, positions] = h

    def shift_contexts(self, active, block_size):
        """Rows past block_size keep their newest half, their cache rebuilt from it (generate's context shift)."""
        for r in active[self.lengths[active] > block_size].tolist():
            self.windows[r, :self.keep] = self.windows[r, self.lengths[r] - self.keep:self.lengths[r]].clone()
            self.lengths[r], self.fresh[r] = self.keep, True


def prefill_fresh(model, stores, s, active, together):
    """Rows whose cache is empty and whose window has tokens for it: a prefill, the rows of one length together."""
    B, device = s.windows.size(0), s.windows.device
    empty = active[s.fresh[active] & (s.lengths[active] > 1)] if bool(s.fresh.any()) else active[:0]
    for size in s.lengths[empty].unique().tolist():
        these = empty[s.lengths[empty] == size]
        h = forward_rows(model, stores, None if len(these) == B else these, s.windows[these, :size - 1],
                         torch.zeros(len(these), dtype=torch.long, device=device), together)
        s.store_hidden(these[:, None], torch.arange(size - 1, device=device), h)


def speculative_round(model, stores, s, active, together, max_new_tokens, vocab_limit, stats):
    """One forward of the active rows: each verifies its pending token and drafts, keeps the drafts it would have
    chosen itself plus its own next token; its cache slots past them are taken back (rewritten before read)."""
    block_size, depth = model.config.block_size, model.config.mtp_depth
    rows = None if len(active) == s.windows.size(0) else active
    pick = (lambda t: t) if rows is None else (lambda t: t[active])
    sizes = pick(s.lengths)
    pos = sizes - 1  # tokens each row's cache holds: its window but the pending last one
    # drafts that fit: a window may pass block_size only with the round's last token, as generate's does
    n = torch.minimum(torch.minimum(pos, block_size - sizes), max_new_tokens - 1 - pick(s.made)).clamp(0, depth)
    width = int(n.max())
    pending = s.windows[active, pos][:, None]  # (b, 1)
    drafts = pending.new_zeros(len(active), 0)
    if width:
        L = int(pos.max())
        drafts = draft(model, pick(s.hidden[:, :L]), pick(s.windows[:, :L + 1]), pos, width)
    h = forward_rows(model, stores, rows, torch.cat((pending, drafts), dim=1), pos, together)
    chosen = model.logits(h)[..., :vocab_limit].argmax(dim=-1)  # (b, width + 1): the model's own choices
    steps = torch.arange(width + 1, device=pos.device)
    accepted = ((chosen[:, :width] == drafts) & (steps[:width] < n[:, None])).int().cumprod(dim=1).sum(dim=1)
    kept = steps <= accepted[:, None]  # (b, width + 1): the pending token's successor and the drafts kept
    at = active[:, None].expand_as(kept)[kept]
    into = (pos[:, None] + steps)[kept]  # the positions of the inputs kept: pos[r], pos[r] + 1, ..
    s.store_hidden(at, into, h[kept])  # the pending token's and the kept drafts' states, at their positions
    s.windows[at, into + 1] = chosen[kept]
    s.out[at, (s.made[active][:, None] + steps)[kept]] = chosen[kept]
    s.made[active] += accepted + 1
    s.lengths[active] += accepted + 1
    s.fresh[active] = False
    for key, value in (('rounds', 1), ('row_rounds', len(active)), ('drafted', int(n.sum())),
                       ('accepted', int(accepted.sum()))):
        stats[key] += value


@torch.no_grad()
def generate_speculative(model, idx, max_new_tokens, vocab_limit=None, report=None):
    """Greedy decoding (temperature 0) with the MTP modules as drafters: each round they draft up to mtp_depth
    tokens a row, the model verifies each row's pending token and drafts in one forward of the batch, and each row
    keeps the drafts it would have chosen itself plus its own next token; its cache slots past them are taken back.
    Each row goes at its own pace (a position of its own in the cache, its own context shift), so one row's rejected
    draft costs the others nothing. The tokens are plain greedy decoding's (each the model's argmax after the ones
    before; the context shifts as generate's); fewer forwards. report: called after each round with the new tokens
    every row has (a progress line). Returns (idx and the new tokens, {'drafted', 'accepted', 'rounds': forwards of
    the batch, 'row_rounds': the rounds each row took part in, summed})."""
    problem = speculation_problem(model)
    if problem:
        raise ValueError(problem)
    length = speculative_cache_length(model)
    stores = KVCache(model, idx.size(0), length, cache_dtype(model), idx.device).stores
    together = rows_apart(model)
    s = SpeculativeRows(idx, model.config.block_size, length, max_new_tokens)
    stats = {'drafted': 0, 'accepted': 0, 'rounds': 0, 'row_rounds': 0}
    while True:
        active = (s.made < max_new_tokens).nonzero().squeeze(1)
        if not len(active):
            break
        prefill_fresh(model, stores, s, active, together)
        speculative_round(model, stores, s, active, together, max_new_tokens, vocab_limit, stats)
        s.shift_contexts(active, model.config.block_size)
        if report is not None:
            report(int(s.made.min()))
    return torch.cat((idx, s.out), dim=1), stats


FEATURES.append(MultiTokenPrediction)
