"""
The lesson: a GPT in one file whose config switches, one flag at a time, each swap that turns GPT-2's block
into a LLaMA/Qwen-style one, so vanilla and modern blocks train side by side.

    flag      vanilla        modern        where
    norm      'layernorm' -> 'rms'         LayerNorm, RMSNorm (NORMS)
    mlp       'gelu'      -> 'swiglu'      MLP, GatedMLP (MLPS)
    n_kv_head None        -> n_head/2      attend (K/V heads shared by query heads), CausalSelfAttention
    pos       'learned'   -> 'rope'        LearnedPositions; Rotary, apply_rope (POSITIONS)

With every default the model is nanoGPT's GPT-2, parameter names included. This file runs alone; the later
chapters (chapters/, `from chapters import GPT, GPTConfig`) plug into its registries, GPTConfig's derived
properties and Feature. generate.py (decoding) and optim.py (the optimizers) build on it.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

# Each swap: the flag it sets, GPT-2's value, the modern value (a callable reads the config's other flags).
SWAPS = {
    'rms': ('norm', 'layernorm', 'rms'),
    'swiglu': ('mlp', 'gelu', 'swiglu'),
    'gqa': ('n_kv_head', None, lambda flags: max(1, flags['n_head'] // 2)),  # half the KV cache
    'rope': ('pos', 'learned', 'rope'),
}


def swap_flags(names, flags, modern=True):
    """The flags that turn on (modern=True) or off the named swaps ('modern': all of them), given the config's
    other flags (a dict holding at least n_head)."""
    out = {}
    for name in SWAPS if names == 'modern' else names:
        flag, vanilla, new = SWAPS[name]
        value = new if modern else vanilla
        out[flag] = value(flags) if callable(value) else value
    return out


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
    norm_position: str = 'pre'  # 'pre' x + f(norm(x)); 'post' norm(x + f(x)) (2017/BERT); 'sandwich' x + norm(f(norm(x))) (Gemma 2/3); 'after' x + norm(f(x)) (OLMo 2/3)
    # MLPs
    mlp: str = 'gelu'  # a key of MLPS: 'gelu' (GPT-2), 'swiglu', 'relu', 'relu2' (squared ReLU), 'geglu' or 'moe' (mixture of experts)
    gelu: str = 'erf'  # mlp='gelu''s GELU: 'erf' (exact, nanoGPT's nn.GELU(); half tanh's cost on a CPU) or 'tanh' (GPT-2's own: its weights load as 'tanh')
    ffn_hidden: int | None = None  # MLP width; None: 4*n_embd, gated MLPs 8/3*n_embd rounded up to multiple_of
    multiple_of: int = 64  # gated MLP widths are rounded up to a multiple of this
    # attention
    attn: str = 'mha'  # a key of ATTENTIONS: 'mha' (multi-head, with n_kv_head also GQA and MQA) or 'mla' (DeepSeek's latent attention)
    n_kv_head: int | None = None  # K/V heads; None: n_head (MHA), fewer: GQA, 1: MQA
    head_dim: int | None = None  # width of each head; None: n_embd // n_head (Qwen3 sets its own)
    layers: str | None = None  # each layer's token mixer, letters of LAYER_KINDS tiled over the layers ('G' global attention; 'L' local, 'D' Gated DeltaNet, ... in chapters/); None: all 'G'
    # positions
    pos: str = 'learned'  # a key of POSITIONS: 'learned' (GPT-2's table), 'rope' (rotary) or 'none'
    rope_theta: float = 10000.0  # RoPE base: the slowest rotation's wavelength is about 2*pi*theta

    def __post_init__(self):
        check_config(self)  # against FIELD_TYPES and CHECKS, this class's and its chapters'

    # Derived widths and per-layer choices. A chapter's config class (chapters/) overrides the ones its flags
    # change, calling super() for the rest: these are the config's extension points.

    @property
    def head_size(self):
        return self.head_dim or self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def mlp_width(self):  # Hugging Face's intermediate_size
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        if MLPS[self.mlp].gated:
            # a third matrix costs 50% more parameters; 2/3 of 4d keeps the count of the plain MLP
            return self.multiple_of * math.ceil(int(8 * self.n_embd / 3) / self.multiple_of)
        return 4 * self.n_embd

    @property
    def rope_dim(self):  # the rotated width of a head (its first dims) in the main rotary table
        return self.head_size

    @property
    def layer_kinds(self):  # each layer's letter in LAYER_KINDS
        pattern = self.layers or self.default_layers
        return [pattern[i % len(pattern)] for i in range(self.n_layer)]

    @property
    def default_layers(self):
        return 'G'

    @property
    def norm_weights(self):  # norms multiply by a learned gain (and a LayerNorm with bias adds one)
        return True

    @property
    def residual(self):  # how a block's branches update the stream: a key of RESIDUALS
        return 'add'

    def norm_position_of(self, layer):
        return self.norm_position

    def mlp_of(self, layer):  # a layer's MLP: a key of MLPS
        return self.mlp

    def has_mlp(self, layer):  # a layer's mixer is followed by an MLP
        return True

    def rope_frequencies(self, dim, theta, length, plain=False):
        """(the dim/2 rotation frequencies theta^(-2i/dim), the factor on cos and sin) for a sequence of `length`
        positions; plain: a table of its own base that no chapter rescales."""
        return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim), 1.0

    def rope_tables_for(self, length, plain=False):  # what the frequencies depend on: None, one table for all
        return None

    @property
    def positions_follow_length(self):  # the tables change with the length reached: no static decoding step
        return False


# Flags that change no weight, which the scripts take from the run (chapters add theirs: chapters.RUNTIME_FLAGS).
RUNTIME_FLAGS = ('block_size', 'dropout')
# Flags that shape training alone (a loss term, a schedule, the init): a trained model computes the same logits
# whatever they say, so an export goes without them (chapters add theirs: chapters.TRAINING_FLAGS).
TRAINING_FLAGS = ('dropout', 'zero_init')


# ----------------------------------------------------------------------------- norm

class LayerNorm(nn.LayerNorm):
    """GPT-2's norm: (x - mean) / std * g + b, the bias only with config.bias."""

    def __init__(self, ndim, config):
        super().__init__(ndim, config.norm_eps, elementwise_affine=config.norm_weights, bias=config.bias)


class RMSNorm(nn.RMSNorm):
    """x / RMS(x) * g: no mean-centering and no bias."""

    def __init__(self, ndim, config, eps=None):
        super().__init__(ndim, config.norm_eps if eps is None else eps, elementwise_affine=config.norm_weights)


NORMS = {'layernorm': LayerNorm, 'rms': RMSNorm}
NORM_POSITIONS = ('pre', 'post', 'sandwich', 'after')  # where a block puts its norms: Block.forward


def make_norm(config):
    return NORMS[config.norm](config.n_embd, config)


# ----------------------------------------------------------------------------- positions

class LearnedPositions(nn.Embedding):
    """GPT-2's table of block_size learned position vectors, added to the token embeddings."""

    def __init__(self, config):
        super().__init__(config.block_size, config.n_embd)

    def forward(self, x, start):
        """x plus the vectors of positions start.., and no rotary tables. start: an int, or in a decoding step
        a (1,) tensor."""
        if isinstance(start, torch.Tensor):
            return x + self.weight[start], None
        end = start + x.size(1)
        if end > self.num_embeddings:
            raise ValueError(f"sequence of length {end} is longer than block_size {self.num_embeddings} "
                             f"(learned positions cannot go further)")
        return x + super().forward(torch.arange(start, end, device=x.device)), None


class Rotary(nn.Module):
    """cos/sin tables for rotary embeddings, kept in fp32 and grown on demand (longer eval contexts). The input
    passes unchanged: attention rotates its queries and keys with the tables (apply_rope). dim: the rotated width
    (config.rope_dim), theta: the base (config.rope_theta); plain: tables no chapter rescales."""

    def __init__(self, config, dim=None, theta=None, plain=False):
        super().__init__()
        self.config, self.plain = config, plain
        self.dim, self.theta = dim or config.rope_dim, theta or config.rope_theta
        self.register_buffer('cos', torch.empty(0, self.dim), persistent=False)
        self.register_buffer('sin', torch.empty(0, self.dim), persistent=False)
        self.built_for = None  # what the frequencies were computed for (config.rope_tables_for)

    def _tables(self, length):
        """cos, sin for positions 0..length-1 at this length's frequencies."""
        want = self.config.rope_tables_for(length, self.plain)
        # rebuilt when too short, for frequencies of another length, or when model.to(bf16) cast them
        if self.built_for != want or length > self.cos.size(0) or self.cos.dtype != torch.float32:
            size = length if want is not None else max(2 * length, self.cos.size(0), self.config.block_size)
            inv, factor = self.config.rope_frequencies(self.dim, self.theta, length, self.plain)
            angles = torch.outer(torch.arange(size, dtype=torch.float32), inv).to(self.cos.device)
            angles = torch.cat((angles, angles), dim=-1)  # half-split layout: pairs are (i, i + dim/2)
            self.cos, self.sin = angles.cos() * factor, angles.sin() * factor
            self.built_for = want
        return self.cos, self.sin

    def forward(self, x, start):
        """x unchanged, and (cos, sin) of positions start.. (with a cache, earlier keys keep the angles they were
        given). start: an int, or in a decoding step a (1,) tensor, read from the tables a prefill built."""
        if isinstance(start, torch.Tensor):
            return x, (self.cos[start], self.sin[start])
        end = start + x.size(1)
        cos, sin = self._tables(end)
        return x, (cos[start:end], sin[start:end])


def apply_rope(x, cos, sin):
    """Rotate x (B, heads, T, dim) by the angles of its positions: each pair of dims (i, i + dim/2) turns as a
    point in the plane. With tables narrower than x (partial RoPE), its first dims rotate, the others pass."""
    if cos.size(-1) < x.size(-1):
        d = cos.size(-1)
        return torch.cat((apply_rope(x[..., :d], cos, sin), x[..., d:]), dim=-1)
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


POSITIONS = {'learned': LearnedPositions, 'rope': Rotary}


# ----------------------------------------------------------------------------- attention

def attend(q, k, v, mask, dropout_p=0.0, scale=None):
    """softmax(q k^T * scale) v over (B, heads, T, dim) tensors; k and v may have fewer heads than q, each shared
    by consecutive query heads (GQA). mask: a boolean tensor of what each query sees, or True for causal
    attention, False for none (a Python bool, so a compiled model does not trace the choice); None: causal
    unless there is a single query."""
    if mask is None:
        mask = q.size(2) > 1
    if q.size(2) == 1 and mask is not True and dropout_p == 0 and q.device.type == 'cpu' and \
            q.dtype in (torch.bfloat16, torch.float16):
        return _attend_one_query(q, k, v, mask, scale)
    gqa = {}
    if k.size(1) != q.size(1):
        if _sdpa_shares_heads(q):
            gqa = {'enable_gqa': True}
        else:
            k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
            v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if isinstance(mask, bool) else mask,
                                          is_causal=mask is True, dropout_p=dropout_p, scale=scale, **gqa)


def _sdpa_shares_heads(q):
    """Whether SDPA should share K/V heads itself (enable_gqa): CUDA's fused kernels take it in half precision
    only (flash), and fp32 would fall back to the math kernel."""
    return q.device.type == 'cpu' or q.dtype in (torch.float16, torch.bfloat16)


def _attend_one_query(q, k, v, mask, scale):
    """attend for a decoding step's single query on a CPU in half precision, written out and computed in fp32:
    SDPA's fused CPU kernel took 0.6-0.9 ms in bf16 at batch 8 (6 heads, 201 keys of 64) against 0.1-0.2 ms for
    this form (fp32 SDPA: 0.1-0.2 ms, so fp32 keeps it). A key head's group of query heads are rows of one
    matrix, so GQA reads each key once. mask: a boolean tensor, or False / None (all keys)."""
    B, H, _, D = q.shape
    Hk = k.size(1)
    scores = (q.float().view(B, Hk, H // Hk, D) @ k.float().transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    if isinstance(mask, torch.Tensor):
        if mask.dim() == 4 and mask.size(1) > 1:  # a mask per query head, into its group's rows
            mask = mask.reshape(mask.size(0), Hk, H // Hk, mask.size(-1))
        scores = scores.masked_fill(~mask, float('-inf'))
    out = scores.softmax(dim=-1) @ v.float()  # (B, Hk, H / Hk, dv)
    return out.to(q.dtype).view(B, H, 1, v.size(-1))


def causal_mask(T, window, device, chunked=False):
    """What each of T queries sees of the same T tokens: None for plain causal attention (SDPA's is_causal), or
    with a window (or chunk) shorter than T a boolean (T, T) tensor (window_mask)."""
    if window is None or window >= T:
        return None
    positions = torch.arange(T, device=device)
    return window_mask(positions, positions, window, chunked)


def window_mask(queries, keys, window, chunked=False):
    """Whether each query (at the positions `queries`) sees each key (at `keys`): the past and itself, only the
    last `window` of them with a window; chunked: only those of its own chunk of `window` positions, chunks
    starting at multiples of it."""
    allowed = keys[None, :] <= queries[:, None]
    if chunked:
        allowed &= keys[None, :] // window == queries[:, None] // window
    elif window is not None:
        allowed &= keys[None, :] > queries[:, None] - window
    return allowed


class TokenMixer(nn.Module):
    """What mixes a layer's tokens, one class per kind of layer (LAYER_KINDS), declaring what GPT hands it and what
    a cache (generate.py) keeps for it. The defaults: no positions, no window, nothing cached."""
    positions = None  # the key of the per-forward tables it reads (GPT.embed's): 'rope', or None for none
    window = None  # a query sees at most this many tokens (itself included); None: all the past
    chunked = False  # the window is a chunk: a query sees the tokens of its own chunk only
    attends = False  # it attends over keys a cache keeps per position (its decoding mask says which are written)
    mixes = True  # False: a layer without a token mixer, its MLP alone

    def cache_entries(self):
        """What a cache keeps per past token: {name: (heads, dim)} (a window: its last `window`, in a ring)."""
        return {}

    def cache_states(self):
        """What a cache keeps whatever the length (a recurrent state, zeros at first): {name: (shape without the
        batch, dtype or None for the cache's)}."""
        return {}

    def cache_blocks(self):
        """What a cache keeps per block of `every` positions (compressed entries the mixer writes itself, from its
        cache's .start): {name: (every, shape of an entry, dtype or None)}."""
        return {}

    def token_flops(self, seq_len):
        """Forward + backward FLOPs per token of its matmuls other than Linears', at seq_len tokens."""
        return 0

    def forward(self, x, rope=None, mask=None, cache=None):
        """x (B, T, n_embd) -> (B, T, n_embd). rope: its positions' table or None; mask: attend's; cache: its part
        of a cache: .stores {name: tensor}, .update(**entries (B, heads, T, dim)) -> every entry the new tokens
        see, .fresh (nothing stored yet)."""
        raise NotImplementedError


class CausalSelfAttention(TokenMixer):
    """Multi-head attention; with n_kv_head < n_head, consecutive query heads share K/V heads (GQA, MQA: attend
    shares them), so the cache keeps n_kv_head heads. positions and window: its layer kind's."""
    attends = True

    def __init__(self, config, layer=0, positions='rope', window=None):
        super().__init__()
        self.positions, self.window = positions, window
        self.n_head, self.n_kv_head, self.head_size = config.n_head, config.kv_heads, config.head_size
        # q, k and v in one matmul; with GQA the k and v parts are n_head/n_kv_head times narrower
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_size, bias=config.bias)
        self.c_proj = nn.Linear(self.n_head * self.head_size, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout

    def cache_entries(self):
        return {'k': (self.n_kv_head, self.head_size), 'v': (self.n_kv_head, self.head_size)}

    def token_flops(self, seq_len):
        """q.k and att.v over seq_len keys (at most the window)."""
        return 3 * 2 * 2 * self.n_head * self.head_size * min(seq_len, self.window or seq_len)

    def forward(self, x, rope=None, mask=None, cache=None):
        B, T, _ = x.size()
        hs, kv = self.head_size, self.n_kv_head
        q, k, v = self.c_attn(x).split([self.n_head * hs, kv * hs, kv * hs], dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k, v = (t.view(B, T, kv, hs).transpose(1, 2) for t in (k, v))  # (B, n_kv, T, hs)
        if rope is not None:  # rotate before K/V heads are shared, so each shared head is rotated once
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(k=k, v=v)
        y = attend(q, k, v, mask, self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, self.n_head * hs)))


ATTENTIONS = {'mha': CausalSelfAttention}


def attention(config, layer, positions='rope', window=None):
    """A softmax attention layer of config.attn's kind, with its layer kind's positions and window."""
    return ATTENTIONS[config.attn](config, layer, positions, window)


@dataclass
class LayerKind:
    """A kind of layer, by its letter in config.layers: what builds its token mixer from (config, layer)."""
    about: str  # what it is, in words
    build: callable  # (config, layer) -> TokenMixer
    name: str  # a short name for bench.py's and ablate.py's variants (a model of this kind alone)
    attention: bool = False  # softmax attention over the keys a cache keeps
    full: bool = False  # it sees the whole past (no window)
    # (a model's flags, a window's length) -> what else a model with this kind must set, each size that follows the
    # sequence (a window, a chunk, a pooling rate) at that length (callers give a quarter of block_size, or their own)
    needs: callable = None
    config_class: type = object  # the config class whose fields its mixer reads (its chapter's Config)


LAYER_KINDS = {'G': LayerKind('global', attention, 'global', attention=True, full=True)}


# ----------------------------------------------------------------------------- mlp

class MLP(nn.Module):
    """up, activation, down: GPT-2's, with GELU: exact (erf) as nanoGPT's, or GPT-2's own tanh form (config.gelu)."""
    gated = False
    inputs = None  # the key of the per-forward tables it reads beside x ('tokens': the token ids), or None

    def __init__(self, config, hidden=None):
        super().__init__()
        hidden = hidden or config.mlp_width
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.approximate = 'tanh' if config.gelu == 'tanh' else 'none'

    def act(self, h):
        return F.gelu(h, approximate=self.approximate)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU, with SiLU as the gate's activation."""
    gated = True
    inputs = None

    def __init__(self, config, hidden=None):
        super().__init__()
        hidden = hidden or config.mlp_width
        # gate and up in one matmul: [gate | up] along the output dimension
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def act(self, gate):
        return F.silu(gate)

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        return self.dropout(self.c_proj(self.act(gate) * up))


MLPS = {'gelu': MLP, 'swiglu': GatedMLP}


# ----------------------------------------------------------------------------- block and model

class Add(nn.Module):
    """The residual stream's update around a branch: x + f(x)."""

    def __init__(self, config, layer=0):
        super().__init__()

    def forward(self, x, branch, which):
        """x after the branch f (which: 0 the token mixer's, 1 the MLP's)."""
        return x + branch(x)


RESIDUALS = {'add': Add}  # config.residual's values


class Block(nn.Module):
    """A token mixer (attention, or its layer kind's: LAYER_KINDS) then an MLP, each a residual branch, with the
    norms where norm_position puts them."""

    def __init__(self, config, layer=0):
        super().__init__()
        self.norm_position = config.norm_position_of(layer)
        mixer = LAYER_KINDS[config.layer_kinds[layer]].build(config, layer)
        self.ln_1 = make_norm(config) if mixer.mixes else None  # on the mixer's input (pre, sandwich) or output
        self.attn = mixer  # named attn whatever its kind: the checkpoints' parameter names
        has_mlp = config.has_mlp(layer)
        self.ln_2 = make_norm(config) if has_mlp else None  # the same for the MLP
        self.mlp = MLPS[config.mlp_of(layer)](config) if has_mlp else None
        if self.norm_position == 'sandwich':  # the branches' outputs are normalized too (Gemma 2/3)
            self.ln_1_out, self.ln_2_out = make_norm(config), make_norm(config)
        self.residual = RESIDUALS[config.residual](config, layer)

    def branch(self, f, ln, ln_out=None):
        """f as a residual branch, its norms where norm_position puts them (all but 'post')."""
        if self.norm_position == 'pre':  # the residual path stays an identity from the top to the bottom
            return lambda h: f(ln(h))
        if self.norm_position == 'sandwich':
            return lambda h: ln_out(f(ln(h)))
        return lambda h: ln(f(h))  # 'after': each branch's output normalized, inside

    def forward(self, x, rope=None, mask=None, cache=None, tables=None):
        """tables: the per-forward tables, of which an MLP that reads more than x (its `inputs`) takes its own."""
        def mix(h):
            return self.attn(h, rope, mask, cache)

        def feed(h):
            return self.mlp(h) if self.mlp.inputs is None else self.mlp(h, tables[self.mlp.inputs])
        if self.norm_position == 'post':  # 2017: the residual stream itself is normalized after each add
            x = self.ln_1(x + mix(x))
            return self.ln_2(x + feed(x))
        if self.ln_1 is not None:
            x = self.residual(x, self.branch(mix, self.ln_1, getattr(self, 'ln_1_out', None)), 0)
        if self.mlp is not None:
            x = self.residual(x, self.branch(feed, self.ln_2, getattr(self, 'ln_2_out', None)), 1)
        return x


class Feature:
    """What a chapter adds around the blocks: hooks GPT calls, each at one place, doing nothing by default. GPT
    makes one of each class in FEATURES whose applies(config) is true, in that order."""
    config_class = object  # the config class whose fields it reads (its chapter's Config): others never have it

    def __init__(self, config):
        self.config = config

    @staticmethod
    def applies(config):
        return False

    def build_block(self, block, layer):
        """Add its modules to a block (the model's, or one an auxiliary head makes), before the weights' init."""

    def build(self, model):
        """Add its modules to the model, under the names checkpoints keep (before the weights' init)."""

    def init(self, model):
        """After the weights' init: initialize what the defaults do not."""

    def embed(self, model, idx, x, start, tables):
        """The first block's input x (B, T, n_embd), after positions, from the tokens idx at positions start..;
        tables: what every layer may read in this forward (GPT.embed's), to add to."""
        return x

    def cache_states(self):
        """What a cache keeps for it whatever the length, as TokenMixer.cache_states (the last token's id): its
        hooks read and write them in tables['cache'] (None without a cache). Names unique across features."""
        return {}

    def caches(self, model, caches):
        """Each layer's part of a cache as its mixer gets it (None without one): what one layer hands another."""
        return caches

    def after_block(self, model, layer, x, tables):
        """The residual stream after a block."""
        return x

    def final(self, model, x):
        """The residual stream after the last block, before the final norm."""
        return x

    def logits(self, model, logits):
        return logits

    def loss(self, model, idx, h, targets):
        """A term of the training loss (or None), given the final hidden states h."""
        return None

    def objective(self, model):
        """What its loss adds to the training objective, in words (train.py names each term), or None."""
        return None

    def figures(self, model):
        """{name: value (None: left out)} for an evaluation's log record, since the last call (mean_and_reset)."""
        return {}

    def after_step(self, model, sum_across):
        """After each optimizer step; sum_across(tensors) sums tensors over the processes (DDP), in place."""

    def flops(self, model, seq_len):
        """Training FLOPs per token of what it runs outside the main model's Linears and token mixers."""
        return 0

    def progress(self, model, fraction):
        """In training, before each step (fraction: the share of the run done) and each evaluation (1.0)."""


FEATURES = []  # the Feature classes, in the order their hooks run


def mean_and_reset(sums):
    """The mean of running [sum, count] tensors (a loss term over training forwards) or None; then zeros."""
    total = sum((s.detach().cpu() for s in sums), torch.zeros(2))
    for s in sums:
        s.zero_()
    return (total[0] / total[1]).item() if total[1] else None


class GPT(nn.Module):
    """The language model: token embeddings (plus GPT-2's learned positions), n_layer Blocks, a final norm and the
    head. forward(idx, targets) gives the logits and the loss; generate continues a prompt (the engine is
    generate.py; without it, generate_plain); configure_optimizers gives AdamW or Muon (optim.py); from_pretrained
    loads a Hugging Face model (hf/). The parameter names are nanoGPT's, so its checkpoints and GPT-2's weights load."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.features = [feature(config) for feature in FEATURES
                         if isinstance(config, feature.config_class) and feature.applies(config)]
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=POSITIONS[config.pos](config),  # GPT-2's learned table keeps its name; rotary tables hold no weights
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            # post-norm blocks already end in a norm; every other placement leaves the stream unnormalized
            ln_f=make_norm(config) if config.norm_position != 'post' else nn.Identity(),
        ))
        for feature in self.features:
            for layer, block in enumerate(self.transformer.h):
                feature.build_block(block, layer)
            feature.build(self)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream (named c_proj: a Linear's
        # weight, or a stack of them)
        for name, p in self.named_parameters():
            if name.endswith(('c_proj.weight', '.c_proj')):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        for feature in self.features:
            feature.init(self)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, cache=None):
        """Logits for every position (B, T, vocab), and the loss when targets are given (-1: not scored), with
        the terms the features add (balancing losses, auxiliary heads)."""
        h = self.hidden_states(idx, cache)
        logits = self.logits(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
            for feature in self.features:
                extra = feature.loss(self, idx, h, targets)
                if extra is not None:
                    loss = loss + extra
        return logits, loss

    def embed(self, idx, start=0, cache=None):
        """The first block's input: the tokens' embeddings (plus GPT-2's learned positions), and the tables every
        layer may read, {'rope': rotary (cos, sin) or None, None: None, 'cache': the features' part of a cache or
        None, 'tokens': idx, ...}. start: the first token's position, an int, or in a decoding step a (1,) tensor."""
        x, rope = self.transformer.wpe(self.transformer.wte(idx), start)
        tables = {'rope': rope, None: None, 'cache': cache, 'tokens': idx}
        for feature in self.features:
            x = feature.embed(self, idx, x, start, tables)
        return self.transformer.drop(x), tables

    def hidden_states(self, idx, cache=None):
        """The final normalized hidden states (B, T, n_embd). cache: a KVCache (generate.py) that idx continues, or
        a decoding step's view of one; the layer loop is this one for training, prefill and decoding."""
        T = idx.size(1)
        x, tables = self.embed(idx, 0 if cache is None else cache.start, None if cache is None else cache.features)
        layer_caches = [None if cache is None else cache[i] for i in range(len(self.transformer.h))]
        for feature in self.features:
            layer_caches = feature.caches(self, layer_caches)
        # each layer's mask, by what its mixer declares: decided here, in Python, so a compiled block gets a
        # plain bool where it is plain causal attention; layers of the same kind share it
        masks = {}
        for i, block in enumerate(self.transformer.h):
            mixer = block.attn
            key = (mixer.positions, mixer.window, mixer.chunked, mixer.attends)
            if key not in masks:
                mask = causal_mask(T, mixer.window, idx.device, mixer.chunked) if cache is None else \
                    cache.mask(i, mixer, T, idx.device)
                masks[key] = T > 1 if mask is None else mask
            x = block(x, tables[mixer.positions], masks[key], layer_caches[i], tables)
            for feature in self.features:
                x = feature.after_block(self, i, x, tables)
        if cache is not None:
            cache.advance(T)
        for feature in self.features:
            x = feature.final(self, x)
        return self.transformer.ln_f(x)

    def logits(self, h):
        logits = self.lm_head(h)
        for feature in self.features:
            logits = feature.logits(self, logits)
        return logits

    # ------------------------------------------------------------------------- accounting

    def get_num_params(self, non_embedding=False, active=False):
        """Parameters (tied ones once). non_embedding=True leaves out the position table, as nanoGPT reports;
        active=True leaves out what a token does not use (modules declaring inactive_params: experts)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.transformer.wpe, LearnedPositions):
            n -= self.transformer.wpe.weight.numel()
        if active:
            n -= sum(m.inactive_params() for m in self.transformer.h.modules() if hasattr(m, 'inactive_params'))
        return n

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6 per weight a token multiplies, plus what each module
        declares (token_flops: attention's scores and weighted values grow with the context) and the features'."""
        T = self.config.block_size if seq_len is None else seq_len
        flops = 6 * self.lm_head.weight.numel()
        for module in self.transformer.modules():
            if isinstance(module, nn.Linear):
                flops += 6 * module.weight.numel()
            elif hasattr(module, 'token_flops'):
                flops += module.token_flops(T)
        return flops + sum(feature.flops(self, T) for feature in self.features)

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilisation: achieved FLOP/s over the device's peak (pass it in: it depends on the device)."""
        return self.flops_per_token() * self.config.block_size * fwdbwd_per_iter / dt / peak_flops

    # ------------------------------------------------------------------------- the other files' parts

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer='adamw',
                             muon_lr=0.02, muon_momentum=0.95, fused=True):
        """AdamW, or optimizer='muon': Muon and AdamW (optim.configure_optimizers says which parameters go where)."""
        import optim
        return optim.configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer, muon_lr,
                                          muon_momentum, fused)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                 vocab_limit=None):
        """Continue idx (B, T) by max_new_tokens; temperature 0 is greedy. generate.py, the decoding engine, does it
        with a KV cache; model.py copied alone samples with the plain loop below."""
        try:
            import generate
        except ModuleNotFoundError as e:
            if e.name != 'generate' or top_p is not None:
                raise
            return self.generate_plain(idx, max_new_tokens, temperature, top_k, vocab_limit)
        return generate.generate(self, idx, max_new_tokens, temperature, top_k, top_p, use_cache, vocab_limit)

    @torch.no_grad()
    def generate_plain(self, idx, max_new_tokens, temperature=1.0, top_k=None, vocab_limit=None):
        """nanoGPT's sampling loop, no cache: the whole context (its last block_size tokens) again for each token."""
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.config.block_size:])[0][:, -1, :vocab_limit].float()
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float('-inf'))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, nxt), dim=1)
        return idx

    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                        vocab_limit=None):
        """Yield (B, 1) new tokens one step at a time (generate.generate_stream)."""
        import generate
        return generate.generate_stream(self, idx, max_new_tokens, temperature, top_k, top_p, use_cache, vocab_limit)

    def compile_decoding(self, backend='inductor', mode=None, keep_cache=None):
        """Compile generate's decoding step (generate.compile_decoding; again after changing the weights) -> model."""
        import generate
        return generate.compile_decoding(self, backend, mode, keep_cache)

    def kv_cache_bytes(self, batch_size, seq_len, dtype=torch.float32):
        """Bytes of the cache generate allocates for batch_size sequences of seq_len tokens (a sliding window keeps
        only its last positions, a recurrent layer its state)."""
        import generate
        return generate.cache_bytes(self, batch_size, seq_len, dtype)

    @classmethod
    def from_pretrained(cls, name_or_path, override_args=None):
        """Load a Hugging Face checkpoint (a hub name such as gpt2 ... gpt2-xl, or a local directory) of one of the
        families in hf.HF_FAMILIES into the config that computes the same logits (hf/)."""
        import hf
        return hf.from_pretrained(name_or_path, override_args)


# ----------------------------------------------------------------------------- the config's checks, as tables

def is_int(value, low=1, high=None):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


def is_number(value):
    """A finite int or float: inf and nan (1e999 on a command line reads as inf) are no setting's value."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def kinds(names, kind):
    """The same check for several fields: {name: kind} for each name of a space-separated string."""
    return dict.fromkeys(names.split(), kind)


def one_of(values):
    """A check that a field holds one of values."""
    return (lambda v, c: v in values, f"one of {', '.join(map(repr, values))}")


def changed(config, names):
    """The named fields set away from their defaults."""
    return [k for k in names if getattr(config, k) != type(config).__dataclass_fields__[k].default]


def flag_list(config, names):
    return ', '.join(f"{k}={getattr(config, k)!r}" for k in names)


POSITIVE_INT = (lambda v, c: is_int(v), 'a positive int')
OPTIONAL_POSITIVE_INT = (lambda v, c: v is None or is_int(v), 'None or a positive int')
POSITIVE_NUMBER = (lambda v, c: v is None or (is_number(v) and v > 0), 'a positive number')  # or None
NON_NEGATIVE_NUMBER = (lambda v, c: is_number(v) and v >= 0, 'a number >= 0')
BOOL = (lambda v, c: isinstance(v, bool), 'True or False')

# What each field holds: {field: (whether a value is allowed, given the config; what is allowed, in words)}, in
# the order checked. Message: "{field} must be {allowed}". A chapter's config class holds its own FIELD_TYPES.
FIELD_TYPES = {
    **kinds('block_size vocab_size n_layer n_head n_embd multiple_of', POSITIVE_INT),
    **kinds('ffn_hidden head_dim', OPTIONAL_POSITIVE_INT),
    'n_kv_head': (lambda v, c: v is None or is_int(v, 1, c.n_head), lambda c: f"None or an int in [1, n_head={c.n_head}]"),
    'dropout': (lambda v, c: is_number(v) and 0 <= v < 1, 'in [0, 1)'),
    **kinds('norm_eps rope_theta', POSITIVE_NUMBER),
    **kinds('bias tie_embeddings', BOOL),
    'gelu': one_of(('erf', 'tanh')),
}
GPTConfig.FIELD_TYPES = FIELD_TYPES


def _registries():
    """The fields that name a kind of part, and the kinds (the registries, as the chapters filled them)."""
    return {'norm': NORMS, 'mlp': MLPS, 'attn': ATTENTIONS, 'pos': POSITIONS, 'norm_position': NORM_POSITIONS}


def _layers_ok(c):
    return c.layers is None or (isinstance(c.layers, str) and c.layers and not set(c.layers) - set(LAYER_KINDS)
                                and len(c.layers) <= c.n_layer)


# How fields depend on each other, in the order checked: [(whether config breaks the rule, the message)]. The
# messages say how to fix the mistake. A chapter's config class holds its own CHECKS.
CHECKS = [
    (lambda c: c.head_dim is None and c.n_embd % c.n_head != 0,
     lambda c: f"n_embd ({c.n_embd}) must be divisible by n_head ({c.n_head}), or set head_dim"),
    (lambda c: c.n_kv_head is not None and c.n_head % c.n_kv_head != 0,
     lambda c: f"n_head ({c.n_head}) must be divisible by n_kv_head ({c.n_kv_head})"),
    (lambda c: not _layers_ok(c),
     lambda c: f"layers must be a string of {', '.join(map(repr, LAYER_KINDS))} "
               f"({', '.join(kind.about for kind in LAYER_KINDS.values())}) at most n_layer={c.n_layer} long, tiled "
               f"over the layers; got {c.layers!r}"),
    (lambda c: c.pos == 'rope' and (c.rope_dim % 2 != 0 or c.rope_dim < 2),
     lambda c: f"pos='rope' needs an even number of rotated dims per head (head_dim, or the part a chapter rotates: "
               f"rope_fraction, qk_rope_head_dim), got {c.rope_dim}"),
]
GPTConfig.CHECKS = CHECKS


def check_config(config):
    """GPTConfig's checks, one ValueError naming the field and what is allowed: each field's type and range
    (FIELD_TYPES), the kind each naming field names (a key of its registry), then the rules (CHECKS); the
    lesson's first, then each chapter's config class's, in the order the classes compose."""
    classes = [cls for cls in reversed(type(config).__mro__) if cls is not object]
    for cls in classes:
        for name, (ok, allowed) in vars(cls).get('FIELD_TYPES', {}).items():
            value = getattr(config, name)
            if not ok(value, config):
                raise ValueError(f"{name} must be {allowed(config) if callable(allowed) else allowed}, got {value!r}")
    for name, registry in _registries().items():
        if getattr(config, name) not in registry:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, registry))}; got {getattr(config, name)!r}")
    chosen = [(f"{name}={getattr(config, name)!r}", registry[getattr(config, name)])
              for name, registry in _registries().items() if isinstance(registry, dict)]
    if _layers_ok(config):
        chosen += [(f"layers={config.layers!r}", LAYER_KINDS[letter]) for letter in set(config.layer_kinds)]
    for setting, part in chosen:  # a chapter's part reads its chapter's fields
        if not isinstance(config, getattr(part, 'config_class', object)):
            raise ValueError(f"{setting} is a chapter's ({part.config_class.__module__}): build the config with "
                             f"`from chapters import GPTConfig`")
    for cls in classes:
        for broken, message in vars(cls).get('CHECKS', ()):
            if broken(config):
                raise ValueError(message(config))
