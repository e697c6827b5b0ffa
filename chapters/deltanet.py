"""
Linear attention with a state that does not grow: Gated DeltaNet ('D' layers; Yang et al. 2024; Qwen3-Next,
Qwen3.5, OLMo hybrid) and Kimi Delta Attention ('K' layers; Kimi Linear, 2025: a decay per key channel). A value
head's state, a (key dim, value dim) matrix, decays and is corrected towards each new value by the delta rule;
training and prefill run it chunk by chunk (parallel inside a chunk), a decoding step one token at a time, so
the cache holds the state whatever the context. Their hybrids with a few global attention layers ('DDDG', Qwen3-
Next's 3:1) are the constant-memory models of 2025-26. On CUDA, where flash-linear-attention is installed, the
chunked forms run its Triton kernels (also Mamba-2's, mamba2.py).

OLMo hybrid's variant: linear_neg_eigval (beta in [0, 2], so a write may flip what the state holds), its own
output norm epsilon, and its own norm placement for these layers (linear_norm_position).
"""

import importlib
import math
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters.short_conv import causal_depthwise_conv
from model import BOOL, LAYER_KINDS, NORM_POSITIONS, OPTIONAL_POSITIVE_INT, POSITIVE_NUMBER, LayerKind, TokenMixer, \
    changed, is_int, is_number, kinds

LINEAR_FIELDS = ('linear_n_key_head', 'linear_n_value_head', 'linear_key_dim', 'linear_value_dim',
                 'linear_conv_kernel', 'linear_chunk_size', 'linear_neg_eigval', 'linear_norm_eps',
                 'linear_norm_position')
LINEAR_KINDS = ('D', 'K')
# defaults before today's, for settings that change no output: a checkpoint saved with one takes today's (every
# checkpoint held linear_chunk_size=64 until 2026-12-07, models without 'D' or 'K' layers too, whose checks refuse it)
OLD_DEFAULTS = {'linear_chunk_size': 64}


@dataclass
class Config:
    linear_n_key_head: int | None = None  # query/key heads of a 'D' layer; None: n_head
    linear_n_value_head: int | None = None  # value heads, a multiple of the key heads; None: linear_n_key_head
    linear_key_dim: int | None = None  # width of each query/key head; None: the attention's head width
    linear_value_dim: int | None = None  # width of each value head; None: the attention's head width
    linear_conv_kernel: int = 4  # the causal depthwise convolution over q, k and v, in tokens
    linear_chunk_size: int = 32  # training and prefill work in chunks of this many tokens, parallel inside one (any: the result is the same; 32 ran 'D' and 'K' layers 1.1x and 1.2x faster than fla's 64 on a CPU, forward and backward)
    kda_rank: int | None = None  # width of the low-rank projections making a 'K' layer's decay and output gate; None: linear_key_dim's value; 0: one full-rank projection each (BailingHybrid)
    kda_lower_bound: float | None = None  # 'K' layers' safe gate: log-decay L * sigmoid(A (f(x) + dt_bias)), never below L (BailingHybrid, GLM-5.3-Flash: -5); None: KDA's -A softplus(...)
    linear_neg_eigval: bool = False  # beta = 2 sigmoid(b(x)), in [0, 2]: a write may flip what the state holds for a key (negative eigenvalues of I - beta k k^T)
    linear_norm_eps: float | None = None  # epsilon of the RMSNorm on a 'D'/'K' layer's output; None: norm_eps (OLMo hybrid: 1e-5)
    linear_norm_position: str | None = None  # the norm placement (norm_position's values) of blocks with a 'D'/'K' layer; None: norm_position (OLMo hybrid: 'pre', its attention blocks 'after')

    FIELD_TYPES = {
        **kinds('linear_n_key_head linear_n_value_head linear_key_dim linear_value_dim', OPTIONAL_POSITIVE_INT),
        'kda_rank': (lambda v, c: v is None or is_int(v, 0), 'None or an int >= 0'),
        **kinds('linear_conv_kernel linear_chunk_size', (lambda v, c: is_int(v), 'an int >= 1')),
        'linear_neg_eigval': BOOL,
        'kda_lower_bound': (lambda v, c: v is None or (is_number(v) and v < 0), 'None or a negative number'),
        'linear_norm_eps': POSITIVE_NUMBER,
        'linear_norm_position': (lambda v, c: v is None or v in NORM_POSITIONS,
                                 f"None or one of {', '.join(map(repr, NORM_POSITIONS))}"),
    }
    CHECKS = [
        (lambda c: c.linear_dims['v_heads'] % c.linear_dims['k_heads'] != 0,
         lambda c: f"linear_n_value_head ({c.linear_dims['v_heads']}) must be a multiple of linear_n_key_head "
                   f"({c.linear_dims['k_heads']}): each key head serves a group of value heads"),
        (lambda c: changed(c, LINEAR_FIELDS) and not set(LINEAR_KINDS) & set(c.layer_kinds),
         lambda c: f"{', '.join(changed(c, LINEAR_FIELDS))} apply to Gated DeltaNet ('D') and Kimi Delta Attention "
                   f"('K') layers and layers={c.layers!r} has none: add 'D' or 'K' to layers or leave them at their "
                   f"defaults"),
        (lambda c: c.linear_norm_position not in (None, c.norm_position) and 'post' in (c.norm_position,
                                                                             c.linear_norm_position),
         lambda c: f"linear_norm_position={c.linear_norm_position!r} with norm_position={c.norm_position!r}: a 'post' "
                   f"block ends in its own norm and the others need a final one; use 'post' for both or neither"),
        (lambda c: c.kda_rank is not None and 'K' not in c.layer_kinds,
         lambda c: f"kda_rank={c.kda_rank} applies to Kimi Delta Attention ('K') layers and layers={c.layers!r} has "
                   f"none: add 'K' to layers or set --kda_rank=None"),
        (lambda c: c.kda_lower_bound is not None and 'K' not in c.layer_kinds,
         lambda c: f"kda_lower_bound={c.kda_lower_bound} is the safe gate of Kimi Delta Attention ('K') layers and "
                   f"layers={c.layers!r} has none: add 'K' to layers or set --kda_lower_bound=None"),
    ]

    @property
    def linear_dims(self):
        """A 'D' or 'K' layer's heads and widths."""
        hs = self.head_size
        k_heads = self.linear_n_key_head or self.n_head
        return {'k_heads': k_heads, 'v_heads': self.linear_n_value_head or k_heads,
                'k_dim': self.linear_key_dim or hs, 'v_dim': self.linear_value_dim or hs}

    def norm_position_of(self, layer):
        """linear_norm_position for 'D' and 'K' layers when set."""
        if self.layer_kinds[layer] in LINEAR_KINDS and self.linear_norm_position is not None:
            return self.linear_norm_position
        return super().norm_position_of(layer)


def l2_normalize(x, eps=1e-6, scale=1.0):
    """x over its last dim scaled to length scale (eps inside the root, as Qwen3-Next and fla)."""
    return L2Normalize.apply(x, eps, scale)


class L2Normalize(torch.autograd.Function):
    """l2_normalize with its backward written out: y = scale x r, r = (x.x + eps)^-1/2, so
    dL/dx = scale r (dL/dy - y (y.dL/dy) / scale^2). Two passes over x forward and three back, where autograd's
    five operators took three and five (q and k of every 'D' and 'K' layer)."""

    @staticmethod
    def forward(ctx, x, eps, scale):
        r = torch.rsqrt(torch.linalg.vecdot(x, x).unsqueeze(-1) + eps)
        # laid out as its shape reads (q and k come as (B, T, heads, dim) transposed): the chunked form's matmuls
        # copied each transposed operand to that order, forward and backward, every time
        y = torch.mul(x, r * scale, out=x.new_empty(x.shape))
        ctx.save_for_backward(y, r)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        y, r = ctx.saved_tensors
        along = torch.linalg.vecdot(y, grad).unsqueeze(-1) / -ctx.scale ** 2
        return torch.addcmul(grad, y, along).mul_(r * ctx.scale), None, None


def gated_delta_chunked(q, k, v, g, beta, chunk, state=None, final=False):
    """The gated delta rule over a sequence, chunk tokens at a time: inside a chunk in parallel, the state
    carried from chunk to chunk. q, k (B, H, T, dk), v (B, H, T, dv), write strengths beta (B, H, T) and
    log-decays g, one per token (B, H, T) or one per token and key channel (B, H, T, dk: Kimi Delta Attention),
    all fp32; state (B, H, dk, dv) or None (zeros). Returns the outputs (B, H, T, dv) and, with final=True, the
    state after the last token.

    Per token t (the recurrent form): S = e^g_t S (row c of S by e^g_tc with a decay per channel);
    S += k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t. Unrolled inside a chunk, with G_t the decay summed from
    the chunk's start and S0 the state before it, the writes u_t = beta_t (v_t - S^T k_t) solve the unit lower
    triangular system (I + A) u = beta v - beta (e^G * k) S0 with A_tj = beta_t k_t.(e^(G_t - G_j) * k_j) (j < t),
    so that o_t = (e^G_t * q_t) S0 + sum_(j<=t) q_t.(e^(G_t - G_j) * k_j) u_j."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    C = chunk_length(chunk, T, per_channel=g.dim() == 4)
    n = -(-T // C)
    pad = n * C - T  # padded tokens write nothing (k = 0, beta = 0) and do not decay (g = 0)
    q, k, v = (time_padded(x, pad).reshape(B, H, n, C, -1) for x in (q, k, v))
    g = time_padded(g if g.dim() == 4 else g[..., None], pad).reshape(B, H, n, C, -1)  # (..., C, 1 or dk)
    beta = time_padded(beta, pad, -1).reshape(B, H, n, C)
    g = g.cumsum(-2)  # G: the decay from the chunk's start to each token, itself included
    k_beta = k * beta[..., None]
    # the diagonal is taken as 1 (unitriangular), so A's own diagonal does not matter
    A, scores = _decayed_dots((k_beta, q), k, g)
    uw = solve_unit_lower(A, torch.cat((v * beta[..., None], k_beta * g.exp()), dim=-1))
    u, w = uw.split([dv, dk], dim=-1)  # the writes are u - w S0
    q_decayed = q * g.exp()  # reads S0 decayed to each token
    k_decayed = k * (g[..., -1:, :] - g).exp()  # writes decayed to the chunk's end
    chunk_decay = g[..., -1, :, None].exp()  # (B, H, n, dk, 1): the state's decay over each chunk
    # each chunk's part taken once (unbind): an index per chunk, [:, :, i], had its gradient written into a
    # zero-filled copy of the whole tensor, n times over (a fifth of the layer's backward)
    u, w, scores, q_decayed, k_decayed, chunk_decay = (t.unbind(2) for t in (u, w, scores, q_decayed, k_decayed,
                                                                              chunk_decay))
    out = []
    for i in range(n):
        if state is None:  # a zero state reads and corrects nothing
            u_i = u[i]
            out.append(scores[i] @ u_i)
        else:
            u_i = u[i] - w[i] @ state
            out.append(q_decayed[i] @ state + scores[i] @ u_i)
        if i < n - 1 or final:
            written = k_decayed[i].transpose(-1, -2) @ u_i
            state = written if state is None else state * chunk_decay[i] + written
    return torch.stack(out, dim=2).view(B, H, n * C, dv)[:, :, :T], state


def solve_unit_lower(A, b):
    """X with (A's lower triangle, 1 on the diagonal) X = b, batched: solved as X^T A^T = b^T, whose operands
    LAPACK reads in place (column-major) where A and b themselves would each be copied to that order first
    (1.8x faster forward and backward for 64 x 64 systems)."""
    return torch.linalg.solve_triangular(A.mT, b.mT, upper=True, left=False, unitriangular=True).mT


def time_padded(x, pad, dim=-2):
    """x with pad zeros after its last time step along dim (-2 or -1), or x itself (F.pad copies even for 0)."""
    return F.pad(x, (0, 0) * (-1 - dim) + (0, pad)) if pad else x


def _decayed_dots(queries, b, g):
    """For each a of queries: a_t.(e^(G_t - G_j) * b_j) for j <= t, 0 above, per chunk: a, b (..., C, dk), G
    (..., C, 1 or dk) summed from the chunk's start. One decay per token factors out of the dot product: a matmul
    (decayed_dots). One per channel stays inside it, and the factored form (e^G_t * a_t).(e^-G_j * b_j) would
    overflow: _channel_decayed_dots."""
    if g.size(-1) > 1:
        return _channel_decayed_dots(queries, b, g)
    return decayed_dots(g[..., 0], b, *queries)


def decayed_dots(g, b, *queries):
    """(a b^T) * e^(G_t - G_j) for j <= t, 0 above, for each a of queries (..., C, d), b (..., C, d), with one
    log-decay G (..., C) per token summed from the chunk's start; a b^T and the decays may broadcast against each
    other (Mamba-2's scores are a group's, its decays a head's). Returns a list."""
    return list(DecayedDots.apply(g, b, *queries))


class DecayedDots(torch.autograd.Function):
    """decayed_dots with its backward written out. The decays D are made in place (no masked copy), each output
    is its product scaled in place, and the backward takes what it needs from D and the outputs: dL/d(a b^T) =
    dL/dout * D, and the decays' gradient P = sum over queries of dL/dout * out gives G_t the row sums of P and
    takes G_j's column sums (autograd's went through the masked copy, a product per query kept unscaled, and a
    sum over broadcast dims for each side of the difference)."""

    @staticmethod
    def forward(ctx, g, b, *queries):
        C = g.size(-1)
        above = torch.ones(C, C, dtype=torch.bool, device=g.device).triu_(1)
        decay = (g[..., :, None] - g[..., None, :]).masked_fill_(above, float('-inf')).exp_()
        outs = [torch.matmul(a, b.transpose(-1, -2)) * decay for a in queries]
        ctx.save_for_backward(b, decay, *queries, *outs)
        ctx.g_shape = g.shape
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        b, decay, *rest = ctx.saved_tensors
        queries, outs = rest[:len(grads)], rest[len(grads):]
        P = grads[0] * outs[0]
        for grad, out in zip(grads[1:], outs[1:]):
            P.addcmul_(grad, out)
        grad_g = (P.sum(-1) - P.sum(-2)).sum_to_size(ctx.g_shape)
        grad_b, grad_queries = None, []
        for grad, a in zip(grads, queries):
            dots = (grad * decay).sum_to_size(*a.shape[:-2], a.size(-2), b.size(-2))  # dL/d(a b^T)
            grad_queries.append((dots @ b).sum_to_size(a.shape))
            part = dots.transpose(-1, -2) @ a
            grad_b = part if grad_b is None else grad_b + part
        return grad_g, grad_b.sum_to_size(b.shape), *grad_queries


def gated_delta_recurrent(q, k, v, g, beta, state=None):
    """The same rule one token at a time (decoding): shapes as gated_delta_chunked; returns (outputs, state)."""
    B, H, T, dk = k.shape
    if state is None:
        state = q.new_zeros(B, H, dk, v.shape[-1])
    g = g if g.dim() == 4 else g[..., None]  # a decay per key channel, or one for all (B, H, T, 1)
    out = []
    for t in range(T):
        state = state * g[:, :, t, :, None].exp()
        remembered = (state * k[:, :, t, :, None]).sum(-2)  # S^T k: what the state already says for this key
        delta = beta[:, :, t, None] * (v[:, :, t] - remembered)
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        out.append((state * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, dim=2), state


def decay_parameters(heads, channels):
    """A_log (one decay rate A per head) and dt_bias (a time step per channel of the decay), as Mamba
    initializes them: A in [1, 16] and softplus(dt_bias) in [1e-3, 0.1], log-uniform."""
    A_log = nn.Parameter(torch.empty(heads).uniform_(1, 16).log())
    dt = torch.empty(channels).uniform_(math.log(1e-3), math.log(0.1)).exp()
    return A_log, nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)



class GatedDeltaNet(TokenMixer):
    """Gated DeltaNet (Qwen3-Next, Qwen3.5), a 'D' layer: linear attention whose state, a (key dim, value dim)
    matrix per value head, is decayed by e^g and corrected towards each new value by the delta rule, so the
    cache holds that state and the convolution's last inputs, whatever the context. q, k and v pass a short
    causal depthwise convolution (SiLU); q and k are L2-normalized per head; beta = sigmoid(b(x)) is each
    token's write strength and g = -exp(A_log) softplus(a(x) + dt_bias) its decay; the output is RMS-normalized
    per head, gated by silu(z(x)) and projected. Key heads may be fewer than value heads (each serves a group)."""
    decay_per_channel = False  # one decay per head and token ('K' layers: one per key channel)

    def __init__(self, config, layer=0):
        super().__init__()
        dims = config.linear_dims
        self.k_heads, self.v_heads, self.k_dim, self.v_dim = dims['k_heads'], dims['v_heads'], dims['k_dim'], dims['v_dim']
        self.kernel, self.chunk = config.linear_conv_kernel, config.linear_chunk_size
        self.eps = config.norm_eps if config.linear_norm_eps is None else config.linear_norm_eps
        self.beta_scale = 2.0 if config.linear_neg_eigval else 1.0  # beta in [0, 2] or [0, 1]
        d, width = config.n_embd, self.conv_width
        self.in_proj_qkv = nn.Linear(d, width, bias=False)
        self.in_proj_z = nn.Linear(d, self.v_heads * self.v_dim, bias=False)
        self.in_proj_b = nn.Linear(d, self.v_heads, bias=False)
        self.in_proj_a = nn.Linear(d, self.v_heads, bias=False)
        self.conv1d = nn.Conv1d(width, width, self.kernel, groups=width, bias=False)
        self.A_log, self.dt_bias = decay_parameters(self.v_heads, self.v_heads)
        self.norm = nn.Parameter(torch.ones(self.v_dim))  # the gated RMSNorm's gain, shared by the heads
        self.c_proj = nn.Linear(self.v_heads * self.v_dim, d, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    @property
    def conv_width(self):
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    def cache_states(self):
        """The convolution's last kernel-1 inputs, and the recurrent state in fp32 (it sums every token's
        write)."""
        return {'conv': ((self.conv_width, self.kernel - 1), None),
                'state': ((self.v_heads, self.k_dim, self.v_dim), torch.float32)}

    def token_flops(self, seq_len):
        """As training (the chunked form, no state carried in or out) runs them, per value head and chunk: the
        two score matrices, the triangular solve's backward product (the solve itself is not a matmul, as the
        convolution is kernel-many products per channel: left out like the norms), the scores times the
        writes, and the state's reads and writes between chunks. (Kimi Delta Attention's decay per channel adds
        products inside each sub-chunk that are elementwise, left out as well.)"""
        C = chunk_length(self.chunk, seq_len, self.decay_per_channel)
        n = -(-seq_len // C)
        dk, dv = self.k_dim, self.v_dim
        # the (query, key) pairs of a score matrix its matmuls compute: a decay per channel makes them the keys of
        # earlier sub-chunks only (_channel_decayed_dots)
        pairs = C * (C - kda_subchunk(C)) // 2 if self.decay_per_channel else C * C
        per_head = 3 * n * (2 * pairs * dk * 2 + 2 * C * C * dv) + n * 2 * C * C * (dv + dk) \
            + 3 * (n - 1) * 3 * 2 * C * dk * dv
        return self.v_heads * per_head / seq_len

    def forward(self, x, rope=None, mask=None, cache=None):
        """rope and mask are attention's: a DeltaNet has no positions but its order. cache: its stores are read
        (unless fresh) and overwritten."""
        B, T, _ = x.size()
        Hk, Hv, dk, dv = self.k_heads, self.v_heads, self.k_dim, self.v_dim
        fresh = cache is None or cache.fresh
        qkv = F.silu(causal_depthwise_conv(self.in_proj_qkv(x), self.conv1d.weight, self.conv1d.bias, cache))
        q, k, v = qkv.split([Hk * dk, Hk * dk, Hv * dv], dim=-1)
        q, k = (l2_normalize(t.view(B, T, Hk, dk).transpose(1, 2).float(), scale=scale)
                for t, scale in ((q, dk ** -0.5), (k, 1.0)))
        if Hv != Hk:  # consecutive value heads share a key head
            q, k = q.repeat_interleave(Hv // Hk, dim=1), k.repeat_interleave(Hv // Hk, dim=1)
        v = v.view(B, T, Hv, dv).transpose(1, 2).float()
        beta = self.beta_scale * torch.sigmoid(self.in_proj_b(x).float()).transpose(1, 2)  # (B, Hv, T)
        g = self.decay(x)
        state = None if fresh else cache.stores['state']
        if cache is not None and T == 1:
            y, state = gated_delta_recurrent(q, k, v, g, beta, state)
        else:
            chunked = fla_kernel('kda' if g.dim() == 4 else 'gated_delta', q) or gated_delta_chunked
            y, state = chunked(q, k, v, g, beta, self.chunk, state, final=cache is not None)
        if cache is not None:
            cache.stores['state'].copy_(state)
        y = y.transpose(1, 2)  # (B, T, Hv, dv)
        y = F.rms_norm(y, (dv,), self.norm.float(), self.eps)
        y = y * self.output_gate(x).view(B, T, Hv, dv)
        return self.resid_dropout(self.c_proj(y.reshape(B, T, Hv * dv).to(x.dtype)))

    def decay(self, x):
        """Each token's log-decay g = -exp(A_log) softplus(a(x) + dt_bias), one per value head (B, Hv, T)."""
        return (-self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())).transpose(1, 2)

    def output_gate(self, x):
        """What the normalized output is multiplied by, per value channel: silu(z(x)), fp32 (B, T, Hv * dv)."""
        return F.silu(self.in_proj_z(x).float())


# A chunk's sub-chunks for the decay per channel: the elementwise part grows with their length, the copies of
# the keys for the matmul part shrink with it. On the 2-core CPU (one layer's forward and backward, 64 sequences,
# key dim 32, one thread) 8 took 22.5 / 57.5 ms at 32 / 64 tokens, 16 took 32.8 / 62.4 and 32 took 47.7 / 88.3.
KDA_SUBCHUNK = 8


def kda_subchunk(chunk):
    return KDA_SUBCHUNK if chunk % KDA_SUBCHUNK == 0 else chunk


def chunk_length(chunk, T, per_channel=False):
    """The tokens per chunk of gated_delta_chunked: chunk, or the whole sequence if shorter; with a decay per
    channel a short sequence is padded up to whole sub-chunks (31 tokens as one sub-chunk of 31 cost 2x)."""
    if per_channel and chunk % KDA_SUBCHUNK == 0:
        return min(chunk, -(-T // KDA_SUBCHUNK) * KDA_SUBCHUNK)
    return min(chunk, T)


def _channel_decayed_dots(queries, b, g):
    """_decayed_dots with a decay per channel, in sub-chunks of s tokens (as flash-linear-attention's kernels).
    A key j in an earlier sub-chunk than query t factors through the start r of t's sub-chunk,
    e^(G_t - G_j) = e^(G_t - G_r) e^(G_r - G_j), both at most 1 (G falls): one matmul per sub-chunk of queries,
    over the keys before it only (a loop: masking the later ones computed twice the decayed copies, 1.4x the
    time). Inside a sub-chunk each query gets its own decayed copy of the keys: _inside_dots."""
    return list(ChannelDecayedDots.apply(b, g, kda_subchunk(b.size(-2)), *queries))


class ChannelDecayedDots(torch.autograd.Function):
    """_channel_decayed_dots with its backward written out, into whole (C x C) outputs and whole gradients:
    through autograd each sub-chunk's slices of a, b and G and each diagonal's inside one had their gradients
    written into zero-filled copies of the whole tensors, and each row of blocks was put together by a cat,
    forward and backward (KDA's chunked form 1.03x faster forward and backward at 32-token chunks: the best
    of 30 in three alternating runs, 26.2 against 27.0 ms; the cats were a seventh of its profile)."""

    @staticmethod
    def forward(ctx, b, g, s, *queries):
        C = b.size(-2)
        m = C // s
        outs = [a.new_zeros(*a.shape[:-1], C) for a in queries]
        insides = _inside_dots([a.unflatten(-2, (m, s)) for a in queries], b.unflatten(-2, (m, s)),
                               g.unflatten(-2, (m, s)))
        for out, inside in zip(outs, insides):  # the blocks on the diagonal: each sub-chunk's own pairs
            _diagonal_blocks(out, m, s).copy_(inside)
        for r in range(1, m):  # sub-chunk r's queries by the keys before it: [before | own | none after]
            rows, start = slice(r * s, (r + 1) * s), g[..., r * s:r * s + 1, :]
            keys = b[..., :r * s, :] * (start - g[..., :r * s, :]).exp()
            from_start = (g[..., rows, :] - start).exp()
            for out, a in zip(outs, queries):
                out[..., rows, :r * s] = (a[..., rows, :] * from_start) @ keys.transpose(-1, -2)
        ctx.save_for_backward(b, g, *queries)
        ctx.s = s
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        b, g, *queries = ctx.saved_tensors
        s, C = ctx.s, b.size(-2)
        m = C // s
        grad_b, grad_g, grad_queries = _inside_dots_backward(
            b.unflatten(-2, (m, s)), g.unflatten(-2, (m, s)), [a.unflatten(-2, (m, s)) for a in queries],
            [_diagonal_blocks(grad, m, s) for grad in grads])
        grad_b, grad_g, grad_queries = grad_b.flatten(-3, -2), grad_g.flatten(-3, -2), \
            [grad_a.flatten(-3, -2) for grad_a in grad_queries]
        for r in range(1, m):
            rows, start = slice(r * s, (r + 1) * s), g[..., r * s:r * s + 1, :]
            to_start = (start - g[..., :r * s, :]).exp()  # E_j = e^(G_r - G_j)
            keys = b[..., :r * s, :] * to_start
            from_start = (g[..., rows, :] - start).exp()  # F_t = e^(G_t - G_r)
            grad_keys = grad_from_start = None
            for grad, a, grad_a in zip(grads, queries, grad_queries):
                block, a_rows = grad[..., rows, :r * s], a[..., rows, :]
                grad_decayed = block @ keys  # of a_t F_t
                grad_a[..., rows, :].addcmul_(grad_decayed, from_start)
                part = grad_decayed * a_rows
                grad_from_start = part if grad_from_start is None else grad_from_start.add_(part)
                part = block.transpose(-1, -2) @ (a_rows * from_start)
                grad_keys = part if grad_keys is None else grad_keys.add_(part)
            # F_t = e^(G_t - G_r): G_t gains dF F; keys_j = b_j E_j: b_j gains dk E and G_j loses dk keys. G_r
            # cancels in F_t E_j = e^(G_t - G_j), so what it would gain and lose sums to 0: left out
            grad_g[..., rows, :].addcmul_(grad_from_start, from_start)
            grad_b[..., :r * s, :].addcmul_(grad_keys, to_start)
            grad_g[..., :r * s, :] -= grad_keys.mul_(keys)
        return grad_b, grad_g, None, *grad_queries


def _diagonal_blocks(x, m, s):
    """The m (s x s) blocks on the diagonal of x (..., m s, m s), as a view (..., m, s, s)."""
    return x.unflatten(-1, (m, s)).unflatten(-3, (m, s)).diagonal(0, -4, -2).movedim(-1, -3)


def _inside_dots(queries, b, g):
    """a_t.(e^(G_t - G_j) * b_j) for the pairs j <= t of each sub-chunk, (..., m, s, s) for each a of queries
    (..., m, s, dk), 0 above the diagonal: elementwise, a diagonal (t - j = d) at a time, over the s - d pairs it
    has. The (s, s, dk) decayed copies of every pair, masked above, did 2x the work and took 2.2x the time."""
    s = b.size(-2)
    out = [a.new_zeros(*a.shape[:-1], s) for a in queries]
    for d in range(s):
        # e^(G_t - G_(t-d)) * b_(t-d), and b itself on the diagonal (d = 0: no decay)
        keys = (g[..., d:, :] - g[..., :s - d, :]).exp() * b[..., :s - d, :] if d else b
        for o, a in zip(out, queries):
            o.diagonal(-d, -2, -1).copy_((a[..., d:, :] * keys).sum(-1))
    return out


def _inside_dots_backward(b, g, queries, grads):
    """The gradients of _inside_dots for b, g and each query, from its outputs' (grads). Per diagonal d, with
    P_t = w_t * e^(G_t - G_(t-d)) * b_(t-d) and w_t the sum over queries of (the output's gradient at (t, t-d)) a_t:
    b_(t-d) gains P / b's factor, G_t gains P and G_(t-d) loses it, and each a_t gains its gradient times the
    decayed key. Each gradient is one tensor the diagonals add into (through autograd, each diagonal's slices
    had theirs written into zero-filled copies of the whole tensors)."""
    s = b.size(-2)
    grad_b, grad_g, grad_queries = torch.zeros_like(b), torch.zeros_like(g), [torch.zeros_like(a) for a in queries]
    for d in range(s):
        on_diagonal = [grad.diagonal(-d, -2, -1)[..., None] for grad in grads]  # (..., s - d, 1)
        decay = (g[..., d:, :] - g[..., :s - d, :]).exp() if d else None
        keys = decay * b[..., :s - d, :] if d else b
        weighted = on_diagonal[0] * queries[0][..., d:, :]
        for grad, a in zip(on_diagonal[1:], queries[1:]):
            weighted.addcmul_(grad, a[..., d:, :])
        for grad_a, grad in zip(grad_queries, on_diagonal):
            grad_a[..., d:, :].addcmul_(grad, keys)
        if d:
            weighted.mul_(decay)  # the gradient of b_(t-d)
            grad_b[..., :s - d, :] += weighted
            weighted.mul_(b[..., :s - d, :])  # P, the gradient of G_t
            grad_g[..., d:, :] += weighted
            grad_g[..., :s - d, :] -= weighted
        else:
            grad_b += weighted
    return grad_b, grad_g, grad_queries


class KimiDeltaAttention(GatedDeltaNet):
    """Kimi Delta Attention (Kimi Linear), a 'K' layer: a Gated DeltaNet whose state forgets at a rate per key
    channel instead of one per head, g = -exp(A_log) softplus(f(x) + dt_bias), with f a low-rank projection
    (n_embd -> kda_rank -> heads * key dim; kda_rank=0: one full-rank n_embd -> heads * key dim, BailingHybrid's),
    A per head and dt_bias per channel; its output gate is sigmoid(a projection of the same form) instead of
    silu(z(x)). The rest is the 'D' layer's: the short convolution
    over q, k and v, L2-normalized q and k, beta = sigmoid(b(x)), the RMS-normalized output, the cache, and
    the chunked and recurrent forms (gated_delta_chunked takes a decay per channel)."""
    decay_per_channel = True

    def __init__(self, config, layer=0):
        super().__init__(config, layer)
        del self.in_proj_z, self.in_proj_a  # the 'D' layer's gate and decay, per head: replaced by low-rank ones
        d = config.n_embd
        rank = self.k_dim if config.kda_rank is None else config.kda_rank
        self.lower_bound = config.kda_lower_bound
        self.A_log, self.dt_bias = decay_parameters(self.v_heads, self.v_heads * self.k_dim)
        # rank 0 (BailingHybrid): no bottleneck, decay_b and gate_b read the token itself
        self.decay_a = nn.Linear(d, rank, bias=False) if rank else None
        self.decay_b = nn.Linear(rank or d, self.v_heads * self.k_dim, bias=False)
        self.gate_a = nn.Linear(d, rank, bias=False) if rank else None
        self.gate_b = nn.Linear(rank or d, self.v_heads * self.v_dim, bias=False)

    @staticmethod
    def _projected(x, a, b):
        """b(a(x)), or b(x) where there is no bottleneck (kda_rank=0)."""
        return b(x if a is None else a(x))

    def decay(self, x):
        """Each token's log-decay per value head and key channel (B, Hv, T, dk)."""
        B, T, _ = x.size()
        f = self._projected(x, self.decay_a, self.decay_b).float() + self.dt_bias.float()
        f = f.view(B, T, self.v_heads, self.k_dim)
        rate = self.A_log.float().exp()[:, None]
        if self.lower_bound is not None:  # the safe gate: a decay per step of at least e^L, whatever f says
            return (self.lower_bound * torch.sigmoid(rate * f)).transpose(1, 2)
        return (-rate * F.softplus(f)).transpose(1, 2)

    def output_gate(self, x):
        return torch.sigmoid(self._projected(x, self.gate_a, self.gate_b).float())


# ----------------------------------------------------------------------------- maintained CUDA kernels (flash-linear-attention)

# On CUDA, where flash-linear-attention is installed, the chunked forms of the 'D', 'K' and 'S' layers run its
# Triton kernels (training and prefill; a decoding step stays the recurrent form, one token). Each adapter below
# keeps the PyTorch form's contract: (batch, heads, T, dim) in, fp32, the state's layout ours. A later chapter's
# form adds its kernel and adapter to FLA_OPS and FLA_ADAPTERS (mamba2.py: SSD).
# tests/test_gpu.py holds each against the PyTorch form; USE_FLA = False runs the PyTorch forms on CUDA too.
USE_FLA = True


# the form a kernel replaces: (fla's module, the kernel's name there)
FLA_OPS = {'gated_delta': ('fla.ops.gated_delta_rule', 'chunk_gated_delta_rule'), 'kda': ('fla.ops.kda', 'chunk_kda')}


@lru_cache(maxsize=None)
def fla_ops():
    """flash-linear-attention's chunked kernels by the form they replace, or None when it is not installed."""
    try:
        return {form: getattr(importlib.import_module(module), name) for form, (module, name) in FLA_OPS.items()}
    except ImportError:
        return None


def fla_kernel(form, x):
    """The kernel adapter for `form` (a key of FLA_OPS) when x is on CUDA and fla is installed, else None (the
    caller runs the PyTorch form)."""
    ops = fla_ops() if USE_FLA and x.is_cuda else None
    return None if ops is None else partial(outside_compile(form), ops[form])


@lru_cache(maxsize=None)
def outside_compile(form):
    """The adapter run as it is by torch.compile (dynamo does not trace Triton's launchers); made here, not where
    the adapter is defined, because torch.compiler.disable imports dynamo, which only this path needs."""
    return torch.compiler.disable(FLA_ADAPTERS[form])


def heads_second(*tensors):
    """(batch, heads, T, ...) <-> (batch, T, heads, ...), contiguous (the kernels index them flat)."""
    return [t.transpose(1, 2).contiguous() for t in tensors]


def _fla_delta(kernel, q, k, v, g, beta, chunk, state=None, final=False):
    """gated_delta_chunked through fla's chunk_gated_delta_rule or chunk_kda (their own chunk size; q comes
    scaled, so scale 1)."""
    out, state = kernel(*heads_second(q, k, v, g, beta), scale=1.0, initial_state=state, output_final_state=final)
    return out.transpose(1, 2), state


FLA_ADAPTERS = {'gated_delta': _fla_delta, 'kda': _fla_delta}


LAYER_KINDS['D'] = LayerKind('Gated DeltaNet', GatedDeltaNet, 'deltanet', config_class=Config)
LAYER_KINDS['K'] = LayerKind('Kimi Delta Attention', KimiDeltaAttention, 'kda', config_class=Config)
