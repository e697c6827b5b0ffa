"""
The speedrun's changes: modded-nanogpt (Keller Jordan and contributors, 2024-26) trains GPT-2 small to 3.28 val loss
on FineWeb in under 1.5 minutes on 8 H100s by stacking dozens of small changes, each a record of its own. The ones
the earlier chapters lack, each a switch, off by default (its record in brackets):

Inside attention (SpeedrunAttention: the attention chapter's, and on the layers these choose, three steps more):
- value_embed_layers: those layers' values gain the token's row of a table of their own, times a learned gate
  per K/V head, 2 * sigmoid(w . x[:12]) from 1 [records 14, 15, 63-70];
- xsa_layers: those layers' output loses a learned share, tanh(a) per head from 0, of its projection on the
  token's own value (exclusive self attention: a head's output says what the other tokens add) [record 82];
- key_offset: global layers' keys take the second half of their dims from the previous token, so one layer can
  match "the token after the one like mine" (induction in one layer) [record 49]. The cache keeps the last
  token's half.

Around the blocks (Speedrun, a Feature; each block's input is made after the block before it):
- x0_lambdas: each block's input is a * x + b * x0, x0 the first block's input, a (from 1) and b (from 0) learned
  per layer [records 9 and after; the README's embed_skip instead adds g * x0 after each block];
- unet_skips: the stream after layer k - 1 joins the input of layer n_layer - k, times a learned weight from 1,
  for 1 <= k < n_layer / 2: early layers' outputs reach the mirrored late layers [record 11];
- layer_skip_from, layer_skip_to: a late layer's input gains sigmoid(c) (from sigmoid(-1.5)) times an earlier
  layer's output [record 77];
- smear: each token's embedding gains lambda * sigmoid(w . x[:12]) times the previous token's (lambda, w from 0):
  a look one token back before any attention [record 34];
- backout_layer: that layer's output, times a learned share from 0.5, is subtracted after the last block: what
  the early layers wrote for later layers' context, not for the prediction [record 40];
- bigram_vocab: a table indexed by a hash of (previous token, token), rows from zero, added to every block's
  input with a learned gate per layer from 0.05 [records 62, 83];
- sigmoid_softcap: the logits become 23 * sigmoid((z + 5) / 7.5) [record 54];
- mtp_shared: the head's logits at each position also predict the tokens 2 .. mtp_shared + 1 ahead, with weights
  mtp_shared_decay^k that fade to 0 over training, the furthest first (the speedrun's [1, .5, .25] -> [1, .5, 0]
  -> [1, 0] -> [1] in thirds), in training: multi-token prediction without extra modules [records 53, 88];
- sliding_window_start: the window schedule (local layers' windows grow during training) [records 31, 72]:
  the feature's progress hook, which train.py calls before each step, sets them.

The tables (value embeddings, the bigram table) are looked up, not multiplied: get_num_params counts them as
parameters and flops_per_token counts no FLOPs for them, as Gemma 4's per-layer embeddings; they sit on
model.transformer, outside the blocks, so Muon leaves them to AdamW. The smear and the bigram hash read the
previous token: a cache keeps the last token's embedding (the smear's) and its id (the bigram's) for the next
call (Feature.cache_states), so decoding continues them; speculative decoding, which takes drafts back out of a
cache, then refuses the model.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters import attention as attention_chapter
from chapters.gemma4 import global_kinds, kv_source
from model import ATTENTIONS, BOOL, FEATURES, LAYER_KINDS, OPTIONAL_POSITIVE_INT, Feature, apply_rope, changed, \
    flag_list, is_int, is_number, mean_and_reset

GATE_DIMS = 12  # the gates read the first this many channels of their input (the speedrun's)
VALUES = 'value_embeds'  # a value-embedding layer reads tables[(its kind's key, VALUES)]: (its kind's table, the rows)
BIGRAM_HASH = (36313, 27191)  # the bigram hash's odd multipliers of the token and of the previous one (the speedrun's)
SOFTCAP = (23.0, 5.0, 7.5)  # logits -> A * sigmoid((z + B) / C) (record 54)


def layer_numbers(text, n_layer):
    """The layers a string names, sorted: numbers separated by commas, negative ones from the end ('0,-1': the
    first and the last). ValueError for anything else, a layer out of range or named twice."""
    layers = [int(part) for part in text.split(',')]
    if any(not -n_layer <= i < n_layer for i in layers):
        raise ValueError(text)
    layers = [i % n_layer for i in layers]
    if len(set(layers)) != len(layers):
        raise ValueError(text)
    return sorted(layers)


def names_layers(value, config):
    if value is None:
        return True
    try:
        return isinstance(value, str) and bool(layer_numbers(value, config.n_layer))
    except ValueError:
        return False


def layers_of(text, config):
    return layer_numbers(text, config.n_layer) if text is not None else []


LAYER_LIST = (names_layers, lambda c: f"None or layer numbers in [-{c.n_layer}, {c.n_layer - 1}] separated by commas, "
                                      f"each once (e.g. '0,-1')")
ATTENTION_FIELDS = ('value_embed_layers', 'xsa_layers', 'key_offset')
STREAM_FIELDS = ('x0_lambdas', 'unet_skips', 'layer_skip_from', 'smear', 'backout_layer', 'bigram_vocab')
MTP_SHAPE_FIELDS = ('mtp_shared_decay', 'mtp_shared_fade')
FEATURE_FIELDS = ('value_embed_layers',) + STREAM_FIELDS + ('sigmoid_softcap', 'mtp_shared')


def mixer_kinds(config, text):
    """The kinds (letters) of the layers a layer list names that are not softmax attention."""
    return sorted({config.layer_kinds[i] for i in layers_of(text, config)} - {k for k, kind in LAYER_KINDS.items()
                                                                             if kind.attention})


def sharing(config, text):
    """The layers a layer list names that attend over another layer's keys and values (Gemma 4's sharing)."""
    return [i for i in layers_of(text, config) if kv_source(config, i) is not None]


def in_range(low, high_of, words):
    return (lambda v, c: v is None or is_int(v, low, high_of(c)), lambda c: f"None or an int in [{low}, {words(c)}]")


@dataclass
class Config:
    value_embed_layers: str | None = None  # layers whose attention values gain the token's row of a table of their own, times a learned gate per K/V head, e.g. '0,1,-2,-1' (the speedrun's value embeddings); None: none
    xsa_layers: str | None = None  # layers whose attention output loses a learned share (tanh, per head, from 0) of its projection on the token's own value, e.g. '1,3' (the speedrun's XSA); None: none
    key_offset: bool = False  # global attention layers: the second half of each key head is the previous token's (the speedrun's partial key offset: induction in one layer)
    x0_lambdas: bool = False  # each block's input is a*x + b*x0, x0 the first block's input, a (from 1) and b (from 0) learned per layer (the speedrun's)
    unet_skips: bool = False  # the stream after layer k-1 joins the input of layer n_layer-k times a learned weight (from 1), for 1 <= k < n_layer/2 (the speedrun's U-net)
    layer_skip_from: int | None = None  # with layer_skip_to: this layer's output, times sigmoid(a learned scalar from -1.5), joins that layer's input (the speedrun's); None: off
    layer_skip_to: int | None = None  # the layer whose input gains layer_skip_from's output (after it by 2 or more); None: off
    smear: bool = False  # each token's embedding gains a gated share of the previous token's, gate and share learned from 0 (the speedrun's smear)
    backout_layer: int | None = None  # this layer's output, times a learned share (from 0.5), is subtracted after the last block (the speedrun's backout); None: off
    bigram_vocab: int = 0  # rows of a table indexed by a hash of (previous token, token), added to every block's input times a learned gate per layer (the speedrun's bigram hash embedding); 0: none
    sigmoid_softcap: bool = False  # the logits become 23*sigmoid((z+5)/7.5) (the speedrun's soft cap; logit_softcap is the tanh one)
    mtp_shared: int = 0  # training: the head's logits at each position also predict the tokens 2..mtp_shared+1 ahead, the k-th further weighted mtp_shared_decay**k (the speedrun's multi-token prediction, no extra modules); 0: none
    mtp_shared_decay: float = 0.5  # the weight of mtp_shared's k-th further token is this to the k (the speedrun: 1, 0.5, 0.25)
    mtp_shared_fade: bool = True  # the further tokens' weights fade to 0 over training, the furthest first: training in mtp_shared+1 equal stages, the k-th further token's weight falling linearly over stage mtp_shared-k+1, the last stage the next token's alone (the speedrun's); False: constant weights
    sliding_window_start: int | None = None  # training: local ('L') layers' window at the start, growing linearly to sliding_window by the end (evaluated at sliding_window); None: fixed

    FIELD_TYPES = {
        **dict.fromkeys(('value_embed_layers', 'xsa_layers'), LAYER_LIST),
        **dict.fromkeys(('key_offset', 'x0_lambdas', 'unet_skips', 'smear', 'sigmoid_softcap', 'mtp_shared_fade'),
                        BOOL),
        **dict.fromkeys(('layer_skip_from', 'layer_skip_to'),
                        in_range(0, lambda c: c.n_layer - 1, lambda c: f"n_layer-1={c.n_layer - 1}")),
        'backout_layer': in_range(0, lambda c: c.n_layer - 2, lambda c: f"n_layer-2={c.n_layer - 2}"),
        **dict.fromkeys(('bigram_vocab', 'mtp_shared'), (lambda v, c: is_int(v, 0), 'an int >= 0')),
        'mtp_shared_decay': (lambda v, c: is_number(v) and v > 0, 'a number > 0'),
        'sliding_window_start': OPTIONAL_POSITIVE_INT,
    }
    CHECKS = [
        (lambda c: changed(c, ATTENTION_FIELDS) and c.attn != 'mha',
         lambda c: f"{flag_list(c, changed(c, ATTENTION_FIELDS))} apply to attn='mha' only, got attn={c.attn!r}"),
        (lambda c: mixer_kinds(c, c.value_embed_layers) or mixer_kinds(c, c.xsa_layers),
         lambda c: f"{flag_list(c, changed(c, ('value_embed_layers', 'xsa_layers')))} name layers of kinds "
                   f"{''.join(mixer_kinds(c, c.value_embed_layers) + mixer_kinds(c, c.xsa_layers))!r}: only "
                   f"softmax attention layers have values to add to"),
        (lambda c: sharing(c, c.value_embed_layers) or sharing(c, c.xsa_layers),
         lambda c: f"{flag_list(c, changed(c, ('value_embed_layers', 'xsa_layers')))} name layers "
                   f"{sharing(c, c.value_embed_layers) + sharing(c, c.xsa_layers)} that share another layer's keys "
                   f"and values (kv_shared_layers={c.kv_shared_layers}): they have no values of their own"),
        (lambda c: c.key_offset and not set(c.layer_kinds) & set(global_kinds()),
         lambda c: f"key_offset=True applies to global layers ({', '.join(map(repr, global_kinds()))}) and "
                   f"layers={c.layers!r} has none: add one or set --key_offset=False"),
        (lambda c: c.key_offset and c.kv_shared_layers,
         lambda c: f"key_offset=True with kv_shared_layers={c.kv_shared_layers} is not supported yet: set one of "
                   f"them off"),
        (lambda c: changed(c, STREAM_FIELDS) and c.norm_position == 'post',
         lambda c: f"{flag_list(c, changed(c, STREAM_FIELDS))} add to the stream between blocks, which "
                   f"norm_position='post' normalizes: use another norm_position"),
        (lambda c: c.unet_skips and c.n_layer < 3,
         lambda c: f"unet_skips=True needs n_layer >= 3 (a skip from layer k-1 to layer n_layer-k, k < n_layer/2), "
                   f"got n_layer={c.n_layer}"),
        (lambda c: (c.layer_skip_from is None) != (c.layer_skip_to is None),
         lambda c: f"layer_skip_from={c.layer_skip_from} and layer_skip_to={c.layer_skip_to}: set both (a layer's "
                   f"output and the later layer whose input it joins) or neither"),
        (lambda c: c.layer_skip_from is not None and c.layer_skip_to is not None
         and c.layer_skip_to < c.layer_skip_from + 2,
         lambda c: f"layer_skip_to={c.layer_skip_to} must be at least layer_skip_from+2={c.layer_skip_from + 2} (the "
                   f"next layer's input is layer_skip_from's output already)"),
        (lambda c: c.bigram_vocab == 1,
         lambda c: "bigram_vocab=1 leaves no row for the bigrams (the last row is the first token's): set 0 or >= 2"),
        (lambda c: c.sigmoid_softcap and c.logit_softcap is not None,
         lambda c: f"sigmoid_softcap=True and logit_softcap={c.logit_softcap} are two soft caps: set one of them"),
        (lambda c: changed(c, MTP_SHAPE_FIELDS) and not c.mtp_shared,
         lambda c: f"{flag_list(c, changed(c, MTP_SHAPE_FIELDS))} apply to mtp_shared only: set mtp_shared >= 1 or "
                   f"leave them at their defaults"),
        (lambda c: c.sliding_window_start is not None and 'L' not in c.layer_kinds,
         lambda c: f"sliding_window_start={c.sliding_window_start} schedules local ('L') layers' window and there are "
                   f"none: set layers and sliding_window, or --sliding_window_start=None"),
        (lambda c: c.sliding_window_start is not None and c.sliding_window is not None
         and c.sliding_window_start > c.sliding_window,
         lambda c: f"sliding_window_start={c.sliding_window_start} must be at most sliding_window="
                   f"{c.sliding_window}, the window it grows to"),
    ]

    def attention_switches(self, layer):
        """value_embed, xsa and key_offset where this chapter's flags put them."""
        own = {'value_embed': layer in layers_of(self.value_embed_layers, self),
               'xsa': layer in layers_of(self.xsa_layers, self),
               'key_offset': self.key_offset and self.layer_kinds[layer] in global_kinds()}
        return {**super().attention_switches(layer), **{name: True for name, on in own.items() if on}}


RUNTIME_FLAGS = ('mtp_shared', 'mtp_shared_decay', 'mtp_shared_fade', 'sliding_window_start')
# a loss term on the head's logits, and a schedule of the window (a built model has sliding_window): a trained
# model's logits follow neither
TRAINING_FLAGS = RUNTIME_FLAGS


# ----------------------------------------------------------------------------- inside attention

def offset_keys(k, cache):
    """k (B, heads, T, hs) with the second half of each head's dims taken from the previous token (the first token
    of a sequence keeps its own); a cache keeps the last token's half for the next call."""
    half = k.size(-1) // 2
    tail = k[..., half:]
    first = tail[:, :, :1] if cache is None or cache.fresh else cache.stores['k_prev'].unsqueeze(2).to(k.dtype)
    shifted = torch.cat((k[..., :half], torch.cat((first, tail[:, :, :-1]), dim=2)), dim=-1)
    if cache is not None:  # after reading it
        cache.stores['k_prev'].copy_(tail[:, :, -1])
    return shifted


def exclude_self(y, v, share):
    """XSA: each head's output y (B, H, T, hs) minus tanh(share) (H,) times its projection on the token's own value
    v (B, K/V heads, T, hs)."""
    v = v.repeat_interleave(y.size(1) // v.size(1), dim=1)
    along = (y * v).sum(-1, keepdim=True) / v.square().sum(-1, keepdim=True).clamp_min(1e-8)
    return y - torch.tanh(share).to(y.dtype).view(1, -1, 1, 1) * along * v


class SpeedrunAttention(attention_chapter.Attention):
    """The attention chapter's Attention; on a layer where this chapter's switches are on (attention_switches),
    its forward with three steps more: the value embedding added to the values, the keys' offset after RoPE, XSA
    on the output. With them off it is Attention itself: the same weights, names and forward."""

    def __init__(self, config, layer=0, positions='rope', window=None):
        super().__init__(config, layer, positions, window)
        switches = config.attention_switches(layer) if isinstance(config, Config) else {}
        self.layer, self.kind_positions = layer, positions
        # the gate per K/V head reads the first channels of the layer's input: 2 * sigmoid(0) = 1 at the start
        self.value_gate = nn.Parameter(torch.zeros(self.n_kv_head, min(GATE_DIMS, config.n_embd))) \
            if switches.get('value_embed') else None
        if self.value_gate is not None:  # it reads its kind's table and the value embeddings (Speedrun.embed)
            self.positions = (positions, VALUES)
        self.xsa = nn.Parameter(torch.zeros(self.n_head)) if switches.get('xsa') else None
        self.key_offset = switches.get('key_offset', False)

    def cache_states(self):
        own = {'k_prev': ((self.n_kv_head, self.head_size - self.head_size // 2), None)} if self.key_offset else {}
        return {**super().cache_states(), **own}

    def token_flops(self, seq_len):
        gate = 6 * self.value_gate.numel() if self.value_gate is not None else 0  # a Linear's, as a matmul
        return super().token_flops(seq_len) + gate

    def forward(self, x, rope=None, mask=None, cache=None):
        if self.value_gate is None and self.xsa is None and not self.key_offset:
            return super().forward(x, rope, mask, cache)
        B, T, _ = x.size()
        q, k, v = self.heads(x)
        if self.value_gate is not None:  # rope: (its kind's table, every value-embedding layer's rows)
            rope, values = rope
            gate = 2 * torch.sigmoid(F.linear(x[..., :self.value_gate.size(1)], self.value_gate))
            rows = values[self.layer].view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)
            v = v + gate.transpose(1, 2).unsqueeze(-1) * rows.to(v.dtype)
        own_values = v
        if self.kind_positions == 'temperature':  # as Attention.forward from here, the marked steps added
            q = q * rope[:, None].to(q.dtype)
        elif rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.rope_qk_norm:
            q, k = F.rms_norm(q, (self.head_size,), eps=self.eps), F.rms_norm(k, (self.head_size,), eps=self.eps)
        if self.key_offset:  # added: after RoPE, as the speedrun's
            k = offset_keys(k, cache)
        if cache is not None:
            k, v = cache.update(k=k, v=v)
        if self.indexer is not None:
            mask, k, v = self.indexer.narrow(x, x, rope, mask, cache, k, v)
            self.indexer.learn(q, k, self.scale)
        y = attention_chapter.attend_with_sinks(q, k, v, mask, self.dropout if self.training else 0.0, self.scale,
                                                self.sinks)
        if self.xsa is not None:  # added
            y = exclude_self(y, own_values, self.xsa)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_size)
        if self.c_gate is not None:
            y = y * torch.sigmoid(self.c_gate(x))
        return self.resid_dropout(self.c_proj(y))


# ----------------------------------------------------------------------------- around the blocks

def continues(start, cache):
    """The features' part of a cache when a forward continues the sequence it holds (a decoding step's position is a
    tensor, a later prefill's a positive int), else None: the sequence starts here."""
    return cache if cache is not None and (isinstance(start, torch.Tensor) or start > 0) else None


def bigram_hash(idx, rows, previous=None):
    """Each position's row of the bigram table (B, T): (a * token) xor (b * previous token) mod (rows - 1); the
    first token of a sequence, which has no previous one, the last row; previous (B,): the token before idx (a
    cache's), which the first then pairs with."""
    a, b = BIGRAM_HASH
    idx = idx.long()
    before = idx[:, :-1] if previous is None else torch.cat((previous[:, None].long(), idx[:, :-1]), dim=1)
    pairs = torch.bitwise_xor(a * idx[:, idx.size(1) - before.size(1):], b * before) % (rows - 1)
    return pairs if previous is not None else torch.cat((idx.new_full((idx.size(0), 1), rows - 1), pairs), dim=1)


def smear(x, gate, share, previous=None):
    """Each token but the first gains share * sigmoid(gate . x[:dims]) times the previous token's vector; previous
    (B, d): the vector before x's first (a cache's), which the first then gains too."""
    before = x[:, :-1] if previous is None else torch.cat((previous[:, None].to(x.dtype), x[:, :-1]), dim=1)
    kept, gained = x[:, :x.size(1) - before.size(1)], x[:, x.size(1) - before.size(1):]
    weight = share * torch.sigmoid(F.linear(gained[..., :gate.size(1)], gate))
    return torch.cat((kept, gained + weight * before), dim=1)


def unet_pairs(n_layer):
    """{the layer whose input gains a U-net skip: (the layer whose output it is, the skip's weight index)}: the
    output of layer k-1 joins the input of layer n_layer-k, for 1 <= k < n_layer/2."""
    return {n_layer - k: (k - 1, k - 1) for k in range(1, (n_layer + 1) // 2)}


class Speedrun(Feature):
    """The parts around the blocks: the tables and scalars on model.transformer, each block's input made after
    the block before it (skips, x0 mix, bigram rows), backout after the last, the sigmoid cap on the logits, the
    shared-head MTP loss and its FLOPs."""
    config_class = Config

    @staticmethod
    def applies(config):
        return bool(changed(config, FEATURE_FIELDS + ('sliding_window_start',)))

    def build(self, model):
        c, t = self.config, model.transformer
        L = c.n_layer
        self.fraction = 0.0  # of training done, which train.py sets through progress (mtp_weights reads it)
        self.mtp_sums = torch.zeros(2)  # the shared-head MTP loss summed over training forwards, and their count
        self.value_layers = layers_of(c.value_embed_layers, c)
        self.value_keys = sorted({t.h[i].attn.positions for i in self.value_layers}, key=str)
        if self.value_layers:  # each layer's rows as wide as its K/V heads
            t.value_embeds = nn.ModuleDict({str(i): nn.Embedding(c.vocab_size, t.h[i].attn.n_kv_head *
                                                                 t.h[i].attn.head_size) for i in self.value_layers})
        self.unet = unet_pairs(L) if c.unet_skips else {}
        self.snapshots = {source for source, _ in self.unet.values()} | \
            {i for i in (c.layer_skip_from, c.backout_layer) if i is not None}
        params = {'resid_lambdas': torch.ones(L) if c.x0_lambdas else None,
                  'x0_lambdas': torch.zeros(L) if c.x0_lambdas else None,
                  'unet_weights': torch.ones(len(self.unet)) if self.unet else None,
                  'layer_skip_lambda': torch.full((1,), -1.5) if c.layer_skip_from is not None else None,
                  'smear_gate': torch.zeros(1, min(GATE_DIMS, c.n_embd)) if c.smear else None,
                  'smear_lambda': torch.zeros(1) if c.smear else None,
                  'backout_lambda': torch.full((1,), 0.5) if c.backout_layer is not None else None,
                  'bigram_lambdas': torch.full((L,), 0.05) if c.bigram_vocab else None}
        for name, value in params.items():
            if value is not None:
                t.register_parameter(name, nn.Parameter(value))
        if c.bigram_vocab:
            t.bigram_embed = nn.Embedding(c.bigram_vocab, c.n_embd)

    @torch.no_grad()
    def init(self, model):
        if self.config.bigram_vocab:  # the speedrun's: rows from zero, so the gates learn once the rows have
            model.transformer.bigram_embed.weight.zero_()

    def cache_states(self):
        """The last token's embedding (the smear's) and id (the bigram's), for the next call."""
        c = self.config
        return {**({'smear_last': ((c.n_embd,), None)} if c.smear else {}),
                **({'bigram_last': ((), torch.long)} if c.bigram_vocab else {})}

    def embed(self, model, idx, x, start, tables):
        c, t = self.config, model.transformer
        cache, held = tables['cache'], continues(start, tables['cache'])
        if c.smear:
            last = x[:, -1]
            x = smear(x, t.smear_gate, t.smear_lambda, None if held is None else held['smear_last'])
            if cache is not None:
                cache['smear_last'].copy_(last)
        if self.value_layers:
            rows = {i: t.value_embeds[str(i)](idx) for i in self.value_layers}
            for key in self.value_keys:
                tables[key] = (tables[key[0]], rows)
        if c.bigram_vocab:
            tables['bigram'] = t.bigram_embed(bigram_hash(idx, c.bigram_vocab,
                                                          None if held is None else held['bigram_last']))
            if cache is not None:
                cache['bigram_last'].copy_(idx[:, -1])
        tables['x0'], tables['outputs'] = x, {}
        return self.block_input(model, 0, x, tables)

    def block_input(self, model, layer, x, tables):
        """The input of `layer` from the stream x before it: the skips into it, the x0 mix, the bigram rows."""
        c, t = self.config, model.transformer
        outputs = tables['outputs']
        if layer in self.unet:
            source, weight = self.unet[layer]
            x = x + t.unet_weights[weight] * outputs[source]
        if layer == c.layer_skip_to:
            x = x + torch.sigmoid(t.layer_skip_lambda) * outputs[c.layer_skip_from]
        if c.x0_lambdas:
            x = t.resid_lambdas[layer] * x + t.x0_lambdas[layer] * tables['x0']
        if c.bigram_vocab:
            x = x + t.bigram_lambdas[layer] * tables['bigram']
        return x

    def after_block(self, model, layer, x, tables):
        if layer in self.snapshots:
            tables['outputs'][layer] = x
        if layer + 1 < self.config.n_layer:
            return self.block_input(model, layer + 1, x, tables)
        if self.config.backout_layer is not None:
            x = x - model.transformer.backout_lambda * tables['outputs'][self.config.backout_layer]
        return x

    def logits(self, model, logits):
        if not self.config.sigmoid_softcap:
            return logits
        a, b, c = SOFTCAP
        return a * torch.sigmoid((logits + b) / c)

    def loss(self, model, idx, h, targets):
        """The shared head's further predictions: position i's logits against the token k + 1 ahead (targets'
        i + k), weighted by mtp_weights at this point of training, summed. The head runs again (the hook is given
        h, not the logits) over the positions that have a further token, while any weight is above 0."""
        T = targets.size(1)
        weights = mtp_weights(self.config, self.fraction)[:T - 1]
        if not model.training or not any(weights):
            return None
        logits = model.logits(h[:, :-1])
        total = 0
        for k, weight in enumerate(weights, start=1):
            if weight:
                scored = logits[:, :T - k].reshape(-1, logits.size(-1)).float()
                total = total + weight * F.cross_entropy(scored, targets[:, k:].reshape(-1), ignore_index=-1)
        self.mtp_sums = self.mtp_sums.to(total.device) + torch.stack((total.detach(), torch.ones_like(total.detach())))
        return total

    def objective(self, model):
        if self.config.mtp_shared:
            fading = ', fading over training' if self.config.mtp_shared_fade else ''
            return (f"the shared head's losses on the {self.config.mtp_shared} tokens after the next, the k-th "
                    f"weighted mtp_shared_decay ({self.config.mtp_shared_decay}) to the k{fading}")
        return None

    def figures(self, model):
        return {'mtp_shared_loss': mean_and_reset([self.mtp_sums])}

    def progress(self, model, fraction):
        """The share of training done: the window schedule sets the local layers' window from it, the MTP loss
        its weights."""
        self.fraction = fraction
        if self.config.sliding_window_start is not None:
            set_window(model, window_at(self.config, fraction))

    def flops(self, model, seq_len):
        """The smear's gate over the tokens after the first, and the head run again over all but the last (counted
        for the whole run, though with mtp_shared_fade it stops in the last stage)."""
        shifted = (seq_len - 1) / seq_len
        gate = 6 * model.transformer.smear_gate.numel() * shifted if self.config.smear else 0
        head = 6 * model.lm_head.weight.numel() * shifted if self.config.mtp_shared else 0
        return gate + head


# ----------------------------------------------------------------------------- the schedules

def mtp_weights(config, fraction):
    """mtp_shared's weights of the tokens 2 .. mtp_shared + 1 ahead at `fraction` (0..1) of training: the k-th
    further token's is mtp_shared_decay**k, and with mtp_shared_fade it falls linearly to 0 over stage n - k + 1
    of n + 1 equal stages (n = mtp_shared): the furthest goes first, and the last stage trains the next token
    alone, the loss that evaluation scores (the speedrun's; with constant weights the head keeps splitting itself
    between the next token and the ones after it, and its next-token loss ends worse)."""
    n, weights = config.mtp_shared, []
    for k in range(1, n + 1):
        fade_start = (n - k) / (n + 1)
        left = min(max(1 - (fraction - fade_start) * (n + 1), 0.0), 1.0) if config.mtp_shared_fade else 1.0
        weights.append(config.mtp_shared_decay ** k * left)
    return weights


def window_at(config, fraction):
    """The local layers' window at `fraction` (0..1) of training: sliding_window_start growing linearly to
    sliding_window (the speedrun grows its windows in stages; records 31, 72)."""
    if config.sliding_window_start is None:
        return config.sliding_window
    start, end = config.sliding_window_start, config.sliding_window
    return start + int((end - start) * min(max(fraction, 0.0), 1.0))


def set_window(model, window):
    """Every local ('L') layer's window, the MTP modules' blocks' included: the masks and a new cache follow it."""
    kinds = model.config.layer_kinds
    mixers = [block.attn for block, kind in zip(model.transformer.h, kinds) if kind == 'L']
    if kinds[-1] == 'L':
        mixers += [module.block.attn for module in getattr(model, 'mtp', ())]
    for mixer in mixers:
        mixer.window = window


ATTENTIONS['mha'] = SpeedrunAttention  # every switch off: the attention chapter's Attention
FEATURES.append(Speedrun)
