"""
Engram (DeepSeek, 2026, "Conditional Memory via Scalable Lookup"): hashed n-gram memories. At a few layers the
stream gains what a table remembers of the n-grams ending at each token: for n = 2..engram_ngram, engram_heads hash
heads each map the n-gram's token ids to a row of a table of its own, a prime number of rows (so that the heads'
collisions differ); the rows of every head, side by side, are projected to a key and a value. The stream gates the
value: sigmoid of the scaled dot product of the normalized key and the normalized stream, signed-square-rooted;
then a short causal depthwise convolution (kernel engram_conv, dilation engram_ngram) over the normalized gated
value, through SiLU, is added to it, and the sum to the stream before the layer. Facts keyed by short token
sequences are looked up, not computed: the tables cost parameters and no FLOPs (get_num_params counts them,
flops_per_token does not); the projections cost a Linear's FLOPs, the convolution's products are elementwise
(counted by neither flops_per_token nor torch's counter, as the norms).

The hashing is Qwen4-Exp's (transformers' qwen4_exp, whose PLE layers carry this memory): odd multipliers per layer
from splitmix64 (seed 1234, a stride of 10007 per memory layer), the n-gram's ids times them xor-ed, modulo each
head's prime, the k-th prime from engram_rows for the k-th head of all layers. Before a sequence's first token
stands the id vocab_size (no token); Qwen4-Exp stands its eos there and restarts the n-grams after each eos, and
it adds the memory to each copy of a hyper-connected stream: its parity needs both (not here yet).

Decoding keeps the last engram_ngram - 1 tokens and each memory layer's convolution's last inputs in the cache
(Feature.cache_states), so a cached continuation computes what a full forward does.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters.short_conv import shifted_products
from chapters.speedrun import LAYER_LIST, continues, layers_of
from model import FEATURES, OPTIONAL_POSITIVE_INT, Feature, RMSNorm, changed, flag_list, is_int

SEED, LAYER_STRIDE = 1234, 10007  # Qwen4-Exp's: the hash multipliers' seed, and its stride per memory layer
GOLDEN, MIX = 0x9E3779B97F4A7C15, (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # splitmix64's constants
MASK64 = (1 << 64) - 1
SHAPE_FIELDS = ('engram_ngram', 'engram_heads', 'engram_dim', 'engram_rows', 'engram_conv', 'engram_eos')


@dataclass
class Config:
    engram_layers: str | None = None  # layers whose input gains the n-gram memory's output, e.g. '1,-2' (DeepSeek's Engram: 2 of 30 layers); None: none
    engram_ngram: int = 3  # the memory's n-grams: n = 2..this (Engram, Qwen4-Exp: 3)
    engram_heads: int = 4  # hash heads per n, each its own table of a prime number of rows (Qwen4-Exp: 8)
    engram_dim: int | None = None  # width of the rows of every head side by side, a multiple of (engram_ngram-1)*engram_heads; None: n_embd
    engram_rows: int = 10007  # each head's table has a prime number of rows: the primes from this up, the next for each head and memory layer (Qwen4-Exp: from 20,000,000)
    engram_conv: int = 4  # kernel of the causal depthwise convolution over the gated memory, dilation engram_ngram (Engram, Qwen4-Exp: 4)
    engram_eos: int | None = None  # the token id that stands before a sequence and after which the n-grams restart (Qwen4-Exp: its eos_token_id); None: vocab_size before it, no restarts

    FIELD_TYPES = {
        'engram_layers': LAYER_LIST,
        'engram_ngram': (lambda v, c: is_int(v, 2), 'an int >= 2'),
        **dict.fromkeys(('engram_heads', 'engram_conv'), (lambda v, c: is_int(v), 'an int >= 1')),
        'engram_dim': OPTIONAL_POSITIVE_INT,
        'engram_rows': (lambda v, c: is_int(v, 2), 'an int >= 2'),
        'engram_eos': (lambda v, c: v is None or is_int(v, 0, c.vocab_size - 1),
                       lambda c: f"None or a token id in [0, vocab_size-1={c.vocab_size - 1}]"),
    }
    CHECKS = [
        (lambda c: changed(c, SHAPE_FIELDS) and c.engram_layers is None,
         lambda c: f"{flag_list(c, changed(c, SHAPE_FIELDS))} shape the n-gram memory: set engram_layers (e.g. '1') "
                   f"or leave them at their defaults"),
        (lambda c: c.engram_layers is not None and c.engram_width % ((c.engram_ngram - 1) * c.engram_heads),
         lambda c: f"engram_dim={c.engram_width} must be a multiple of (engram_ngram-1)*engram_heads="
                   f"{(c.engram_ngram - 1) * c.engram_heads} (each head's rows an equal share)"),
        (lambda c: c.engram_layers is not None and c.norm_position == 'post',
         lambda c: "engram_layers adds to the stream between blocks, which norm_position='post' normalizes: use "
                   "another norm_position"),
    ]

    @property
    def engram_width(self):
        return self.engram_dim or self.n_embd

    @property
    def stream_copies(self):
        """The copies of the residual stream the memory gates: 1, a plain stream (hyper_connections widens it)."""
        return 1


def splitmix64(value):
    value = (value + GOLDEN) & MASK64
    value = ((value ^ (value >> 30)) * MIX[0]) & MASK64
    value = ((value ^ (value >> 27)) * MIX[1]) & MASK64
    return value ^ (value >> 31)


def hash_multipliers(vocab_size, n, index):
    """n odd multipliers for the index-th memory layer, each below (2**63 - 1) // vocab_size, so that any id up to
    vocab_size times one stays within int64."""
    half = max(1, (2 ** 63 - 1) // vocab_size // 2)
    base = SEED + LAYER_STRIDE * index
    return [2 * (splitmix64((base + GOLDEN * (j + 1)) & MASK64) % half) + 1 for j in range(n)]


def is_prime(n):
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def primes_from(low, skip, count):
    """count consecutive primes >= low, after the first `skip` of them."""
    primes, n = [], low
    while len(primes) < skip + count:
        if is_prime(n):
            primes.append(n)
        n += 1
    return primes[skip:]


class GroupedRMSNorm(nn.Module):
    """RMSNorm of each of the n copies of a hyper-connected stream (B, T, n, d) over its d channels, each copy with
    gains of its own (Qwen4-Exp's norm grouped by hidden_size over the flattened copies); computed in fp32."""

    def __init__(self, n, d, eps):
        super().__init__()
        self.n, self.d, self.eps = n, d, eps
        self.weight = nn.Parameter(torch.ones(n * d))  # flat, as Qwen4-Exp keeps it

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float().view(self.n, self.d)).to(x.dtype)


class EngramTable(nn.Embedding):
    """One memory layer's tables, every head's rows in one (sum of the primes, head width) table: a token's lookup
    is the rows of its n-grams' heads, side by side (B, T, engram_dim)."""

    def __init__(self, config, index):
        heads = (config.engram_ngram - 1) * config.engram_heads
        sizes = primes_from(config.engram_rows, index * heads, heads)
        super().__init__(sum(sizes), config.engram_width // heads)
        self.ngram, self.heads, self.eos = config.engram_ngram, config.engram_heads, config.engram_eos
        self.pad = config.vocab_size if self.eos is None else self.eos
        offsets = [sum(sizes[:h]) for h in range(heads)]
        multipliers = hash_multipliers(config.vocab_size, config.engram_ngram, index)
        self.register_buffer('multipliers', torch.tensor(multipliers), persistent=False)
        self.register_buffer('sizes', torch.tensor(sizes), persistent=False)
        self.register_buffer('offsets', torch.tensor(offsets), persistent=False)

    def history(self, idx, before=None):
        """The tokens the n-grams read (B, ngram - 1 + T): before (B, ngram - 1), a cache's last tokens, else the id
        vocab_size or engram_eos (before the sequence), then idx."""
        before = idx.new_full((idx.size(0), self.ngram - 1), self.pad) if before is None else before
        return torch.cat((before.to(idx.dtype), idx), dim=1).long()

    def ids(self, idx, before=None):
        """Each head's row for each position (B, T, heads): the n-gram ending at the token, for n = 2..ngram, its
        ids times the multipliers xor-ed (the history's), modulo the head's prime."""
        T, C = idx.size(1), self.ngram - 1
        history = self.history(idx, before)
        mixed = history[:, C:] * self.multipliers[0]
        if self.eos is not None:  # eos_seen[:, j]: the eos among the history's first j tokens
            eos_seen = F.pad((history == self.eos).long().cumsum(1), (1, 0))
        rows = []
        for n in range(2, self.ngram + 1):
            back = n - 1  # the token this far back joins the n-gram
            token = history[:, C - back:C - back + T]
            if self.eos is not None:  # an eos in the `back` tokens before: the n-gram restarted, eos stands in
                crossed = eos_seen[:, C:C + T] - eos_seen[:, C - back:C - back + T] > 0
                token = torch.where(crossed, torch.full_like(token, self.eos), token)
            mixed = torch.bitwise_xor(mixed, token * self.multipliers[back])
            heads = slice((n - 2) * self.heads, (n - 1) * self.heads)
            rows.append(mixed.unsqueeze(-1) % self.sizes[heads] + self.offsets[heads])
        return torch.cat(rows, dim=-1)

    def forward(self, idx, before=None):
        return super().forward(self.ids(idx, before)).flatten(-2)


class EngramBranch(nn.Module):
    """A memory layer's part in its block: the rows of its n-grams, gated by the stream, plus the causal
    convolution's; added to the stream before the block. With n copies of the stream (B, T, n, d), each copy
    gates the shared value by a key of its own, its norms grouped per copy, and the convolution runs over them
    all (n d channels)."""

    def __init__(self, config):
        super().__init__()
        width, d, n = config.engram_width, config.n_embd, config.stream_copies
        self.copies = n
        self.key_proj = nn.Linear(width, n * d, bias=False)
        self.value_proj = nn.Linear(width, d, bias=False)
        self.norm_key, self.norm_query, self.norm_conv = (
            RMSNorm(d, config) if n == 1 else GroupedRMSNorm(n, d, config.norm_eps) for _ in range(3))
        c = n * d
        self.conv = nn.Conv1d(c, c, config.engram_conv, groups=c, dilation=config.engram_ngram, bias=False)
        self.dilation = config.engram_ngram
        self.reach = (config.engram_conv - 1) * self.dilation  # the positions before a token it reads

    def forward(self, x, rows, past=None, keep=None):
        """past (B, reach, d): the convolution's inputs before x's first token (a cache's), else zeros; keep: where
        to write its last reach inputs, for the next call."""
        key, value = self.key_proj(rows), self.value_proj(rows)
        if self.copies > 1:  # a key per copy, the value shared: (B, T, n, d) and (B, T, 1, d)
            key, value = key.unflatten(-1, (self.copies, -1)), value.unsqueeze(-2)
        key = self.norm_key(key)
        gate = (key * self.norm_query(x)).sum(-1, keepdim=True) / x.size(-1) ** 0.5
        gated = torch.sigmoid(gate.abs().clamp_min(1e-6).sqrt() * gate.sign()) * value
        normed = self.norm_conv(gated).flatten(2)  # the copies side by side: the convolution's channels
        inputs = F.pad(normed, (0, 0, self.reach, 0)) if past is None else torch.cat((past.to(normed.dtype), normed), 1)
        if keep is not None:
            keep.copy_(inputs[:, inputs.size(1) - self.reach:])
        conv = shifted_products(inputs, self.conv.weight, self.dilation)  # elementwise: neither FLOP count counts it
        return x + gated + F.silu(conv).view_as(gated)


class Engram(Feature):
    """The memory layers' tables (model.transformer.engram_tables, outside the blocks: AdamW's, not Muon's) and
    branches (each memory layer's block.engram), the stream passed through a branch before each memory layer."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.engram_layers is not None

    def build(self, model):
        self.layers = layers_of(self.config.engram_layers, self.config)
        t = model.transformer
        t.engram_tables = nn.ModuleDict({str(i): EngramTable(self.config, index)
                                         for index, i in enumerate(self.layers)})
        for i in self.layers:
            t.h[i].engram = EngramBranch(self.config)

    def cache_states(self):
        """The last engram_ngram - 1 tokens, and each memory layer's convolution's last inputs."""
        c = self.config
        reach = (c.engram_conv - 1) * c.engram_ngram
        return {'engram_tokens': ((c.engram_ngram - 1,), torch.long),
                **{f'engram_conv{i}': ((reach, c.stream_copies * c.n_embd), None) for i in layers_of(c.engram_layers, c)}}

    def embed(self, model, idx, x, start, tables):
        t, cache = model.transformer, tables['cache']
        held = tables['engram_held'] = continues(start, cache)
        before = None if held is None else held['engram_tokens']
        tables['engram'] = {i: t.engram_tables[str(i)](idx, before) for i in self.layers}
        if cache is not None:  # after the lookups read them
            history = t.engram_tables[str(self.layers[0])].history(idx, before)
            cache['engram_tokens'].copy_(history[:, history.size(1) - (self.config.engram_ngram - 1):])
        return self.branch(model, 0, x, tables, held) if 0 in self.layers else x

    def branch(self, model, layer, x, tables, held):
        """x through the memory layer's branch, its convolution continuing the cache's inputs (held: the features'
        part of a cache when this forward continues it)."""
        cache, name = tables['cache'], f'engram_conv{layer}'
        return model.transformer.h[layer].engram(x, tables['engram'][layer], None if held is None else held[name],
                                                 None if cache is None else cache[name])

    def after_block(self, model, layer, x, tables):
        if layer + 1 in self.layers:
            return self.branch(model, layer + 1, x, tables, tables['engram_held'])
        return x


FEATURES.append(Engram)
