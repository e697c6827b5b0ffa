"""
DeepSeek-V4's block (DeepSeek, 2026), the parts the earlier chapters lack; its hyper-connections are the next
chapter's (hyper_connections.py), its sliding window layer_kinds.py's, its sinks and partial RoPE attention.py's.

- Attention with one shared key-value head (attn='shared_kv'): the queries from a low-rank bottleneck (q_rank,
  RMS-normalised with a gain), then each query head scaled to unit RMS without one; one head per token, normalised
  and rotated, is both the key and the value of every query head, so the cache keeps head_dim numbers per token
  and layer, half of MQA's. The softmax scale is head_dim^-1/2, sinks (attn_sinks) join it. With K = V the values
  are rotated too: the output's rotated dims are turned back by the query's position (inverse RoPE), so what each
  past token contributes depends only on how far back it is.
- The grouped low-rank output projection (o_groups, o_lora_rank): the heads fall into o_groups groups, each
  projected apart to o_lora_rank (one block-diagonal matrix), then the groups together to n_embd, so the output
  projection of n_head * head_dim (32768 in the release) costs a fraction of a dense one.
- The compressed layers, beside their window: 'H', heavily compressed attention (HCA), every hca_rate tokens
  pooled into one entry by a learned softmax per channel over the window (gates plus a bias by place),
  normalised, rotated at the window's start; 'I', compressed sparse attention (CSA), entries every csa_rate tokens
  pooled over overlapping windows of twice that, of which each query reads the csa_topk a lightning indexer scores
  highest (its own compressor and query heads; it learns from a KL loss of its own). The entries whose windows are
  complete join the window's keys in one softmax with the sinks, each entry key and value. Their RoPE table is the
  model's (DeepSeek-V4's compress_rope_theta with YaRN); the sliding layers' is rope_local_theta. A cache keeps
  the entries per block of positions, the pending tokens of the unfinished window and, for CSA, the last window's
  first halves.
- The router's sqrt-softplus score (router_score='sqrtsoftplus', with router='sigmoid': the biased top-k of
  DeepSeek-V3, its weights renormalised and times routed_scaling): score = sqrt(softplus(logit)).
- Hash routing (hash_moe_layers): the first MoE layers take each token's experts from a frozen table by its id
  (random here, k distinct experts per id), weighted by the router's scores renormalised.
- The clamped SwiGLU of DeepSeek-V4 (swiglu_form='plain' with swiglu_limit L): silu(min(gate, L)) * clamp(up, -L,
  L), on the routed and the shared experts ('plain_routed': on the routed experts only, HY-V4's; 'plain_all': on
  the dense MLPs of an MoE model's other layers as well, GLM-5.3-Flash's); gpt-oss's form (moe.py) is another,
  on the routed experts alone ('gpt-oss') or on the shared experts and the dense layers' MLP too ('gpt-oss_all',
  MiniMax-M3's).

DeepSeek-V4 rotates the last dims of each head in pairs; these rotate the first in halves, as every chapter here
does: the same model with its head dims in another order (hf/deepseek_v4.py reorders the weights).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

import model as M
from chapters import attention
from chapters.layer_kinds import WINDOWED
from chapters.moe import Experts, MoE, oss_swiglu
from chapters.sparse_attention import top_k_earliest, visible_keys
from model import ATTENTIONS, FEATURES, LAYER_KINDS, NON_NEGATIVE_NUMBER, OPTIONAL_POSITIVE_INT, POSITIVE_INT, \
    Feature, GatedMLP, LayerKind, RMSNorm, TokenMixer, apply_rope, changed, flag_list, is_int, kinds, one_of

SHARED_KV_FIELDS = ('q_rank', 'o_groups', 'o_lora_rank')
# attention's switches that a shared key-value head, normalised its own way, cannot take
SHARED_KV_CANNOT = ('n_kv_head', 'qk_norm', 'qk_norm_all_heads', 'qkv_bias', 'attn_gate', 'v_norm', 'rope_qk_norm',
                    'nope_temperature', 'index_topk')
HCA_FIELDS = ('hca_rate',)  # the flags of 'H' layers, and of 'I' layers
CSA_FIELDS = ('csa_rate', 'csa_topk', 'csa_index_heads', 'csa_index_dim', 'csa_index_loss_coef')
COMPRESSED_KINDS = ('H', 'I')
ROUTER_SCORES = (None, 'sqrtsoftplus')
RUNTIME_FLAGS = ('csa_index_loss_coef',)  # changes no weight
TRAINING_FLAGS = ('csa_index_loss_coef',)  # a loss term's weight
SWIGLU_FORMS = ('gpt-oss', 'plain', 'plain_routed', 'plain_all', 'gpt-oss_all')
CLAMPS_ALL = ('plain_all', 'gpt-oss_all')  # the forms that clamp the dense layers' MLP too


def defaults(c, names):
    """The flags of names set away from their defaults, as the command-line flags that put them back."""
    return ' '.join(f'--{k}={type(c).__dataclass_fields__[k].default}' for k in changed(c, names))


@dataclass
class Config:
    q_rank: int | None = None  # attn='shared_kv': the queries' low-rank bottleneck, RMS-normalised with a gain (DeepSeek-V4's q_lora_rank: 1024); None: queries projected directly
    o_groups: int = 1  # attn='shared_kv' with o_lora_rank: the heads fall into this many groups, each projected apart (DeepSeek-V4: 8)
    o_lora_rank: int | None = None  # attn='shared_kv': each group of heads projected to this width, then all groups to n_embd (DeepSeek-V4: 1024); None: one projection
    router_score: str | None = None  # router='sigmoid': 'sqrtsoftplus' scores the experts by sqrt(softplus(logit)) in place of the sigmoid (DeepSeek-V4); None: the sigmoid
    swiglu_form: str = 'gpt-oss'  # how swiglu_limit L clamps: 'gpt-oss' (moe.py's); 'plain': silu(min(gate, L)) * clamp(up, -L, L), routed and shared experts (DeepSeek-V4: L = 10); 'plain_routed': the routed experts only (HY-V4); 'plain_all': routed, shared and the dense layers' MLP (GLM-5.3-Flash); 'gpt-oss_all': gpt-oss's form there too (MiniMax-M3)
    hash_moe_layers: int = 0  # the first k MoE layers route by the token id: each id's experts from a frozen random table, weighted by the router's scores (DeepSeek-V4: 3)
    hca_rate: int = 128  # 'H' layers (heavily compressed attention): every m tokens pooled into one entry the queries read beside their window (DeepSeek-V4: 128)
    csa_rate: int = 4  # 'I' layers (compressed sparse attention): an entry every m tokens pooled over 2m, the windows overlapping by half (DeepSeek-V4: 4)
    csa_topk: int = 512  # 'I' layers: each query reads the k entries its indexer scores highest (DeepSeek-V4: 512)
    csa_index_heads: int = 4  # 'I' layers: the indexer's query heads (DeepSeek-V4: 64)
    csa_index_dim: int = 32  # 'I' layers: width of the indexer's heads and of its entries; the first rope_dim dims rotate (DeepSeek-V4: 128)
    csa_index_loss_coef: float = 1.0  # 'I' layers: the indexer's KL loss toward the attention over the entries, times this, joins the training loss; 0: the indexer does not learn

    FIELD_TYPES = {
        'q_rank': OPTIONAL_POSITIVE_INT,
        'o_groups': POSITIVE_INT,
        'o_lora_rank': OPTIONAL_POSITIVE_INT,
        'router_score': one_of(ROUTER_SCORES),
        'swiglu_form': one_of(SWIGLU_FORMS),
        'hash_moe_layers': (lambda v, c: is_int(v, 0), 'an int >= 0'),
        **kinds('hca_rate csa_rate csa_topk csa_index_heads csa_index_dim', POSITIVE_INT),
        'csa_index_loss_coef': NON_NEGATIVE_NUMBER,
    }
    CHECKS = [
        (lambda c: changed(c, SHARED_KV_FIELDS) and c.attn != 'shared_kv',
         lambda c: f"{flag_list(c, changed(c, SHARED_KV_FIELDS))} apply to attn='shared_kv' only, got attn={c.attn!r}"),
        (lambda c: c.attn == 'shared_kv' and changed(c, SHARED_KV_CANNOT),
         lambda c: f"attn='shared_kv' makes one key-value head, normalised its own way: "
                   f"{flag_list(c, changed(c, SHARED_KV_CANNOT))} cannot apply (set {defaults(c, SHARED_KV_CANNOT)})"),
        (lambda c: c.o_groups != 1 and c.o_lora_rank is None,
         lambda c: f"o_groups={c.o_groups} groups the low-rank output projection: set o_lora_rank (each group's "
                   f"width)"),
        (lambda c: c.n_head % c.o_groups != 0,
         lambda c: f"o_groups ({c.o_groups}) must divide n_head ({c.n_head}): each group is whole heads"),
        (lambda c: c.router_score is not None and (c.mlp != 'moe' or c.router != 'sigmoid'),
         lambda c: f"router_score={c.router_score!r} scores the experts of the biased top-k router: set mlp='moe' and "
                   f"router='sigmoid', got mlp={c.mlp!r}, router={c.router!r}"),
        (lambda c: c.router_score is not None and c.n_expert_group != 1,
         lambda c: f"router_score={c.router_score!r} chooses among all the experts (DeepSeek-V4 has no groups): set "
                   f"n_expert_group=1, got {c.n_expert_group}"),
        (lambda c: changed(c, ('swiglu_form',)) and c.swiglu_limit is None,
         lambda c: f"swiglu_form={c.swiglu_form!r} says how swiglu_limit clamps: set swiglu_limit (DeepSeek-V4: 10)"),
        (lambda c: c.hash_moe_layers and c.mlp != 'moe',
         lambda c: f"hash_moe_layers={c.hash_moe_layers} routes MoE layers by the token id: set mlp='moe', got "
                   f"mlp={c.mlp!r}"),
        (lambda c: c.mlp == 'moe' and c.hash_moe_layers > len(c.moe_layer_indices),
         lambda c: f"hash_moe_layers={c.hash_moe_layers} is more than the model's {len(c.moe_layer_indices)} MoE "
                   f"layers"),
        *[(lambda c, fields=fields, kind=kind: changed(c, fields) and kind not in c.layer_kinds,
           lambda c, fields=fields, kind=kind, name=name: f"{flag_list(c, changed(c, fields))} apply to {name} layers "
                                                          f"({kind!r}) and layers={c.layers!r} has none: add {kind!r} "
                                                          f"to layers or set {defaults(c, fields)}")
          for fields, kind, name in ((HCA_FIELDS, 'H', 'heavily compressed'), (CSA_FIELDS, 'I', 'compressed sparse'))],
        (lambda c: set(COMPRESSED_KINDS) & set(c.layer_kinds) and c.attn != 'shared_kv',
         lambda c: f"layers={c.layers!r} has compressed layers ('H', 'I'), which pool DeepSeek-V4's one key-value "
                   f"head: set attn='shared_kv' and n_kv_head=None, got attn={c.attn!r}"),
        (lambda c: 'I' in c.layer_kinds and c.pos == 'rope' and c.csa_index_dim < c.rope_dim,
         lambda c: f"csa_index_dim ({c.csa_index_dim}) must be at least the rotated width of a head ({c.rope_dim}): "
                   f"the indexer rotates its first dims with the attention's tables"),
        # a rate above block_size: no window completes, no entry forms, the compressor never learns, and the layer
        # is plain windowed attention
        *[(lambda c, rate=rate, kind=kind: kind in c.layer_kinds and getattr(c, rate) > c.block_size,
           lambda c, rate=rate, kind=kind, name=name: f"{rate}={getattr(c, rate)} is above block_size "
                                                      f"({c.block_size}): the {name} layers ({kind!r}) would never "
                                                      f"complete a window, so never form an entry; set {rate} to "
                                                      f"at most {c.block_size}")
          for rate, kind, name in (('hca_rate', 'H', 'heavily compressed'), ('csa_rate', 'I', 'compressed sparse'))],
    ]

    @property
    def moe_layer_indices(self):
        """The layers whose MLP is an MoE."""
        return [i for i in range(self.n_layer) if self.mlp_of(i) == 'moe']

    @property
    def hash_layers(self):
        """The layers routed by the token id (hash_moe_layers): the first MoE layers."""
        return self.moe_layer_indices[:self.hash_moe_layers] if self.mlp == 'moe' else []


# ----------------------------------------------------------------------------- attention

class GroupedLinear(nn.Linear):
    """A block-diagonal linear: the input's `groups` equal parts each through its own rows of the weight
    (out_features / groups of them), the outputs side by side. Its weight is (out_features, in_features / groups),
    transformers' DeepseekV4GroupedLinear's; a token multiplies each weight once, as through a Linear."""

    def __init__(self, in_features, out_features, groups):
        super().__init__(in_features // groups, out_features, bias=False)
        self.groups = groups

    def forward(self, x):
        parts = x.unflatten(-1, (self.groups, self.in_features))  # (..., groups, in / groups)
        w = self.weight.view(self.groups, -1, self.in_features)  # (groups, out / groups, in / groups)
        return torch.einsum('...gi,goi->...go', parts, w).flatten(-2)


class SharedKVAttention(TokenMixer):
    """DeepSeek-V4's attention: n_head query heads over one key-value head. Queries from a low-rank bottleneck
    (q_rank) or one projection, each head RMS-normalised without a gain; the key-value head RMS-normalised with
    one; both rotated (their first rope_dim dims), the sinks in the softmax, the output's rotated dims turned
    back by the query's position, then the (grouped low-rank) output projection. A cache keeps the one head."""
    attends = True
    config_class = Config

    def __init__(self, config, layer=0, positions='rope', window=None):
        super().__init__()
        self.positions, self.window = positions, window
        self.n_head, self.head_size = H, hs = config.n_head, config.head_size
        d = config.n_embd
        if config.q_rank:
            self.q_a = nn.Linear(d, config.q_rank, bias=config.bias)
            self.q_a_norm = RMSNorm(config.q_rank, config)
            self.q_b = nn.Linear(config.q_rank, H * hs, bias=False)
            self.q_proj = None
        else:
            self.q_proj = nn.Linear(d, H * hs, bias=config.bias)
        self.c_kv = nn.Linear(d, hs, bias=config.bias)  # the one head, key and value
        self.kv_norm = RMSNorm(hs, config)
        self.sinks = nn.Parameter(torch.zeros(H)) if config.attn_sinks else None
        self.c_group = GroupedLinear(H * hs, config.o_groups * config.o_lora_rank, config.o_groups) \
            if config.o_lora_rank else None
        self.c_proj = nn.Linear(config.o_groups * config.o_lora_rank if config.o_lora_rank else H * hs, d,
                                bias=config.bias)
        self.scale, self.eps = config.attn_scale, config.norm_eps
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout

    def cache_entries(self):
        return {'kv': (1, self.head_size)}

    def token_flops(self, seq_len):
        """q.k and att.v over seq_len keys (at most the window), each key its own value."""
        return 3 * 2 * 2 * self.n_head * self.head_size * min(seq_len, self.window or seq_len)

    def heads(self, x, rope):
        """The queries' input (the bottleneck's latent, or x), the queries (B, H, T, hs), each head at unit RMS, and the
        key-value head (B, 1, T, hs), normalised; both rotated."""
        B, T, _ = x.size()
        q_in = x if self.q_proj is not None else self.q_a_norm(self.q_a(x))
        q = self.q_proj(x) if self.q_proj is not None else self.q_b(q_in)
        q = F.rms_norm(q.view(B, T, self.n_head, self.head_size), (self.head_size,), eps=self.eps).transpose(1, 2)
        kv = self.kv_norm(self.c_kv(x)).unsqueeze(1)
        if rope is not None:
            q, kv = apply_rope(q, *rope), apply_rope(kv, *rope)
        return q_in, q, kv

    def output(self, y, rope):
        """The attention's output (B, H, T, hs) to the stream: its rotated dims turned back by the query's position
        (the values were rotated at theirs), then the (grouped low-rank) projection."""
        if rope is not None:
            y = apply_rope(y, rope[0], -rope[1])
        y = y.transpose(1, 2).flatten(2)
        if self.c_group is not None:
            y = self.c_group(y)
        return self.resid_dropout(self.c_proj(y))

    def forward(self, x, rope=None, mask=None, cache=None):
        _, q, kv = self.heads(x, rope)
        if cache is not None:
            kv, = cache.update(kv=kv)
        # through the module, so a probe that replaces it sees the call
        y = attention.attend_with_sinks(q, kv, kv, mask, self.dropout if self.training else 0.0, self.scale, self.sinks)
        return self.output(y, rope)


# ----------------------------------------------------------------------------- the compressed layers

def wide(t):
    """t in float32 at least (half precision raised, float64 kept): softmaxes and scores are computed so."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


class Compressor(nn.Module):
    """DeepSeek-V4's compressor: every `rate` tokens pooled into one entry of `width`. Each token gives a candidate
    (c_kv) and a gate (c_gate) per channel; an entry is the candidates weighted by the softmax, per channel, of
    gate + a learned bias by the token's place in its window, RMS-normalised with a gain, and rotated at the
    window's first position. Overlapping (CSA): each token gives two halves, entry w pooling the first halves of
    window w-1 with the second halves of window w (2 * rate tokens, a stride of rate; window 0's first half is
    none). Entry w is complete once its window is: position (w + 1) * rate - 1.

    A cache (cache_blocks, cache_states) keeps the entries made (`name`), the pending tokens' candidates and
    gates (`name`_kv, `name`_gate: slot = position % rate) and, overlapping, the last complete window's first
    halves (`name`_prev_kv, `name`_prev_gate)."""

    def __init__(self, config, width, rate, overlap, name):
        super().__init__()
        self.width, self.rate, self.overlap, self.name = width, rate, overlap, name
        self.parts = 2 if overlap else 1
        self.c_kv = nn.Linear(config.n_embd, self.parts * width, bias=False)
        self.c_gate = nn.Linear(config.n_embd, self.parts * width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(rate, self.parts * width))
        self.norm = RMSNorm(width, config)

    def cache_blocks(self):
        return {self.name: (self.rate, (self.width,), None)}

    def cache_states(self):
        rate, width, name = self.rate, self.width, self.name
        pending = {f'{name}_kv': ((rate, self.parts * width), None), f'{name}_gate': ((rate, self.parts * width), None)}
        previous = {f'{name}_prev_kv': ((rate, width), None), f'{name}_prev_gate': ((rate, width), None)}
        return {**pending, **(previous if self.overlap else {})}

    def pool(self, kv, gate, previous=None):
        """Complete windows' candidates and gates (B, n, rate, parts * width) -> their entries (B, n, width),
        normalised. previous: the first halves (candidates, gates: (B, rate, width)) of the window before the
        first, or None: none."""
        width = self.width
        gate = wide(gate) + self.position_bias.to(wide(gate).dtype)
        if self.overlap:  # window w: the first halves of window w-1, then its own second halves
            B, n, rate, _ = kv.shape
            if previous is None:
                first_kv, first_gate = kv.new_zeros(B, 1, rate, width), gate.new_full((B, 1, rate, width), -math.inf)
            else:
                first_kv = previous[0][:, None].to(kv.dtype)
                first_gate = previous[1][:, None].to(gate.dtype) + self.position_bias.to(gate.dtype)[:, :width]
            # [:, :n]: a sequence shorter than a window has none, and so no first halves either
            kv = torch.cat((torch.cat((first_kv, kv[:, :-1, :, :width]), 1)[:, :n], kv[..., width:]), dim=2)
            gate = torch.cat((torch.cat((first_gate, gate[:, :-1, :, :width]), 1)[:, :n], gate[..., width:]), dim=2)
        return self.norm((kv * gate.softmax(dim=2).to(kv.dtype)).sum(dim=2))

    def rotate(self, entries, windows, table):
        """Entries (B, n, width) of windows `windows` (n,) rotated at their first positions; table: the full
        rotary (cos, sin), or None without RoPE."""
        if table is None:
            return entries
        at = windows * self.rate
        return apply_rope(entries.unsqueeze(1), table[0][at], table[1][at]).squeeze(1)

    def forward(self, x, table, cache=None):
        """Every entry the new tokens' positions have made (B, n, width), rotated: without a cache those of x's
        complete windows; with one, all so far (a decoding step: the cache's whole store, the entries not yet
        complete included, for the step's mask to hide)."""
        kv, gate = self.c_kv(x), self.c_gate(x)
        rate, width = self.rate, self.width
        if cache is None:
            n = x.size(1) // rate
            entries = self.pool(kv[:, :n * rate].unflatten(1, (n, rate)), gate[:, :n * rate].unflatten(1, (n, rate)))
            return self.rotate(entries, torch.arange(n, device=x.device), table)
        start, stores, name = cache.start, cache.stores, self.name
        pending_kv, pending_gate, made = stores[f'{name}_kv'], stores[f'{name}_gate'], stores[name]
        if self.overlap:
            prev_kv, prev_gate = stores[f'{name}_prev_kv'], stores[f'{name}_prev_gate']
        if isinstance(start, torch.Tensor):  # a decoding step: one token, its window's entry remade from the slots
            slot, window = start % rate, start // rate
            pending_kv.index_copy_(1, slot, kv.to(pending_kv.dtype))
            pending_gate.index_copy_(1, slot, gate.to(pending_gate.dtype))
            # the slots after this token's hold the last window's: the entry is partial, unseen until complete
            previous = (prev_kv, prev_gate.masked_fill(window == 0, -math.inf)) if self.overlap else None
            entry = self.pool(pending_kv[:, None], pending_gate[:, None], previous)
            made.index_copy_(1, window, self.rotate(entry, window, table).to(made.dtype))
            if self.overlap:  # the window complete: its first halves are the next one's previous
                done = slot == rate - 1
                prev_kv.copy_(torch.where(done, pending_kv[..., :width], prev_kv))
                prev_gate.copy_(torch.where(done, pending_gate[..., :width], prev_gate))
            return made
        pending, first = start % rate, start // rate  # a prefill or a chunk: the pending tokens, then the new
        if pending:
            kv = torch.cat((pending_kv[:, :pending].to(kv.dtype), kv), dim=1)
            gate = torch.cat((pending_gate[:, :pending].to(gate.dtype), gate), dim=1)
        n = kv.size(1) // rate
        if n:
            previous = (prev_kv, prev_gate) if self.overlap and first > 0 else None
            entries = self.pool(kv[:, :n * rate].unflatten(1, (n, rate)), gate[:, :n * rate].unflatten(1, (n, rate)),
                                previous)
            made[:, first:first + n] = self.rotate(entries, torch.arange(first, first + n, device=x.device), table)
            if self.overlap:
                prev_kv.copy_(kv[:, (n - 1) * rate:n * rate, :width])
                prev_gate.copy_(gate[:, (n - 1) * rate:n * rate, :width])
        left = kv.size(1) - n * rate
        pending_kv[:, :left], pending_gate[:, :left] = kv[:, n * rate:], gate[:, n * rate:]
        return made[:, :first + n]


class EntryIndexer(nn.Module):
    """CSA's lightning indexer: its own overlapping compressor (csa_index_dim wide) makes one key per entry; its
    query heads (from the queries' bottleneck) score each entry, score(t, w) = sum over heads h of
    weight_h(t) * ReLU(q_h(t) . k(w)) / sqrt(dim) (sparse_attention.py's indexer over entries instead of
    tokens), and each query reads the csa_topk entries it scores highest among those complete (of equal scores
    the earliest). The picking has no gradient: the indexer learns from its own loss (learn), the KL divergence
    from the attention's distribution over the entries read (summed over heads, renormalised, outside the
    gradient) to the softmax of its scores, on detached inputs, so it moves the indexer alone."""

    def __init__(self, config, rate, query_width):
        super().__init__()
        self.n_head, self.head_dim, self.topk = config.csa_index_heads, config.csa_index_dim, config.csa_topk
        self.loss_coef = config.csa_index_loss_coef
        self.compress = Compressor(config, self.head_dim, rate, overlap=True, name='index')
        self.wq = nn.Linear(query_width, self.n_head * self.head_dim, bias=False)
        self.weights = nn.Linear(config.n_embd, self.n_head, bias=False)
        self.loss = None  # what this forward adds to the training loss (times csa_index_loss_coef)
        self._scores = self._reads = None  # this forward's, for learn

    def flops(self, entries, qk_width):
        """Its scores over the entries (forward, and backward for its loss), and the attention's logits over them
        once more for the loss's target (forward only). Its Linears' inputs are detached: GPT's 6 per weight less
        2 (no input gradient), or without its loss 4 (nothing runs backward)."""
        learns = bool(self.loss_coef) and entries > 0  # a sequence shorter than a window makes no entry, no loss
        weights = sum(m.weight.numel() for m in (self.wq, self.weights, self.compress.c_kv, self.compress.c_gate))
        scores = (3 if learns else 1) * 2 * self.n_head * self.head_dim * entries
        return scores + (2 * qk_width * entries if learns else 0) - (2 if learns else 4) * weights

    def select(self, x, q_in, rope, table, cache, seen):
        """(B, T, n): the entries each query reads, of those it may see (seen, (T, n))."""
        B, T, _ = x.shape
        keys = self.compress(x.detach(), table, cache)  # (B, n, dim)
        q = self.wq(q_in.detach()).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        if rope is not None:
            q = apply_rope(q, *rope)
        w = wide(self.weights(x.detach())) * self.n_head ** -0.5
        dots = wide(q).reshape(B, -1, self.head_dim) @ wide(keys).transpose(-1, -2)  # the heads as rows
        dots = F.relu(dots.view(B, self.n_head, T, -1)) * self.head_dim ** -0.5
        scores = (w.transpose(1, 2).unsqueeze(-1) * dots).sum(1)  # (B, T, n)
        n = scores.size(-1)
        reads = seen.expand(B, T, n)
        if self.topk < n:  # else every entry is picked: the ones seen are read
            reads = top_k_earliest(scores, self.topk, hidden=~seen) & reads
        self._scores, self._reads = scores, reads
        return reads

    def learn(self, q, entries, scale):
        """In training, this forward's KL loss (self.loss) from the attention's queries q (B, H, T, dim) over the
        entries (B, n, dim) it read; queries that read none have no term."""
        self.loss = None
        if not (self.training and self.loss_coef) or not entries.size(1):
            return
        reads = self._reads
        rows = reads.any(-1, keepdim=True)  # (B, T, 1)
        # the entries not read pushed to a finite floor (a row reading none is then uniform, not nan, and its
        # target is made 0): their log-probability times the target's 0 there is 0
        unread = attention.bias_of(reads, torch.float32)  # in fp32, as the scores are without autocast
        log_index = (wide(self._scores) + unread).log_softmax(-1)
        with torch.no_grad():
            # wide after the matmul too: autocast runs it in half precision, where the floor would be -inf
            logits = wide(wide(q) @ wide(entries).unsqueeze(1).transpose(-1, -2)) * \
                (q.size(-1) ** -0.5 if scale is None else scale)
            target = logits.add_(unread.unsqueeze(1)).softmax(-1).sum(1) * rows
            target /= target.sum(-1, keepdim=True).clamp(min=1e-30)
        kl = (torch.xlogy(target, target) - target * log_index).sum(-1)
        self.loss = kl.sum() / rows.sum().clamp(min=1)


class CompressedAttention(SharedKVAttention):
    """DeepSeek-V4's compressed layers: the shared key-value attention over its window (sliding_window, or the whole
    past without one) and, in the same softmax with the sinks, the compressed entries (a Compressor's) whose
    windows are complete: HCA ('H') reads them all (one per hca_rate tokens); CSA ('I', overlapping windows, one
    per csa_rate tokens) reads the csa_topk its indexer picks. The entries are keys and values, rotated at their
    windows' first positions, so the output's turn back leaves each relative. Its positions are
    tables['compressed']: the model's rotary tables at its tokens' positions, and whole (the windows')."""

    def __init__(self, config, layer, sparse):
        super().__init__(config, layer, positions='compressed', window=config.sliding_window)
        self.rate = config.csa_rate if sparse else config.hca_rate
        self.compress = Compressor(config, self.head_size, self.rate, overlap=sparse, name='entries')
        self.indexer = EntryIndexer(config, self.rate, config.q_rank or config.n_embd) if sparse else None

    def _parts(self):
        return [self.compress] + ([self.indexer.compress] if self.indexer is not None else [])

    def cache_blocks(self):
        return {k: v for part in self._parts() for k, v in part.cache_blocks().items()}

    def cache_states(self):
        return {k: v for part in self._parts() for k, v in part.cache_states().items()}

    def token_flops(self, seq_len):
        """The window's keys (SharedKVAttention's) and every entry of a sequence of seq_len (training reads them
        all, masked), each key its own value; CSA's indexer."""
        entries = seq_len // self.rate
        index = self.indexer.flops(entries, self.n_head * self.head_size) if self.indexer is not None else 0
        return super().token_flops(seq_len) + 3 * 2 * 2 * self.n_head * self.head_size * entries + index

    def forward(self, x, rope=None, mask=None, cache=None):
        B, T, _ = x.size()
        table = None if rope is None else rope[2:]  # the whole tables, for the windows' first positions
        rope = None if rope is None else rope[:2]
        q_in, q, kv = self.heads(x, rope)
        if cache is not None:
            kv, = cache.update(kv=kv)
        positions = (0 if cache is None else cache.start) + torch.arange(T, device=x.device)
        entries = self.compress(x, table, cache)  # (B, n, hs)
        n = entries.size(1)
        seen = torch.arange(n, device=x.device) < ((positions + 1) // self.rate)[:, None]  # complete windows
        reads = seen.expand(B, T, n) if self.indexer is None else \
            self.indexer.select(x, q_in, rope, table, cache, seen)
        window = visible_keys(mask, T, kv.size(2), x.device).expand(B, T, -1)
        keys = torch.cat((kv, entries.unsqueeze(1).to(kv.dtype)), dim=2)
        # through the module, so a probe that replaces it sees the call
        y = attention.attend_with_sinks(q, keys, keys, torch.cat((window, reads), dim=-1)[:, None],
                           self.dropout if self.training else 0.0, self.scale, self.sinks)
        if self.indexer is not None:
            self.indexer.learn(q, entries, self.scale)
        return self.output(y, rope)


class CompressedTables(Feature):
    """The tables compressed layers read (tables['compressed']): the model's rotary (cos, sin) at the tokens'
    positions and whole (for their windows' first positions), None without RoPE; and their indexers' losses in the
    training loss."""
    config_class = Config

    @staticmethod
    def applies(config):
        return bool(set(COMPRESSED_KINDS) & set(config.layer_kinds))

    def embed(self, model, idx, x, start, tables):
        rope, rotary = tables['rope'], model.transformer.wpe
        tables['compressed'] = None if rope is None else (*rope, rotary.cos, rotary.sin)
        return x

    def __init__(self, config):
        super().__init__(config)
        self.index_sums = torch.zeros(2)  # the CSA indexers' KL loss summed over training forwards, and the count

    def loss(self, model, idx, h, targets):
        losses = [block.attn.indexer.loss for block in model.transformer.h
                  if getattr(block.attn, 'indexer', None) is not None and isinstance(block.attn, CompressedAttention)
                  and block.attn.indexer.loss is not None]
        if not losses:
            return None
        mean = sum(losses) / len(losses)
        self.index_sums = self.index_sums.to(mean.device) + torch.stack((mean.detach(), torch.ones_like(mean.detach())))
        return self.config.csa_index_loss_coef * mean

    def objective(self, model):
        if self.config.csa_index_loss_coef and 'I' in self.config.layer_kinds:
            return f"csa_index_loss_coef ({self.config.csa_index_loss_coef}) times the CSA indexers' KL loss"
        return None

    def figures(self, model):
        return {'csa_index_loss': M.mean_and_reset([self.index_sums])}


# ----------------------------------------------------------------------------- experts

def clamped_swiglu(gate, up, limit):
    """DeepSeek-V4's SwiGLU of clamped inputs: silu(min(gate, L)) * clamp(up, -L, L)."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def swiglu_of(form):
    """The clamped SwiGLU (gate, up, limit) -> hidden of a swiglu_form: gpt-oss's or DeepSeek-V4's."""
    return oss_swiglu if form.startswith('gpt-oss') else clamped_swiglu


class ClampedExperts(Experts):
    """The experts with DeepSeek-V4's clamped SwiGLU."""

    def act(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return clamped_swiglu(gate, up, self.limit)


class ClampedGatedMLP(GatedMLP):
    """The shared experts with DeepSeek-V4's clamped SwiGLU (and, swiglu_form='plain_all', the dense layers' MLP);
    with 'gpt-oss_all', gpt-oss's (MiniMax-M3)."""

    def __init__(self, config, hidden=None):
        super().__init__(config, hidden)
        self.limit, self.swiglu = config.swiglu_limit, swiglu_of(config.swiglu_form)

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        return self.dropout(self.c_proj(self.swiglu(gate, up, self.limit)))


class DeepseekV4MoE(MoE):
    """The MoE of moe.py with DeepSeek-V4's router score (sqrt(softplus(logit)): the experts chosen by the top-k of
    score + the balancing bias, weighted by their scores renormalised, times routed_scaling) and clamped SwiGLU
    (swiglu_form='plain', routed and shared experts; 'plain_routed', routed only; 'gpt-oss_all', gpt-oss's on the
    shared experts too). Its weights and names are the MoE's."""

    def __init__(self, config):
        super().__init__(config)
        self.sqrt_softplus = config.router_score == 'sqrtsoftplus'
        if config.swiglu_form.startswith('plain'):  # a plain form: built anew clamped (the same shapes)
            self.experts = ClampedExperts(config)
        # the shared experts clamped in the same form, but gpt-oss's (routed only) and HY-V4's
        if self.shared is not None and config.swiglu_form not in ('gpt-oss', 'plain_routed'):
            self.shared = ClampedGatedMLP(config, config.n_shared_expert * config.expert_hidden)

    def score(self, logits):
        """Each expert's score: sqrt(softplus(logit)), or the router's sigmoid or softmax."""
        if self.sqrt_softplus:
            return F.softplus(logits).sqrt()
        return logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)

    def choose(self, scores, tokens):
        """Each token's experts (N, k): the top k of score + the balancing bias."""
        return (scores + self.expert_bias).topk(self.k, dim=-1).indices

    def route(self, x, tokens=None):
        if not self.sqrt_softplus and tokens is None:
            return super().route(x)
        logits = self.router(x).float()
        scores = self.score(logits)
        experts = self.choose(scores, tokens)
        weights = scores.gather(1, experts)
        if self.norm_topk:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, scores, experts, weights


def hash_table(vocab_size, n_expert, k, generator=None):
    """(vocab_size, k): for each token id, k distinct experts drawn at random (the k largest of uniform draws)."""
    return torch.rand(vocab_size, n_expert, generator=generator).topk(k, dim=-1).indices


class HashMoE(DeepseekV4MoE):
    """DeepSeek-V4's hash routing (hash_moe_layers): a token's experts are its id's row of a frozen table
    (tid2eid, a saved buffer: random here, k distinct experts per id; Hugging Face starts it at zeros, the
    checkpoint brings its own), weighted by the router's scores of those experts renormalised, times
    routed_scaling. No balancing bias and no balancing loss: the router's scores do not choose. It reads the
    token ids beside x (inputs='tokens')."""
    inputs = 'tokens'

    def __init__(self, config):
        super().__init__(config)
        if self.sigmoid:  # the table chooses: no bias to balance it
            del self.expert_bias
        self.register_buffer('tid2eid', hash_table(config.vocab_size, self.E, self.k))

    def choose(self, scores, tokens):
        return self.tid2eid[tokens.reshape(-1)]

    def forward(self, x, tokens):
        y = super().forward(x, tokens)
        self.loss = None  # the table's choice is nothing a loss on the router's scores can balance
        return y

    @torch.no_grad()
    def balance(self, rate):
        self.load.zero_()


class DeepseekV4Experts(Feature):
    """The MoE layers in DeepSeek-V4's form where its router score or clamp is set, the first hash_moe_layers of
    them routed by the token id; with swiglu_form='plain_all', the dense layers' MLP clamped too."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.mlp == 'moe' and bool(changed(config, ('router_score', 'swiglu_form', 'hash_moe_layers')))

    def build_block(self, block, layer):
        if type(block.mlp) is GatedMLP and self.config.swiglu_form in CLAMPS_ALL:  # a dense layer (GLM-5.3-Flash)
            block.mlp = ClampedGatedMLP(self.config)
        if type(block.mlp) is not MoE:
            return
        if layer in self.config.hash_layers:
            block.mlp = HashMoE(self.config)
        elif changed(self.config, ('router_score', 'swiglu_form')):
            block.mlp = DeepseekV4MoE(self.config)


ATTENTIONS['shared_kv'] = SharedKVAttention
FEATURES.append(DeepseekV4Experts)
FEATURES.append(CompressedTables)


def _compressed_needs(flags, window, sparse):
    """What a model of compressed layers needs: the one shared key-value head; HCA a window's worth of tokens in
    each entry (V4's 128 is past a short block_size); CSA an indexer as wide as a head."""
    head = flags.get('head_dim') or flags['n_embd'] // flags['n_head']
    return {'attn': 'shared_kv', 'n_kv_head': None,
            **({'csa_index_dim': max(32, head)} if sparse else {'hca_rate': window})}


WINDOWED.update('HI')  # every V4 layer keeps a sliding window beside its compressed entries
LAYER_KINDS['H'] = LayerKind('heavily compressed', lambda config, layer: CompressedAttention(config, layer, False),
                             'hca', attention=True, needs=lambda flags, window: _compressed_needs(flags, window, False),
                             config_class=Config)
LAYER_KINDS['I'] = LayerKind('compressed sparse', lambda config, layer: CompressedAttention(config, layer, True),
                             'csa', attention=True, needs=lambda flags, window: _compressed_needs(flags, window, True),
                             config_class=Config)
