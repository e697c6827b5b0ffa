"""
Gemma 4's block (Google, 2026), the parts the earlier chapters lack:

- Global layers shaped apart from local ones: wider heads (global_head_dim, 512 beside 256) and fewer K/V heads
  (global_n_kv_head), so the few layers that see the whole context carry more per head and cache less; their RoPE
  "proportional" (rope_proportion, 0.25): over the whole head, only the first quarter of the rotation pairs turn,
  at frequencies theta^(-2i/head) as if every pair did, the rest at zero frequency (those dims carry no position).
- K = V (attn_k_eq_v): a global layer makes its keys and values in one projection; the keys are normalized and
  rotated, the values the same projection normalized without a gain and not rotated.
- K/V sharing across layers (kv_shared_layers, as Gemma 3n): the last layers make queries only and attend over
  the keys and values of the last earlier layer of their own kind, as that layer left them (normalized, rotated,
  from the cache), so the cache holds only the layers below and their K/V projections are gone.
- The MoE block (moe_dense_mlp; the 26B-A4B model): a dense MLP in every layer and the experts beside it, each
  branch normalizing its input and output; the router reads the stream itself.
- Per-layer embeddings (per_layer_embd; the small models): every layer gets a vector of its own for each token,
  from a narrow table looked up by the token plus a projection of the main embedding, added after the layer's
  MLP through a gated projection: token-specific facts fetched layer by layer from a table that costs lookups,
  not FLOPs.
- layer_scalar: each layer's output times a scalar of its own kept in the checkpoint, not trained.
Its other parts are earlier chapters': the sandwich norm, GEGLU, scaled embeddings, value norms, QK-norm.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters.moe import MoE
from chapters.small_swaps import GEGLU
from model import BOOL, FEATURES, LAYER_KINDS, OPTIONAL_POSITIVE_INT, Feature, GatedMLP, RMSNorm, Rotary, \
    changed, flag_list, is_int, is_number, make_norm

GLOBAL_FIELDS = ('global_head_dim', 'global_n_kv_head', 'rope_proportion')
MOE_DENSE_CANNOT = ('router', 'n_expert_group', 'topk_group', 'n_shared_expert', 'routed_scaling', 'moe_every',
                    'first_dense_layers', 'moe_scale_input', 'swiglu_limit', 'moe_bias', 'router_norm_topk')


def global_kinds():
    """Global layers, whose shapes and K = V these flags set: softmax attention over the whole past."""
    return [letter for letter, kind in LAYER_KINDS.items() if kind.attention and kind.full]


def sharing_kinds():
    """The kinds that may share keys and values: softmax attention over cached keys and values."""
    return [letter for letter, kind in LAYER_KINDS.items() if kind.attention]


def shared_kinds(c):
    """The kinds of the last kv_shared_layers layers."""
    return c.layer_kinds[c.n_layer - c.kv_shared_layers:] if c.kv_shared_layers else []


def changes_global_rope(c):
    return changed(c, ('global_head_dim', 'rope_proportion'))


@dataclass
class Config:
    layer_scalar: bool = False  # each layer's output, the whole stream, times a scalar of its own kept in the checkpoint, not trained (Gemma 4's layer_scalar)
    global_head_dim: int | None = None  # the head width of global layers ('G', 'N'); None: head_dim's (Gemma 4: 512 beside 256)
    global_n_kv_head: int | None = None  # the K/V heads of global layers; None: n_kv_head's (Gemma 4's num_global_key_value_heads)
    rope_proportion: float | None = None  # global layers' RoPE: this share of each head's rotation pairs turn, at frequencies over the whole head, the rest at zero frequency (Gemma 4's 'proportional': 0.25); None: plain RoPE
    moe_dense_mlp: bool = False  # with mlp='moe': a dense MLP beside the experts, each branch with its norms, the router reading the stream itself (Gemma 4's MoE block)
    per_layer_embd: int = 0  # width of each layer's own embedding of every token, added after its MLP through a gated projection (Gemma 4's hidden_size_per_layer_input); 0: none
    attn_k_eq_v: bool = False  # global layers ('G', 'N'): one projection gives the keys and the values, these normalized without a gain and not rotated (Gemma 4's attention_k_eq_v)
    kv_shared_layers: int = 0  # the last n layers reuse the keys and values of the last earlier layer of their kind and have no K/V projections (Gemma 4's num_kv_shared_layers); 0: none

    FIELD_TYPES = {
        'kv_shared_layers': (lambda v, c: is_int(v, 0, c.n_layer - 1), lambda c: f"an int in [0, n_layer-1={c.n_layer - 1}]"),
        'per_layer_embd': (lambda v, c: is_int(v, 0), 'an int >= 0'),
        **dict.fromkeys(('attn_k_eq_v', 'layer_scalar', 'moe_dense_mlp'), BOOL),
        'global_head_dim': OPTIONAL_POSITIVE_INT,
        'global_n_kv_head': (lambda v, c: v is None or is_int(v, 1, c.n_head),
                             lambda c: f"None or an int in [1, n_head={c.n_head}]"),
        'rope_proportion': (lambda v, c: v is None or (is_number(v) and 0 < v <= 1), 'None or in (0, 1]'),
    }
    CHECKS = [
        (lambda c: c.global_n_kv_head is not None and c.n_head % c.global_n_kv_head != 0,
         lambda c: f"n_head ({c.n_head}) must be divisible by global_n_kv_head ({c.global_n_kv_head})"),
        (lambda c: changed(c, GLOBAL_FIELDS) and c.attn != 'mha',
         lambda c: f"{flag_list(c, changed(c, GLOBAL_FIELDS))} apply to attn='mha' only, got attn={c.attn!r}"),
        (lambda c: changed(c, GLOBAL_FIELDS) and not set(c.layer_kinds) & set(global_kinds()),
         lambda c: f"{flag_list(c, changed(c, GLOBAL_FIELDS))} apply to global layers "
                   f"({', '.join(map(repr, global_kinds()))}) and layers={c.layers!r} has none: add one or leave them "
                   f"at None"),
        (lambda c: c.pos == 'rope' and changes_global_rope(c) and 'C' in c.layer_kinds,
         lambda c: f"{flag_list(c, changes_global_rope(c))} change the global layers' RoPE, which chunked ('C') "
                   f"layers share: leave them at None with 'C' layers"),
        (lambda c: c.pos == 'rope' and changes_global_rope(c) and 'L' in c.layer_kinds and c.rope_local_theta is None,
         lambda c: f"{flag_list(c, changes_global_rope(c))} change the global layers' RoPE: local ('L') layers then "
                   f"need tables of their own, set rope_local_theta"),
        (lambda c: c.rope_proportion is not None and (c.pos != 'rope' or c.rope_scaling is not None
                                                      or c.rope_fraction != 1),
         lambda c: f"rope_proportion={c.rope_proportion} needs pos='rope' without rope_scaling and rope_fraction=1 (it "
                   f"chooses the pairs that turn itself), got pos={c.pos!r}, rope_scaling={c.rope_scaling!r}, "
                   f"rope_fraction={c.rope_fraction}"),
        (lambda c: c.pos == 'rope' and c.global_head_dim is not None and int(c.global_head_dim * c.rope_fraction) % 2,
         lambda c: f"global_head_dim={c.global_head_dim} with pos='rope' needs an even number of rotated dims (times "
                   f"rope_fraction={c.rope_fraction})"),
        (lambda c: c.moe_dense_mlp and c.mlp != 'moe',
         lambda c: f"moe_dense_mlp={c.moe_dense_mlp!r} apply to mlp='moe' only, got mlp={c.mlp!r}"),
        (lambda c: c.moe_dense_mlp and changed(c, MOE_DENSE_CANNOT),
         lambda c: f"moe_dense_mlp=True routes as Gemma 4 does (softmax, no groups, no shared experts, no scaling, "
                   f"every layer): {flag_list(c, changed(c, MOE_DENSE_CANNOT))} cannot apply"),
        (lambda c: c.attn_k_eq_v and c.attn != 'mha',
         lambda c: f"attn_k_eq_v=True makes the values of attn='mha' from its keys, got attn={c.attn!r}"),
        (lambda c: c.attn_k_eq_v and not set(c.layer_kinds) & set(global_kinds()),
         lambda c: f"attn_k_eq_v=True applies to global layers ({', '.join(map(repr, global_kinds()))}) and "
                   f"layers={c.layers!r} has none: add one or set --attn_k_eq_v=False"),
        (lambda c: c.kv_shared_layers and c.attn != 'mha',
         lambda c: f"kv_shared_layers={c.kv_shared_layers} shares keys and values of attn='mha' only, got "
                   f"attn={c.attn!r}"),
        (lambda c: set(shared_kinds(c)) - set(sharing_kinds()),
         lambda c: f"kv_shared_layers={c.kv_shared_layers} covers layers of kinds "
                   f"{''.join(sorted(set(shared_kinds(c))))!r}; only attention layers "
                   f"({', '.join(map(repr, sharing_kinds()))}) share keys and values"),
        (lambda c: set(shared_kinds(c)) - set(c.layer_kinds[:c.n_layer - c.kv_shared_layers]),
         lambda c: f"kv_shared_layers={c.kv_shared_layers}: the shared layers' kinds "
                   f"{''.join(sorted(set(shared_kinds(c)) - set(c.layer_kinds[:c.n_layer - c.kv_shared_layers])))!r} "
                   f"have no earlier layer to share from (share fewer layers)"),
    ]

    def attention_switches(self, layer):
        """kv_shared when a layer reads an earlier layer's keys and values, k_eq_v when its keys are its values (a
        global layer's, attn_k_eq_v), and a global layer's head width and K/V heads."""
        is_global = self.layer_kinds[layer] in global_kinds()
        switches = {'kv_shared': kv_source(self, layer) is not None}
        switches['k_eq_v'] = self.attn_k_eq_v and is_global and not switches['kv_shared']
        if is_global:
            switches.update(head_size=self.global_head_dim, n_kv_head=self.global_n_kv_head)
        own = {name: value for name, value in switches.items() if value}
        return {**super().attention_switches(layer), **own}

    def rope_frequencies(self, dim, theta, length, plain=False):
        if self.rope_proportion is not None and not plain:
            return proportional_frequencies(self.rope_proportion, theta, dim), 1.0
        return super().rope_frequencies(dim, theta, length, plain)


def kv_source(config, layer):
    """The layer whose keys and values `layer` attends over, or None when it makes its own: the last layer before
    the shared ones of its kind."""
    first_shared = config.n_layer - config.kv_shared_layers
    if layer < first_shared:
        return None
    kinds = config.layer_kinds
    return max(i for i in range(first_shared) if kinds[i] == kinds[layer])


def proportional_frequencies(proportion, theta, dim):
    """The dim/2 frequencies of proportional RoPE: the first int(proportion * dim // 2) of plain RoPE's, then zeros
    (laid out as transformers lays them out)."""
    turning = int(proportion * dim // 2)
    inv = 1.0 / theta ** (torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / dim)
    return torch.cat((inv, torch.zeros(dim // 2 - turning)))


# The keys and values pass through each layer's part of the cache: the source layer's is wrapped to keep what it
# returns (KVHandoff), and each sharing layer's update returns those (SharedKV), whatever it was given (its own,
# of no heads).

class KVHandoff:
    """A source layer's part of the cache (None in training) that keeps the keys and values it returns."""

    def __init__(self, cache):
        self.cache, self.entries = cache, None

    def update(self, **new):
        self.entries = list(new.values()) if self.cache is None else self.cache.update(**new)
        return self.entries


class SharedKV:
    """A sharing layer's part of the cache: update returns its source's keys and values."""

    def __init__(self, handoff):
        self.handoff = handoff

    def update(self, **new):
        return self.handoff.entries


def share_kv(config, caches):
    """Each layer's part of the cache (caches: one per layer, None without a cache) as its mixer gets it: a source
    layer's wrapped in a KVHandoff and a sharing layer's reading it."""
    caches, handoffs = list(caches), {}
    for layer in range(config.n_layer):
        source = kv_source(config, layer)
        if source is not None:
            if source not in handoffs:
                handoffs[source] = caches[source] = KVHandoff(caches[source])
            caches[layer] = SharedKV(handoffs[source])
    return caches


class DenseAndExperts(MoE):
    """Gemma 4's MoE block: a dense gated MLP (ffn_hidden) beside the experts, ln_dense_out(dense(ln(x))) +
    ln_experts_out(experts(ln_experts(x))), x the un-normalized stream (Block's ln_2 is then an identity). Its
    router reads x / RMS(x) times a learned vector and 1/sqrt(n_embd), a softmax over the experts, the top k
    renormalized and times a learned scale of each chosen expert."""

    def __init__(self, config):
        super().__init__(config)
        self.dense = GEGLU(config) if config.moe_activation == 'gelu' else GatedMLP(config)
        self.ln, self.ln_dense_out = make_norm(config), make_norm(config)
        self.ln_experts, self.ln_experts_out = make_norm(config), make_norm(config)
        self.router_scale = nn.Parameter(torch.ones(config.n_embd))  # on the router's normalized input
        self.expert_scale = nn.Parameter(torch.ones(config.n_expert))  # on each chosen expert's weight
        self.eps = config.norm_eps

    def forward(self, x):
        shape = x.shape
        dense = self.ln_dense_out(self.dense(self.ln(x)))
        x = x.reshape(-1, shape[-1])
        logits, scores, experts, weights = self.route(x)
        y = self.ln_experts_out(self.experts(self.ln_experts(x), experts, weights))
        self._account(logits, scores, experts)
        return self.dropout(dense + y.view(shape))


    def route(self, x, tokens=None):
        routed = F.rms_norm(x, (x.size(-1),), eps=self.eps) * self.router_scale * x.size(-1) ** -0.5
        logits = self.router(routed).float()
        scores = logits.softmax(dim=-1)
        weights, experts = scores.topk(self.k, dim=-1)
        return logits, scores, experts, weights / weights.sum(dim=-1, keepdim=True) * self.expert_scale[experts]


def per_layer_embeddings(config):
    """The model's parts of the per-layer embeddings: the narrow table (scaled by sqrt(per_layer_embd) on lookup),
    the projection of the main embedding to every layer's width (scaled by n_embd**-0.5), and the norm of each
    layer's projection."""
    width = config.n_layer * config.per_layer_embd
    return {'wte_per_layer': nn.Embedding(config.vocab_size, width),
            'per_layer_proj': nn.Linear(config.n_embd, width, bias=False),
            'per_layer_norm': RMSNorm(config.per_layer_embd, config)}


def per_layer_inputs(transformer, idx, x):
    """Every layer's vector of each token (B, T, n_layer, per_layer_embd): from idx and its token embeddings x."""
    per_layer = transformer.per_layer_norm.normalized_shape[0]
    shape = (*idx.shape, -1, per_layer)
    looked_up = transformer.wte_per_layer(idx).view(shape) * per_layer ** 0.5
    projected = transformer.per_layer_norm((transformer.per_layer_proj(x) * x.size(-1) ** -0.5).view(shape))
    return (projected + looked_up) * 2 ** -0.5


class PerLayerInput(nn.Module):
    """A layer's branch after its MLP: x + norm(c_proj(gelu(c_fc(x)) * its per-layer vector))."""

    def __init__(self, config, layer):
        super().__init__()
        self.layer = layer
        self.c_fc = nn.Linear(config.n_embd, config.per_layer_embd, bias=False)  # the gate
        self.c_proj = nn.Linear(config.per_layer_embd, config.n_embd, bias=False)
        self.ln = make_norm(config)

    def forward(self, x, per_layer_inputs):
        gated = F.gelu(self.c_fc(x), approximate='tanh') * per_layer_inputs[:, :, self.layer]
        return x + self.ln(self.c_proj(gated))


class Gemma4(Feature):
    """The global layers' rotary tables at their own width, the MoE block, the per-layer embeddings (the model's
    table and projection, each block's branch), the layer scalars, and the keys and values handed from layer to
    layer."""
    config_class = Config

    @staticmethod
    def applies(config):
        return bool(config.global_head_dim or config.moe_dense_mlp or config.per_layer_embd or config.layer_scalar
                    or config.kv_shared_layers)

    def build(self, model):
        config = self.config
        if config.global_head_dim is not None and config.pos == 'rope':  # the main tables serve the global layers
            model.transformer.wpe = Rotary(config, dim=int(config.global_head_dim * config.rope_fraction))
        if config.per_layer_embd:
            model.transformer.update(per_layer_embeddings(config))

    def build_block(self, block, layer):
        config = self.config
        if config.moe_dense_mlp and isinstance(block.mlp, MoE):  # it normalizes its branches' inputs itself
            block.mlp, block.ln_2 = DenseAndExperts(config), nn.Identity()
        if config.per_layer_embd:
            block.per_layer = PerLayerInput(config, layer)
        if config.layer_scalar:  # a buffer: loaded and saved, never trained
            block.register_buffer('layer_scalar', torch.ones(1))

    def embed(self, model, idx, x, start, tables):
        if self.config.per_layer_embd:  # from the token embeddings alone (no learned positions in them)
            tables['per_layer'] = per_layer_inputs(model.transformer, idx, model.transformer.wte(idx))
        return x

    def caches(self, model, caches):
        return share_kv(self.config, caches) if self.config.kv_shared_layers else caches

    def after_block(self, model, layer, x, tables):
        block = model.transformer.h[layer]
        if self.config.per_layer_embd:
            x = block.per_layer(x, tables['per_layer'])
        if self.config.layer_scalar:
            x = x * block.layer_scalar
        return x


FEATURES.append(Gemma4)
