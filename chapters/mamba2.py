"""
Mamba-2 ('S' layers; Dao and Gu 2024, "Transformers are SSMs"; Nemotron-H, Falcon-H1, Granite 4): a selective
state-space layer whose state per head, a (head dim, state dim) matrix, decays by e^(dt A) and takes in dt x B^T,
read by C. Training and prefill run SSD (the state-space duality: inside a chunk in parallel, as attention with a
decay mask; the state carried from chunk to chunk), a decoding step the recurrence, so the cache holds the state
and the convolution's last inputs whatever the context. On CUDA, where flash-linear-attention is installed, SSD
runs its simple-GLA kernel (through deltanet.py's adapters, to which this file adds SSD's).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters.deltanet import FLA_ADAPTERS, FLA_OPS, decayed_dots, fla_kernel, heads_second, time_padded
from chapters.short_conv import causal_depthwise_conv
from model import LAYER_KINDS, NON_NEGATIVE_NUMBER, OPTIONAL_POSITIVE_INT, LayerKind, TokenMixer, changed, is_int, kinds

SSM_FIELDS = ('ssm_n_head', 'ssm_head_dim', 'ssm_state_dim', 'ssm_n_groups', 'ssm_conv_kernel', 'ssm_chunk_size',
              'ssm_dt_min')


@dataclass
class Config:
    ssm_n_head: int | None = None  # heads of an 'S' layer; None: 2 * n_embd / ssm_head_dim (Mamba's expand 2)
    ssm_head_dim: int | None = None  # width of each head; None: the attention's head width
    ssm_state_dim: int = 64  # each head's state is (ssm_head_dim, ssm_state_dim); B and C are this wide
    ssm_n_groups: int = 1  # B and C come in this many groups, each shared by ssm_n_head / ssm_n_groups heads
    ssm_conv_kernel: int = 4  # the causal depthwise convolution over x, B and C, in tokens
    ssm_chunk_size: int = 64  # training and prefill work in chunks of this many tokens, parallel inside one
    ssm_dt_min: float = 0.0  # time steps below this are raised to it (Nemotron-H's time_step_limit[0]); 0: none

    FIELD_TYPES = {
        **kinds('ssm_n_head ssm_head_dim', OPTIONAL_POSITIVE_INT),
        **kinds('ssm_state_dim ssm_n_groups ssm_conv_kernel ssm_chunk_size', (lambda v, c: is_int(v), 'an int >= 1')),
        'ssm_dt_min': NON_NEGATIVE_NUMBER,
    }
    CHECKS = [
        (lambda c: c.ssm_dims['heads'] % c.ssm_n_groups != 0,
         lambda c: f"ssm_n_groups ({c.ssm_n_groups}) must divide the 'S' layers' heads ({c.ssm_dims['heads']}): each "
                   f"group's B and C serve a group of heads"),
        (lambda c: changed(c, SSM_FIELDS) and 'S' not in c.layer_kinds,
         lambda c: f"{', '.join(changed(c, SSM_FIELDS))} apply to Mamba-2 ('S') layers and layers={c.layers!r} has "
                   f"none: add 'S' to layers or leave them at their defaults"),
    ]

    @property
    def ssm_dims(self):
        """An 'S' layer's heads and widths."""
        head_dim = self.ssm_head_dim or self.head_size
        return {'heads': self.ssm_n_head or max(1, 2 * self.n_embd // head_dim), 'head_dim': head_dim,
                'state': self.ssm_state_dim, 'groups': self.ssm_n_groups}


def ssd_chunked(x, dt, A, B, C, chunk, state=None, final=False):
    """Mamba-2's selective state-space recurrence over a sequence, chunk tokens at a time (SSD: inside a chunk
    in parallel, as attention with a decay mask; the state carried from chunk to chunk). x (batch, H, T, P),
    time steps dt (batch, H, T), decay rates A (H,) (negative), B and C (batch, G, T, N), each of the G groups
    serving H / G consecutive heads (G = H: one each), all fp32; state (batch, H, P, N) or None (zeros). Returns
    the outputs (batch, H, T, P) and, with final=True, the state after the last token.

    Per token t (the recurrent form): S = e^(dt_t A) S + (dt_t x_t) B_t^T; y_t = S C_t. Inside a chunk, with G_t
    the log-decay summed from the chunk's start and S0 the state before it:
    y_t = e^G_t S0 C_t + sum_(j<=t) e^(G_t - G_j) (C_t.B_j) dt_j x_j. The decay is a scalar per head and token, so
    it stays out of the products with B and C: the scores C.B are a group's, computed once for its heads (not
    once per head on copies of B and C), and e^G_t scales what S0 C_t reads."""
    batch, H, T, P = x.shape
    groups = B.size(1)
    n_chunks, L = -(-T // min(chunk, T)), min(chunk, T)
    pad = n_chunks * L - T  # padded tokens write nothing (x dt = 0) and do not decay (dt A = 0)
    # heads as (group, head in the group): B, C and their scores broadcast over a group's heads
    g = time_padded(dt * A[:, None], pad, -1).view(batch, groups, H // groups, n_chunks, L).cumsum(-1)
    x = time_padded(x * dt[..., None], pad).view(batch, groups, H // groups, n_chunks, L, P)
    B, C = (time_padded(t, pad).reshape(batch, groups, 1, n_chunks, L, -1) for t in (B, C))
    y = decayed_dots(g, B, C)[0] @ x  # within each chunk: (C_t.B_j) e^(G_t - G_j), j <= t
    first = 0 if state is not None else 1  # the first chunk whose entering state is read (a zero one reads nothing)
    rows = n_chunks + 1 - first if final else n_chunks - first  # entering states needed (row n: the final state)
    if rows:
        state = None if state is None else state.view(batch, groups, H // groups, P, -1)
        states = _chunk_states(g, x, B, first, rows, state)  # (batch, groups, H / groups, rows, P, N)
        read = n_chunks - first
        # S0 read by each token of chunks first.., decayed to it: all chunks in one matmul
        y[..., first:, :, :] += (C[..., first:, :, :] @ states[..., :read, :, :].transpose(-1, -2)) \
            * g[..., first:, :, None].exp()
    state = states[..., -1, :, :].flatten(1, 2) if final else None
    return y.view(batch, H, n_chunks * L, P)[:, :, :T], state


def _chunk_states(g, x, B, first, rows, state):
    """The state entering chunks first, .., first + rows - 1 (chunk n: after the last), all at once: with a_k chunk
    k's whole log-decay, S_i = sum_(j<i) e^(a_(j+1) + .. + a_(i-1)) W_j + e^(a_0 + .. + a_(i-1)) S0, W_j chunk j's
    writes decayed to its end. One matmul by the (rows x writes) decays, where a loop over the chunks took a pass
    per chunk and copied each chunk's slices (its backward stacked them back). Each decay is a sum of the chunks
    between, summed from row i back (suffix sums), not a difference of two running sums: over a long sequence
    those grow to thousands, and their difference would keep only fp32's few digits left at that size."""
    n_writes, n = first + rows - 1, g.size(-2)  # chunks 0..n_writes-1 write a state that is read
    x_end = x[..., :n_writes, :, :] * (g[..., :n_writes, -1:] - g[..., :n_writes, :]).exp()[..., None]
    written = (x_end.transpose(-1, -2) @ B[..., :n_writes, :, :]).flatten(-2)  # (..., n_writes, P * N)
    i = torch.arange(first, first + rows, device=g.device)[:, None]
    before = torch.arange(n, device=g.device) < i  # (rows, n): chunk k lies before row i
    # suffix[i, j] = a_j + .. + a_(i-1) (0 from j = i on), from chunk i - 1 back
    suffix = F.pad(g[..., -1][..., None, :].masked_fill(~before, 0.0).flip(-1).cumsum(-1).flip(-1), (0, 1))
    later = i <= torch.arange(n_writes, device=g.device)  # j >= i: not yet written
    decays = suffix[..., 1:n_writes + 1].masked_fill(later, float('-inf')).exp()  # a_(j+1) + .. + a_(i-1)
    states = (decays @ written).unflatten(-1, x.shape[-1:] + B.shape[-1:])
    if state is not None:
        states = states + suffix[..., 0, None, None].exp() * state[..., None, :, :]
    return states


def ssd_recurrent(x, dt, A, B, C, state=None):
    """The same recurrence one token at a time (decoding): shapes as ssd_chunked; returns (outputs, state)."""
    batch, H, T, P = x.shape
    if state is None:
        state = x.new_zeros(batch, H, P, B.size(-1))
    outs = []
    for t in range(T):
        written = (dt[:, :, t, None] * x[:, :, t])[..., None] * B[:, :, t, None, :]
        state = state * (dt[:, :, t] * A).exp()[..., None, None] + written
        outs.append((state * C[:, :, t, None, :]).sum(-1))
    return torch.stack(outs, dim=2), state


class Mamba2(TokenMixer):
    """Mamba-2 (Nemotron-H, Falcon-H1, Granite 4), an 'S' layer: one projection gives the gate z, the input x,
    B and C (n_groups of them, each shared by a group of heads) and a time step per head; x, B and C pass a
    causal depthwise convolution (SiLU); each head's state, a (head dim, state dim) matrix, decays by
    e^(dt A) (a scalar per head and token) and takes in dt x B^T, and is read by C; then the D skip (D x), a
    gated RMSNorm per group, norm(y * silu(z)), and the output projection. The cache holds the state and the
    convolution's last inputs, whatever the context."""

    def __init__(self, config, layer=0):
        super().__init__()
        dims = config.ssm_dims
        self.heads, self.head_dim, self.state_dim, self.groups = dims['heads'], dims['head_dim'], dims['state'], \
            dims['groups']
        self.kernel, self.chunk, self.eps = config.ssm_conv_kernel, config.ssm_chunk_size, config.norm_eps
        self.dt_min = config.ssm_dt_min
        inner, width = self.heads * self.head_dim, self.conv_width
        self.in_proj = nn.Linear(config.n_embd, inner + width + self.heads, bias=config.bias)  # [z | x B C | dt]
        self.conv1d = nn.Conv1d(width, width, self.kernel, groups=width)
        # decay rates A in [1, 16] and time steps softplus(dt_bias) in [1e-3, 0.1], log-uniform (Mamba's init)
        self.A_log = nn.Parameter(torch.empty(self.heads).uniform_(1, 16).log())
        dt = torch.empty(self.heads).uniform_(math.log(1e-3), math.log(0.1)).exp()
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = nn.Parameter(torch.ones(inner))  # the gated RMSNorm's gain
        self.c_proj = nn.Linear(inner, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    @property
    def conv_width(self):
        return self.heads * self.head_dim + 2 * self.groups * self.state_dim

    def cache_states(self):
        """The convolution's last kernel-1 inputs, and the state in fp32 (it sums every token's write)."""
        return {'conv': ((self.conv_width, self.kernel - 1), None),
                'state': ((self.heads, self.head_dim, self.state_dim), torch.float32)}

    def token_flops(self, seq_len):
        """The convolution's weights as a Linear's, and as training's chunked form runs them (no state carried in
        or out): the scores C.B per group and chunk, their product with each head's inputs, and the state's reads
        and writes between chunks."""
        L = min(self.chunk, seq_len)
        n = -(-seq_len // L)
        P, N = self.head_dim, self.state_dim
        scores = self.groups * 2 * L * L * N + self.heads * 2 * L * L * P  # per chunk, padded ones included
        state = self.heads * 2 * 2 * L * P * N  # read and written between chunks: n - 1 times
        return 6 * self.conv1d.weight.numel() + 3 * (n * scores + (n - 1) * state) / seq_len

    def forward(self, x, rope=None, mask=None, cache=None):
        """rope and mask are attention's: a state-space layer has no positions but its order. cache: its stores
        are read (unless fresh) and overwritten."""
        batch, T, _ = x.size()
        H, P, N, G = self.heads, self.head_dim, self.state_dim, self.groups
        z, xBC, dt = self.in_proj(x).split([H * P, self.conv_width, H], dim=-1)
        xBC = F.silu(causal_depthwise_conv(xBC, self.conv1d.weight, self.conv1d.bias, cache))
        xs, B, C = xBC.float().split([H * P, G * N, G * N], dim=-1)
        xs = xs.view(batch, T, H, P).transpose(1, 2)
        B, C = (t.view(batch, T, G, N).transpose(1, 2) for t in (B, C))  # a group's serve H / G consecutive heads
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(min=self.dt_min).transpose(1, 2)  # (batch, H, T)
        A = -self.A_log.float().exp()
        state = None if cache is None or cache.fresh else cache.stores['state']
        if cache is not None and T == 1:
            y, state = ssd_recurrent(xs, dt, A, *(t.repeat_interleave(H // G, dim=1) for t in (B, C)), state)
        else:
            chunked = fla_kernel('ssd', xs) or ssd_chunked
            y, state = chunked(xs, dt, A, B, C, self.chunk, state, final=cache is not None)
        if cache is not None:
            cache.stores['state'].copy_(state)
        y = (y + self.D.float()[:, None, None] * xs).transpose(1, 2).reshape(batch, T, H * P)
        y = (y * F.silu(z.float())).view(batch, T, G, -1)
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).view(batch, T, H * P) * self.norm.float()
        return self.resid_dropout(self.c_proj(y.to(x.dtype)))


def _fla_ssd(kernel, x, dt, A, B, C, chunk, state=None, final=False):
    """ssd_chunked through fla's chunk_simple_gla (SSD is simple GLA, a scalar log-decay per head and token:
    queries C, keys B, values dt x, log-decay dt A): its state (heads, values, keys) = ours (heads, P, N)."""
    B, C = (t.repeat_interleave(x.size(1) // t.size(1), dim=1) for t in (B, C))  # a group's to each of its heads
    q, k, v, g = heads_second(C, B, x * dt[..., None], dt * A[:, None])
    out, state = kernel(q, k, v, g=g, scale=1.0, initial_state=state, output_final_state=final, state_v_first=True)
    return out.transpose(1, 2), state


FLA_OPS['ssd'] = ('fla.ops.simple_gla', 'chunk_simple_gla')
FLA_ADAPTERS['ssd'] = _fla_ssd
LAYER_KINDS['S'] = LayerKind('Mamba-2', Mamba2, 'mamba2', config_class=Config)
