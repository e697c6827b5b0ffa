"""
The whole model in one file: a GPT whose config switches, one flag at a time, the four swaps
that turn a GPT-2 block into a LLaMA/Qwen-style block.

    norm      'layernorm' -> 'rms'       LayerNorm / RMSNorm                (make_norm)
    mlp       'gelu'      -> 'swiglu'    MLP / GatedMLP ('relu', 'geglu' too) (make_mlp)
    n_kv_head None        -> n_head/4    CausalSelfAttention's K/V head count
    pos       'learned'   -> 'rope'      wpe table / Rotary
    prenorm   True        -> False       Block.forward (post-norm as in 2017/BERT)

With every default it is nanoGPT's GPT-2, parameter names included, so GPT-2 weights load.
Hugging Face's transformers is imported lazily, only by from_pretrained.
"""

import inspect
import math
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
from torch.nn import functional as F

NORMS = ('layernorm', 'rms')
MLPS = ('gelu', 'relu', 'swiglu', 'geglu')
POSITIONS = ('learned', 'rope')


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, as GPT-2
    norm: str = 'layernorm'
    norm_eps: float = 1e-5
    mlp: str = 'gelu'
    ffn_hidden: Optional[int] = None  # None: 4*n_embd, or 8/3*n_embd rounded up to multiple_of for gated MLPs
    multiple_of: int = 64
    n_kv_head: Optional[int] = None  # None: n_head (MHA); 1: MQA
    pos: str = 'learned'
    rope_theta: float = 10000.0
    prenorm: bool = True
    tie_embeddings: bool = True

    def __post_init__(self):
        for name in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'multiple_of'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name, value, allowed in (('norm', self.norm, NORMS), ('mlp', self.mlp, MLPS),
                                     ('pos', self.pos, POSITIONS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head is not None:
            if isinstance(self.n_kv_head, bool) or not isinstance(self.n_kv_head, int) \
                    or not 1 <= self.n_kv_head <= self.n_head:
                raise ValueError(f"n_kv_head must be None or an int in [1, n_head={self.n_head}], "
                                 f"got {self.n_kv_head!r}")
            if self.n_head % self.n_kv_head != 0:
                raise ValueError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head})")
        if self.ffn_hidden is not None and (isinstance(self.ffn_hidden, bool)
                                            or not isinstance(self.ffn_hidden, int) or self.ffn_hidden < 1):
            raise ValueError(f"ffn_hidden must be None or a positive int, got {self.ffn_hidden!r}")
        if self.pos == 'rope' and self.head_size % 2 != 0:
            raise ValueError(f"pos='rope' needs an even head size, got n_embd/n_head = {self.head_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")

    @property
    def head_size(self):
        return self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def hidden_size(self):
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        if self.mlp in ('swiglu', 'geglu'):
            # a third matrix costs 50% more parameters; 2/3 of 4d keeps the count of the plain MLP
            h = int(8 * self.n_embd / 3)
            return self.multiple_of * math.ceil(h / self.multiple_of)
        return 4 * self.n_embd

    @classmethod
    def from_dict(cls, d):
        """Build from a dict that may hold extra keys (a training config): only our fields are used."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ----------------------------------------------------------------------------- norm

class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / RMS(x) * g: no mean-centering and no bias."""

    def __init__(self, ndim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def make_norm(config):
    if config.norm == 'rms':
        return RMSNorm(config.n_embd, config.norm_eps)
    return LayerNorm(config.n_embd, config.bias, config.norm_eps)


# ----------------------------------------------------------------------------- rope

class Rotary(nn.Module):
    """cos/sin tables for rotary embeddings, kept in fp32 and grown on demand (longer eval contexts)."""

    def __init__(self, head_size, theta, length):
        super().__init__()
        self.head_size, self.theta = head_size, theta
        self._build(length, device=None)

    def _build(self, length, device):
        exponents = torch.arange(0, self.head_size, 2, dtype=torch.float32, device=device) / self.head_size
        t = torch.arange(length, dtype=torch.float32, device=device)
        freqs = torch.outer(t, 1.0 / (self.theta ** exponents))
        freqs = torch.cat((freqs, freqs), dim=-1)  # half-split layout: pairs are (i, i + head_size/2)
        self.register_buffer('cos', freqs.cos(), persistent=False)
        self.register_buffer('sin', freqs.sin(), persistent=False)

    def forward(self, start, length):
        # rebuilt when too short, or when model.to(bf16) cast the tables: angles need fp32
        if start + length > self.cos.size(0) or self.cos.dtype != torch.float32:
            self._build(max(2 * (start + length), self.cos.size(0)), self.cos.device)
        return self.cos[start:start + length], self.sin[start:start + length]


def apply_rope(x, cos, sin):
    """Rotate x (B, heads, T, head_size) by the angles of its positions."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


# ----------------------------------------------------------------------------- attention

# SDPA shares K/V heads itself since torch 2.5 (enable_gqa); older versions get an explicit repeat
try:
    F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2),
                                   enable_gqa=True)
    _SDPA_HAS_GQA = True
except TypeError:
    _SDPA_HAS_GQA = False


class KVCache:
    """Preallocated keys and values of every layer, n_kv_head heads each: (n_layer, 2, B, n_kv_head, T, hs)."""

    def __init__(self, config, batch_size, length, dtype, device):
        self.data = torch.empty(config.n_layer, 2, batch_size, config.kv_heads, length, config.head_size,
                                dtype=dtype, device=device)
        self.pos = 0  # number of positions filled

    @property
    def length(self):
        return self.data.size(4)

    def update(self, layer, k, v):
        """Store k, v (B, n_kv_head, T, hs) after the filled positions; return all keys and values so far."""
        end = self.pos + k.size(2)
        self.data[layer, 0, :, :, self.pos:end] = k
        self.data[layer, 1, :, :, self.pos:end] = v
        return self.data[layer, 0, :, :, :end], self.data[layer, 1, :, :, :end]


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = config.n_head, config.kv_heads, config.head_size
        # q, k and v in one matmul; with GQA the k and v parts are n_head/n_kv_head times narrower
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_size, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout

    def forward(self, x, rope=None, cache=None, layer=0):
        B, T, C = x.size()
        hs = self.head_size
        q, k, v = self.c_attn(x).split([self.n_head * hs, self.n_kv_head * hs, self.n_kv_head * hs], dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, n_kv, T, hs)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        if rope is not None:  # rotate before K/V heads are shared, so each shared head is rotated once
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        past = 0
        if cache is not None:
            past = cache.pos
            k, v = cache.update(layer, k, v)
        mask, causal = None, T > 1
        if past > 0 and T > 1:  # new queries see every cached key plus the causal part of their own
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            causal = False
        gqa = {}
        if self.n_kv_head != self.n_head:
            # CUDA's fused kernels take enable_gqa only in half precision (flash); fp32 would fall back to math
            if _SDPA_HAS_GQA and (q.device.type == 'cpu' or q.dtype in (torch.float16, torch.bfloat16)):
                gqa = {'enable_gqa': True}
            else:  # consecutive query heads share one K/V head
                k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
                v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0, **gqa)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


# ----------------------------------------------------------------------------- mlp

class MLP(nn.Module):
    """up, activation, down: GPT-2's with GELU (tanh form, as GPT-2 computes it), 2017's with ReLU."""

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

    def __init__(self, config):
        super().__init__()
        # gate and up in one matmul: [gate | up] along the output dimension
        self.c_fc = nn.Linear(config.n_embd, 2 * config.hidden_size, bias=config.bias)
        self.c_proj = nn.Linear(config.hidden_size, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.silu = config.mlp == 'swiglu'

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        gate = F.silu(gate) if self.silu else F.gelu(gate)
        return self.dropout(self.c_proj(gate * up))


def make_mlp(config):
    if config.mlp in ('swiglu', 'geglu'):
        return GatedMLP(config)
    return MLP(config)


# ----------------------------------------------------------------------------- block and model

class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.prenorm = config.prenorm
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = make_mlp(config)

    def forward(self, x, rope=None, cache=None, layer=0):
        if self.prenorm:  # the residual path stays an identity from the top to the bottom
            x = x + self.attn(self.ln_1(x), rope, cache, layer)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x, rope, cache, layer))
        return self.ln_2(x + self.mlp(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            # post-norm blocks already end in a norm, so only pre-norm needs a final one
            ln_f=make_norm(config) if config.prenorm else nn.Identity(),
        ))
        if config.pos == 'learned':
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
            self.rotary = None
        else:
            self.rotary = Rotary(config.head_size, config.rope_theta, config.block_size)
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
        if non_embedding and self.config.pos == 'learned':
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
        B, T = idx.size()
        start = cache.pos if cache is not None else 0
        if self.config.pos == 'learned' and start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size "
                             f"{self.config.block_size} (learned positions cannot go further)")
        if cache is not None and start + T > cache.length:
            raise ValueError(f"KV cache of length {cache.length} cannot hold {start + T} positions")
        x = self.transformer.wte(idx)
        rope = None
        if self.rotary is not None:
            rope = self.rotary(start, T)
        else:
            x = x + self.transformer.wpe(torch.arange(start, start + T, device=idx.device))
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, rope, cache, i)
        if cache is not None:
            cache.pos += T
        return self.transformer.ln_f(x)

    def crop_block_size(self, block_size):
        """Shrink the context window, e.g. to fine-tune GPT-2 (1024) at 256."""
        if block_size > self.config.block_size:
            raise ValueError(f"block_size can only shrink: {block_size} > {self.config.block_size}")
        self.config.block_size = block_size
        if self.config.pos == 'learned':
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    # ------------------------------------------------------------------------- accounting

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6 per weight of every matmul, plus attention's scores."""
        cfg = self.config
        T = cfg.block_size if seq_len is None else seq_len
        matmul_weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        # q.k and att.v: 2 * 2 * T * head_size per query head per layer, forward; x3 with backward
        attention = 12 * cfg.n_layer * cfg.n_head * cfg.head_size * T
        return 6 * matmul_weights + attention

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilisation: achieved FLOP/s over the device's peak (pass it in: it depends on the device)."""
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    def kv_cache_bytes(self, batch_size, seq_len, dtype=torch.float32):
        """Bytes of the KV cache generate allocates for batch_size sequences of seq_len tokens."""
        cfg = self.config
        itemsize = torch.empty((), dtype=dtype).element_size()
        return cfg.n_layer * 2 * batch_size * cfg.kv_heads * self._cache_length(seq_len) * cfg.head_size * itemsize

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
            cache = KVCache(self.config, idx.size(0), self._cache_length(idx.size(1) + max_new_tokens),
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
                    cache.pos = 0

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
        """Load a GPT-2 checkpoint (gpt2 ... gpt2-xl, or a local directory) into the vanilla config, or a
        Llama-architecture one into the matching modern config (rms, swiglu, rope, n_kv_head, no bias)."""
        from transformers import AutoConfig, AutoModelForCausalLM
        override_args = dict(override_args or {})
        unknown = set(override_args) - {'dropout'}
        if unknown:
            raise ValueError(f"override_args may only set 'dropout', got {sorted(unknown)}")
        hf_config = AutoConfig.from_pretrained(name_or_path)
        if hf_config.model_type == 'gpt2':
            config_args = _gpt2_config_args(hf_config)
        elif hf_config.model_type == 'llama':
            config_args = _llama_config_args(hf_config)
        else:
            raise ValueError(f"{name_or_path}: model_type {hf_config.model_type!r} is not supported "
                             f"(GPT-2 'gpt2' or Llama 'llama')")
        config_args.update(override_args)
        model = cls(GPTConfig(**config_args))
        hf = AutoModelForCausalLM.from_pretrained(name_or_path)
        hf_state = hf.state_dict()
        if hf_config.model_type == 'gpt2':
            state = _from_hf_gpt2(hf_state, model.config)
        else:
            state = _from_hf_llama(hf_state, model.config)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if config_args.get('tie_embeddings'):
            missing = [k for k in missing if k != 'lm_head.weight']
        if missing or unexpected:
            raise ValueError(f"{name_or_path}: weights do not match: missing {missing}, unexpected {unexpected}")
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


# ----------------------------------------------------------------------------- HF weight mapping

def _gpt2_config_args(c):
    if c.activation_function not in ('gelu_new', 'gelu_pytorch_tanh'):
        raise ValueError(f"GPT-2 checkpoint uses activation {c.activation_function!r}; only the tanh GELU "
                         f"('gelu_new') is supported")
    return dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.n_positions,
                vocab_size=c.vocab_size, bias=True, norm_eps=c.layer_norm_epsilon,
                ffn_hidden=None if getattr(c, 'n_inner', None) in (None, 4 * c.n_embd) else c.n_inner, tie_embeddings=bool(getattr(c, 'tie_word_embeddings', True)))


def rope_theta_of(hf_config):
    """transformers 5 keeps the rope base in config.rope_parameters; 4.x in config.rope_theta."""
    params = getattr(hf_config, 'rope_parameters', None) or {}
    kind = params.get('rope_type', 'default')
    scaling = getattr(hf_config, 'rope_scaling', None) or {}
    kind = scaling.get('rope_type', scaling.get('type', kind))
    if kind not in ('default', None):
        raise ValueError(f"rope scaling {kind!r} is not supported (only plain RoPE)")
    return float(params.get('rope_theta', getattr(hf_config, 'rope_theta', 10000.0)))


def _llama_config_args(c):
    head_dim = getattr(c, 'head_dim', None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise ValueError(f"Llama checkpoint with head_dim {head_dim} * heads != hidden_size is not supported")
    if c.hidden_act != 'silu':
        raise ValueError(f"Llama checkpoint uses hidden_act {c.hidden_act!r}; only 'silu' (SwiGLU) is supported")
    attention_bias, mlp_bias = getattr(c, 'attention_bias', False), getattr(c, 'mlp_bias', False)
    if attention_bias != mlp_bias:
        raise ValueError("Llama checkpoint with attention_bias != mlp_bias is not supported")
    return dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                n_kv_head=c.num_key_value_heads or c.num_attention_heads, block_size=c.max_position_embeddings,
                vocab_size=c.vocab_size, bias=bool(attention_bias), norm='rms', norm_eps=c.rms_norm_eps,
                mlp='swiglu', ffn_hidden=c.intermediate_size, pos='rope', rope_theta=rope_theta_of(c),
                tie_embeddings=bool(c.tie_word_embeddings))


def _from_hf_gpt2(hf, config):
    # GPT-2 stores its linear layers as Conv1D, i.e. transposed
    transposed = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
    state = {}
    for k, v in hf.items():
        if k.endswith('.attn.bias') or k.endswith('.attn.masked_bias'):
            continue  # causal-mask buffers of older checkpoints
        state[k] = v.t() if k.endswith(transposed) else v
    return state


def _from_hf_llama(hf, config):
    state = {'transformer.wte.weight': hf['model.embed_tokens.weight'],
             'transformer.ln_f.weight': hf['model.norm.weight']}
    if 'lm_head.weight' in hf and not config.tie_embeddings:
        state['lm_head.weight'] = hf['lm_head.weight']
    for i in range(config.n_layer):
        p, o = f'model.layers.{i}.', f'transformer.h.{i}.'
        state[o + 'ln_1.weight'] = hf[p + 'input_layernorm.weight']
        state[o + 'ln_2.weight'] = hf[p + 'post_attention_layernorm.weight']
        for suffix in ('weight', 'bias') if config.bias else ('weight',):
            state[o + f'attn.c_attn.{suffix}'] = torch.cat([hf[p + f'self_attn.{n}_proj.{suffix}'] for n in 'qkv'])
            state[o + f'attn.c_proj.{suffix}'] = hf[p + f'self_attn.o_proj.{suffix}']
            state[o + f'mlp.c_fc.{suffix}'] = torch.cat([hf[p + f'mlp.{n}_proj.{suffix}'] for n in ('gate', 'up')])
            state[o + f'mlp.c_proj.{suffix}'] = hf[p + f'mlp.down_proj.{suffix}']
    return state
