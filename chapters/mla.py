"""
Multi-head latent attention (attn='mla'; DeepSeek-V2, V3, Kimi): keys and values rebuilt, per head, from one small
latent vector per token (kv_lora_rank), so the cache keeps that latent and one rotated key shared by all heads,
a fraction of GQA's; queries may pass through a bottleneck of their own (q_lora_rank). Cached decoding uses the
absorbed form (the up-projections folded into the query and the output). The widths default to DeepSeek-V2's
proportions to the head width. Attention's sinks (attn_sinks) and output gate (attn_gate: sigmoid of a projection
of the block input, per value dim) apply to it as to softmax attention (HY-V4 has both).
"""

from dataclasses import dataclass

import torch
import torch.nn as nn

from chapters import attention
from chapters.long_context import yarn_mscale
from model import ATTENTIONS, BOOL, POSITIVE_NUMBER, RMSNorm, TokenMixer, apply_rope, changed, flag_list, is_int, kinds

MLA_FIELDS = ('kv_lora_rank', 'q_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim')


def mla_cannot(c):
    """The flags of attention that MLA, which makes its own keys and values, cannot apply."""
    return changed(c, ('n_kv_head', 'head_dim', 'qk_norm', 'qkv_bias', 'rope_fraction', 'attn_scale'))


@dataclass
class Config:
    kv_lora_rank: int | None = None  # width of the cached latent; None: 4 * n_embd / n_head
    q_lora_rank: int | None = None  # width of the queries' bottleneck; None or 0: queries projected directly
    qk_nope_head_dim: int | None = None  # per head, the query/key part without rotation; None: n_embd / n_head
    qk_rope_head_dim: int | None = None  # the rotated part, one key shared by all heads; None: half the above
    v_head_dim: int | None = None  # per head, the value width; None: n_embd / n_head
    mla_norm_eps: float | None = None  # epsilon of the RMSNorms on the latents (queries' and keys'); None: 1e-6, DeepSeek's (GLM-5.3-Flash: its rms_norm_eps)
    mla_head_gate: bool = False  # each head's output times sigmoid(a projection of the block input), one gate per head (Ling 3 / BailingHybrid)

    FIELD_TYPES = {  # a query bottleneck and a rotated part may be absent (0)
        **kinds('kv_lora_rank qk_nope_head_dim v_head_dim', (lambda v, c: v is None or is_int(v), 'None or an int >= 0')),
        **kinds('q_lora_rank qk_rope_head_dim', (lambda v, c: v is None or is_int(v, 0), 'None or an int >= 0')),
        'mla_head_gate': BOOL,
        'mla_norm_eps': POSITIVE_NUMBER,
    }
    CHECKS = [
        (lambda c: c.attn == 'mla' and mla_cannot(c),
         lambda c: f"attn='mla' makes its own keys and values: {flag_list(c, mla_cannot(c))} cannot apply (set "
                   f"{' '.join(f'--{k}={type(c).__dataclass_fields__[k].default}' for k in mla_cannot(c))})"),
        (lambda c: c.attn == 'mla' and c.pos == 'learned' and c.qk_rope_head_dim,
         lambda c: f"qk_rope_head_dim={c.qk_rope_head_dim} needs pos='rope' (learned positions rotate nothing): set "
                   f"--pos=rope or --qk_rope_head_dim=None"),
        (lambda c: c.attn == 'mla' and c.pos == 'rope' and c.qk_rope_head_dim == 0,
         lambda c: "qk_rope_head_dim=0 with pos='rope': the rotated part needs a width"),
        (lambda c: c.attn != 'mla' and [k for k in MLA_FIELDS if getattr(c, k) is not None],
         lambda c: f"{', '.join(k for k in MLA_FIELDS if getattr(c, k) is not None)} apply to attn='mla' only, got "
                   f"attn={c.attn!r} (set --attn=mla, or "
                   f"{' '.join(f'--{k}=None' for k in MLA_FIELDS if getattr(c, k) is not None)})"),
        (lambda c: c.mla_norm_eps is not None and c.attn != 'mla',
         lambda c: f"mla_norm_eps={c.mla_norm_eps} is the epsilon of attn='mla''s latent norms, got attn={c.attn!r} "
                   f"(set --attn=mla or --mla_norm_eps=None)"),
        (lambda c: c.mla_head_gate and c.attn != 'mla',
         lambda c: f"mla_head_gate=True gates the heads of attn='mla', got attn={c.attn!r} (set --attn=mla, or "
                   f"--attn_gate=True for a gate per head dim)"),
        (lambda c: c.mla_head_gate and c.attn_gate,
         lambda c: "mla_head_gate=True and attn_gate=True are two gates on the same heads' output (one per head, one "
                   "per head dim): set one of them"),
        (lambda c: c.attn == 'mla' and c.rope_qk_norm,
         lambda c: "rope_qk_norm applies to attn='mha' only (MLA makes its own queries and keys)"),
    ]

    @property
    def mla_dims(self):
        """MLA's widths (DeepSeek-V2's proportions to the head width)."""
        hs = self.n_embd // self.n_head
        nope = self.qk_nope_head_dim or hs
        rope = self.qk_rope_head_dim if self.qk_rope_head_dim is not None else (max(2, nope // 2 // 2 * 2)
                                                                                 if self.pos == 'rope' else 0)
        return {'latent': self.kv_lora_rank or 4 * hs, 'q_latent': self.q_lora_rank or 0, 'nope': nope,
                'rope': rope, 'v': self.v_head_dim or hs}

    @property
    def rope_dim(self):
        return self.mla_dims['rope'] if self.attn == 'mla' else super().rope_dim


# the modern block with latent attention: bench.py's variant 'mla'
VARIANT = {'attn': 'mla', 'n_kv_head': None}


class LatentAttention(TokenMixer):
    """DeepSeek's multi-head latent attention (MLA). Keys and values are rebuilt, per head, from one small
    latent vector per token, and queries may pass through a bottleneck of their own. Positions live in a
    separate rotated part: each query head has one, and one rotated key (from the token, not the latent) is
    shared by all heads. The KV cache holds only the latent and that shared key.

    Cached decoding uses the absorbed form: the key up-projection is folded into the query, the value
    up-projection into the output, so each step attends over the cached latents directly (as MQA with one
    wide head) instead of rebuilding every past key and value. Training and prefill rebuild them."""

    attends = True
    config_class = Config

    def __init__(self, config, layer=0, positions='rope', window=None):
        super().__init__()
        dims = config.mla_dims
        self.positions, self.window = positions, window
        # widths (the tensors of forward have the short names)
        self.n_head, self.latent_dim, self.nope_dim, self.rope_dim, self.v_dim = (
            config.n_head, dims['latent'], dims['nope'], dims['rope'], dims['v'])
        H, d = self.n_head, config.n_embd
        latent_eps = 1e-6 if config.mla_norm_eps is None else config.mla_norm_eps  # DeepSeek's latents: eps 1e-6
        if dims['q_latent']:
            self.q_a = nn.Linear(d, dims['q_latent'], bias=config.bias)
            self.q_a_norm = RMSNorm(dims['q_latent'], config, eps=latent_eps)
            self.q_b = nn.Linear(dims['q_latent'], H * (self.nope_dim + self.rope_dim), bias=False)
            self.q_proj = None
        else:
            self.q_proj = nn.Linear(d, H * (self.nope_dim + self.rope_dim), bias=False)
        self.kv_a = nn.Linear(d, self.latent_dim + self.rope_dim, bias=config.bias)  # [latent | shared rotated key]
        self.kv_norm = RMSNorm(self.latent_dim, config, eps=latent_eps)
        self.kv_b = nn.Linear(self.latent_dim, H * (self.nope_dim + self.v_dim), bias=False)  # per head [k_nope | v]
        self.c_proj = nn.Linear(H * self.v_dim, d, bias=config.bias)
        # attention.py's switches: a sink logit per head; the output gated per value dim (attn_gate, HY-V4's,
        # without a bias) or per head (mla_head_gate, Ling 3's): sigmoid(c_gate(x)), broadcast over each head
        self.sinks = nn.Parameter(torch.zeros(H)) if config.attn_sinks else None
        gate_width = H * self.v_dim if config.attn_gate else H if config.mla_head_gate else 0
        self.c_gate = nn.Linear(d, gate_width, bias=False) if gate_width else None
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        # the softmax scale follows the query/key width, sharpened as YaRN's DeepSeek form asks
        self.scale = (self.nope_dim + self.rope_dim) ** -0.5
        if config.rope_scaling and config.yarn_mscale_all_dim:
            self.scale *= yarn_mscale(config.rope_scale, config.yarn_mscale_all_dim) ** 2
        self.absorb = True  # cached decoding in the absorbed form (False: rebuild keys and values; bench.py)
        self.indexer = None  # what narrows the keys each query reads (sparse_attention.py sets it)

    def cache_entries(self):
        """The latent and the shared rotated key, for all heads (and an indexer's key)."""
        return {'latent': (1, self.latent_dim + self.rope_dim),  # [latent | rotated key], as decoding reads them
                **(self.indexer.cache_entries() if self.indexer is not None else {})}

    def token_flops(self, seq_len):
        """q.k and att.v over seq_len rebuilt keys (training's form); and an indexer's."""
        width = self.nope_dim + self.rope_dim + self.v_dim
        index = self.indexer.flops(seq_len, self.n_head * (self.nope_dim + self.rope_dim)) \
            if self.indexer is not None else 0
        return 3 * 2 * self.n_head * width * min(seq_len, self.window or seq_len) + index

    def forward(self, x, rope=None, mask=None, cache=None):
        B, T, _ = x.size()
        H = self.n_head
        q_in = self.q_a_norm(self.q_a(x)) if self.q_proj is None else x  # what DSA's indexer makes its queries of too
        q = self.q_b(q_in) if self.q_proj is None else self.q_proj(x)
        q = q.view(B, T, H, self.nope_dim + self.rope_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rope = self.kv_a(x).split([self.latent_dim, self.rope_dim], dim=-1)
        latent = self.kv_norm(latent).unsqueeze(1)  # (B, 1, T, latent): one "head" for all
        k_rope = k_rope.unsqueeze(1)
        if rope is not None:
            q_rope, k_rope = apply_rope(q_rope, *rope), apply_rope(k_rope, *rope)
        keys = torch.cat((latent, k_rope), dim=-1)  # what the cache keeps of each token
        if cache is not None:
            keys, = cache.update(latent=keys)
        if self.indexer is not None:  # DeepSeek Sparse Attention: each query reads the keys its indexer picks
            mask, keys = self.indexer.narrow(x, q_in, rope, mask, cache, keys)
        if cache is not None and T == 1 and self.absorb:
            y = self._absorbed(q_nope, q_rope, keys, mask)
        else:
            latent, k_rope = keys.split([self.latent_dim, self.rope_dim], dim=-1)
            kv = self.kv_b(latent.squeeze(1)).view(B, -1, H, self.nope_dim + self.v_dim).transpose(1, 2)
            k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
            k = torch.cat((k_nope, k_rope.expand(-1, H, -1, -1)), dim=-1)
            q = torch.cat((q_nope, q_rope), dim=-1)
            if self.indexer is not None:
                self.indexer.learn(q, k, self.scale)
            y = attention.attend_with_sinks(q, k, v, mask, self.dropout if self.training else 0.0, self.scale,
                                           self.sinks)
        y = y.transpose(1, 2)  # (B, T, H, v)
        if self.c_gate is not None:  # one gate per value dim or per head
            y = y * torch.sigmoid(self.c_gate(x).float()).to(y.dtype).view(B, T, H, -1)
        return self.resid_dropout(self.c_proj(y.reshape(B, T, H * self.v_dim)))

    def _absorbed(self, q_nope, q_rope, keys, mask):
        """q.k = (q_nope W_uk) . latent + q_rope . k_rope, and att.v = (att . latent) W_uv^T; keys: the cached
        [latent | k_rope] of every past token; mask: False (every key is the past), or the slots that are (1, S)."""
        w = self.kv_b.weight.view(self.n_head, self.nope_dim + self.v_dim, self.latent_dim)
        # the heads as the matmuls' batch and the sequences as rows: a batch of sequences broadcast over w had
        # torch copy w once per sequence (16 MB a layer a step at batch 8 for HY-V4's shapes); the rows laid out
        # (B, H, ...) again, tiny: left a transposed view, inductor's compiled step for GLM-5-Next at batch 8 gave
        # other tokens than eager's (which the tiny MLA models the tests compile did not show)
        per_head = lambda t, m: (t.squeeze(-2).transpose(0, 1) @ m).transpose(0, 1).contiguous().unsqueeze(-2)
        q_latent = per_head(q_nope, w[:, :self.nope_dim])  # (B, H, 1, latent)
        # one query per head at the same position: the heads become the queries of one shared "head", so the
        # cache is read once, not repeated per head
        q = torch.cat((q_latent, q_rope), dim=-1).transpose(1, 2)  # (B, 1, H, latent + rope)
        # the sinks, one per head, are one per query row here
        sinks = self.sinks.view(1, 1, -1, 1) if self.sinks is not None else None
        # the values are the whole keys, the output's latent dims kept: with q, k and v of one width SDPA takes its
        # fused kernel, where a narrower v sends it to the math one (on a CPU 2x slower per step at 8k-32k keys)
        y = attention.attend_with_sinks(q, keys, keys, mask, scale=self.scale, sinks=sinks)[..., :self.latent_dim]
        return per_head(y.transpose(1, 2), w[:, self.nope_dim:].transpose(1, 2))  # (B, H, 1, v)


ATTENTIONS['mla'] = LatentAttention
