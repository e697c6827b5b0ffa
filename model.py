"""
The whole model in one file: a GPT whose config switches, one flag at a time, each swap that turns a
GPT-2 block into a LLaMA/Qwen-style block.

    flag      vanilla        modern        classes (one dict per kind of part)
    norm      'layernorm' -> 'rms'         NORMS: LayerNorm, RMSNorm
    mlp       'gelu'      -> 'swiglu'      MLPS: MLP, GatedMLP
    n_kv_head None        -> n_head/2      CausalSelfAttention's K/V head count (ATTENTIONS)
    pos       'learned'   -> 'rope'        POSITIONS: LearnedPositions, Rotary
    prenorm   True        -> False         Block.forward (post-norm as in 2017/BERT)

GPTConfig is the one list of model flags: the scripts read it (each field is a setting, its comment the
help text), and SWAPS says which values make the vanilla and the modern block. With every default the
model is nanoGPT's GPT-2, parameter names included, so GPT-2 weights load. transformers is imported
lazily, only to load or export Hugging Face checkpoints (the tables at the end of this file).
"""

import inspect
import math
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    # sizes
    block_size: int = 1024  # context length the model trains at
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12  # number of blocks
    n_head: int = 12  # query heads per attention
    n_embd: int = 768  # width of the residual stream
    dropout: float = 0.0  # on embeddings, attention weights and residual branches
    bias: bool = True  # biases in Linears and LayerNorms, as GPT-2
    tie_embeddings: bool = True  # lm_head shares the token embedding matrix
    # norms
    norm: str = 'layernorm'  # a key of NORMS: 'layernorm' (GPT-2) or 'rms' (RMSNorm)
    norm_eps: float = 1e-5  # epsilon inside every norm
    prenorm: bool = True  # False: the 2017/BERT post-norm x = norm(x + f(x))
    # MLPs
    mlp: str = 'gelu'  # a key of MLPS: 'gelu' (GPT-2), 'relu', 'swiglu' or 'geglu'
    ffn_hidden: Optional[int] = None  # MLP width; None: 4*n_embd, gated MLPs 8/3*n_embd rounded up to multiple_of
    multiple_of: int = 64  # gated MLP widths are rounded up to a multiple of this
    # attention
    attn: str = 'mha'  # a key of ATTENTIONS: 'mha' (multi-head, with n_kv_head also GQA and MQA)
    n_kv_head: Optional[int] = None  # K/V heads; None: n_head (MHA), fewer: GQA, 1: MQA
    head_dim: Optional[int] = None  # width of each head; None: n_embd // n_head (Qwen3 sets its own)
    qkv_bias: bool = False  # biases on the q, k and v projections only (Qwen2), whatever `bias` says
    qk_norm: bool = False  # RMSNorm on each query and key head before RoPE (Qwen3, OLMo 2, Gemma 3)
    sliding_window: Optional[int] = None  # each query sees only the last W keys, itself included (Mistral)
    # positions
    pos: str = 'learned'  # a key of POSITIONS: 'learned' (GPT-2's table) or 'rope' (rotary)
    rope_theta: float = 10000.0  # RoPE base: the slowest rotation's wavelength is about 2*pi*theta
    rope_scaling: Optional[str] = None  # RoPE past the trained length: None, 'linear', 'dynamic', 'yarn' or 'llama3'
    rope_factor: Optional[float] = None  # rope_scaling's stretch; None: block_size / rope_original_length
    rope_original_length: Optional[int] = None  # the context RoPE was trained at; None: block_size
    rope_low_freq_factor: float = 1.0  # llama3: wavelengths over original_length / this are stretched fully
    rope_high_freq_factor: float = 4.0  # llama3: wavelengths under original_length / this are kept
    yarn_beta_fast: float = 32.0  # yarn: dims turning more often than this within the original length are kept
    yarn_beta_slow: float = 1.0  # yarn: dims turning less often than this are stretched fully
    yarn_mscale: float = 0.0  # yarn: DeepSeek's attention temperature (with yarn_mscale_all_dim); 0: off
    yarn_mscale_all_dim: float = 0.0  # yarn: DeepSeek's; also scales MLA's softmax; 0: off
    rope_attention_factor: Optional[float] = None  # yarn: factor on cos and sin; None: 0.1*ln(factor)+1

    def __post_init__(self):
        for name in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'multiple_of'):
            _check_int(name, getattr(self, name))
        for name, kinds in (('norm', NORMS), ('mlp', MLPS), ('attn', ATTENTIONS), ('pos', POSITIONS),
                            ('rope_scaling', ROPE_SCALINGS)):
            if getattr(self, name) not in kinds:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, kinds))}; got {getattr(self, name)!r}")
        for name in ('ffn_hidden', 'head_dim', 'sliding_window', 'rope_original_length'):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 'None or a positive int')
        if self.head_dim is None and self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}), or set head_dim")
        if self.n_kv_head is not None:
            _check_int('n_kv_head', self.n_kv_head, f"None or an int in [1, n_head={self.n_head}]", 1, self.n_head)
            if self.n_head % self.n_kv_head != 0:
                raise ValueError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head})")
        if self.pos == 'rope' and self.rope_dim % 2 != 0:
            raise ValueError(f"pos='rope' needs an even head_dim, got {self.rope_dim}")
        if self.rope_scaling is not None and self.pos != 'rope':
            raise ValueError(f"rope_scaling={self.rope_scaling!r} needs pos='rope', got pos={self.pos!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for name in ('norm_eps', 'rope_theta', 'rope_factor', 'rope_low_freq_factor', 'rope_high_freq_factor',
                     'yarn_beta_fast', 'yarn_beta_slow', 'rope_attention_factor'):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not self.rope_high_freq_factor > self.rope_low_freq_factor:
            raise ValueError(f"rope_high_freq_factor ({self.rope_high_freq_factor}) must be greater than "
                             f"rope_low_freq_factor ({self.rope_low_freq_factor})")
        for name in ('yarn_mscale', 'yarn_mscale_all_dim'):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), (int, float)) \
                    or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a number >= 0, got {getattr(self, name)!r}")
        for name in ('bias', 'tie_embeddings', 'prenorm', 'qkv_bias', 'qk_norm'):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def head_size(self):
        return self.head_dim or self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def rope_dim(self):
        """Width of the rotated part of each query and key head."""
        return self.head_size

    @property
    def rope_length(self):
        """The context RoPE was trained at: rope_scaling stretches past it."""
        return self.rope_original_length or self.block_size

    @property
    def rope_scale(self):
        return self.rope_factor or self.block_size / self.rope_length

    @property
    def hidden_size(self):
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        if MLPS[self.mlp].gated:
            # a third matrix costs 50% more parameters; 2/3 of 4d keeps the count of the plain MLP
            return self.multiple_of * math.ceil(int(8 * self.n_embd / 3) / self.multiple_of)
        return 4 * self.n_embd

    @classmethod
    def from_dict(cls, d):
        """Build from a dict that may hold extra keys (a training config): only our fields are used."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# Flags that change no weight: a trained model can be evaluated, sampled or trained on with other values of
# these (a longer context with RoPE scaling or a window, dropout), so the scripts take them from the run.
RUNTIME_FLAGS = ('block_size', 'dropout', 'sliding_window', 'rope_scaling', 'rope_factor', 'rope_original_length',
                 'rope_low_freq_factor', 'rope_high_freq_factor', 'yarn_beta_fast', 'yarn_beta_slow', 'yarn_mscale',
                 'yarn_mscale_all_dim', 'rope_attention_factor')


def _check_int(name, value, allowed='a positive int', low=1, high=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


# Each swap: the flag it sets, GPT-2's value, and the modern (Llama/Qwen-style) value; a callable value
# depends on the config's other flags. bench.py's variants, ablate.py's grid groups and the recipes' tests
# are built from this table.
SWAPS = {
    'rms': ('norm', 'layernorm', 'rms'),
    'swiglu': ('mlp', 'gelu', 'swiglu'),
    'gqa': ('n_kv_head', None, lambda flags: max(1, flags['n_head'] // 2)),  # half the KV cache
    'rope': ('pos', 'learned', 'rope'),
}


def swap_flags(names, flags, modern=True):
    """The flags that turn on (modern=True) or off the named swaps ('modern': all of them), given the
    config's other flags (a dict holding at least n_head)."""
    out = {}
    for name in SWAPS if names == 'modern' else names:
        flag, vanilla, new = SWAPS[name]
        value = new if modern else vanilla
        out[flag] = value(flags) if callable(value) else value
    return out


# ----------------------------------------------------------------------------- norm

class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, config):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if config.bias else None
        self.eps = config.norm_eps

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / RMS(x) * g: no mean-centering and no bias."""

    def __init__(self, ndim, config):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.eps = config.norm_eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


NORMS = {'layernorm': LayerNorm, 'rms': RMSNorm}


def make_norm(config):
    return NORMS[config.norm](config.n_embd, config)


# ----------------------------------------------------------------------------- positions

class LearnedPositions(nn.Embedding):
    """GPT-2's table of block_size learned position vectors, added to the token embeddings."""

    def __init__(self, config):
        super().__init__(config.block_size, config.n_embd)

    def forward(self, x, start):
        """x plus the vectors of positions start.., and no rotary tables."""
        end = start + x.size(1)
        if end > self.num_embeddings:
            raise ValueError(f"sequence of length {end} is longer than block_size {self.num_embeddings} "
                             f"(learned positions cannot go further)")
        return x + super().forward(torch.arange(start, end, device=x.device)), None


ROPE_SCALINGS = (None, 'linear', 'dynamic', 'yarn', 'llama3')


def _yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(config, dim, length):
    """(the dim/2 rotation frequencies, the factor on cos and sin) of RoPE with config's rope_scaling, for a
    sequence of `length` positions (only 'dynamic' depends on it); the formulas transformers uses."""
    theta, kind = config.rope_theta, config.rope_scaling
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv = 1.0 / theta ** exponents
    factor, original = config.rope_scale, config.rope_length
    if kind is None:
        return inv, 1.0
    if kind == 'linear':  # position interpolation: positions squeezed `factor` times
        return inv / factor, 1.0
    if kind == 'dynamic':  # NTK-aware: a larger base once the sequence outgrows the original length
        longest = max(length, original)
        base = theta * ((factor * longest / original) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / base ** exponents, 1.0
    if kind == 'llama3':  # long wavelengths stretched, short ones kept, a smooth band between
        low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
        wavelength = 2 * math.pi / inv
        stretched = torch.where(wavelength > original / low, inv / factor, inv)
        smooth = (original / wavelength - low) / (high - low)
        band = (wavelength >= original / high) & (wavelength <= original / low)
        return torch.where(band, (1 - smooth) * stretched / factor + smooth * stretched, stretched), 1.0

    # yarn: stretch the dims that turn fewer than beta_slow times within the original length, keep those
    # turning more than beta_fast times, ramp between; and sharpen the attention (the factor on cos and sin)
    def dim_turning(turns):
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))
    low = max(math.floor(dim_turning(config.yarn_beta_fast)), 0)
    high = min(math.ceil(dim_turning(config.yarn_beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
    attention_factor = config.rope_attention_factor
    if attention_factor is None:
        if config.yarn_mscale and config.yarn_mscale_all_dim:
            attention_factor = _yarn_mscale(factor, config.yarn_mscale) / _yarn_mscale(factor, config.yarn_mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    return inv / factor * ramp + inv * (1 - ramp), attention_factor


class Rotary(nn.Module):
    """cos/sin tables for rotary embeddings, kept in fp32 and grown on demand (longer eval contexts).
    The input passes unchanged: attention rotates its queries and keys with the tables."""

    def __init__(self, config):
        super().__init__()
        self.config, self.dim = config, config.rope_dim
        self.register_buffer('cos', torch.empty(0, self.dim), persistent=False)
        self.register_buffer('sin', torch.empty(0, self.dim), persistent=False)
        self.built_for = None  # the length 'dynamic' frequencies were computed for

    def _tables(self, length):
        """cos, sin for positions 0..length-1 at this length's frequencies."""
        dynamic = self.config.rope_scaling == 'dynamic' and length > self.config.rope_length
        want = length if dynamic else None  # whose frequencies the tables must hold
        # rebuilt when too short, for another length's 'dynamic' angles, or when model.to(bf16) cast them
        if self.built_for != want or length > self.cos.size(0) or self.cos.dtype != torch.float32:
            size = length if dynamic else max(2 * length, self.cos.size(0), self.config.block_size)
            inv, factor = rope_frequencies(self.config, self.dim, length)
            angles = torch.outer(torch.arange(size, dtype=torch.float32), inv).to(self.cos.device)
            angles = torch.cat((angles, angles), dim=-1)  # half-split layout: pairs are (i, i + dim/2)
            self.cos, self.sin = angles.cos() * factor, angles.sin() * factor
            self.built_for = want
        return self.cos, self.sin

    def forward(self, x, start):
        """x unchanged, and (cos, sin) of positions start..; with 'dynamic', at the frequencies of the length
        reached (as transformers does: with a KV cache, earlier keys keep the angles they were given)."""
        end = start + x.size(1)
        cos, sin = self._tables(end)
        return x, (cos[start:end], sin[start:end])


def apply_rope(x, cos, sin):
    """Rotate x (B, heads, T, dim) by the angles of its positions."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


POSITIONS = {'learned': LearnedPositions, 'rope': Rotary}


# ----------------------------------------------------------------------------- attention

# SDPA shares K/V heads itself since torch 2.5 (enable_gqa); older versions get an explicit repeat
try:
    F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2),
                                   enable_gqa=True)
    _SDPA_HAS_GQA = True
except TypeError:
    _SDPA_HAS_GQA = False


def attend(q, k, v, mask, dropout_p=0.0, scale=None):
    """softmax(q k^T * scale) v over (B, heads, T, dim) tensors; k and v may have fewer heads than q,
    each shared by consecutive query heads. mask None: causal (a single query sees every key)."""
    gqa = {}
    if k.size(1) != q.size(1):
        # CUDA's fused kernels take enable_gqa only in half precision (flash); fp32 would fall back to math
        if _SDPA_HAS_GQA and (q.device.type == 'cpu' or q.dtype in (torch.float16, torch.bfloat16)):
            gqa = {'enable_gqa': True}
        else:
            k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
            v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and q.size(2) > 1,
                                          dropout_p=dropout_p, scale=scale, **gqa)


class CausalSelfAttention(nn.Module):
    """Multi-head attention; with n_kv_head < n_head, consecutive query heads share K/V heads (GQA, MQA)."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = config.n_head, config.kv_heads, config.head_size
        # q, k and v in one matmul; with GQA the k and v parts are n_head/n_kv_head times narrower
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_size,
                                bias=config.bias or config.qkv_bias)
        self.c_proj = nn.Linear(self.n_head * self.head_size, config.n_embd, bias=config.bias)
        if config.qk_norm:  # each head's query and key scaled to unit RMS, so logits cannot grow unbounded
            self.q_norm, self.k_norm = RMSNorm(self.head_size, config), RMSNorm(self.head_size, config)
        self.qk_norm = config.qk_norm
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout

    def cache_entries(self):
        """What the KV cache keeps per past token: {name: (heads, dim)}."""
        return {'k': (self.n_kv_head, self.head_size), 'v': (self.n_kv_head, self.head_size)}

    def token_flops(self, keys):
        """Forward + backward FLOPs per token of the matmuls that are not Linears: q.k and att.v over `keys` keys."""
        return 3 * 2 * 2 * self.n_head * self.head_size * keys

    def forward(self, x, rope=None, mask=None, cache=None, layer=0):
        B, T, _ = x.size()
        hs = self.head_size
        q, k, v = self.c_attn(x).split([self.n_head * hs, self.n_kv_head * hs, self.n_kv_head * hs], dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, n_kv, T, hs)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # rotate before K/V heads are shared, so each shared head is rotated once
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(layer, k=k, v=v)
        y = attend(q, k, v, mask, self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, self.n_head * hs)))


ATTENTIONS = {'mha': CausalSelfAttention}


class KVCache:
    """What each layer's attention keeps of past tokens (its cache_entries), preallocated as (B, heads, slots,
    dim) tensors for `length` positions. With a sliding window shorter than that, only the last `window`
    positions are kept, in a ring: slot = position % window."""

    def __init__(self, model, batch_size, length, dtype, device):
        self.length, self.window = length, model.config.sliding_window
        self.slots = self.slots_for(model.config, length)
        self.layers = [{name: torch.empty(batch_size, heads, self.slots, dim, dtype=dtype, device=device)
                        for name, (heads, dim) in block.attn.cache_entries().items()}
                       for block in model.transformer.h]
        self.pos = 0  # positions seen

    @staticmethod
    def slots_for(config, length):
        return min(length, config.sliding_window or length)

    @staticmethod
    def bytes_for(model, batch_size, length, dtype):
        """Bytes a cache of these dimensions takes, without allocating it."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        per_token = sum(heads * dim for block in model.transformer.h
                        for heads, dim in block.attn.cache_entries().values())
        return per_token * batch_size * KVCache.slots_for(model.config, length) * itemsize

    @property
    def ring(self):
        return self.slots < self.length

    def key_positions(self, T, device):
        """Positions of the keys update() returns for T new tokens, in its order."""
        if not self.ring:
            return torch.arange(self.pos + T, device=device)
        if T == 1:  # the ring itself: slot s holds the latest position p with p % slots == s
            filled = torch.arange(min(self.pos + 1, self.slots), device=device)
            return self.pos - (self.pos - filled) % self.slots
        past = min(self.pos, self.slots - 1)  # what the first new query can still see
        return torch.arange(self.pos - past, self.pos + T, device=device)

    def update(self, layer, **new):
        """Store the new tokens' entries (B, heads, T, dim); return, in the order given, every entry the new
        tokens attend to (all so far, or with a window the ones key_positions names)."""
        T = next(iter(new.values())).size(2)
        if self.pos + T > self.length:
            raise ValueError(f"KV cache of length {self.length} cannot hold {self.pos + T} positions")
        out = []
        for name, value in new.items():
            store = self.layers[layer][name]
            if not self.ring:
                store[:, :, self.pos:self.pos + T] = value
                out.append(store[:, :, :self.pos + T])
            elif T == 1:
                store[:, :, self.pos % self.slots] = value[:, :, 0]
                out.append(store[:, :, :min(self.pos + 1, self.slots)])
            else:  # the past the window still needs, in order, then the new tokens
                past = torch.arange(self.pos - min(self.pos, self.slots - 1), self.pos, device=value.device)
                out.append(torch.cat((store[:, :, past % self.slots], value), dim=2))
                kept = torch.arange(self.pos, self.pos + T, device=value.device)[-self.slots:]
                store[:, :, kept % self.slots] = value[:, :, -self.slots:]
        return out

    def advance(self, T):
        self.pos += T

    def reset(self):
        """Forget every position (the next call is a prefill)."""
        self.pos = 0


def attention_mask(start, T, key_positions, window, device):
    """Where T queries at positions start.. may attend the keys at key_positions (None: the keys are the
    queries themselves); None when plain causal attention (SDPA's is_causal, or a single query) is it."""
    if key_positions is not None and T == 1:  # a cache returns a single query only keys it may see
        return None
    if key_positions is None or (start == 0 and key_positions.numel() == T):  # the keys are the queries
        if window is None or window >= T:
            return None
        key_positions = torch.arange(start, start + T, device=device)
    queries = torch.arange(start, start + T, device=device)[:, None]
    allowed = key_positions[None, :] <= queries
    if window is not None:
        allowed &= key_positions[None, :] > queries - window
    return allowed


# ----------------------------------------------------------------------------- mlp

class MLP(nn.Module):
    """up, activation, down: GPT-2's with GELU (tanh form, as GPT-2 computes it), 2017's with ReLU."""
    gated = False

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.hidden_size, bias=config.bias)
        self.c_proj = nn.Linear(config.hidden_size, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.relu = config.mlp == 'relu'

    def forward(self, x):
        h = self.c_fc(x)
        h = F.relu(h) if self.relu else F.gelu(h, approximate='tanh')
        return self.dropout(self.c_proj(h))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with SiLU as the gate's activation, GEGLU with GELU."""
    gated = True

    def __init__(self, config):
        super().__init__()
        # gate and up in one matmul: [gate | up] along the output dimension
        self.c_fc = nn.Linear(config.n_embd, 2 * config.hidden_size, bias=config.bias)
        self.c_proj = nn.Linear(config.hidden_size, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.silu = config.mlp != 'geglu'

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        gate = F.silu(gate) if self.silu else F.gelu(gate)
        return self.dropout(self.c_proj(gate * up))


MLPS = {'gelu': MLP, 'relu': MLP, 'swiglu': GatedMLP, 'geglu': GatedMLP}


# ----------------------------------------------------------------------------- block and model

class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.prenorm = config.prenorm
        self.ln_1 = make_norm(config)
        self.attn = ATTENTIONS[config.attn](config)
        self.ln_2 = make_norm(config)
        self.mlp = MLPS[config.mlp](config)

    def forward(self, x, rope=None, mask=None, cache=None, layer=0):
        if self.prenorm:  # the residual path stays an identity from the top to the bottom
            x = x + self.attn(self.ln_1(x), rope, mask, cache, layer)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x, rope, mask, cache, layer))
        return self.ln_2(x + self.mlp(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=POSITIONS[config.pos](config),  # GPT-2's learned table keeps its name; rotary tables hold no weights
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            # post-norm blocks already end in a norm, so only pre-norm needs a final one
            ln_f=make_norm(config) if config.prenorm else nn.Identity(),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight

        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding=False):
        """Parameters (tied ones once). non_embedding=True leaves out the position table, as nanoGPT reports."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.transformer.wpe, LearnedPositions):
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx, targets=None, cache=None):
        """Logits for every position (B, T, vocab), and the loss when targets are given."""
        logits = self.lm_head(self.hidden_states(idx, cache))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def hidden_states(self, idx, cache=None):
        """The final normalized hidden states (B, T, n_embd); with a cache, idx continues what it holds."""
        T = idx.size(1)
        start = cache.pos if cache is not None else 0
        keys = cache.key_positions(T, idx.device) if cache is not None else None
        x, rope = self.transformer.wpe(self.transformer.wte(idx), start)
        mask = attention_mask(start, T, keys, self.config.sliding_window, idx.device)
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, rope, mask, cache, i)
        if cache is not None:
            cache.advance(T)
        return self.transformer.ln_f(x)

    def crop_block_size(self, block_size):
        """Shrink the context window, e.g. to fine-tune GPT-2 (1024) at 256."""
        if block_size > self.config.block_size:
            raise ValueError(f"block_size can only shrink: {block_size} > {self.config.block_size}")
        self.config.block_size = block_size
        wpe = self.transformer.wpe
        if isinstance(wpe, LearnedPositions):
            wpe.weight = nn.Parameter(wpe.weight[:block_size])
            wpe.num_embeddings = block_size

    # ------------------------------------------------------------------------- accounting

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6 per weight a token multiplies, plus attention's
        scores and weighted values, which grow with the context (up to the window)."""
        T = self.config.block_size if seq_len is None else seq_len
        flops = 0
        for module in self.modules():
            if isinstance(module, nn.Linear):
                flops += 6 * module.weight.numel()
            elif hasattr(module, 'token_flops'):
                flops += module.token_flops(min(T, self.config.sliding_window or T))
        return flops

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilisation: achieved FLOP/s over the device's peak (pass it in: it depends on the device)."""
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    def kv_cache_bytes(self, batch_size, seq_len, dtype=torch.float32):
        """Bytes of the KV cache generate allocates for batch_size sequences of seq_len tokens (a sliding window
        keeps only its last positions)."""
        return KVCache.bytes_for(self, batch_size, self._cache_length(seq_len), dtype)

    def _cache_length(self, seq_len):
        return min(seq_len, self.config.block_size)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        # matrices and embeddings decay; biases and norm gains do not
        groups = [{'params': [p for p in params if p.dim() >= 2], 'weight_decay': weight_decay},
                  {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}]
        fused = device_type == 'cuda' and 'fused' in inspect.signature(torch.optim.AdamW).parameters
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({'fused': True} if fused else {}))

    # ------------------------------------------------------------------------- generation

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                        vocab_limit=None):
        """Yield (B, 1) new tokens one step at a time; vocab_limit: sample only ids below it (a vocabulary
        padded past the tokenizer's, e.g. 50304 for GPT-2's 50257, has ids that decode to nothing).

        The context is a window of at most block_size tokens. When a new token would overflow it,
        the oldest half is dropped (as llama.cpp does) and, with the cache, the cache is rebuilt from
        the newest half in one prefill. Without the cache the same window is recomputed every step, so
        both paths see the same tokens at the same positions.
        """
        if max_new_tokens <= 0:
            return
        block_size = self.config.block_size
        keep = max(1, block_size // 2)
        window = idx if idx.size(1) <= block_size else idx[:, -keep:]
        cache = None
        if use_cache:
            cache = KVCache(self, idx.size(0), self._cache_length(idx.size(1) + max_new_tokens),
                            self._cache_dtype(), idx.device)
        for step in range(max_new_tokens):
            if cache is None:
                h = self.hidden_states(window)
            elif cache.pos == 0:
                h = self.hidden_states(window, cache)  # prefill
            else:
                h = self.hidden_states(window[:, -1:], cache)
            logits = self.lm_head(h[:, -1, :])[:, :vocab_limit]  # only the last position is sampled from
            nxt = sample_next(logits.float(), temperature, top_k, top_p)
            yield nxt
            window = torch.cat((window, nxt), dim=1)
            if window.size(1) > block_size:
                window = window[:, -keep:]
                if cache is not None:
                    cache.reset()

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                 vocab_limit=None):
        """Continue idx (B, T) by max_new_tokens; temperature 0 is greedy."""
        new = list(self.generate_stream(idx, max_new_tokens, temperature, top_k, top_p, use_cache, vocab_limit))
        return torch.cat([idx] + new, dim=1)

    def _cache_dtype(self):
        device_type = self.lm_head.weight.device.type
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
        return self.lm_head.weight.dtype

    # ------------------------------------------------------------------------- Hugging Face

    @classmethod
    def from_pretrained(cls, name_or_path, override_args=None):
        """Load a Hugging Face checkpoint (a hub name such as gpt2 ... gpt2-xl, or a local directory) of one
        of the families in HF_FAMILIES into the config that computes the same logits."""
        from transformers import AutoConfig, AutoModelForCausalLM
        override_args = dict(override_args or {})
        unknown = set(override_args) - {'dropout'}
        if unknown:
            raise ValueError(f"override_args may only set 'dropout', got {sorted(unknown)}")
        hf_config = AutoConfig.from_pretrained(name_or_path)
        family = HF_FAMILIES.get(hf_config.model_type)
        if family is None:
            raise ValueError(f"{name_or_path}: model_type {hf_config.model_type!r} is not supported "
                             f"({', '.join(map(repr, HF_FAMILIES))})")
        model = cls(GPTConfig(**{**family.read_config(hf_config), **override_args}))
        hf_state = AutoModelForCausalLM.from_pretrained(name_or_path).state_dict()
        state, unused = hf_to_ours(hf_state, model, family)
        if unused:
            raise ValueError(f"{name_or_path}: weights this model has no place for: {sorted(unused)[:5]}")
        model.load_state_dict(state)
        return model


def sample_next(logits, temperature=1.0, top_k=None, top_p=None):
    """Pick the next token of each row of logits (B, vocab)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token once the ones before it already cover top_p (the first is always kept)
        drop = cumulative - sorted_logits.softmax(dim=-1) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float('-inf'))
        logits = torch.full_like(logits, float('-inf')).scatter(-1, order, sorted_logits)
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)


# ----------------------------------------------------------------------------- Hugging Face families
#
# One entry per transformers architecture: the flag values it can carry (every other flag must keep its
# default), its config read into our flags and written back, and one name table used both ways.
# A table row is (our name, HF name or names, how): several HF names are concatenated along dim 0 in our
# tensor (q, k, v into c_attn; gate, up into c_fc); how='T' transposes matrices (GPT-2's Conv1D). {i} is the layer,
# {b} 'weight' or 'bias'; rows whose tensor a model does not have are skipped.

ANY = None  # in a family's `carries`: any value of that flag


@dataclass
class HFFamily:
    model_type: str
    hf_class: str  # the transformers class export builds
    carries: dict  # flag -> tuple of values it can represent, or ANY
    names: list  # the name table
    read_config: callable  # HF config -> our flags
    write_config: callable  # GPTConfig -> HF config kwargs

    def blocking(self, config):
        """The flags (name=value) of config this family cannot represent."""
        defaults = GPTConfig.__dataclass_fields__
        out = []
        for f in fields(config):
            value = getattr(config, f.name)
            allowed = self.carries.get(f.name, (defaults[f.name].default,))
            if allowed is not ANY and value not in allowed:
                out.append(f"{f.name}={value!r}")
        return out


def _gpt2_read(c):
    if c.activation_function not in ('gelu_new', 'gelu_pytorch_tanh'):
        raise ValueError(f"GPT-2 checkpoint uses activation {c.activation_function!r}; only the tanh GELU "
                         f"('gelu_new') is supported")
    return dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.n_positions,
                vocab_size=c.vocab_size, bias=True, norm_eps=c.layer_norm_epsilon,
                ffn_hidden=None if getattr(c, 'n_inner', None) in (None, 4 * c.n_embd) else c.n_inner,
                tie_embeddings=bool(getattr(c, 'tie_word_embeddings', True)))


def _gpt2_write(cfg):
    eot = 50256  # GPT-2's <|endoftext|>, only where the vocabulary has it (not a character one)
    special = eot if cfg.vocab_size > eot else None
    return dict(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                n_head=cfg.n_head, n_inner=cfg.hidden_size, activation_function='gelu_new',
                layer_norm_epsilon=cfg.norm_eps, resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
                attn_pdrop=cfg.dropout, tie_word_embeddings=cfg.tie_embeddings, bos_token_id=special,
                eos_token_id=special)


def _rope_read(c):
    """Our RoPE flags from a transformers 5 config (its rope_parameters also hold an old rope_scaling)."""
    params = dict(getattr(c, 'rope_parameters', None) or {})
    kind = params.get('rope_type', params.get('type', 'default'))
    flags = dict(pos='rope', rope_theta=float(params.get('rope_theta', getattr(c, 'rope_theta', 10000.0))))
    if kind == 'default':
        return flags
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"rope_type {kind!r} is not supported ({', '.join(map(repr, ROPE_SCALINGS[1:]))} are)")
    if params.get('partial_rotary_factor', 1.0) != 1.0 or params.get('truncate', True) is not True:
        raise ValueError("partial rotary factors and yarn's truncate=False are not supported")
    # 'dynamic' stretches past max_position_embeddings; yarn and llama3 past their own original length
    original = c.max_position_embeddings if kind == 'dynamic' else params.get('original_max_position_embeddings')
    flags.update(rope_scaling=kind, rope_factor=float(params['factor']) if params.get('factor') else None,
                 rope_original_length=int(original or c.max_position_embeddings))
    if kind in ('dynamic', 'yarn') and flags['rope_factor']:
        # the context the stretch reaches: a checkpoint may give only the original length as its maximum
        flags['block_size'] = max(c.max_position_embeddings, int(flags['rope_factor'] * flags['rope_original_length']))
    if kind == 'llama3':
        flags.update(rope_low_freq_factor=float(params['low_freq_factor']),
                     rope_high_freq_factor=float(params['high_freq_factor']))
    if kind == 'yarn':
        flags.update(yarn_beta_fast=float(params.get('beta_fast') or 32.0),
                     yarn_beta_slow=float(params.get('beta_slow') or 1.0),
                     yarn_mscale=float(params.get('mscale') or 0.0),
                     yarn_mscale_all_dim=float(params.get('mscale_all_dim') or 0.0),
                     rope_attention_factor=params.get('attention_factor'))
    return flags


def _rope_write(cfg):
    """rope_parameters (and max_position_embeddings) for a transformers config."""
    params = {'rope_type': cfg.rope_scaling or 'default', 'rope_theta': cfg.rope_theta}
    if cfg.rope_scaling:
        params['factor'] = float(cfg.rope_scale)
    if cfg.rope_scaling in ('yarn', 'llama3'):
        params['original_max_position_embeddings'] = cfg.rope_length
    if cfg.rope_scaling == 'llama3':
        params.update(low_freq_factor=cfg.rope_low_freq_factor, high_freq_factor=cfg.rope_high_freq_factor)
    if cfg.rope_scaling == 'yarn':
        params.update(beta_fast=cfg.yarn_beta_fast, beta_slow=cfg.yarn_beta_slow)
        params.update({k: v for k, v in (('mscale', cfg.yarn_mscale), ('mscale_all_dim', cfg.yarn_mscale_all_dim),
                                         ('attention_factor', cfg.rope_attention_factor)) if v})
    # transformers' 'dynamic' stretches past max_position_embeddings itself
    length = cfg.rope_length if cfg.rope_scaling == 'dynamic' else cfg.block_size
    return dict(rope_parameters=params, max_position_embeddings=length)


def _qwen_window(c):
    """Qwen2/3 slide only when use_sliding_window, on layers from max_window_layers on: all or none for us."""
    if not getattr(c, 'use_sliding_window', False):
        return None
    if c.max_window_layers != 0 and c.max_window_layers < c.num_hidden_layers:
        raise ValueError(f"sliding windows on some layers only (max_window_layers={c.max_window_layers}) "
                         f"are not supported")
    return c.sliding_window if c.max_window_layers == 0 else None


def _llama_like_read(c):
    """The flags every Llama-style family shares (rms, swiglu, rope, n_kv_head, head_dim)."""
    if c.hidden_act != 'silu':
        raise ValueError(f"hidden_act {c.hidden_act!r} is not supported (only 'silu': SwiGLU)")
    head_dim = getattr(c, 'head_dim', None)
    flags = dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                 n_kv_head=c.num_key_value_heads or c.num_attention_heads, block_size=c.max_position_embeddings,
                 head_dim=None if head_dim in (None, c.hidden_size // c.num_attention_heads) else head_dim,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.rms_norm_eps, mlp='swiglu',
                 ffn_hidden=c.intermediate_size, tie_embeddings=bool(c.tie_word_embeddings))
    flags.update(_rope_read(c))  # it may set block_size
    return flags


def _llama_like_write(cfg):
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.hidden_size,
                num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
                head_dim=cfg.head_size, rms_norm_eps=cfg.norm_eps, hidden_act='silu', attention_dropout=cfg.dropout,
                tie_word_embeddings=cfg.tie_embeddings, **_rope_write(cfg))


def _llama_read(c):
    attention_bias, mlp_bias = getattr(c, 'attention_bias', False), getattr(c, 'mlp_bias', False)
    if attention_bias != mlp_bias:
        raise ValueError("attention_bias != mlp_bias is not supported")
    return {**_llama_like_read(c), 'bias': bool(attention_bias)}


def _llama_write(cfg):
    return {**_llama_like_write(cfg), 'attention_bias': cfg.bias, 'mlp_bias': cfg.bias}


def _mistral_read(c):
    return {**_llama_like_read(c), 'sliding_window': c.sliding_window}


def _mistral_write(cfg):
    return {**_llama_like_write(cfg), 'sliding_window': cfg.sliding_window}


def _qwen_write(cfg):
    return {**_llama_like_write(cfg), 'use_sliding_window': cfg.sliding_window is not None,
            'sliding_window': cfg.sliding_window, 'max_window_layers': 0}


def _qwen2_read(c):  # q, k and v always have biases, o none
    return {**_llama_like_read(c), 'qkv_bias': True, 'sliding_window': _qwen_window(c)}


def _qwen3_write(cfg):
    return {**_qwen_write(cfg), 'attention_bias': False}


def _qwen3_read(c):
    if getattr(c, 'attention_bias', False):
        raise ValueError("Qwen3 with attention_bias is not supported")
    return {**_llama_like_read(c), 'qk_norm': True, 'sliding_window': _qwen_window(c)}


_SIZES = {k: ANY for k in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'dropout', 'norm_eps',
                           'ffn_hidden', 'multiple_of', 'tie_embeddings')}
_ROPE = {k: ANY for k in ('rope_theta', 'rope_scaling', 'rope_factor', 'rope_original_length', 'rope_low_freq_factor',
                          'rope_high_freq_factor', 'yarn_beta_fast', 'yarn_beta_slow', 'yarn_mscale',
                          'yarn_mscale_all_dim', 'rope_attention_factor')}
_LLAMA_LIKE = {**_SIZES, **_ROPE, 'norm': ('rms',), 'mlp': ('swiglu',), 'pos': ('rope',), 'n_kv_head': ANY,
               'head_dim': ANY}
_GPT2_NAMES = [(n, n, None) for n in ('transformer.wte.weight', 'transformer.wpe.weight', 'transformer.ln_f.{b}',
                                      'transformer.h.{i}.ln_1.{b}', 'transformer.h.{i}.ln_2.{b}', 'lm_head.weight')] + [
    (n, n, 'T') for n in ('transformer.h.{i}.attn.c_attn.{b}', 'transformer.h.{i}.attn.c_proj.{b}',
                          'transformer.h.{i}.mlp.c_fc.{b}', 'transformer.h.{i}.mlp.c_proj.{b}')]
_LLAMA_NAMES = [
    ('transformer.wte.weight', 'model.embed_tokens.weight', None),
    ('transformer.ln_f.weight', 'model.norm.weight', None),
    ('lm_head.weight', 'lm_head.weight', None),
    ('transformer.h.{i}.ln_1.weight', 'model.layers.{i}.input_layernorm.weight', None),
    ('transformer.h.{i}.ln_2.weight', 'model.layers.{i}.post_attention_layernorm.weight', None),
    ('transformer.h.{i}.attn.c_attn.{b}', tuple(f'model.layers.{{i}}.self_attn.{n}_proj.{{b}}' for n in 'qkv'), None),
    ('transformer.h.{i}.attn.c_proj.{b}', 'model.layers.{i}.self_attn.o_proj.{b}', None),
    ('transformer.h.{i}.attn.q_norm.weight', 'model.layers.{i}.self_attn.q_norm.weight', None),
    ('transformer.h.{i}.attn.k_norm.weight', 'model.layers.{i}.self_attn.k_norm.weight', None),
    ('transformer.h.{i}.mlp.c_fc.{b}', ('model.layers.{i}.mlp.gate_proj.{b}', 'model.layers.{i}.mlp.up_proj.{b}'), None),
    ('transformer.h.{i}.mlp.c_proj.{b}', 'model.layers.{i}.mlp.down_proj.{b}', None),
]

HF_FAMILIES = {  # in the order export tries them: the first that carries every flag is used
    'gpt2': HFFamily('gpt2', 'GPT2LMHeadModel', {**_SIZES, 'bias': ANY}, _GPT2_NAMES, _gpt2_read, _gpt2_write),
    'llama': HFFamily('llama', 'LlamaForCausalLM', {**_LLAMA_LIKE, 'bias': ANY}, _LLAMA_NAMES, _llama_read,
                      _llama_write),
    'mistral': HFFamily('mistral', 'MistralForCausalLM', {**_LLAMA_LIKE, 'bias': (False,), 'sliding_window': ANY},
                        _LLAMA_NAMES, _mistral_read, _mistral_write),
    'qwen2': HFFamily('qwen2', 'Qwen2ForCausalLM',
                      {**_LLAMA_LIKE, 'bias': (False,), 'qkv_bias': (True,), 'sliding_window': ANY},
                      _LLAMA_NAMES, _qwen2_read, _qwen_write),
    'qwen3': HFFamily('qwen3', 'Qwen3ForCausalLM',
                      {**_LLAMA_LIKE, 'bias': (False,), 'qk_norm': (True,), 'sliding_window': ANY},
                      _LLAMA_NAMES, _qwen3_read, _qwen3_write),
}


def _rows(family, config):
    """(our name, HF names, how) for every concrete tensor name of this config's depth."""
    for ours, hf, how in family.names:
        hf = hf if isinstance(hf, tuple) else (hf,)
        for i in range(config.n_layer) if '{i}' in ours else [None]:
            for b in ('weight', 'bias') if '{b}' in ours else [None]:
                yield ours.format(i=i, b=b), tuple(h.format(i=i, b=b) for h in hf), how


def hf_to_ours(hf_state, model, family):
    """Our state dict from a transformers one; and the HF tensors nothing used (a feature we lack)."""
    ours = model.state_dict()
    state, used = {}, set()
    for name, hf_names, how in _rows(family, model.config):
        if name not in ours or not all(h in hf_state for h in hf_names):
            continue
        tensor = torch.cat([hf_state[h] for h in hf_names]) if len(hf_names) > 1 else hf_state[hf_names[0]]
        state[name] = tensor.t() if how == 'T' and tensor.dim() == 2 else tensor
        used.update(hf_names)
    if model.config.tie_embeddings:
        state['lm_head.weight'] = state['transformer.wte.weight']
        used.add('lm_head.weight')
    # causal-mask buffers of older GPT-2 checkpoints and rotary tables are not weights
    unused = {k for k in hf_state if k not in used and not k.endswith(('.attn.bias', '.attn.masked_bias', 'inv_freq'))}
    return state, unused


def ours_to_hf(model, hf_state, family):
    """A transformers state dict from ours, shaped like hf_state (the target model's own)."""
    out = {}
    for name, hf_names, how in _rows(family, model.config):
        if name not in model.state_dict():
            continue
        tensor = model.state_dict()[name].detach().clone()
        tensor = tensor.t().contiguous() if how == 'T' and tensor.dim() == 2 else tensor
        parts = tensor.split([hf_state[h].size(0) for h in hf_names]) if len(hf_names) > 1 else (tensor,)
        out.update(zip(hf_names, parts))
    # a family whose layers always have biases (GPT-2) gets zeros where our bias=False model has none
    out.update({k: torch.zeros_like(v) for k, v in hf_state.items() if k not in out and k.endswith('.bias')})
    return out
