"""
Attention's switches: what the families changed inside softmax attention, each a flag on the lesson's
CausalSelfAttention.

- qkv_bias: biases on q, k and v only (Qwen2), whatever `bias` says.
- qk_norm: RMSNorm on each query and key head before RoPE (Qwen3, Gemma 3, OLMo 2 with qk_norm_all_heads over
  each token's whole query and key), so the logits cannot grow unbounded (Dehghani et al. 2023, Wortsman et
  al. 2023); rope_qk_norm: unit RMS after RoPE, no weights (Llama 4's "L2 norm").
- attn_sinks: a learned logit per head in the softmax's denominator, so a head may attend nowhere (gpt-oss;
  Xiao et al. 2023's sink token, learned).
- attn_gate: the output times sigmoid(a projection of the block input), per head dim (Qwen3-Next; Qiu et al.
  2025, "Gated Attention").
- attn_scale: the softmax scale on q.k (Gemma 3: query_pre_attn_scalar**-0.5); v_norm: every value head scaled
  to unit RMS, no gain (Gemma 4); rope_fraction: only the first dims of each head rotate, the rest carry no
  position (partial RoPE: GLM-4.5 0.5, Qwen3-Next 0.25).

Attention also takes what a later chapter decides per layer (config.attention_switches): a layer's own head
width and K/V heads, keys that are its values, keys and values handed on from an earlier layer (Gemma 4), a
query scale per position instead of rotations (Llama 4's NoPE layers) and an indexer that narrows the keys
(DeepSeek's sparse attention). With every switch off it is the lesson's attention, the same weights and names.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

import model
from model import ATTENTIONS, BOOL, POSITIVE_NUMBER, CausalSelfAttention, RMSNorm, TokenMixer, apply_rope, is_number


@dataclass
class Config:
    qkv_bias: bool = False  # biases on the q, k and v projections only (Qwen2), whatever `bias` says
    qk_norm: bool = False  # RMSNorm on each query and key head before RoPE (Qwen3, Gemma 3, GLM-4.5)
    qk_norm_all_heads: bool = False  # with qk_norm: normalize each token's whole query and key, all heads at once (OLMo 2, MiniMax-M2)
    rope_qk_norm: bool = False  # layers with RoPE: each query and key head scaled to unit RMS after it, no weights (Llama 4's "L2 norm")
    attn_sinks: bool = False  # a learned logit per head in the softmax's denominator, so a head may attend nowhere (gpt-oss)
    attn_gate: bool = False  # the attention output times sigmoid(a projection of the block input), per head dim (Qwen3-Next)
    attn_scale: float | None = None  # softmax scale on q.k; None: head_dim**-0.5 (Gemma 3: query_pre_attn_scalar**-0.5)
    v_norm: bool = False  # every attention layer's values scaled to unit RMS per head, no gain (Gemma 4; K = V layers always are)
    rope_fraction: float = 1.0  # share of each head's dims that rotate, the first ones (GLM-4.5 0.5, Qwen3-Next 0.25); the rest carry no position

    FIELD_TYPES = {
        **dict.fromkeys('qkv_bias qk_norm qk_norm_all_heads rope_qk_norm attn_sinks attn_gate v_norm'.split(), BOOL),
        'attn_scale': POSITIVE_NUMBER,
        'rope_fraction': (lambda v, c: is_number(v) and 0 < v <= 1, 'in (0, 1]'),
    }
    CHECKS = [
        (lambda c: c.qk_norm_all_heads and not c.qk_norm,
         lambda c: "qk_norm_all_heads=True says how qk_norm normalizes: set qk_norm=True too"),
        (lambda c: c.rope_qk_norm and c.pos != 'rope',
         lambda c: f"rope_qk_norm=True normalizes queries and keys after RoPE: that needs pos='rope', got pos={c.pos!r}"),
        (lambda c: c.v_norm and c.attn != 'mha',
         lambda c: f"v_norm=True normalizes the values of attn='mha', got attn={c.attn!r}"),
    ]

    @property
    def rope_dim(self):
        return int(self.head_size * self.rope_fraction)

    def attention_switches(self, layer):
        """Attention's keywords a later chapter sets for a layer (Gemma 4: kv_shared, k_eq_v, head_size,
        n_kv_head); none by default."""
        return {}


def with_sink(q, k, v, mask, sinks, scale):
    """Attention sinks as SDPA inputs: one more key that every query sees, with a zero value, whose logit is the
    head's sink. q gains dims holding sink / scale, the keys dims holding 0 (the sink key: 1), so the real logits
    are unchanged and the sink's is the sink; padded to a multiple of 8 dims for the fused kernels. sinks: one per
    query head (H,), or any shape that broadcasts to (B, H, T, 1) (MLA's absorbed decoding: one per query row)."""
    B, H, T, D = q.shape
    Hk, S = k.size(1), k.size(2)
    pad = 8 - D % 8
    sinks = sinks.view(1, H, 1, 1) if sinks.dim() == 1 else sinks
    q = torch.cat((q, (sinks / scale).to(q.dtype).expand(B, H, T, 1), q.new_zeros(B, H, T, pad - 1)), dim=-1)
    sink_key = k.new_zeros(B, Hk, 1, D + pad)
    sink_key[..., D] = 1
    k = torch.cat((torch.cat((k, k.new_zeros(B, Hk, S, pad)), dim=-1), sink_key), dim=2)
    v = torch.cat((v, v.new_zeros(B, v.size(1), 1, v.size(-1))), dim=2)
    if isinstance(mask, bool):  # causal: query i is the (S - T + i)-th key
        causal, mask = mask, torch.ones(T, S, dtype=torch.bool, device=q.device)
        mask = mask.tril(S - T) if causal else mask
    return q, k, v, F.pad(mask, (0, 1), value=True)  # the sink key: seen by every query, whatever the mask's shape


def bias_of(mask, dtype):
    """A boolean mask as a bias to add to logits: 0 where True, a quarter of the dtype's lowest number elsewhere
    (finite with any logit added: exp of it is 0, and times a probability of 0 it is 0, not nan). Made by
    arithmetic: masked_fill and where branch on each element, and at a scattered mask (an indexer's top-k picks)
    took 6-8x an add's time on a CPU."""
    return mask.to(dtype).sub_(1).mul_(torch.finfo(dtype).max / 4)


def additive(mask, T, S, dtype):
    """A mask as the fused CPU kernel takes it: None for causal or none (a bool; causal is the kernel's own only
    when T == S, else query i sees keys up to S - T + i), else a bias (bias_of) to add to the logits."""
    if isinstance(mask, bool):
        if not mask or T == S:
            return None
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    return bias_of(mask, dtype)


class SinkAttention(torch.autograd.Function):
    """Attention with one sink per head on a CPU (q, k and v of one width, as the kernel takes them): PyTorch's
    fused (flash) kernel over the keys, whose row log-sum-exp gives the share of each row the sink leaves to them,
    w = sigmoid(lse - sink), so out = w * attention (with_sink's extra key and padded dims cost an explicit mask
    and a quarter more work at 32 dims). The backward is the kernel's own, handed w * grad and the output as
    scaled: its row term grad . out is then the one the sink's zero-valued key gives, so dq, dk, dv are exact; the
    sink's own gradient is -sum (1 - w) grad . out."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, mask, scale):
        causal = mask is True and q.size(2) == k.size(2)
        bias = additive(mask, q.size(2), k.size(2), q.dtype)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal,
                                                                              attn_mask=bias, scale=scale)
        kept = torch.sigmoid(lse - sinks.view(-1, 1).to(lse.dtype))  # (B, H, T)
        out = out * kept[..., None].to(out.dtype)
        ctx.save_for_backward(q, k, v, out, lse, kept, bias)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, kept, bias = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            (grad * kept[..., None].to(grad.dtype)).contiguous(), q, k, v, out, lse, 0.0, ctx.causal,
            attn_mask=bias, scale=ctx.scale)
        dsinks = -((1 - kept) * (grad * out).sum(-1).to(kept.dtype)).sum((0, 2))
        return dq, dk, dv, dsinks, None, None


def attend_with_sinks(q, k, v, mask, dropout_p=0.0, scale=None, sinks=None):
    """model.attend, with sinks (a logit per query head that joins every softmax's denominator) when given (called
    through the module, so a probe that replaces model.attend sees every call)."""
    width = v.size(-1)
    if width < q.size(-1) and q.device.type == 'cpu' and q.size(2) > 1:  # MLA's values, narrower than its keys
        # SDPA's fused CPU kernel (and SinkAttention) take values as wide as the keys; else SDPA runs its math
        # kernel, an MLA training step 1.13x as long at 4 x 128, T 256. Zeros pad them; the output is cut back.
        # (A decoding step's single query keeps its own paths: model.attend's written-out one in half precision)
        v = F.pad(v, (0, q.size(-1) - width))
        return attend_with_sinks(q, k, v, mask, dropout_p, scale, sinks)[..., :width]
    if sinks is not None:  # the scale given explicitly: SDPA's default would follow the padded queries' width
        scale = q.size(-1) ** -0.5 if scale is None else scale
        if q.device.type == 'cpu' and dropout_p == 0 and sinks.dim() == 1 and v.size(-1) == q.size(-1):
            return SinkAttention.apply(q, k, v, sinks, q.size(2) > 1 if mask is None else mask, scale)
        q, k, v, mask = with_sink(q, k, v, q.size(2) > 1 if mask is None else mask, sinks, scale)
    return model.attend(q, k, v, mask, dropout_p, scale)


class Attention(CausalSelfAttention):
    """The lesson's attention with the switches. Its projections' shapes follow them, so it builds its own (the
    lesson's names, in the lesson's order) rather than the lesson's __init__'s."""

    def __init__(self, config, layer=0, positions='rope', window=None):
        TokenMixer.__init__(self)
        # a config without this chapter's fields (the lesson's alone) has every switch off
        options = config if isinstance(config, Config) else Config()
        switches = options.attention_switches(layer)
        self.positions, self.window = positions, window
        self.n_head = config.n_head
        self.n_kv_head = switches.get('n_kv_head') or config.kv_heads  # a layer's own: Gemma 4's global layers
        self.head_size = switches.get('head_size') or config.head_size
        # a layer sharing K/V projects queries only; with K = V, queries and keys (Gemma 4)
        self.kv_shared, self.k_eq_v = switches.get('kv_shared', False), switches.get('k_eq_v', False)
        self.v_norm = self.k_eq_v or options.v_norm
        kv_parts = 1 if self.k_eq_v else 2
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + kv_parts * self.projected_kv_heads) * self.head_size,
                                bias=config.bias or options.qkv_bias)
        self.c_proj = nn.Linear(self.n_head * self.head_size, config.n_embd, bias=config.bias)
        if options.qk_norm:  # per head (Qwen3), or over each token's whole query and key (OLMo 2)
            q_width, k_width = (self.n_head * self.head_size, self.n_kv_head * self.head_size) \
                if options.qk_norm_all_heads else (self.head_size, self.head_size)
            self.q_norm, self.k_norm = RMSNorm(q_width, config), RMSNorm(k_width, config)
            if self.kv_shared:  # the keys come normalized from the layer that made them
                self.k_norm = nn.Identity()
        self.qk_norm = options.qk_norm and ('all' if options.qk_norm_all_heads else 'head')
        self.rope_qk_norm, self.eps = options.rope_qk_norm and positions in ('rope', 'local'), config.norm_eps
        self.sinks = nn.Parameter(torch.zeros(self.n_head)) if options.attn_sinks else None
        self.c_gate = nn.Linear(config.n_embd, self.n_head * self.head_size, bias=config.bias or options.qkv_bias) \
            if options.attn_gate else None
        self.scale = options.attn_scale
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.indexer = None  # what narrows the keys each query reads (DeepSeek's sparse attention sets it)

    @property
    def projected_kv_heads(self):
        """The K/V heads its c_attn makes: none when it shares an earlier layer's."""
        return 0 if self.kv_shared else self.n_kv_head

    def cache_entries(self):
        # a layer sharing K/V keeps none of its own: its source's serve it
        own = {} if self.kv_shared else {'k': (self.n_kv_head, self.head_size), 'v': (self.n_kv_head, self.head_size)}
        return {**own, **(self.indexer.cache_entries() if self.indexer is not None else {})}

    def token_flops(self, seq_len):
        """q.k and att.v over seq_len keys (at most the window); and an indexer's."""
        index = self.indexer.flops(seq_len, self.n_head * self.head_size) if self.indexer is not None else 0
        return super().token_flops(seq_len) + index

    def heads(self, x):
        """q (B, n_head, T, hs), k and v (B, K/V heads, T, hs), normalized as the switches say."""
        B, T, _ = x.size()
        hs, kv_heads = self.head_size, self.projected_kv_heads
        q, k, v = self.c_attn(x).split([self.n_head * hs, kv_heads * hs, 0 if self.k_eq_v else kv_heads * hs], dim=2)
        if self.k_eq_v:  # the values are the keys as projected, normalized below
            v = k
        if self.qk_norm == 'all':
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k, v = (t.view(B, T, kv_heads, hs).transpose(1, 2) for t in (k, v))
        if self.v_norm:
            v = F.rms_norm(v, (hs,), eps=self.eps)
        if self.qk_norm == 'head':
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def forward(self, x, rope=None, mask=None, cache=None):
        B, T, _ = x.size()
        q, k, v = self.heads(x)
        if self.positions == 'temperature':  # `rope` holds each query's scale (Llama 4's NoPE layers)
            q = q * rope[:, None].to(q.dtype)
        elif rope is not None:  # rotate before K/V heads are shared, so each shared head is rotated once
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.rope_qk_norm:
            q, k = F.rms_norm(q, (self.head_size,), eps=self.eps), F.rms_norm(k, (self.head_size,), eps=self.eps)
        if cache is not None:
            k, v = cache.update(k=k, v=v)
        if self.indexer is not None:  # each query reads the keys its indexer picks
            mask, k, v = self.indexer.narrow(x, x, rope, mask, cache, k, v)
            self.indexer.learn(q, k, self.scale)
        y = attend_with_sinks(q, k, v, mask, self.dropout if self.training else 0.0, self.scale, self.sinks)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_size)
        if self.c_gate is not None:
            y = y * torch.sigmoid(self.c_gate(x))
        return self.resid_dropout(self.c_proj(y))


ATTENTIONS['mha'] = Attention  # every switch off: the lesson's CausalSelfAttention
