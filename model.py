"""
The whole model in one file: a GPT whose config switches, one flag at a time, each swap that turns a
GPT-2 block into a LLaMA/Qwen-style block, and the next ones the field uses.

It reads top to bottom as the lesson goes. First the GPT-2 block and the four swaps, then the model:

    flag      vanilla        modern        where
    norm      'layernorm' -> 'rms'         LayerNorm, RMSNorm (NORMS)
    mlp       'gelu'      -> 'swiglu'      MLP, GatedMLP (MLPS)
    n_kv_head None        -> n_head/2      attend (K/V heads shared by query heads), CausalSelfAttention
    pos       'learned'   -> 'rope'        LearnedPositions; rope_frequencies, Rotary, apply_rope (POSITIONS)
    norm_position 'pre'   -> 'post', 'sandwich', 'after'   Block.forward (2017/BERT, Gemma, OLMo 2)

then each later chapter in a section of its own: mixture of experts (mlp='moe'), multi-head latent attention
(attn='mla'), long context (rope_scaling), layers of several kinds (layers='LG', 'GGGN': sliding windows and
NoPE), attention sinks (attn_sinks), linear attention (layers='DDDG': Gated DeltaNet), nanochat (norm_gain=False,
embed_norm), Llama 4 (layers='CCCN': chunked attention), gated short convolution (layers='VVG': LFM2), Mamba-2
(layers='SSSG'), layers of one part (layers='S-S-N-', mlp_with_mixer=False: Nemotron-H), Kimi Delta Attention
(layers='KKKG', pos='none'), sparse attention (index_topk: DeepSeek's lightning indexer), multi-token prediction
(mtp_depth), Gemma 4 (attn_k_eq_v, kv_shared_layers, global layers' shapes, the MoE block, per-layer embeddings);
then the machinery (the swaps' table, old checkpoints' names, the config's checks as tables).

Every layer's token mixer is a TokenMixer that declares what it needs (its positions, its window, what a cache
keeps for it, its FLOPs) and is entered in LAYER_KINDS under its letter: 'G' global, 'L' local, 'N' global
without RoPE and 'C' chunked softmax attention, 'D' Gated DeltaNet, 'K' Kimi Delta Attention, 'V' gated short
convolution, 'S' Mamba-2, '-' no mixer (the MLP alone); the rest of the model asks it. The decoding engine
(caches, the decoding step, compiled decoding, sampling) is generate.py and the Muon optimizer optim.py: both
build on this file.

GPTConfig is the one list of model flags: the scripts read it (each field is a setting, its comment the
help text), SWAPS says which values make the vanilla and the modern block, BEYOND_MODERN the next swaps.
With every default the model is nanoGPT's GPT-2, parameter names included, so GPT-2 weights load.
The Hugging Face families (HF_FAMILIES: names and configs, both ways) live in hf.py, which builds on this file.
"""

import math
from dataclasses import dataclass, fields
from functools import lru_cache, partial
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
    embed_scale: bool = False  # token embeddings times sqrt(n_embd) (Gemma)
    logit_softcap: Optional[float] = None  # final logits squashed to c*tanh(logits/c) (Gemma 2, the speedrun); None: off
    zero_init: bool = False  # the projections into the residual stream (c_proj, experts, DeltaNet's out) and an untied head start at zero (the speedrun)
    # norms
    norm: str = 'layernorm'  # a key of NORMS: 'layernorm' (GPT-2) or 'rms' (RMSNorm)
    norm_eps: float = 1e-5  # epsilon inside every norm
    norm_position: str = 'pre'  # 'pre' x + f(norm(x)); 'post' norm(x + f(x)) (2017/BERT); 'sandwich' x + norm(f(norm(x))) (Gemma 2/3); 'after' x + norm(f(x)) (OLMo 2/3)
    # MLPs
    mlp: str = 'gelu'  # a key of MLPS: 'gelu' (GPT-2), 'relu', 'relu2' (squared ReLU: Primer, the speedrun), 'swiglu', 'geglu' or 'moe' (mixture of experts)
    ffn_hidden: Optional[int] = None  # MLP width; None: 4*n_embd, gated MLPs 8/3*n_embd rounded up to multiple_of
    multiple_of: int = 64  # gated MLP widths are rounded up to a multiple of this
    # attention
    attn: str = 'mha'  # a key of ATTENTIONS: 'mha' (multi-head, with n_kv_head also GQA and MQA) or 'mla' (DeepSeek's latent attention)
    n_kv_head: Optional[int] = None  # K/V heads; None: n_head (MHA), fewer: GQA, 1: MQA
    head_dim: Optional[int] = None  # width of each head; None: n_embd // n_head (Qwen3 sets its own)
    qkv_bias: bool = False  # biases on the q, k and v projections only (Qwen2), whatever `bias` says
    qk_norm: bool = False  # RMSNorm on each query and key head before RoPE (Qwen3, Gemma 3, GLM-4.5)
    sliding_window: Optional[int] = None  # each query sees only the last W keys, itself included (Mistral)
    layers: Optional[str] = None  # each layer's token mixer, the string tiled over the layers: 'G' global, 'L' local (sliding_window), 'N' global without RoPE, 'C' chunked (attention_chunk_size, Llama 4), 'D' Gated DeltaNet (linear attention), 'K' Kimi Delta Attention, 'V' gated short convolution (LFM2), 'S' Mamba-2, '-' no mixer (the MLP alone, Nemotron-H); None: all 'G' (all 'L' with a sliding_window)
    attn_sinks: bool = False  # a learned logit per head in the softmax's denominator, so a head may attend nowhere (gpt-oss)
    attn_gate: bool = False  # the attention output times sigmoid(a projection of the block input), per head dim (Qwen3-Next)
    qk_norm_all_heads: bool = False  # with qk_norm: normalize each token's whole query and key, all heads at once (OLMo 2, MiniMax-M2)
    attn_scale: Optional[float] = None  # softmax scale on q.k; None: head_dim**-0.5 (Gemma 3: query_pre_attn_scalar**-0.5)
    # Gated DeltaNet ('D' layers): linear attention with a state that does not grow (Qwen3-Next, Qwen3.5)
    linear_n_key_head: Optional[int] = None  # query/key heads of a 'D' layer; None: n_head
    linear_n_value_head: Optional[int] = None  # value heads, a multiple of the key heads; None: linear_n_key_head
    linear_key_dim: Optional[int] = None  # width of each query/key head; None: the attention's head width
    linear_value_dim: Optional[int] = None  # width of each value head; None: the attention's head width
    linear_conv_kernel: int = 4  # the causal depthwise convolution over q, k and v, in tokens
    linear_chunk_size: int = 64  # training and prefill work in chunks of this many tokens, parallel inside one
    # Kimi Delta Attention ('K' layers: the 'D' layers' widths, conv and chunks, a decay per key channel)
    kda_rank: Optional[int] = None  # width of the low-rank projections making a 'K' layer's decay and output gate; None: linear_key_dim's value
    # OLMo hybrid's Gated DeltaNet ('D' and 'K' layers)
    linear_neg_eigval: bool = False  # beta = 2 sigmoid(b(x)), in [0, 2]: a write may flip what the state holds for a key (negative eigenvalues of I - beta k k^T)
    linear_norm_eps: Optional[float] = None  # epsilon of the RMSNorm on a 'D'/'K' layer's output; None: norm_eps (OLMo hybrid: 1e-5)
    linear_norm_position: Optional[str] = None  # the norm placement (norm_position's values) of blocks with a 'D'/'K' layer; None: norm_position (OLMo hybrid: 'pre', its attention blocks 'after')
    # positions
    pos: str = 'learned'  # a key of POSITIONS: 'learned' (GPT-2's table), 'rope' (rotary) or 'none' (Kimi Linear)
    rope_theta: float = 10000.0  # RoPE base: the slowest rotation's wavelength is about 2*pi*theta
    rope_local_theta: Optional[float] = None  # RoPE base of 'L' layers, which then take no rope_scaling (Gemma 3: 10k local, 1M global); None: as the others
    rope_fraction: float = 1.0  # share of each head's dims that rotate, the first ones (GLM-4.5 0.5, Qwen3-Next 0.25); the rest carry no position
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
    yarn_truncate: bool = True  # yarn: the band between kept and stretched dims starts and ends at whole dims (gpt-oss: False)
    # multi-head latent attention (attn='mla'): K and V rebuilt from a cached per-token latent (DeepSeek-V2/V3)
    kv_lora_rank: Optional[int] = None  # width of the cached latent; None: 4 * n_embd / n_head
    q_lora_rank: Optional[int] = None  # width of the queries' bottleneck; None or 0: queries projected directly
    qk_nope_head_dim: Optional[int] = None  # per head, the query/key part without rotation; None: n_embd / n_head
    qk_rope_head_dim: Optional[int] = None  # the rotated part, one key shared by all heads; None: half the above
    v_head_dim: Optional[int] = None  # per head, the value width; None: n_embd / n_head
    # mixture of experts (mlp='moe')
    n_expert: int = 8  # routed experts in each MoE layer
    n_expert_active: int = 2  # routed experts each token goes to (top-k)
    moe_hidden: Optional[int] = None  # width of each expert; None: the dense width / n_expert_active
    n_shared_expert: int = 0  # experts every token goes to, each moe_hidden wide (DeepSeekMoE)
    shared_expert_gate: bool = False  # the shared experts' output times sigmoid(a learned projection of the token) (Qwen3-Next)
    router: str = 'softmax'  # 'softmax' (Mixtral, Qwen3-MoE) or 'sigmoid' (DeepSeek-V3, balanced by a bias)
    router_norm_topk: bool = True  # the chosen experts' weights rescaled to sum to 1
    n_expert_group: int = 1  # experts come from the topk_group best of this many groups (DeepSeek)
    topk_group: int = 1  # groups a token's experts may come from
    routed_scaling: float = 1.0  # factor on the routed experts' sum (DeepSeek-V3: 2.5)
    first_dense_layers: int = 0  # the first k layers keep a dense SwiGLU (DeepSeek)
    moe_aux_loss_coef: float = 0.0  # Switch Transformer's load-balancing loss in the training loss; 0: off
    moe_z_loss_coef: float = 0.0  # ST-MoE's router z-loss (logits kept small) in the training loss; 0: off
    moe_bias_update_rate: float = 0.001  # sigmoid router: step of the balancing bias per iteration; 0: frozen
    moe_bias: bool = False  # biases on the router and in the experts (gpt-oss)
    swiglu_limit: Optional[float] = None  # experts' clamped SwiGLU (gpt-oss: 7): (clamp(up)+1) * g*sigmoid(1.702g), g = min(gate, limit); None: plain SwiGLU
    # nanochat: weightless norms, and a norm on the embeddings
    norm_gain: bool = True  # norms multiply by a learned gain (and LayerNorm adds a bias); False: weightless, every norm module (nanochat)
    embed_norm: bool = False  # a norm on the first block's input, the token embeddings (nanochat)
    # Llama 4: chunked attention, NoPE layers' temperature, L2 QK-norm, its MoE
    attention_chunk_size: Optional[int] = None  # 'C' layers: a query sees only the tokens of its own chunk of this many, chunks starting at multiples of it (Llama 4: 8192)
    nope_temperature: Optional[float] = None  # 'N' layers: queries times 1 + this * ln(1 + floor((pos + 1) / nope_temperature_floor)) (Llama 4: 0.1); None: off
    nope_temperature_floor: int = 8192  # the positions per step of nope_temperature's growth (Llama 4: 8192)
    rope_qk_norm: bool = False  # layers with RoPE: each query and key head scaled to unit RMS after it, no weights (Llama 4's "L2 norm")
    moe_every: int = 1  # with mlp='moe': MoE on every k-th layer (layers k-1, 2k-1, ...), a dense SwiGLU between (Llama 4 Maverick: 2)
    moe_scale_input: bool = False  # the router's weight multiplies each chosen expert's input, not its output (Llama 4)
    # gated short convolution ('V' layers: LFM2)
    short_conv_kernel: int = 3  # a 'V' layer's causal depthwise convolution, in tokens (LFM2's conv_L_cache)
    # Mamba-2 ('S' layers): a selective state-space layer, a constant-size state (Nemotron-H)
    ssm_n_head: Optional[int] = None  # heads of an 'S' layer; None: 2 * n_embd / ssm_head_dim (Mamba's expand 2)
    ssm_head_dim: Optional[int] = None  # width of each head; None: the attention's head width
    ssm_state_dim: int = 64  # each head's state is (ssm_head_dim, ssm_state_dim); B and C are this wide
    ssm_n_groups: int = 1  # B and C come in this many groups, each shared by ssm_n_head / ssm_n_groups heads
    ssm_conv_kernel: int = 4  # the causal depthwise convolution over x, B and C, in tokens
    ssm_chunk_size: int = 64  # training and prefill work in chunks of this many tokens, parallel inside one
    ssm_dt_min: float = 0.0  # time steps below this are raised to it (Nemotron-H's time_step_min, 1e-3); 0: none
    mlp_with_mixer: bool = True  # a layer's token mixer is followed by an MLP; False: each layer one part, a mixer or ('-') an MLP (Nemotron-H)
    # DeepSeek Sparse Attention (index_topk): a lightning indexer picks the past tokens each query reads (DeepSeek-V3.2, GLM-5)
    index_topk: Optional[int] = None  # each query of a global attention layer reads only the k past tokens its indexer scores highest; None: all (dense)
    index_n_heads: int = 4  # the indexer's query heads (DeepSeek-V3.2: 64)
    index_head_dim: int = 32  # width of the indexer's query heads and of its one key per token; the first rope_dim dims rotate (DeepSeek-V3.2: 128)
    index_stage: str = 'sparse'  # 'dense': warm-up, attention reads every past token while the indexer learns to score them; 'sparse': it reads the top-k
    index_loss_coef: float = 1.0  # the indexer's KL loss toward the main attention, times this, joins the training loss; 0: the indexer does not learn
    index_share: Optional[str] = None  # IndexCache (GLM-5), tiled over the layers: 'F' a layer's own indexer, 'S' reuses the top-k of the nearest earlier indexer (no weights of its own); None: all 'F'
    # multi-token prediction (mtp_depth): modules predicting tokens further ahead, trained beside the main head (DeepSeek-V3)
    mtp_depth: int = 0  # extra modules after the model, the k-th predicting the token k+1 ahead with the shared head; 0: none
    mtp_loss_coef: float = 0.3  # their mean loss, times this, joins the training loss (DeepSeek-V3: 0.3, later 0.1); 0: not computed
    # Gemma 4: K = V, cross-layer K/V sharing, value norm, the layer scalar, global layers' shapes and RoPE, per-layer embeddings
    v_norm: bool = False  # every attention layer's values scaled to unit RMS per head, no gain (Gemma 4; K = V layers always are)
    layer_scalar: bool = False  # each layer's output, the whole stream, times a scalar of its own kept in the checkpoint, not trained (Gemma 4's layer_scalar)
    global_head_dim: Optional[int] = None  # the head width of global layers ('G', 'N'); None: head_dim's (Gemma 4: 512 beside 256)
    global_n_kv_head: Optional[int] = None  # the K/V heads of global layers; None: n_kv_head's (Gemma 4's num_global_key_value_heads)
    rope_proportion: Optional[float] = None  # global layers' RoPE: this share of each head's rotation pairs turn, at frequencies over the whole head, the rest at zero frequency (Gemma 4's 'proportional': 0.25); None: plain RoPE
    moe_dense_mlp: bool = False  # with mlp='moe': a dense MLP beside the experts, each branch with its norms, the router reading the stream itself (Gemma 4's MoE block)
    moe_activation: str = 'silu'  # with mlp='moe': the experts' gate activation, and the dense MLP's beside them: 'silu' (SwiGLU) or 'gelu' (GEGLU, tanh form: Gemma 4)
    per_layer_embd: int = 0  # width of each layer's own embedding of every token, added after its MLP through a gated projection (Gemma 4's hidden_size_per_layer_input); 0: none
    attn_k_eq_v: bool = False  # global layers ('G', 'N'): one projection gives the keys and the values, these normalized without a gain and not rotated (Gemma 4's attention_k_eq_v)
    kv_shared_layers: int = 0  # the last n layers reuse the keys and values of the last earlier layer of their kind and have no K/V projections (Gemma 4's num_kv_shared_layers); 0: none

    def __post_init__(self):
        check_config(self)  # against the tables at the end of the file

    @property
    def head_size(self):
        return self.head_dim or self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def mlp_width(self):
        """The MLP's hidden width (Hugging Face's intermediate_size; its hidden_size is our n_embd)."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        if MLPS[self.mlp].gated:
            # a third matrix costs 50% more parameters; 2/3 of 4d keeps the count of the plain MLP
            return self.multiple_of * math.ceil(int(8 * self.n_embd / 3) / self.multiple_of)
        return 4 * self.n_embd

    @property
    def rope_dim(self):
        """Width of the rotated part of each query and key head (its first dims)."""
        return self.mla_dims['rope'] if self.attn == 'mla' else int(self.head_size * self.rope_fraction)

    @property
    def layer_kinds(self):
        """Each layer's letter in LAYER_KINDS: 'G' global attention, 'L' local (sliding_window), 'N' global
        without RoPE, 'C' chunked, 'D' Gated DeltaNet, 'K' Kimi Delta Attention, 'V' gated short convolution,
        'S' Mamba-2, '-' no mixer."""
        pattern = self.layers or ('L' if self.sliding_window is not None else 'G')
        return [pattern[i % len(pattern)] for i in range(self.n_layer)]

    def window_of(self, layer):
        """The sliding window of a layer, None for full attention."""
        return self.sliding_window if self.layer_kinds[layer] == 'L' else None

    def norm_position_of(self, layer):
        """Where a layer's block puts its norms: linear_norm_position for 'D' and 'K' layers when set."""
        linear = self.layer_kinds[layer] in ('D', 'K') and self.linear_norm_position is not None
        return self.linear_norm_position if linear else self.norm_position

    def mlp_of(self, layer):
        """The MLP kind of a layer: an MoE model's first_dense_layers keep a dense SwiGLU."""
        dense = layer < self.first_dense_layers or (layer + 1) % self.moe_every != 0  # moe_every: Llama 4's chapter
        return 'swiglu' if self.mlp == 'moe' and dense else self.mlp

    # the later chapters' widths, the defaults filled in

    @property
    def expert_hidden(self):
        return self.moe_hidden or max(1, self.mlp_width // self.n_expert_active)

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
    def rope_length(self):
        """The context RoPE was trained at: rope_scaling stretches past it."""
        return self.rope_original_length or self.block_size

    @property
    def rope_scale(self):
        return self.rope_factor or self.block_size / self.rope_length

    @property
    def linear_dims(self):
        """A 'D' layer's heads and widths."""
        hs = self.head_size
        k_heads = self.linear_n_key_head or self.n_head
        return {'k_heads': k_heads, 'v_heads': self.linear_n_value_head or k_heads,
                'k_dim': self.linear_key_dim or hs, 'v_dim': self.linear_value_dim or hs}

    @property
    def ssm_dims(self):
        """An 'S' layer's heads and widths."""
        head_dim = self.ssm_head_dim or self.head_size
        return {'heads': self.ssm_n_head or max(1, 2 * self.n_embd // head_dim), 'head_dim': head_dim,
                'state': self.ssm_state_dim, 'groups': self.ssm_n_groups}

    @property
    def index_shares(self):
        """Per layer, whether it reuses an earlier layer's top-k (index_share 'S')."""
        pattern = self.index_share or 'F'
        return [pattern[i % len(pattern)] == 'S' for i in range(self.n_layer)]

    @classmethod
    def from_dict(cls, d):
        """Build from a dict that may hold extra keys (a training config): only our fields are used."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in upgrade_args(d).items() if k in names})


# ----------------------------------------------------------------------------- norm

class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, config):
        super().__init__()
        self.shape = (ndim,)
        self.weight = nn.Parameter(torch.ones(ndim)) if config.norm_gain else None  # weightless: nanochat's chapter
        self.bias = nn.Parameter(torch.zeros(ndim)) if config.bias and config.norm_gain else None
        self.eps = config.norm_eps

    def forward(self, x):
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / RMS(x) * g: no mean-centering and no bias."""

    def __init__(self, ndim, config, eps=None):
        super().__init__()
        self.shape = (ndim,)
        self.weight = nn.Parameter(torch.ones(ndim)) if config.norm_gain else None  # weightless: nanochat's chapter
        self.eps = config.norm_eps if eps is None else eps

    def forward(self, x):
        return F.rms_norm(x, self.shape, self.weight, self.eps)


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


def rope_frequencies(config, dim, length, local=False):
    """(the dim/2 rotation frequencies, the factor on cos and sin): plain RoPE's theta^(-2i/dim), dim i and
    i + dim/2 turning together; with config.rope_scaling, scaled for a sequence of `length` positions (the long
    context chapter: scaled_frequencies). local: the tables of 'L' layers with their own base
    (rope_local_theta), which are not scaled."""
    theta = config.rope_local_theta if local else config.rope_theta
    if config.rope_proportion is not None and not local:  # Gemma 4's chapter
        return proportional_frequencies(config.rope_proportion, theta, dim), 1.0
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    if config.rope_scaling is None or local:
        return inv, 1.0
    return scaled_frequencies(config, inv, dim, length)


class Rotary(nn.Module):
    """cos/sin tables for rotary embeddings, kept in fp32 and grown on demand (longer eval contexts).
    The input passes unchanged: attention rotates its queries and keys with the tables (apply_rope)."""

    def __init__(self, config, local=False):
        super().__init__()
        self.config, self.dim, self.local = config, config.rope_dim, local
        if config.global_head_dim is not None and not local:  # the global layers' own width (Gemma 4's chapter)
            self.dim = int(config.global_head_dim * config.rope_fraction)
        self.register_buffer('cos', torch.empty(0, self.dim), persistent=False)
        self.register_buffer('sin', torch.empty(0, self.dim), persistent=False)
        self.built_for = None  # the length 'dynamic' frequencies were computed for

    def _tables(self, length):
        """cos, sin for positions 0..length-1 at this length's frequencies."""
        dynamic = self.config.rope_scaling == 'dynamic' and length > self.config.rope_length and not self.local
        want = length if dynamic else None  # whose frequencies the tables must hold
        # rebuilt when too short, for another length's 'dynamic' angles, or when model.to(bf16) cast them
        if self.built_for != want or length > self.cos.size(0) or self.cos.dtype != torch.float32:
            size = length if dynamic else max(2 * length, self.cos.size(0), self.config.block_size)
            inv, factor = rope_frequencies(self.config, self.dim, length, self.local)
            angles = torch.outer(torch.arange(size, dtype=torch.float32), inv).to(self.cos.device)
            angles = torch.cat((angles, angles), dim=-1)  # half-split layout: pairs are (i, i + dim/2)
            self.cos, self.sin = angles.cos() * factor, angles.sin() * factor
            self.built_for = want
        return self.cos, self.sin

    def forward(self, x, start):
        """x unchanged, and (cos, sin) of positions start..; with 'dynamic', at the frequencies of the length
        reached (as transformers does: with a KV cache, earlier keys keep the angles they were given). start:
        an int, or in a decoding step a (1,) tensor, read from the tables a prefill built (up to block_size)."""
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

# SDPA shares K/V heads itself since torch 2.5 (enable_gqa); older versions get an explicit repeat
try:
    F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2),
                                   enable_gqa=True)
    _SDPA_HAS_GQA = True
except TypeError:
    _SDPA_HAS_GQA = False


def attend(q, k, v, mask, dropout_p=0.0, scale=None, sinks=None):
    """softmax(q k^T * scale) v over (B, heads, T, dim) tensors; k and v may have fewer heads than q,
    each shared by consecutive query heads. mask: a boolean tensor of what each query sees, or True for causal
    attention, False for none (a Python bool, so a compiled model does not trace the choice); None: causal
    unless there is a single query. sinks: a logit per query head that joins every softmax's denominator."""
    if mask is None:
        mask = q.size(2) > 1
    if sinks is not None:  # the scale given explicitly: SDPA's default would follow the padded queries' width
        scale = q.size(-1) ** -0.5 if scale is None else scale
        q, k, v, mask = _with_sink(q, k, v, mask, sinks, scale)
    if q.size(2) == 1 and mask is not True and dropout_p == 0 and q.device.type == 'cpu' and \
            q.dtype in (torch.bfloat16, torch.float16):
        return _attend_one_query(q, k, v, mask, scale)
    gqa = {}
    if k.size(1) != q.size(1):
        # CUDA's fused kernels take enable_gqa only in half precision (flash); fp32 would fall back to math
        if _SDPA_HAS_GQA and (q.device.type == 'cpu' or q.dtype in (torch.float16, torch.bfloat16)):
            gqa = {'enable_gqa': True}
        else:
            k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
            v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if isinstance(mask, bool) else mask,
                                          is_causal=mask is True, dropout_p=dropout_p, scale=scale, **gqa)


def _attend_one_query(q, k, v, mask, scale):
    """attend for a decoding step's single query on a CPU in half precision, written out and computed in fp32:
    SDPA's fused CPU kernel took 0.6-0.9 ms in bf16 at batch 8 (6 heads, 201 keys of 64) against 0.1-0.2 ms for
    this form, compiled or not (fp32 SDPA: 0.1-0.2 ms, so fp32 keeps it). A key head's group of query heads
    are rows of one matrix, so GQA reads each key once. mask: a boolean tensor, or False / None (all keys)."""
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
    """Whether each query (at the positions `queries`) sees each key (at `keys`): the past and itself, only
    the last `window` of them with a window; chunked: only those of its own chunk of `window` positions, chunks
    starting at multiples of it (Llama 4's chunked attention)."""
    allowed = keys[None, :] <= queries[:, None]
    if chunked:
        allowed &= keys[None, :] // window == queries[:, None] // window
    elif window is not None:
        allowed &= keys[None, :] > queries[:, None] - window
    return allowed


class TokenMixer(nn.Module):
    """What mixes a layer's tokens, one class per kind of layer (LAYER_KINDS), declaring what the rest of the
    model asks of it: Block builds it, GPT's forward hands it its positions and mask, a cache (generate.py)
    keeps what it declares. The defaults are a mixer with no positions, no window and nothing cached."""
    positions = None  # the rotary tables it rotates by: 'rope', 'local' (an 'L' layer's own base) or None; 'temperature': its queries' scales (Llama 4's chapter)
    window = None  # a query sees at most this many tokens (itself included); None: all the past
    chunked = False  # the window is a chunk: a query sees the tokens of its own chunk only (Llama 4's chapter)
    kv_shared = False  # its keys and values are an earlier layer's, handed on through its cache (Gemma 4's chapter)

    def cache_entries(self):
        """What a cache keeps per past token: {name: (heads, dim)}; a window keeps its last `window` only, in
        a ring. A mixer with entries attends: in a decoding step its mask says which of their slots are written."""
        return {}

    def cache_states(self):
        """What a cache keeps whatever the length (a recurrent state): {name: (shape without the batch, dtype,
        or None for the cache's)}, zeros at the start of a sequence."""
        return {}

    def token_flops(self, seq_len):
        """Forward + backward FLOPs per token of its matmuls that are not Linears (Linears are counted apart),
        over sequences of seq_len tokens."""
        return 0

    def forward(self, x, rope=None, mask=None, cache=None):
        """x (B, T, n_embd) -> (B, T, n_embd). rope: the (cos, sin) of its positions' kind, or None; mask:
        which keys each query sees (attend's); cache: this layer's part of a cache (generate.py): .stores
        {name: tensor} as declared, .update(**entries) for the entries (B, heads, T, dim), which returns every
        cached entry the new tokens see, .fresh (nothing stored yet)."""
        raise NotImplementedError


class CausalSelfAttention(TokenMixer):
    """Multi-head attention; with n_kv_head < n_head, consecutive query heads share K/V heads (GQA, MQA: attend
    shares them). positions and window: its layer kind's ('L' slides a window, 'N' has no RoPE); qk_norm, sinks,
    an output gate and the softmax scale are switches."""

    def __init__(self, config, positions='rope', window=None, kv_shared=False, k_eq_v=False, head_size=None,
                 n_kv_head=None):
        super().__init__()
        self.positions = positions
        self.window = window
        # a layer's own head width and K/V heads: Gemma 4's global layers
        self.n_head, self.n_kv_head = config.n_head, n_kv_head or config.kv_heads
        self.head_size = head_size or config.head_size
        # Gemma 4's chapter: a layer sharing K/V projects queries only; with K = V, queries and keys
        self.kv_shared, self.k_eq_v = kv_shared, k_eq_v
        self.v_norm = k_eq_v or config.v_norm
        kv_parts = 1 if k_eq_v else 2
        # q, k and v in one matmul; with GQA the k and v parts are n_head/n_kv_head times narrower
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + kv_parts * self.projected_kv_heads) * self.head_size,
                                bias=config.bias or config.qkv_bias)
        self.c_proj = nn.Linear(self.n_head * self.head_size, config.n_embd, bias=config.bias)
        if config.qk_norm:  # queries and keys scaled to unit RMS, so logits cannot grow unbounded
            # per head (Qwen3), or over each token's whole query and key (OLMo 2)
            q_width, k_width = (self.n_head * self.head_size, self.n_kv_head * self.head_size) \
                if config.qk_norm_all_heads else (self.head_size, self.head_size)
            self.q_norm, self.k_norm = RMSNorm(q_width, config), RMSNorm(k_width, config)
            if kv_shared:  # the keys come normalized from the layer that made them
                self.k_norm = nn.Identity()
        self.qk_norm = config.qk_norm and ('all' if config.qk_norm_all_heads else 'head')
        self.rope_qk_norm, self.eps = config.rope_qk_norm and positions in ('rope', 'local'), config.norm_eps  # Llama 4
        # a logit per head that any query may "attend" to instead of a key (gpt-oss: _with_sink)
        self.sinks = nn.Parameter(torch.zeros(self.n_head)) if config.attn_sinks else None
        # from the block input, one gate per output dim of every head (Qwen3-Next)
        self.c_gate = nn.Linear(config.n_embd, self.n_head * self.head_size, bias=config.bias or config.qkv_bias) \
            if config.attn_gate else None
        self.scale = config.attn_scale
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.indexer = None  # DeepSeek Sparse Attention's, on global layers with index_topk (its chapter)

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
        index = self.indexer.token_flops(seq_len, self.n_head * self.head_size) if self.indexer is not None else 0
        return 3 * 2 * 2 * self.n_head * self.head_size * min(seq_len, self.window or seq_len) + index

    def forward(self, x, rope=None, mask=None, cache=None):
        B, T, _ = x.size()
        hs = self.head_size
        kv_heads = self.projected_kv_heads
        q, k, v = self.c_attn(x).split([self.n_head * hs, kv_heads * hs, 0 if self.k_eq_v else kv_heads * hs], dim=2)
        if self.k_eq_v:  # Gemma 4: the values are the keys as projected, normalized below
            v = k
        if self.qk_norm == 'all':
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, kv_heads, hs).transpose(1, 2)  # (B, n_kv, T, hs)
        v = v.view(B, T, kv_heads, hs).transpose(1, 2)
        if self.v_norm:
            v = F.rms_norm(v, (hs,), eps=self.eps)
        if self.qk_norm == 'head':
            q, k = self.q_norm(q), self.k_norm(k)
        if self.positions == 'temperature':  # Llama 4's NoPE layers: `rope` holds each query's scale
            q = q * rope[:, None].to(q.dtype)
        elif rope is not None:  # rotate before K/V heads are shared, so each shared head is rotated once
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.rope_qk_norm:
            q, k = F.rms_norm(q, (hs,), eps=self.eps), F.rms_norm(k, (hs,), eps=self.eps)
        if cache is not None:
            k, v = cache.update(k=k, v=v)
        if self.indexer is not None:  # DeepSeek Sparse Attention: each query reads the keys its indexer picks
            mask, k, v = self.indexer.narrow(x, x, rope, mask, cache, k, v)
            self.indexer.learn(q, k, self.scale)
        y = attend(q, k, v, mask, self.dropout if self.training else 0.0, self.scale, self.sinks)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * hs)
        if self.c_gate is not None:
            y = y * torch.sigmoid(self.c_gate(x))
        return self.resid_dropout(self.c_proj(y))


ATTENTIONS = {'mha': CausalSelfAttention}  # attn's values; 'mla' joins in its chapter


def attention(config, layer, positions='rope', local=False):
    """A softmax attention layer of config.attn's kind, with its layer kind's positions and window."""
    if positions is None and config.nope_temperature is not None:  # Llama 4's chapter
        positions = 'temperature'
    return ATTENTIONS[config.attn](config, positions, config.sliding_window if local else None,
                                   **gemma4_attention(config, layer))


# Every kind of layer, by its letter in config.layers: (what it is, in words; what builds its token mixer
# from (config, layer)). The later chapters add theirs; adding a kind is a TokenMixer and an entry here.
LAYER_KINDS = {'G': ('global', attention)}


# ----------------------------------------------------------------------------- mlp

class MLP(nn.Module):
    """up, activation, down: GPT-2's with GELU (tanh form, as GPT-2 computes it), 2017's with ReLU, Primer's
    with ReLU squared (sparse like ReLU, smooth at zero, no gate: the speedrun's MLP)."""
    gated = False

    def __init__(self, config, hidden=None):
        super().__init__()
        hidden = hidden or config.mlp_width
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.act = config.mlp

    def forward(self, x):
        h = self.c_fc(x)
        if self.act == 'relu2':
            h = F.relu(h).square()
        elif self.act == 'relu':
            h = F.relu(h)
        else:
            h = F.gelu(h, approximate='tanh')
        return self.dropout(self.c_proj(h))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with SiLU as the gate's activation, GEGLU with GELU."""
    gated = True

    def __init__(self, config, hidden=None):
        super().__init__()
        hidden = hidden or config.mlp_width
        # gate and up in one matmul: [gate | up] along the output dimension
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.silu = config.mlp != 'geglu'

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        gate = F.silu(gate) if self.silu else F.gelu(gate, approximate='tanh')  # GELU's form as in 'gelu' (Gemma's too)
        return self.dropout(self.c_proj(gate * up))


MLPS = {'gelu': MLP, 'relu': MLP, 'relu2': MLP, 'swiglu': GatedMLP, 'geglu': GatedMLP}  # 'moe' joins in its chapter


# ----------------------------------------------------------------------------- block and model

class Block(nn.Module):
    """A token mixer (attention, or its layer kind's: LAYER_KINDS) then an MLP, each a residual branch, with
    the norms where norm_position puts them."""

    def __init__(self, config, layer=0):
        super().__init__()
        self.norm_position = config.norm_position_of(layer)
        # layers of one part (Nemotron-H): a '-' layer has no token mixer; with mlp_with_mixer=False a mixer no MLP
        has_mixer = config.layer_kinds[layer] != '-'
        has_mlp = config.mlp_with_mixer or not has_mixer
        # on the attention's input (pre, sandwich) or its output (post, after)
        self.ln_1 = make_norm(config) if has_mixer else None
        # the layer kind's token mixer (named attn whatever its kind: the checkpoints' parameter names)
        self.attn = LAYER_KINDS[config.layer_kinds[layer]][1](config, layer)
        self.ln_2 = make_norm(config) if has_mlp else None  # the same for the MLP
        self.mlp = MLPS[config.mlp_of(layer)](config) if has_mlp else None
        if config.moe_dense_mlp and isinstance(self.mlp, MoE):  # Gemma 4's MoE block normalizes its branches' inputs
            self.mlp, self.ln_2 = DenseAndExperts(config), nn.Identity()
        if self.norm_position == 'sandwich':  # Gemma: the branches' outputs are normalized too
            self.ln_1_out, self.ln_2_out = make_norm(config), make_norm(config)
        self.per_layer = PerLayerInput(config, layer) if config.per_layer_embd else None  # Gemma 4's chapter
        if config.layer_scalar:  # a buffer: loaded and saved, never trained (Gemma 4's chapter)
            self.register_buffer('layer_scalar', torch.ones(1))

    def forward(self, x, rope=None, mask=None, cache=None):
        if self.ln_1 is None:  # an MLP alone (pre-norm: the config's checks)
            return x + self.mlp(self.ln_2(x))
        if self.mlp is None:  # a token mixer alone
            return x + self.attn(self.ln_1(x), rope, mask, cache)
        if self.norm_position == 'pre':  # the residual path stays an identity from the top to the bottom
            x = x + self.attn(self.ln_1(x), rope, mask, cache)
            return x + self.mlp(self.ln_2(x))
        if self.norm_position == 'post':  # 2017: the residual stream itself is normalized after each add
            x = self.ln_1(x + self.attn(x, rope, mask, cache))
            return self.ln_2(x + self.mlp(x))
        if self.norm_position == 'sandwich':
            x = x + self.ln_1_out(self.attn(self.ln_1(x), rope, mask, cache))
            return x + self.ln_2_out(self.mlp(self.ln_2(x)))
        x = x + self.ln_1(self.attn(x, rope, mask, cache))  # 'after': each branch's output normalized, inside
        return x + self.ln_2(self.mlp(x))


class GPT(nn.Module):
    """The language model: token embeddings (plus GPT-2's learned positions), n_layer Blocks, a final norm and
    the head. forward(idx, targets) gives the logits and the loss; generate continues a prompt (the engine is
    generate.py); configure_optimizers gives AdamW or Muon (optim.py); from_pretrained loads a Hugging Face
    model (hf.py). The parameter names are nanoGPT's, so its checkpoints and GPT-2's weights load."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=POSITIONS[config.pos](config),  # GPT-2's learned table keeps its name; rotary tables hold no weights
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            # post-norm blocks already end in a norm; every other placement leaves the stream unnormalized
            ln_f=make_norm(config) if config.norm_position != 'post' else nn.Identity(),
        ))
        if config.embed_norm:  # nanochat's chapter
            self.transformer.ln_emb = make_norm(config)
        share_indices(self.transformer.h)  # DSA's IndexCache: layers reading an earlier layer's top-k (its chapter)
        if config.per_layer_embd:  # Gemma 4's chapter
            self.transformer.update(per_layer_embeddings(config))
        # local layers' own tables (Gemma 3: rope_local_theta), no weights; None: they share wpe's
        self.rope_local = Rotary(config, local=True) if config.rope_local_theta is not None else None
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight

        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream; zero_init starts them at
        # zero, so each block begins as the identity and learns what to add (a tied head is the embedding: kept)
        for name, p in self.named_parameters():
            if name.endswith(('c_proj.weight', 'experts.c_proj')):
                nn.init.normal_(p, mean=0.0, std=0.0 if config.zero_init else 0.02 / math.sqrt(2 * config.n_layer))
        if config.zero_init and not config.tie_embeddings:
            nn.init.zeros_(self.lm_head.weight)
        if config.mtp_depth:  # multi-token prediction (its chapter), made after the main model's init and on a
            with torch.random.fork_rng(devices=[]):  # fork of the RNG: the main model trains as it would without them
                self.mtp = nn.ModuleList([MTPModule(config) for _ in range(config.mtp_depth)])

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, cache=None):
        """Logits for every position (B, T, vocab), and the loss when targets are given (in training, with
        the MoE balancing losses, DSA's indexer losses and the MTP modules' losses the config switches on)."""
        h = self.hidden_states(idx, cache)
        logits = self.logits(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
            balancing = [m.loss for m in self.moe_layers() if m.loss is not None]
            if balancing:  # the mean over layers: a coefficient means the same at any depth
                loss = loss + sum(balancing) / len(balancing)
            index_losses = [m.loss for m in self.indexers() if m.loss is not None]
            if index_losses:  # DSA's indexers learn from their own loss alone (their inputs are detached)
                loss = loss + self.config.index_loss_coef * sum(index_losses) / len(index_losses)
            if self.config.mtp_depth and self.config.mtp_loss_coef and self.training:
                loss = loss + self.config.mtp_loss_coef * mtp_loss(self, h, targets)
        return logits, loss

    def embed(self, idx, start=0):
        """The first block's input: the tokens' embeddings (plus GPT-2's learned positions), and the rotary
        tables of their positions by kind, {'rope': (cos, sin), 'local': ..., None: None}. start: the first
        token's position, an int, or in a decoding step a (1,) tensor."""
        x = self.transformer.wte(idx)
        if self.config.embed_scale:
            x = x * self.config.n_embd ** 0.5
        per_layer = per_layer_inputs(self.transformer, idx, x) if self.config.per_layer_embd else None  # Gemma 4
        x, rope = self.transformer.wpe(x, start)
        if self.config.embed_norm:
            x = self.transformer.ln_emb(x)
        local = rope if self.rope_local is None else self.rope_local(x, start)[1]
        tables = {'rope': rope, 'local': local, None: None}
        if self.config.nope_temperature is not None:  # Llama 4's chapter
            tables['temperature'] = nope_temperature_scales(self.config, start, idx.size(1), idx.device)
        if per_layer is not None:  # not a position's table, but every layer's input per token (Gemma 4's chapter)
            tables['per_layer'] = per_layer
        return self.transformer.drop(x), tables

    def hidden_states(self, idx, cache=None):
        """The final normalized hidden states (B, T, n_embd); with a cache (generate.py), idx continues what it
        holds."""
        T = idx.size(1)
        start = cache.pos if cache is not None else 0
        x, tables = self.embed(idx, start)
        # each layer's positions and mask, by what its mixer declares; decided here, in Python, so a compiled
        # block gets a plain bool where the mask is plain causal attention
        contexts = {}
        # each layer's part of the cache; with K/V sharing (Gemma 4's chapter) what hands the keys and values on
        layer_caches = share_kv(self.config, [cache[i] if cache is not None else None
                                              for i in range(len(self.transformer.h))])
        for i, block in enumerate(self.transformer.h):
            positions, window, chunked = block.attn.positions, block.attn.window, block.attn.chunked
            if (positions, window, chunked) not in contexts:
                mask = causal_mask(T, window, idx.device, chunked) if cache is None else \
                    cache.mask(T, window, idx.device, chunked)
                contexts[positions, window, chunked] = (tables[positions], T > 1 if mask is None else mask)
            x = after_block(block, block(x, *contexts[positions, window, chunked], layer_caches[i]), tables)
        if cache is not None:
            cache.advance(T)
        return self.transformer.ln_f(x)

    def logits(self, h):
        """The head's logits of hidden states, soft-capped to (-c, c) with logit_softcap=c."""
        logits = self.lm_head(h)
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    # ------------------------------------------------------------------------- accounting

    def get_num_params(self, non_embedding=False, active=False):
        """Parameters (tied ones once). non_embedding=True leaves out the position table, as nanoGPT reports;
        active=True only counts the experts a token goes to (MoE)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.transformer.wpe, LearnedPositions):
            n -= self.transformer.wpe.weight.numel()
        if active:
            n -= sum(m.inactive_params() for m in self.moe_layers())
        return n

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6 per weight a token multiplies, plus what each token
        mixer and stack of experts declares (attention's scores and weighted values grow with the context)."""
        T = self.config.block_size if seq_len is None else seq_len
        flops = 0
        mtp = set(self.mtp.modules()) if self.config.mtp_depth else set()  # counted apart: shorter sequences
        for module in self.modules():
            if module in mtp:
                continue
            if isinstance(module, nn.Linear):
                flops += 6 * module.weight.numel()
            elif isinstance(module, (TokenMixer, Experts)):
                flops += module.token_flops(T)
        return flops + mtp_flops(self, T)

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilisation: achieved FLOP/s over the device's peak (pass it in: it depends on the device)."""
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    # ------------------------------------------------------------------------- the other files' parts

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer='adamw',
                             muon_lr=0.02, muon_momentum=0.95, fused=True):
        """AdamW, or optimizer='muon': Muon and AdamW (optim.configure_optimizers says which parameters go where)."""
        import optim
        return optim.configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer, muon_lr,
                                          muon_momentum, fused)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                 vocab_limit=None):
        """Continue idx (B, T) by max_new_tokens; temperature 0 is greedy (generate.py, the decoding engine)."""
        import generate
        return generate.generate(self, idx, max_new_tokens, temperature, top_k, top_p, use_cache, vocab_limit)

    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                        vocab_limit=None):
        """Yield (B, 1) new tokens one step at a time (generate.generate_stream)."""
        import generate
        return generate.generate_stream(self, idx, max_new_tokens, temperature, top_k, top_p, use_cache, vocab_limit)

    def compile_decoding(self, backend='inductor', mode=None, keep_cache=None):
        """Compile generate's decoding step (generate.compile_decoding); call again after changing the weights.
        Returns the model."""
        import generate
        return generate.compile_decoding(self, backend, mode, keep_cache)

    def kv_cache_bytes(self, batch_size, seq_len, dtype=torch.float32):
        """Bytes of the cache generate allocates for batch_size sequences of seq_len tokens (a sliding window keeps
        only its last positions, a recurrent layer its state)."""
        import generate
        return generate.cache_bytes(self, batch_size, seq_len, dtype)

    @classmethod
    def from_pretrained(cls, name_or_path, override_args=None):
        """Load a Hugging Face checkpoint (a hub name such as gpt2 ... gpt2-xl, or a local directory) of one
        of the families in hf.HF_FAMILIES into the config that computes the same logits (hf.py, where a
        family is added alone)."""
        import hf
        return hf.from_pretrained(name_or_path, override_args)

    # ------------------------------------------------------------------------- the experts' bookkeeping (MoE)

    def moe_layers(self):
        return [block.mlp for block in self.transformer.h if isinstance(block.mlp, MoE)]

    def moe_report_and_reset(self):
        """Since the last call, the experts' load and balancing losses (moe_report); then every count restarts."""
        return moe_report(self.moe_layers(), reset=True)

    def update_expert_bias(self):
        """After an optimizer step: move the sigmoid routers' balancing biases (config.moe_bias_update_rate)
        by the load since the last step, then restart the counts. With DDP, all-reduce moe_counters() first."""
        for m in self.moe_layers():
            m.balance(self.config.moe_bias_update_rate)

    def reads_expert_load(self):
        """Whether update_expert_bias reads the load (sigmoid routers with a bias step): only then do DDP ranks
        need to sum it every step."""
        return bool(self.moe_layers()) and self.config.router == 'sigmoid' and self.config.moe_bias_update_rate > 0

    def moe_counters(self):
        """The MoE layers' running counts (load, losses): what DDP ranks sum before using them."""
        return [t for m in self.moe_layers() for t in (m.load, m.losses)]

    # ------------------------------------------------------------------------- the indexers' and MTP losses

    def indexers(self):
        return [block.attn.indexer for block in self.transformer.h
                if isinstance(getattr(block.attn, 'indexer', None), LightningIndexer)]

    def mtp_loss_and_reset(self):
        """The MTP modules' mean loss over the training forwards since the last call (None if none); then the
        counts restart: what train.py logs apart from the main loss."""
        return mean_loss_and_reset(self.mtp if self.config.mtp_depth else [])

    def index_loss_and_reset(self):
        """The indexers' mean KL loss over the training forwards since the last call (None if none), then
        the counts restart: what train.py logs apart from the main loss."""
        return mean_loss_and_reset(self.indexers())


# ============================================================================= the later chapters

# ----------------------------------------------------------------------------- mixture of experts (mlp='moe')

def grouped_mm_fits(widths, dtype=torch.bfloat16):
    """F.grouped_mm reads rows that start on 16-byte boundaries: every row stride of its inputs and weights (the
    widths n_embd and the expert's hidden width) must be a multiple of 16 bytes, 8 bf16 values; else it raises."""
    return all(w * dtype.itemsize % 16 == 0 for w in widths)


def _fused_grouped_mm(x, widths):
    """PyTorch's grouped matmul is a fused kernel on CUDA in bf16 (on the CPU a slower loop of its own): for
    bf16 inputs, or under bf16 autocast (which does not cover it), at widths it can read."""
    return x.is_cuda and hasattr(F, 'grouped_mm') and (x.dtype == torch.bfloat16 or (
        torch.is_autocast_enabled('cuda') and torch.get_autocast_dtype('cuda') == torch.bfloat16)) \
        and grouped_mm_fits(widths)


class Experts(nn.Module):
    """n_expert SwiGLU experts as stacked weights: c_fc (E, 2*hidden, d) as [gate | up], c_proj (E, d, hidden)."""

    def __init__(self, config):
        super().__init__()
        E, h, d = config.n_expert, config.expert_hidden, config.n_embd
        self.k, self.limit = config.n_expert_active, config.swiglu_limit
        self.gelu = config.moe_activation == 'gelu'  # GEGLU experts: Gemma 4's chapter
        self.scale_input = config.moe_scale_input  # Llama 4's chapter
        self.c_fc = nn.Parameter(torch.randn(E, 2 * h, d) * 0.02)
        self.c_proj = nn.Parameter(torch.randn(E, d, h) * 0.02)  # GPT rescales it with the other c_proj
        self.c_fc_bias = self.c_proj_bias = None
        if config.moe_bias:  # gpt-oss
            self.c_fc_bias, self.c_proj_bias = nn.Parameter(torch.zeros(E, 2 * h)), nn.Parameter(torch.zeros(E, d))

    def act(self, gate_up):
        """SwiGLU of [gate | up]; with swiglu_limit, gpt-oss's clamped form (gate * sigmoid(1.702 gate), times up + 1)."""
        gate, up = gate_up.chunk(2, dim=-1)
        if self.limit is None:
            return (F.gelu(gate, approximate='tanh') if self.gelu else F.silu(gate)) * up
        gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
        return gate * torch.sigmoid(1.702 * gate) * (up + 1)

    def per_expert(self):
        """Parameters of one expert (from the shapes: a sharded stack needs no gathering)."""
        return math.prod(self.c_fc.shape[1:]) + math.prod(self.c_proj.shape[1:])

    def token_flops(self, seq_len):
        """Forward + backward FLOPs per token: the k experts it goes to, not the others."""
        return 6 * self.k * self.per_expert()

    def forward(self, x, experts, weights):
        """x (N, d); experts, weights (N, k): each token's sum of weight * expert(token), dropless.
        Tokens are grouped by expert so each expert runs one matmul over all its tokens."""
        N, k = experts.shape
        order = experts.flatten().argsort(stable=True)  # the N*k (token, expert) pairs, grouped by expert
        tokens = order // k
        # tokens per expert: a fixed-size scatter, not bincount (whose data-dependent size syncs with the host
        # and breaks a compiled graph)
        flat = experts.flatten()
        counts = torch.zeros(self.c_fc.size(0), dtype=flat.dtype, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        xs, routed = x[tokens], weights.flatten()[order, None]
        if self.scale_input:
            xs = xs * routed.to(xs.dtype)
        biased = self.c_fc_bias is not None
        if _fused_grouped_mm(xs, (self.c_fc.size(2), self.c_proj.size(2))):  # one kernel for all experts, in bf16
            ends = counts.cumsum(0).to(torch.int32)
            bf16 = torch.bfloat16
            gate_up = F.grouped_mm(xs.to(bf16), self.c_fc.to(bf16).transpose(1, 2), offs=ends)
            if biased:
                gate_up = gate_up + self.c_fc_bias.to(bf16)[flat[order]]
            ys = F.grouped_mm(self.act(gate_up), self.c_proj.to(bf16).transpose(1, 2), offs=ends)
            if biased:
                ys = ys + self.c_proj_bias.to(bf16)[flat[order]]
            ys = ys.to(xs.dtype)
        else:  # a loop over experts, not tokens: the slices' sizes are read on the host (one sync per layer)
            ys, start = torch.empty_like(xs), 0
            for e, n in enumerate(counts.tolist()):
                if n:
                    gate_up = F.linear(xs[start:start + n], self.c_fc[e], self.c_fc_bias[e] if biased else None)
                    ys[start:start + n] = F.linear(self.act(gate_up), self.c_proj[e],
                                                   self.c_proj_bias[e] if biased else None)
                    start += n
        if not self.scale_input:
            ys = ys * routed.to(ys.dtype)
        return torch.zeros_like(x).index_add_(0, tokens, ys)


ROUTERS = ('softmax', 'sigmoid')


class MoE(nn.Module):
    """Mixture of experts: each token goes to n_expert_active of n_expert SwiGLU experts, weighted by the
    router, plus n_shared_expert always-on experts (DeepSeekMoE). Dropless: every token is computed by the
    experts it chose, however uneven the choice.

    router='softmax' (Mixtral, Qwen3-MoE): softmax over all experts, top-k. router='sigmoid' (DeepSeek-V3):
    sigmoid scores; a per-expert bias, added only to choose experts, is moved outside the gradient toward
    even load (GPT.update_expert_bias). With groups, a token's experts come from its topk_group best groups (a
    group scored by its best expert, or with sigmoid its best two, as DeepSeek-V2 and V3 do).
    The load and the balancing losses of each forward are kept for logging (moe_report)."""
    gated = True

    def __init__(self, config):
        super().__init__()
        self.k, self.E, self.sigmoid = config.n_expert_active, config.n_expert, config.router == 'sigmoid'
        self.groups, self.topk_group, self.norm_topk = config.n_expert_group, config.topk_group, config.router_norm_topk
        self.scaling, self.aux_coef, self.z_coef = config.routed_scaling, config.moe_aux_loss_coef, config.moe_z_loss_coef
        self.router = nn.Linear(config.n_embd, self.E, bias=config.moe_bias)
        self.experts = Experts(config)
        self.shared = GatedMLP(config, config.n_shared_expert * config.expert_hidden) if config.n_shared_expert else None
        # how much of the shared experts each token takes (Qwen3-Next)
        self.shared_gate = nn.Linear(config.n_embd, 1, bias=False) if config.shared_expert_gate else None
        if self.sigmoid:  # saved: it is part of what the model computes
            self.register_buffer('expert_bias', torch.zeros(self.E))
        self.register_buffer('load', torch.zeros(self.E), persistent=False)  # assignments per expert
        self.register_buffer('losses', torch.zeros(3), persistent=False)  # aux loss, z loss, forwards
        self.dropout = nn.Dropout(config.dropout)
        self.loss = None  # what this forward adds to the training loss

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x).float()
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)
        choice = scores + self.expert_bias if self.sigmoid else scores
        if self.groups > 1:
            grouped = choice.view(-1, self.groups, self.E // self.groups)
            group_score = grouped.topk(min(2, grouped.size(-1)), dim=-1).values.sum(-1) if self.sigmoid \
                else grouped.amax(dim=-1)
            best = group_score.topk(self.topk_group, dim=-1).indices
            keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
            choice = choice.masked_fill(~keep.repeat_interleave(self.E // self.groups, dim=1), float('-inf'))
        experts = choice.topk(self.k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.norm_topk:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        y = self.experts(x, experts, weights * self.scaling)
        if self.shared is not None:
            y = y + (self.shared(x) * torch.sigmoid(self.shared_gate(x)) if self.shared_gate is not None
                     else self.shared(x))
        self._account(logits, scores, experts)
        return self.dropout(y.view(shape))

    def _account(self, logits, scores, experts):
        """Load and balancing losses of this forward: kept for logging, and the training loss's share."""
        counts = torch.zeros_like(self.load).scatter_add_(0, experts.flatten(), torch.ones_like(
            experts.flatten(), dtype=self.load.dtype))
        self.load += counts
        # Switch Transformer: E * sum_e (share of assignments to e) * (mean router probability of e); 1 when even
        share = counts / experts.numel()
        probs = scores / scores.sum(dim=-1, keepdim=True) if self.sigmoid else scores
        aux = self.E * (share * probs.mean(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()  # ST-MoE: keeps router logits small
        self.losses += torch.stack((aux.detach(), z.detach(), torch.ones_like(z)))
        self.loss = self.aux_coef * aux + self.z_coef * z if self.training and (self.aux_coef or self.z_coef) else None

    def inactive_params(self):
        """Parameters of the experts a token does not go to."""
        return (self.E - self.k) * self.experts.per_expert()

    @torch.no_grad()
    def balance(self, rate):
        """DeepSeek-V3's auxiliary-loss-free balancing: each expert's bias moves by `rate` toward even load
        (up if it got less than the mean since the last call, down if more). The load then restarts."""
        if self.sigmoid and rate:
            self.expert_bias += rate * torch.sign(self.load.mean() - self.load)
        self.load.zero_()


MLPS['moe'] = MoE


def moe_report(layers, reset=False):
    """Since the counts last restarted: per MoE layer the share of assignments each expert got, the max/mean
    load, and the mean balancing losses (unweighted); reset: then every count restarts."""
    report = {'load': [], 'max_over_mean': []}
    totals = torch.zeros(3)
    for m in layers:
        load = m.load.float().cpu()
        share = load / load.sum().clamp(min=1)
        report['load'].append([round(v, 4) for v in share.tolist()])
        report['max_over_mean'].append(round((load.max() / load.mean().clamp(min=1e-9)).item(), 3))
        totals += m.losses.cpu()
        if reset:
            m.load.zero_()
            m.losses.zero_()
    if totals[2]:
        report.update(aux_loss=(totals[0] / totals[2]).item(), z_loss=(totals[1] / totals[2]).item())
    return report


# ----------------------------------------------------------------------------- multi-head latent attention (attn='mla')

class LatentAttention(TokenMixer):
    """DeepSeek's multi-head latent attention (MLA). Keys and values are rebuilt, per head, from one small
    latent vector per token, and queries may pass through a bottleneck of their own. Positions live in a
    separate rotated part: each query head has one, and one rotated key (from the token, not the latent) is
    shared by all heads. The KV cache holds only the latent and that shared key.

    Cached decoding uses the absorbed form: the key up-projection is folded into the query, the value
    up-projection into the output, so each step attends over the cached latents directly (as MQA with one
    wide head) instead of rebuilding every past key and value. Training and prefill rebuild them."""

    def __init__(self, config, positions='rope', window=None):
        super().__init__()
        dims = config.mla_dims
        self.positions, self.window = positions, window
        # widths (the tensors of forward have the short names)
        self.n_head, self.latent_dim, self.nope_dim, self.rope_dim, self.v_dim = (
            config.n_head, dims['latent'], dims['nope'], dims['rope'], dims['v'])
        H, d = self.n_head, config.n_embd
        if dims['q_latent']:
            self.q_a = nn.Linear(d, dims['q_latent'], bias=config.bias)
            self.q_a_norm = RMSNorm(dims['q_latent'], config, eps=1e-6)  # DeepSeek's latents: eps 1e-6
            self.q_b = nn.Linear(dims['q_latent'], H * (self.nope_dim + self.rope_dim), bias=False)
            self.q_proj = None
        else:
            self.q_proj = nn.Linear(d, H * (self.nope_dim + self.rope_dim), bias=False)
        self.kv_a = nn.Linear(d, self.latent_dim + self.rope_dim, bias=config.bias)  # [latent | shared rotated key]
        self.kv_norm = RMSNorm(self.latent_dim, config, eps=1e-6)
        self.kv_b = nn.Linear(self.latent_dim, H * (self.nope_dim + self.v_dim), bias=False)  # per head [k_nope | v]
        self.c_proj = nn.Linear(H * self.v_dim, d, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        # the softmax scale follows the query/key width, sharpened as YaRN's DeepSeek form asks
        self.scale = (self.nope_dim + self.rope_dim) ** -0.5
        if config.rope_scaling and config.yarn_mscale_all_dim:
            self.scale *= _yarn_mscale(config.rope_scale, config.yarn_mscale_all_dim) ** 2
        self.absorb = True  # cached decoding in the absorbed form (False: rebuild keys and values; bench.py)
        self.indexer = None  # DeepSeek Sparse Attention's, with index_topk (its chapter)

    def cache_entries(self):
        """The latent and the shared rotated key, for all heads (and an indexer's key)."""
        return {'latent': (1, self.latent_dim + self.rope_dim),  # [latent | rotated key], as decoding reads them
                **(self.indexer.cache_entries() if self.indexer is not None else {})}

    def token_flops(self, seq_len):
        """q.k and att.v over seq_len rebuilt keys (training's form); and an indexer's."""
        width = self.nope_dim + self.rope_dim + self.v_dim
        index = self.indexer.token_flops(seq_len, self.n_head * (self.nope_dim + self.rope_dim)) \
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
            y = attend(q, k, v, mask, self.dropout if self.training else 0.0, self.scale)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, H * self.v_dim)))

    def _absorbed(self, q_nope, q_rope, keys, mask):
        """q.k = (q_nope W_uk) . latent + q_rope . k_rope, and att.v = (att . latent) W_uv^T; keys: the cached
        [latent | k_rope] of every past token; mask: False (every key is the past), or the slots that are (1, S)."""
        w = self.kv_b.weight.view(self.n_head, self.nope_dim + self.v_dim, self.latent_dim)
        q_latent = q_nope @ w[:, :self.nope_dim]  # (B, H, 1, latent)
        # one query per head at the same position: the heads become the queries of one shared "head", so the
        # cache is read once, not repeated per head
        q = torch.cat((q_latent, q_rope), dim=-1).transpose(1, 2)  # (B, 1, H, latent + rope)
        y = attend(q, keys, keys[..., :self.latent_dim], mask, scale=self.scale).transpose(1, 2)
        return y @ w[:, self.nope_dim:].transpose(1, 2)  # (B, H, 1, v)


ATTENTIONS['mla'] = LatentAttention


# ----------------------------------------------------------------------------- long context (rope_scaling)

ROPE_SCALINGS = (None, 'linear', 'dynamic', 'yarn', 'llama3')


def _yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def scaled_frequencies(config, inv, dim, length):
    """RoPE's frequencies inv (rope_frequencies) stretched past the trained length by config.rope_scaling, for
    a sequence of `length` positions (only 'dynamic' depends on it), and the factor on cos and sin; the
    formulas transformers uses."""
    theta, kind = config.rope_theta, config.rope_scaling
    factor, original = config.rope_scale, config.rope_length
    if kind == 'linear':  # position interpolation: positions squeezed `factor` times
        return inv / factor, 1.0
    if kind == 'dynamic':  # NTK-aware: a larger base once the sequence outgrows the original length
        longest = max(length, original)
        base = theta * ((factor * longest / original) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim), 1.0
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
    low, high = dim_turning(config.yarn_beta_fast), dim_turning(config.yarn_beta_slow)
    if config.yarn_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
    attention_factor = config.rope_attention_factor
    if attention_factor is None:
        if config.yarn_mscale and config.yarn_mscale_all_dim:
            attention_factor = _yarn_mscale(factor, config.yarn_mscale) / _yarn_mscale(factor, config.yarn_mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    return inv / factor * ramp + inv * (1 - ramp), attention_factor


# ----------------------------------------------------------------------------- layers of several kinds (layers='LG', 'GGGN')

# local attention: a sliding window of sliding_window tokens (Mistral, Gemma), with its own RoPE base with
# rope_local_theta (Gemma 3); global attention without RoPE, NoPE (SmolLM3, Llama 4)
LAYER_KINDS['L'] = ('local', partial(attention, positions='local', local=True))
LAYER_KINDS['N'] = ('global without RoPE', partial(attention, positions=None))


# ----------------------------------------------------------------------------- attention sinks (attn_sinks)

def _with_sink(q, k, v, mask, sinks, scale):
    """Attention sinks as SDPA inputs: one more key that every query sees, with a zero value, whose logit is the
    head's sink. q gains dims holding sink / scale, the keys dims holding 0 (the sink key: 1), so the real
    logits are unchanged and the sink's is the sink; padded to a multiple of 8 dims for the fused kernels."""
    B, H, T, D = q.shape
    Hk, S = k.size(1), k.size(2)
    pad = 8 - D % 8
    q = torch.cat((q, (sinks / scale).to(q.dtype).view(1, H, 1, 1).expand(B, H, T, 1), q.new_zeros(B, H, T, pad - 1)),
                  dim=-1)
    sink_key = k.new_zeros(B, Hk, 1, D + pad)
    sink_key[..., D] = 1
    k = torch.cat((torch.cat((k, k.new_zeros(B, Hk, S, pad)), dim=-1), sink_key), dim=2)
    v = torch.cat((v, v.new_zeros(B, v.size(1), 1, v.size(-1))), dim=2)
    if isinstance(mask, bool):  # causal: query i is the (S - T + i)-th key
        causal, mask = mask, torch.ones(T, S, dtype=torch.bool, device=q.device)
        mask = mask.tril(S - T) if causal else mask
    return q, k, v, torch.cat((mask, mask.new_ones(T, 1)), dim=-1)


# ----------------------------------------------------------------------------- linear attention: Gated DeltaNet (layers='DDDG')

def l2_normalize(x, eps=1e-6):
    """x over its last dim scaled to unit length (eps inside the root, as Qwen3-Next and fla)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


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
    q, k, v = (F.pad(x, (0, 0, 0, pad)).view(B, H, n, C, -1) for x in (q, k, v))
    g = F.pad(g if g.dim() == 4 else g[..., None], (0, 0, 0, pad)).view(B, H, n, C, -1)  # (..., C, 1 or dk)
    beta = F.pad(beta, (0, pad)).view(B, H, n, C)
    g = g.cumsum(-2)  # G: the decay from the chunk's start to each token, itself included
    below = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    k_beta = k * beta[..., None]
    # the diagonal is taken as 1 (unitriangular), so A's own diagonal does not matter
    A, scores = _decayed_dots((k_beta, q), k, g, below)
    uw = torch.linalg.solve_triangular(A, torch.cat((v * beta[..., None], k_beta * g.exp()), dim=-1),
                                       upper=False, unitriangular=True)
    u, w = uw.split([dv, dk], dim=-1)  # the writes are u - w S0
    q_decayed = q * g.exp()  # reads S0 decayed to each token
    k_decayed = k * (g[..., -1:, :] - g).exp()  # writes decayed to the chunk's end
    out = []
    for i in range(n):
        if state is None:  # a zero state reads and corrects nothing
            u_i = u[:, :, i]
            out.append(scores[:, :, i] @ u_i)
        else:
            u_i = u[:, :, i] - w[:, :, i] @ state
            out.append(q_decayed[:, :, i] @ state + scores[:, :, i] @ u_i)
        if i < n - 1 or final:
            written = k_decayed[:, :, i].transpose(-1, -2) @ u_i
            state = written if state is None else state * g[:, :, i, -1, :, None].exp() + written
    return torch.stack(out, dim=2).view(B, H, n * C, dv)[:, :, :T], state


def _decayed_dots(queries, b, g, below):
    """For each a of queries: a_t.(e^(G_t - G_j) * b_j) for j <= t, 0 above, per chunk: a, b (..., C, dk), G
    (..., C, 1 or dk) summed from the chunk's start; the decays computed once for all. One decay per token
    factors out of the dot product: a matmul. One per channel stays inside it, and the factored form
    (e^G_t * a_t).(e^-G_j * b_j) would overflow: _channel_decayed_dots."""
    if g.size(-1) > 1:
        return _channel_decayed_dots(queries, b, g)
    decay = (g[..., :, None, :] - g[..., None, :, :]).masked_fill(~below[..., None], float('-inf')).exp()[..., 0]
    return [(a @ b.transpose(-1, -2)) * decay for a in queries]


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


def causal_depthwise_conv(x, weight, bias=None, cache=None, name='conv'):
    """Each channel of x (B, channels, T) convolved over its last kernel inputs, its own kernel (weight: a
    depthwise Conv1d's (channels, 1, kernel)), the inputs before the first taken as zeros or, with a cache, as
    the last kernel-1 inputs it keeps under `name` (then overwritten with the new last ones)."""
    kernel = weight.size(-1)
    past = x.new_zeros(x.size(0), x.size(1), kernel - 1) if cache is None else cache.stores[name].to(x.dtype)
    x = torch.cat((past, x), dim=2)
    if cache is not None:
        cache.stores[name].copy_(x[:, :, x.size(2) - (kernel - 1):])
    y = shifted_products(x, weight)
    return y if bias is None else y + bias[:, None]


def shifted_products(x, weight):
    """The depthwise convolution as kernel-many shifted products per channel, summed: torch's FLOP counter
    miscounts a grouped convolution's backward, and on a CPU it runs forward and backward faster than an unfold
    window (no copy of every window) or conv1d."""
    kernel, T = weight.size(-1), x.size(2) - weight.size(-1) + 1
    w = weight.view(weight.size(0), kernel, 1)
    y = x[:, :, :T] * w[:, 0]
    for i in range(1, kernel):
        y = y + x[:, :, i:i + T] * w[:, i]
    return y


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
        per_head = 3 * n * (2 * C * C * dk * 2 + 2 * C * C * dv) + n * 2 * C * C * (dv + dk) \
            + 3 * (n - 1) * 3 * 2 * C * dk * dv
        return self.v_heads * per_head / seq_len

    def forward(self, x, rope=None, mask=None, cache=None):
        """rope and mask are attention's: a DeltaNet has no positions but its order. cache: its stores are read
        (unless fresh) and overwritten."""
        B, T, _ = x.size()
        Hk, Hv, dk, dv = self.k_heads, self.v_heads, self.k_dim, self.v_dim
        fresh = cache is None or cache.fresh
        qkv = causal_depthwise_conv(self.in_proj_qkv(x).transpose(1, 2), self.conv1d.weight, self.conv1d.bias, cache)
        qkv = F.silu(qkv).transpose(1, 2)
        q, k, v = qkv.split([Hk * dk, Hk * dk, Hv * dv], dim=-1)
        q, k = (l2_normalize(t.view(B, T, Hk, dk).transpose(1, 2).float()) for t in (q, k))
        q = q * dk ** -0.5
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
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm.float()
        y = y * self.output_gate(x).view(B, T, Hv, dv)
        return self.resid_dropout(self.c_proj(y.reshape(B, T, Hv * dv).to(x.dtype)))

    def decay(self, x):
        """Each token's log-decay g = -exp(A_log) softplus(a(x) + dt_bias), one per value head (B, Hv, T)."""
        return (-self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())).transpose(1, 2)

    def output_gate(self, x):
        """What the normalized output is multiplied by, per value channel: silu(z(x)), fp32 (B, T, Hv * dv)."""
        return F.silu(self.in_proj_z(x).float())


LAYER_KINDS['D'] = ('Gated DeltaNet', GatedDeltaNet)


# ----------------------------------------------------------------------------- nanochat (norm_gain=False, embed_norm)

# nanochat's block (Karpathy's small chat model): the modern block without any norm weight, on top of the
# speedrun's parts. Every norm module (the blocks', the final one, the QK-norms, MLA's latents; not Gated
# DeltaNet's per-head output norm) is a plain x / RMS(x) with norm_gain=False (LayerNorm then also drops its
# bias), and embed_norm normalizes the first block's input. Its QK-norm comes after RoPE in nanochat's code, but a
# rotation keeps each head's RMS, so a weightless QK-norm before it is the same; its RoPE turns the other way,
# which hf.py converts in the weights (the sign of each head's second half of q and k).
NANOCHAT_BLOCK = {'norm': 'rms', 'norm_gain': False, 'embed_norm': True, 'qk_norm': True, 'mlp': 'relu2',
                  'pos': 'rope', 'bias': False, 'tie_embeddings': False, 'logit_softcap': 15.0}


# ----------------------------------------------------------------------------- Llama 4 (layers='CCCN', nope_temperature, rope_qk_norm, moe_every)

# Llama 4's block: three RoPE layers in four attend in chunks ('C': a query sees only the tokens of its own
# chunk of attention_chunk_size, so the cache keeps one chunk, a ring aligned with the chunks), the fourth is
# global without RoPE ('N'), its queries sharpened with the position (nope_temperature, below) so that attention
# over very long contexts does not flatten; the RoPE layers' queries and keys are scaled to unit RMS after RoPE
# (rope_qk_norm, no weights). Its MoE: a sigmoid router whose weight scales the chosen expert's input
# (moe_scale_input), one shared expert, MoE on every moe_every-th layer, dense SwiGLUs between.

def nope_temperature_scales(config, start, T, device):
    """The factor on the queries of 'N' layers at positions start.. (start: an int, or a (1,) tensor in a
    decoding step): 1 + beta * ln(1 + floor((pos + 1) / F)), 1 for the first F - 1 positions, growing slowly
    after them (Llama 4's attention temperature tuning)."""
    positions = start + torch.arange(T, device=device)
    steps = torch.floor((positions.float() + 1.0) / config.nope_temperature_floor)
    return 1.0 + config.nope_temperature * torch.log1p(steps)


def chunked_attention(config, layer):
    """A RoPE attention layer that sees the tokens of its own chunk only: its window is the chunk."""
    mixer = attention(config, layer)
    mixer.window, mixer.chunked = config.attention_chunk_size, True
    return mixer


LAYER_KINDS['C'] = ('chunked', chunked_attention)
# ----------------------------------------------------------------------------- gated short convolution (layers='VVG': LFM2)


class ShortConv(TokenMixer):
    """LFM2's gated short convolution, a 'V' layer: B, C and x from one projection of the token, then
    y = out(C * conv(B * x)), conv a causal depthwise convolution over the last short_conv_kernel tokens (a
    few). No positions and no softmax: what a token sees of the past is the kernel's reach in this layer, so a
    cache keeps the last kernel-1 gated inputs, whatever the context."""

    def __init__(self, config, layer=0):
        super().__init__()
        d, self.kernel = config.n_embd, config.short_conv_kernel
        self.in_proj = nn.Linear(d, 3 * d, bias=config.bias)  # [B | C | x]
        self.conv1d = nn.Conv1d(d, d, self.kernel, groups=d, bias=config.bias)
        self.c_proj = nn.Linear(d, d, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def cache_states(self):
        return {'conv': ((self.conv1d.in_channels, self.kernel - 1), None)}

    def token_flops(self, seq_len):
        """The convolution multiplies each of its weights once per token, as a Linear does."""
        return 6 * self.conv1d.weight.numel()

    def forward(self, x, rope=None, mask=None, cache=None):
        """rope and mask are attention's: the convolution has no positions but its order."""
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        h = causal_depthwise_conv((b * h).transpose(1, 2), self.conv1d.weight, self.conv1d.bias, cache)
        return self.resid_dropout(self.c_proj(c * h.transpose(1, 2)))


LAYER_KINDS['V'] = ('gated short convolution', ShortConv)


# ----------------------------------------------------------------------------- state-space layers: Mamba-2 (layers='SSSG')

def ssd_chunked(x, dt, A, B, C, chunk, state=None, final=False):
    """Mamba-2's selective state-space recurrence over a sequence, chunk tokens at a time (SSD: inside a chunk
    in parallel, as attention with a decay mask; the state carried from chunk to chunk). x (batch, H, T, P),
    time steps dt (batch, H, T), decay rates A (H,) (negative), B and C (batch, H, T, N), all fp32; state
    (batch, H, P, N) or None (zeros). Returns the outputs (batch, H, T, P) and, with final=True, the state after
    the last token.

    Per token t (the recurrent form): S = e^(dt_t A) S + (dt_t x_t) B_t^T; y_t = S C_t. Inside a chunk, with G_t
    the log-decay summed from the chunk's start and S0 the state before it:
    y_t = e^G_t S0 C_t + sum_(j<=t) e^(G_t - G_j) (C_t.B_j) dt_j x_j."""
    batch, H, T, P = x.shape
    n_chunks, L = -(-T // min(chunk, T)), min(chunk, T)
    pad = n_chunks * L - T  # padded tokens write nothing (x dt = 0) and do not decay (dt A = 0)
    g = F.pad(dt * A[:, None], (0, pad)).view(batch, H, n_chunks, L).cumsum(-1)
    x, B, C = (F.pad(t, (0, 0, 0, pad)).view(batch, H, n_chunks, L, -1) for t in (x * dt[..., None], B, C))
    below = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(~below, float('-inf')).exp()  # e^(G_t - G_j), j <= t
    out = (C @ B.transpose(-1, -2)) * decay @ x  # within each chunk
    C_decayed = C * g.exp()[..., None]  # reads S0 decayed to each token
    x_decayed = x * (g[..., -1:] - g).exp()[..., None]  # writes decayed to the chunk's end
    outs = []
    for i in range(n_chunks):
        outs.append(out[:, :, i] if state is None else out[:, :, i] + C_decayed[:, :, i] @ state.transpose(-1, -2))
        if i < n_chunks - 1 or final:
            written = x_decayed[:, :, i].transpose(-1, -2) @ B[:, :, i]
            state = written if state is None else state * g[:, :, i, -1, None, None].exp() + written
    return torch.stack(outs, dim=2).view(batch, H, n_chunks * L, P)[:, :, :T], state


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
        """The convolution's weights as a Linear's, and per head, as training's chunked form runs them: the
        scores C.B and their product with the inputs inside each chunk, and the state's reads and writes
        (counted at every chunk)."""
        L = min(self.chunk, seq_len)
        P, N = self.head_dim, self.state_dim
        return 6 * self.conv1d.weight.numel() + self.heads * 3 * (2 * L * (N + P) + 2 * 2 * P * N)

    def forward(self, x, rope=None, mask=None, cache=None):
        """rope and mask are attention's: a state-space layer has no positions but its order. cache: its stores
        are read (unless fresh) and overwritten."""
        batch, T, _ = x.size()
        H, P, N, G = self.heads, self.head_dim, self.state_dim, self.groups
        z, xBC, dt = self.in_proj(x).split([H * P, self.conv_width, H], dim=-1)
        xBC = F.silu(causal_depthwise_conv(xBC.transpose(1, 2), self.conv1d.weight, self.conv1d.bias, cache))
        xs, B, C = xBC.transpose(1, 2).float().split([H * P, G * N, G * N], dim=-1)
        xs = xs.view(batch, T, H, P).transpose(1, 2)
        # each group's B and C serve H / G consecutive heads
        B, C = (t.view(batch, T, G, N).transpose(1, 2).repeat_interleave(H // G, dim=1) for t in (B, C))
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(min=self.dt_min).transpose(1, 2)  # (batch, H, T)
        A = -self.A_log.float().exp()
        state = None if cache is None or cache.fresh else cache.stores['state']
        if cache is not None and T == 1:
            y, state = ssd_recurrent(xs, dt, A, B, C, state)
        else:
            chunked = fla_kernel('ssd', xs) or ssd_chunked
            y, state = chunked(xs, dt, A, B, C, self.chunk, state, final=cache is not None)
        if cache is not None:
            cache.stores['state'].copy_(state)
        y = (y + self.D.float()[:, None, None] * xs).transpose(1, 2).reshape(batch, T, H * P)
        y = (y * F.silu(z.float())).view(batch, T, G, -1)
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).view(batch, T, H * P) * self.norm.float()
        return self.resid_dropout(self.c_proj(y.to(x.dtype)))


LAYER_KINDS['S'] = ('Mamba-2', Mamba2)


# ----------------------------------------------------------------------------- layers of one part (Nemotron-H)

class NoMixer(TokenMixer):
    """'-': a layer without a token mixer, its MLP alone (Block builds no norm for a mixer). It declares
    nothing: no positions, nothing cached, no FLOPs."""

    def __init__(self, config, layer=0):
        super().__init__()


LAYER_KINDS['-'] = ('no mixer: the MLP alone', NoMixer)
# ----------------------------------------------------------------------------- Kimi Delta Attention (layers='KKKG', pos='none')

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
    e^(G_t - G_j) = e^(G_t - G_r) e^(G_r - G_j), both at most 1 (G falls): one matmul per sub-chunk of queries.
    Inside a sub-chunk each query gets its own decayed copy of the keys, (s, s, dk) elementwise, then a matmul."""
    C = b.size(-2)
    s = kda_subchunk(C)
    m = C // s
    b, g = b.unflatten(-2, (m, s)), g.unflatten(-2, (m, s))  # (..., m, s, dk)
    start = g[..., :1, :]  # G_r of each sub-chunk
    earlier = torch.arange(m, device=b.device)[:, None] > torch.arange(C, device=b.device)[None, :] // s  # (m, C)
    to_start = (start - g.flatten(-3, -2)[..., None, :, :]).masked_fill(~earlier[..., None], float('-inf')).exp()
    keys_across = (b.flatten(-3, -2)[..., None, :, :] * to_start).transpose(-1, -2)  # (..., m, dk, C)
    from_start = (g - start).exp()
    below = torch.ones(s, s, dtype=torch.bool, device=b.device).tril()
    keys_inside = b[..., None, :, :] * (g[..., :, None, :] - g[..., None, :, :]).masked_fill(
        ~below[..., None], float('-inf')).exp()  # (..., m, s, s, dk): each query's decayed copy
    same = torch.eye(m, dtype=torch.bool, device=b.device)[:, None, :, None]  # query and key sub-chunk alike
    out = []
    for a in queries:
        a = a.unflatten(-2, (m, s))
        across = ((a * from_start) @ keys_across).unflatten(-1, (m, s))  # (..., m, s, m, s)
        inside = (keys_inside * a[..., :, None, :]).sum(-1)  # (..., m, s, s): a product per channel, summed
        out.append(torch.where(same, inside.unsqueeze(-2), across).flatten(-4, -3).flatten(-2, -1))
    return out


class KimiDeltaAttention(GatedDeltaNet):
    """Kimi Delta Attention (Kimi Linear), a 'K' layer: a Gated DeltaNet whose state forgets at a rate per key
    channel instead of one per head, g = -exp(A_log) softplus(f(x) + dt_bias), with f a low-rank projection
    (n_embd -> kda_rank -> heads * key dim), A per head and dt_bias per channel; its output gate is
    sigmoid(a low-rank projection) instead of silu(z(x)). The rest is the 'D' layer's: the short convolution
    over q, k and v, L2-normalized q and k, beta = sigmoid(b(x)), the RMS-normalized output, the cache, and
    the chunked and recurrent forms (gated_delta_chunked takes a decay per channel)."""
    decay_per_channel = True

    def __init__(self, config, layer=0):
        super().__init__(config, layer)
        del self.in_proj_z, self.in_proj_a  # the 'D' layer's gate and decay, per head: replaced by low-rank ones
        d, rank = config.n_embd, config.kda_rank or self.k_dim
        self.A_log, self.dt_bias = decay_parameters(self.v_heads, self.v_heads * self.k_dim)
        self.decay_a = nn.Linear(d, rank, bias=False)
        self.decay_b = nn.Linear(rank, self.v_heads * self.k_dim, bias=False)
        self.gate_a = nn.Linear(d, rank, bias=False)
        self.gate_b = nn.Linear(rank, self.v_heads * self.v_dim, bias=False)

    def decay(self, x):
        """Each token's log-decay per value head and key channel (B, Hv, T, dk)."""
        B, T, _ = x.size()
        f = (self.decay_b(self.decay_a(x)).float() + self.dt_bias.float()).view(B, T, self.v_heads, self.k_dim)
        return (-self.A_log.float().exp()[:, None] * F.softplus(f)).transpose(1, 2)

    def output_gate(self, x):
        return torch.sigmoid(self.gate_b(self.gate_a(x)).float())


LAYER_KINDS['K'] = ('Kimi Delta Attention', KimiDeltaAttention)


class NoPositions(nn.Module):
    """pos='none': no position information at all, neither a table nor rotations (Kimi Linear, whose recurrent
    layers know the order and whose attention is MLA without RoPE: its 'rotated' part, if any, is not rotated)."""

    def __init__(self, config):
        super().__init__()

    def forward(self, x, start):
        return x, None


POSITIONS['none'] = NoPositions
# ----------------------------------------------------------------------------- sparse attention: DeepSeek's lightning indexer (index_topk)


def mean_loss_and_reset(modules):
    """The mean loss the modules summed in their `losses` buffers ([sum, forwards]), None if none; then zeros."""
    totals = sum((m.losses.cpu() for m in modules), torch.zeros(2))
    for m in modules:
        m.losses.zero_()
    return (totals[0] / totals[1]).item() if totals[1] else None


def visible_keys(mask, T, S, device):
    """attend's mask as a boolean (T, S) tensor (or the (1, S) of a decoding step): which keys each query sees."""
    if isinstance(mask, torch.Tensor):
        return mask
    if mask is False or (mask is None and T == 1):
        return torch.ones(T, S, dtype=torch.bool, device=device)
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)  # causal: query i is key S - T + i


def top_k_earliest(scores, k):
    """(..., S) bool: each row's k highest scores, of equal scores the earliest (a stable sort's choice), found with
    topk, not a sort: a decoding step's cost at 8k positions was the sort's."""
    kth = scores.topk(k, dim=-1).values[..., -1:]
    above, tied = scores > kth, scores == kth
    return above | (tied & (tied.cumsum(-1) <= k - above.sum(-1, keepdim=True)))


class LightningIndexer(nn.Module):
    """DeepSeek Sparse Attention's indexer (DeepSeek-V3.2): a cheap score of every past token for each query, so
    the layer's attention reads only the index_topk highest. Its own small query heads (from the queries' input),
    one key per token (LayerNorm'd), the first rope_dim dims of both rotated; score(query t, token s) = sum over
    its heads h of w_h(t) * ReLU(q_h(t).k(s)), the weights w from the token too. A cache keeps its keys.

    It learns from its own loss (learn): the KL divergence from the main attention's distribution (summed over
    heads, renormalized, outside the gradient) to the softmax of its scores, over the keys the attention reads.
    Its inputs are detached, so the loss moves the indexer alone and the language-model loss the rest.
    index_stage='dense' is the warm-up: the attention reads every past token while the indexer learns to score
    them; 'sparse' reads the top-k."""

    def __init__(self, config, query_width):
        super().__init__()
        self.n_head, self.head_dim, self.topk = config.index_n_heads, config.index_head_dim, config.index_topk
        self.dense, self.loss_coef = config.index_stage == 'dense', config.index_loss_coef
        self.wq = nn.Linear(query_width, self.n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(config.n_embd, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)  # DeepSeek's: a LayerNorm with a bias
        self.weights = nn.Linear(config.n_embd, self.n_head, bias=False)
        self.register_buffer('losses', torch.zeros(2), persistent=False)  # KL summed, forwards
        self.loss = None  # what this forward adds to the training loss (times index_loss_coef)
        self._scores = self._reads = None  # this forward's, for learn

    def cache_entries(self):
        return {'index_k': (1, self.head_dim)}

    def token_flops(self, seq_len, qk_width):
        """Its scores over seq_len keys (forward and backward), and the main attention's q.k once more for the
        loss's target (forward only); the attention itself reads every key in training (masked). GPT counts 6 per
        weight of every Linear: the indexer's inputs are detached, so its Linears take no input gradient (4 per
        weight), and without its loss (index_loss_coef=0) nothing of it runs backward (2)."""
        learns = bool(self.loss_coef)
        weights = sum(m.weight.numel() for m in (self.wq, self.wk, self.weights))
        scores = (3 if learns else 1) * 2 * self.n_head * self.head_dim * seq_len
        target = 2 * qk_width * seq_len if learns else 0
        return scores + target - (2 if learns else 4) * weights

    def scores(self, x, q_in, rope, cache):
        """(B, T, S): every new query's score of every key it may see (a cache's too)."""
        B, T, _ = x.shape
        x, q_in = x.detach(), q_in.detach()
        q = self.wq(q_in).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(self.wk(x)).unsqueeze(1)  # (B, 1, T, D): one key for all heads
        if rope is not None:  # the tables' width: the first rope_dim dims turn, the rest pass
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, = cache.update(index_k=k)
        # the heads' queries as rows of one matrix per sequence (a broadcast over heads would copy the keys)
        dots = q.float().reshape(B, -1, self.head_dim) @ k.float().squeeze(1).transpose(-1, -2)
        dots = F.relu(dots.view(B, self.n_head, T, -1)) * self.head_dim ** -0.5  # (B, H, T, S)
        w = self.weights(x).float() * self.n_head ** -0.5  # (B, T, H)
        return (w.transpose(1, 2).unsqueeze(-1) * dots).sum(1)

    def narrow(self, x, q_in, rope, mask, cache, *keys):
        """The attention's mask for the picked keys, and its keys (B, heads, S, dim): as they are, or in a
        decoding step (one query, a cache) only the index_topk picked, so the step reads k entries, not S."""
        self.selection = self.select(x, q_in, rope, mask, cache)  # what layers sharing it read too
        return read_selected(self.selection, keys)

    def select(self, x, q_in, rope, mask, cache):
        """(the attention's mask, None), or in a decoding step (the mask of the k picked, their slots (B, 1, k, 1))."""
        scores = self.scores(x, q_in, rope, cache)
        B, T, S = scores.shape
        reads = visible_keys(mask, T, S, x.device)
        self._scores, self._reads = scores, reads
        if self.dense or self.topk >= S:  # every visible key is picked: the dense attention, as it is
            return mask, None
        # the k best; of equal scores (ReLU makes zeros common) the earliest keys, so a decoding step over the
        # cache's slots picks what a forward over the sequence picks (a key's slot is its position)
        picked = top_k_earliest(scores.masked_fill(~reads, float('-inf')), self.topk)  # (B, T, S), k per row
        if T == 1 and cache is not None:  # the k picked slots, in order: a topk of their positions
            positions = torch.arange(S, device=x.device)
            slots = torch.where(picked[:, 0], positions, positions + S).topk(self.topk, largest=False).indices
            seen = reads.expand(B, S).gather(1, slots)  # a pick among unwritten slots sees nothing
            return seen[:, None, None, :], slots[:, None, :, None]
        self._reads = picked & reads
        return self._reads[:, None], None

    def learn(self, q, k, scale):
        """In training, the KL loss of this forward (self.loss) from the main attention's queries q (B, H, T, dim)
        and keys k (B, H or fewer, S, dim), over the keys the attention read."""
        self.loss = None
        if not (self.training and self.loss_coef):
            return
        reads, log_index = self._reads, self._scores.masked_fill(~self._reads, float('-inf')).log_softmax(-1)
        with torch.no_grad():
            k = k.repeat_interleave(q.size(1) // k.size(1), dim=1) if k.size(1) != q.size(1) else k
            logits = (q.float() @ k.float().transpose(-1, -2)) * (q.size(-1) ** -0.5 if scale is None else scale)
            target = logits.masked_fill(~reads.unsqueeze(-3), float('-inf')).softmax(-1).sum(1)
            target = target / target.sum(-1, keepdim=True)
        kl = (torch.xlogy(target, target) - target * log_index.masked_fill(~reads, 0.0)).sum(-1).mean()
        self.losses += torch.stack((kl.detach(), torch.ones_like(kl.detach())))
        self.loss = kl


def read_selected(selection, keys):
    """An indexer's selection applied: (its mask, the keys as they are or, in a decoding step, the picked slots)."""
    mask, slots = selection
    if slots is not None:  # index_select per sequence: 2.6x (batch 1) to 13x (batch 8) faster than one advanced
        # index or a gather expanded over heads and dims, on a CPU at 8k slots
        pick = lambda t, b: t[b].index_select(1, slots[b, 0, :, 0])
        keys = [pick(t, 0)[None] if t.size(0) == 1 else torch.stack([pick(t, b) for b in range(t.size(0))])
                for t in keys]  # one sequence: no stack, which would copy the picked entries once more
    return (mask, *keys)


class SharedIndex(nn.Module):
    """GLM-5's IndexCache: a layer with no indexer of its own reads the keys the nearest earlier indexer picked
    for the same queries (index_share 'S'); its cache keeps no indexer keys, and it adds no loss."""

    def __init__(self):
        super().__init__()
        self.source = []  # [the earlier layer's LightningIndexer] (a list: not a submodule, its weights not ours)

    def cache_entries(self):
        return {}

    def token_flops(self, seq_len, qk_width):
        return 0

    def narrow(self, x, q_in, rope, mask, cache, *keys):
        return read_selected(self.source[0].selection, keys)

    def learn(self, q, k, scale):
        pass


def _with_indexer(build):
    """A layer kind's builder whose global attention layers get an indexer when index_topk is set (or, marked
    'S' in index_share, a SharedIndex; share_indices links it)."""
    def build_layer(config, layer):
        mixer = build(config, layer)
        if config.index_topk is not None and mixer.window is None:
            q_width = config.mla_dims['q_latent'] if config.attn == 'mla' else 0
            mixer.indexer = SharedIndex() if config.index_shares[layer] else \
                LightningIndexer(config, q_width or config.n_embd)
        return mixer
    return build_layer


def share_indices(blocks):
    """Each SharedIndex reads the nearest earlier layer's indexer."""
    last = None
    for block in blocks:
        indexer = getattr(block.attn, 'indexer', None)
        if isinstance(indexer, SharedIndex):
            indexer.source[:] = [last]
        elif indexer is not None:
            last = indexer


for _letter in ('G', 'N'):  # global attention, with RoPE or without (local layers read their window already)
    LAYER_KINDS[_letter] = (LAYER_KINDS[_letter][0], _with_indexer(LAYER_KINDS[_letter][1]))
INDEX_STAGES = ('dense', 'sparse')


# ----------------------------------------------------------------------------- multi-token prediction (mtp_depth)

class MTPModule(nn.Module):
    """One depth of DeepSeek-V3's multi-token prediction: the previous depth's hidden state of token i (the main
    model's at the first) and the embedding of token i + k, both normalized, concatenated and projected, pass one
    block (the last layer's kind) and a norm; the shared head then predicts token i + k + 1."""

    def __init__(self, config):
        super().__init__()
        self.norm_h, self.norm_e, self.norm = make_norm(config), make_norm(config), make_norm(config)
        self.proj = nn.Linear(2 * config.n_embd, config.n_embd, bias=False)
        self.block = Block(config, config.n_layer - 1)
        self.apply(partial(GPT._init_weights, None))
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):  # GPT-2's scaled init, as the model's blocks
                nn.init.normal_(p, mean=0.0, std=0.0 if config.zero_init else 0.02 / math.sqrt(2 * config.n_layer))
        self.register_buffer('losses', torch.zeros(2), persistent=False)  # loss summed, forwards

    def forward(self, h, embedded, tables):
        """h, embedded (B, L, n_embd) -> this depth's hidden states (B, L, n_embd), before its norm."""
        x = self.proj(torch.cat((self.norm_h(h), self.norm_e(embedded)), dim=-1))
        mixer = self.block.attn
        mask = causal_mask(x.size(1), mixer.window, x.device)
        return self.block(x, tables[mixer.positions], x.size(1) > 1 if mask is None else mask)


def mtp_flops(model, T):
    """Training FLOPs of the MTP modules per token of a T-token sequence: depth k runs over T - k tokens (its
    Linears, its block's mixer and experts, the shared head); none at weight 0 (not computed)."""
    if not (model.config.mtp_depth and model.config.mtp_loss_coef):
        return 0
    flops = 0
    for k, module in enumerate(model.mtp, start=1):
        L = T - k
        if L < 1:
            break
        per_token = 6 * model.lm_head.weight.numel()
        for part in module.modules():
            if isinstance(part, nn.Linear):
                per_token += 6 * part.weight.numel()
            elif isinstance(part, (TokenMixer, Experts)):
                per_token += part.token_flops(L)
        flops += per_token * L
    return flops / T


def rotary_tables(model, x):
    """The rotary tables of x's positions 0.. by kind, as GPT.embed gives them (learned positions: none)."""
    rope = model.transformer.wpe(x, 0)[1]
    return {'rope': rope, 'local': rope if model.rope_local is None else model.rope_local(x, 0)[1], None: None}


def mtp_states(model, module, h, tokens):
    """One depth's hidden states (B, L, n_embd) from the previous depth's h and the tokens (B, L) one further on."""
    embedded = model.transformer.wte(tokens)
    if model.config.embed_scale:
        embedded = embedded * model.config.n_embd ** 0.5
    return module(h, embedded, rotary_tables(model, embedded))


def mtp_loss(model, h, targets):
    """The mean over depths of each MTP module's loss: at depth k, position i reads the token i + k (targets'
    i + k - 1) and predicts the next (targets' i + k); the sequence shortens by one a depth."""
    T = targets.size(1)
    losses = []
    for k, module in enumerate(model.mtp, start=1):
        L = T - k
        if L < 1:
            break
        h = mtp_states(model, module, h[:, :L], targets[:, k - 1:T - 1].clamp(min=0))  # -1 (ignored) reads token 0
        logits = model.logits(module.norm(h))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets[:, k:].reshape(-1), ignore_index=-1)
        module.losses += torch.stack((loss.detach(), torch.ones_like(loss.detach())))
        losses.append(loss)
    return sum(losses) / len(losses)


# ------------------------------------------------------------------ Gemma 4: K = V, K/V sharing (attn_k_eq_v, kv_shared_layers)

# Gemma 4's global layers make their keys and values in one projection (attn_k_eq_v): the keys are normalized
# (qk_norm) and rotated, the values are the same projection normalized without a gain and not rotated; the cache
# keeps both.

# Gemma 4 (as Gemma 3n before it) saves cache and compute at the top of the stack: its last kv_shared_layers
# layers make queries only and attend over the keys and values of the last earlier layer of their own kind (a
# local layer a local layer's, a global one a global one's), as that layer left them: normalized, rotated, and
# from the cache. Nothing of theirs is cached, so the cache holds only the layers below (kv_cache_bytes), and
# their K/V projections are gone (parameters and FLOPs). The keys and values pass through each layer's part of
# the cache: the source layer's is wrapped to keep what it returns (KVHandoff), and each sharing layer's
# update returns those (SharedKV), whatever it was given (its own, of no heads).
KV_SHARING_KINDS = 'GLNC'  # the layer kinds of softmax attention over cached keys and values
GLOBAL_KINDS = 'GN'  # global layers: attn_k_eq_v's, global_head_dim's, global_n_kv_head's


def kv_source(config, layer):
    """The layer whose keys and values `layer` attends over, or None when it makes its own: the last layer
    before the shared ones of its kind."""
    first_shared = config.n_layer - config.kv_shared_layers
    if layer < first_shared:
        return None
    kinds = config.layer_kinds
    return max(i for i in range(first_shared) if kinds[i] == kinds[layer])


def gemma4_attention(config, layer):
    """The switches of Gemma 4's attention that a layer takes (CausalSelfAttention's keywords): kv_shared when it
    reads an earlier layer's keys and values, k_eq_v when its keys are its values (a global layer's, attn_k_eq_v), and a
    global layer's head width and K/V heads."""
    is_global = config.layer_kinds[layer] in GLOBAL_KINDS
    switches = {'kv_shared': kv_source(config, layer) is not None}
    switches['k_eq_v'] = config.attn_k_eq_v and is_global and not switches['kv_shared']
    if is_global:
        switches.update(head_size=config.global_head_dim, n_kv_head=config.global_n_kv_head)
    return {name: value for name, value in switches.items() if value}  # none for a layer as any other (MLA's too)


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
    """Each layer's part of the cache (caches: one per layer, None without a cache) as its mixer gets it: with
    kv_shared_layers, a source layer's wrapped in a KVHandoff and a sharing layer's reading it."""
    if not config.kv_shared_layers:
        return caches
    caches, handoffs = list(caches), {}
    for layer in range(config.n_layer):
        source = kv_source(config, layer)
        if source is not None:
            if source not in handoffs:
                handoffs[source] = caches[source] = KVHandoff(caches[source])
            caches[layer] = SharedKV(handoffs[source])
    return caches


# ----------------------------------------------------------------------------- Gemma 4: global layers' shapes and RoPE

# Gemma 4's global layers are shaped apart from its local ones: wider heads (global_head_dim, 512 beside 256) and
# fewer K/V heads (global_n_kv_head), so the few layers that see the whole context carry more per head and cache
# less. Their RoPE is "proportional" (rope_proportion, 0.25): over the whole head, only the first quarter of the
# rotation pairs (i, i + head/2) turn, at frequencies theta^(-2i/head) as if every pair did, and the rest keep zero
# frequency (cos 1, sin 0: those dims carry no position), laid out as transformers lays them out.

def proportional_frequencies(proportion, theta, dim):
    """The dim/2 frequencies of proportional RoPE: the first int(proportion * dim // 2) of plain RoPE's, then zeros."""
    turning = int(proportion * dim // 2)
    inv = 1.0 / theta ** (torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / dim)
    return torch.cat((inv, torch.zeros(dim // 2 - turning)))


# ----------------------------------------------------------------------------- Gemma 4: the MoE block (moe_dense_mlp)

# Gemma 4's MoE model (26B-A4B) keeps a dense MLP in every layer and adds the experts beside it: the two branches
# each normalize their input and output, and their sum is the block's MLP output. Its router reads the stream
# itself: x / RMS(x) times a learned vector and 1/sqrt(n_embd), a softmax over the experts, the top k renormalized
# and times a learned scale of each chosen expert. Experts and dense MLP are GEGLU (moe_activation='gelu').

class DenseAndExperts(MoE):
    """A dense gated MLP (ffn_hidden) beside the experts: ln_dense_out(dense(ln(x))) + ln_experts_out(experts(
    ln_experts(x))), x the un-normalized stream (Block's ln_2 is then an identity)."""

    def __init__(self, config):
        super().__init__(config)
        self.dense = GatedMLP(config)
        self.dense.silu = config.moe_activation == 'silu'
        self.ln, self.ln_dense_out = make_norm(config), make_norm(config)
        self.ln_experts, self.ln_experts_out = make_norm(config), make_norm(config)
        self.router_scale = nn.Parameter(torch.ones(config.n_embd))  # on the router's normalized input
        self.expert_scale = nn.Parameter(torch.ones(config.n_expert))  # on each chosen expert's weight
        self.eps = config.norm_eps

    def forward(self, x):
        shape = x.shape
        dense = self.ln_dense_out(self.dense(self.ln(x)))
        x = x.reshape(-1, shape[-1])
        routed = F.rms_norm(x, (shape[-1],), eps=self.eps) * self.router_scale * shape[-1] ** -0.5
        logits = self.router(routed).float()
        scores = logits.softmax(dim=-1)
        weights, experts = scores.topk(self.k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True) * self.expert_scale[experts]
        y = self.ln_experts_out(self.experts(self.ln_experts(x), experts, weights))
        self._account(logits, scores, experts)
        return self.dropout(dense + y.view(shape))


# ----------------------------------------------------------------------------- Gemma 4: per-layer embeddings (per_layer_embd)

# Gemma 4's small models give every layer a vector of its own for each token: a second embedding table, narrow
# (per_layer_embd per layer, all layers' side by side in one row), looked up by the token, plus a projection of the
# main embedding (which sees the token's context-free meaning at full width), normalized; the two averaged (times
# 1/sqrt(2)). After each layer's MLP, a gated projection adds it: x + norm(up(gelu(gate(x)) * its vector)), so the
# stream can fetch token-specific facts layer by layer from a table that costs lookups, not FLOPs.

def per_layer_embeddings(config):
    """The model's parts of it: the narrow table (scaled by sqrt(per_layer_embd) on lookup), the projection of the
    main embedding to every layer's width (scaled by n_embd**-0.5), and the norm of each layer's projection."""
    width = config.n_layer * config.per_layer_embd
    return {'wte_per_layer': nn.Embedding(config.vocab_size, width),
            'per_layer_proj': nn.Linear(config.n_embd, width, bias=False),
            'per_layer_norm': RMSNorm(config.per_layer_embd, config)}


def per_layer_inputs(transformer, idx, x):
    """Every layer's vector of each token (B, T, n_layer, per_layer_embd): from idx and its embeddings x."""
    per_layer = transformer.per_layer_norm.shape[0]
    shape = (*idx.shape, -1, per_layer)
    looked_up = transformer.wte_per_layer(idx).view(shape) * per_layer ** 0.5
    projected = transformer.per_layer_norm((transformer.per_layer_proj(x) * x.size(-1) ** -0.5).view(shape))
    return (projected + looked_up) * 2 ** -0.5


def after_block(block, x, tables):
    """What Gemma 4 does after a block: its per-layer embedding's branch, then the layer scalar."""
    if block.per_layer is not None:
        x = block.per_layer(x, tables['per_layer'])
    if hasattr(block, 'layer_scalar'):
        x = x * block.layer_scalar
    return x


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


# ============================================================================= machinery

# ----------------------------------------------------------------------------- maintained CUDA kernels (flash-linear-attention)

# On CUDA, where flash-linear-attention is installed, the chunked forms of the 'D', 'K' and 'S' layers run its
# Triton kernels (training and prefill; a decoding step stays the recurrent form, one token). Each adapter below
# keeps the PyTorch form's contract: (batch, heads, T, dim) in, fp32, the state's layout ours. Mamba-2's SSD is
# fla's simple GLA (a scalar log-decay per head and token): queries C, keys B, values dt x, log-decay dt A.
# tests/test_gpu.py holds each against the PyTorch form; USE_FLA = False runs the PyTorch forms on CUDA too.
USE_FLA = True


@lru_cache(maxsize=None)
def fla_ops():
    """flash-linear-attention's chunked kernels by the form they replace, or None when it is not installed."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.kda import chunk_kda
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError:
        return None
    return {'gated_delta': chunk_gated_delta_rule, 'kda': chunk_kda, 'ssd': chunk_simple_gla}


def fla_kernel(form, x):
    """The kernel adapter for `form` ('gated_delta', 'kda', 'ssd') when x is on CUDA and fla is installed, else
    None (the caller runs the PyTorch form)."""
    ops = fla_ops() if USE_FLA and x.is_cuda else None
    return None if ops is None else partial(FLA_ADAPTERS[form], ops[form])


def _heads_second(*tensors):
    """(batch, heads, T, ...) <-> (batch, T, heads, ...), contiguous (the kernels index them flat)."""
    return [t.transpose(1, 2).contiguous() for t in tensors]


@torch.compiler.disable  # torch.compile runs the kernel as it is: dynamo does not trace Triton's launchers
def _fla_delta(kernel, q, k, v, g, beta, chunk, state=None, final=False):
    """gated_delta_chunked through fla's chunk_gated_delta_rule or chunk_kda (their own chunk size; q comes
    scaled, so scale 1)."""
    out, state = kernel(*_heads_second(q, k, v, g, beta), scale=1.0, initial_state=state, output_final_state=final)
    return out.transpose(1, 2), state


@torch.compiler.disable
def _fla_ssd(kernel, x, dt, A, B, C, chunk, state=None, final=False):
    """ssd_chunked through fla's chunk_simple_gla: its state (heads, values, keys) = ours (heads, P, N)."""
    q, k, v, g = _heads_second(C, B, x * dt[..., None], dt * A[:, None])
    out, state = kernel(q, k, v, g=g, scale=1.0, initial_state=state, output_final_state=final, state_v_first=True)
    return out.transpose(1, 2), state


FLA_ADAPTERS = {'gated_delta': _fla_delta, 'kda': _fla_delta, 'ssd': _fla_ssd}


# Each swap: the flag it sets, GPT-2's value, and the modern (Llama/Qwen-style) value; a callable value
# depends on the config's other flags. bench.py's variants, ablate.py's grid groups and the recipes' tests
# are built from this table.
SWAPS = {
    'rms': ('norm', 'layernorm', 'rms'),
    'swiglu': ('mlp', 'gelu', 'swiglu'),
    'gqa': ('n_kv_head', None, lambda flags: max(1, flags['n_head'] // 2)),  # half the KV cache
    'rope': ('pos', 'learned', 'rope'),
}


# The next chapter's swaps, each on top of the modern block, with the published defaults: bench.py's variants
# (ablate.py's moe and attention groups vary them).
BEYOND_MODERN = {
    'moe': {'mlp': 'moe', 'n_expert': 8, 'n_expert_active': 2, 'moe_aux_loss_coef': 0.01},  # Mixtral's shape
    'mla': {'attn': 'mla', 'n_kv_head': None},  # DeepSeek-V2's proportions to the head width
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


# Flags that change no weight: a trained model can be evaluated, sampled or trained on with other values of
# these (a longer context with RoPE scaling or a window, dropout), so the scripts take them from the run.
RUNTIME_FLAGS = ('block_size', 'dropout', 'sliding_window', 'rope_scaling', 'rope_factor', 'rope_original_length',
                 'rope_low_freq_factor', 'rope_high_freq_factor', 'yarn_beta_fast', 'yarn_beta_slow', 'yarn_mscale',
                 'yarn_mscale_all_dim', 'rope_attention_factor', 'yarn_truncate', 'index_stage', 'index_loss_coef',
                 'mtp_loss_coef')


# Renamed flags: old name -> (new name, {old value: new value}). Old checkpoints load through upgrade_args, and
# configurator.py reads this table to tell a user the setting that replaced an old one.
RENAMED_FLAGS = {'prenorm': ('norm_position', {True: 'pre', False: 'post'})}


def upgrade_args(args):
    """A saved config's flags under today's names (checkpoints from before norm_position said prenorm)."""
    args = dict(args)
    for old, (new, values) in RENAMED_FLAGS.items():
        if old in args:
            value = args.pop(old)
            args.setdefault(new, values.get(value, value))
    return args


# ----------------------------------------------------------------------------- the config's checks, as tables

def _int(value, low=1, high=None):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kinds(names, kind):
    return dict.fromkeys(names.split(), kind)


# What each field holds: {field: (whether a value is allowed, given the config; what is allowed, in words)}, in
# the order checked (a field's range may depend on one checked before it). Message: "{field} must be {allowed}".
POSITIVE_INT = (lambda v, c: _int(v), 'a positive int')
OPTIONAL_POSITIVE_INT = (lambda v, c: v is None or _int(v), 'None or a positive int')
POSITIVE_NUMBER = (lambda v, c: v is None or (_number(v) and v > 0), 'a positive number')  # or None
NON_NEGATIVE_NUMBER = (lambda v, c: _number(v) and v >= 0, 'a number >= 0')
BOOL = (lambda v, c: isinstance(v, bool), 'True or False')
FIELD_TYPES = {
    **_kinds('block_size vocab_size n_layer n_head n_embd multiple_of n_expert n_expert_group topk_group', POSITIVE_INT),
    'n_expert_active': (lambda v, c: _int(v, 1, c.n_expert), lambda c: f"an int in [1, n_expert={c.n_expert}]"),
    **_kinds('n_shared_expert first_dense_layers', (lambda v, c: _int(v, 0), 'an int >= 0')),
    **_kinds('ffn_hidden head_dim sliding_window rope_original_length moe_hidden', OPTIONAL_POSITIVE_INT),
    'n_kv_head': (lambda v, c: v is None or _int(v, 1, c.n_head), lambda c: f"None or an int in [1, n_head={c.n_head}]"),
    # MLA's widths: a query bottleneck and a rotated part may be absent (0)
    **_kinds('kv_lora_rank qk_nope_head_dim v_head_dim', (lambda v, c: v is None or _int(v), 'None or an int >= 0')),
    **_kinds('q_lora_rank qk_rope_head_dim', (lambda v, c: v is None or _int(v, 0), 'None or an int >= 0')),
    **_kinds('linear_n_key_head linear_n_value_head linear_key_dim linear_value_dim', OPTIONAL_POSITIVE_INT),
    **_kinds('linear_conv_kernel linear_chunk_size', (lambda v, c: _int(v), 'an int >= 1')),
    'short_conv_kernel': (lambda v, c: _int(v), 'an int >= 1'),
    **_kinds('ssm_n_head ssm_head_dim', OPTIONAL_POSITIVE_INT),
    **_kinds('ssm_state_dim ssm_n_groups ssm_conv_kernel ssm_chunk_size', (lambda v, c: _int(v), 'an int >= 1')),
    'ssm_dt_min': NON_NEGATIVE_NUMBER,
    'mlp_with_mixer': BOOL,
    'kda_rank': OPTIONAL_POSITIVE_INT,
    'linear_neg_eigval': BOOL,
    'linear_norm_eps': POSITIVE_NUMBER,
    'linear_norm_position': (lambda v, c: v is None or v in NORM_POSITIONS,
                             f"None or one of {', '.join(map(repr, NORM_POSITIONS))}"),
    'rope_fraction': (lambda v, c: _number(v) and 0 < v <= 1, 'in (0, 1]'),
    'dropout': (lambda v, c: _number(v) and 0 <= v < 1, 'in [0, 1)'),
    **_kinds('norm_eps rope_theta rope_factor rope_low_freq_factor rope_high_freq_factor yarn_beta_fast '
             'yarn_beta_slow rope_attention_factor routed_scaling rope_local_theta attn_scale logit_softcap '
             'swiglu_limit', POSITIVE_NUMBER),
    **_kinds('yarn_mscale yarn_mscale_all_dim moe_aux_loss_coef moe_z_loss_coef moe_bias_update_rate',
             NON_NEGATIVE_NUMBER),
    **_kinds('bias tie_embeddings zero_init qkv_bias qk_norm router_norm_topk attn_sinks attn_gate qk_norm_all_heads '
             'embed_scale yarn_truncate moe_bias shared_expert_gate', BOOL),
    **_kinds('norm_gain embed_norm', BOOL),
    # Llama 4's
    **_kinds('nope_temperature_floor moe_every', POSITIVE_INT),
    'attention_chunk_size': OPTIONAL_POSITIVE_INT,
    'nope_temperature': POSITIVE_NUMBER,
    **_kinds('rope_qk_norm moe_scale_input', BOOL),
    # DeepSeek Sparse Attention
    'index_topk': OPTIONAL_POSITIVE_INT,
    **_kinds('index_n_heads index_head_dim', POSITIVE_INT),
    'index_stage': (lambda v, c: v in INDEX_STAGES, f"one of {', '.join(map(repr, INDEX_STAGES))}"),
    'index_loss_coef': NON_NEGATIVE_NUMBER,
    'index_share': (lambda v, c: v is None or (isinstance(v, str) and v and not set(v) - set('FS')
                                               and len(v) <= c.n_layer),
                    lambda c: f"None or a string of 'F' (own indexer) and 'S' (shares an earlier one's top-k) at most "
                              f"n_layer={c.n_layer} long, tiled over the layers"),
    # multi-token prediction
    'mtp_depth': (lambda v, c: _int(v, 0), 'an int >= 0'),
    'mtp_loss_coef': NON_NEGATIVE_NUMBER,
    # Gemma 4's
    'kv_shared_layers': (lambda v, c: _int(v, 0, c.n_layer - 1), lambda c: f"an int in [0, n_layer-1={c.n_layer - 1}]"),
    'attn_k_eq_v': BOOL,
    'per_layer_embd': (lambda v, c: _int(v, 0), 'an int >= 0'),
    **_kinds('v_norm layer_scalar moe_dense_mlp', BOOL),
    'moe_activation': (lambda v, c: v in ('silu', 'gelu'), "'silu' or 'gelu'"),
    'global_head_dim': OPTIONAL_POSITIVE_INT,
    'global_n_kv_head': (lambda v, c: v is None or _int(v, 1, c.n_head), lambda c: f"None or an int in [1, n_head={c.n_head}]"),
    'rope_proportion': (lambda v, c: v is None or (_number(v) and 0 < v <= 1), 'None or in (0, 1]'),
}


def _choices():
    """The fields that name a kind of part, and the kinds (the registries, as the later chapters filled them)."""
    return {'norm': NORMS, 'mlp': MLPS, 'attn': ATTENTIONS, 'pos': POSITIONS, 'rope_scaling': ROPE_SCALINGS,
            'router': ROUTERS, 'norm_position': NORM_POSITIONS}


def _changed(config, names):
    """The named fields set away from their defaults."""
    return [k for k in names if getattr(config, k) != GPTConfig.__dataclass_fields__[k].default]


def _flag_list(config, names):
    return ', '.join(f"{k}={getattr(config, k)!r}" for k in names)


def _mla_cannot(c):
    """The flags of attention that MLA, which makes its own keys and values, cannot apply."""
    return _changed(c, ('n_kv_head', 'head_dim', 'qk_norm', 'qkv_bias', 'rope_fraction', 'attn_sinks', 'attn_gate',
                        'attn_scale'))


MLA_FIELDS = ('kv_lora_rank', 'q_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim')
LINEAR_FIELDS = ('linear_n_key_head', 'linear_n_value_head', 'linear_key_dim', 'linear_value_dim',
                 'linear_conv_kernel', 'linear_chunk_size', 'linear_neg_eigval', 'linear_norm_eps',
                 'linear_norm_position')
SSM_FIELDS = ('ssm_n_head', 'ssm_head_dim', 'ssm_state_dim', 'ssm_n_groups', 'ssm_conv_kernel', 'ssm_chunk_size',
              'ssm_dt_min')
EXPERT_ONLY_FIELDS = ('moe_bias', 'swiglu_limit')  # the experts' own: MoE only, even with dense layers first
INDEX_FIELDS = ('index_n_heads', 'index_head_dim', 'index_stage', 'index_loss_coef', 'index_share')  # with index_topk only


def _unshared(c):
    """The first layer marked 'S' in index_share with no indexer before it to share, or on a layer without one."""
    indexed = [kind in 'GN' for kind in c.layer_kinds]
    for i, shares in enumerate(c.index_shares):
        if shares and (not indexed[i] or not any(indexed[j] and not c.index_shares[j] for j in range(i))):
            return i
    return None


# the flags of a RoPE scaling, and the rope_scaling values they apply to
ROPE_SCALING_FLAGS = {'rope_factor': ('linear', 'dynamic', 'yarn', 'llama3'),
                      'rope_original_length': ('linear', 'dynamic', 'yarn', 'llama3'),
                      'rope_low_freq_factor': ('llama3',), 'rope_high_freq_factor': ('llama3',),
                      'yarn_beta_fast': ('yarn',), 'yarn_beta_slow': ('yarn',), 'yarn_mscale': ('yarn',),
                      'yarn_mscale_all_dim': ('yarn',), 'rope_attention_factor': ('yarn',), 'yarn_truncate': ('yarn',)}


GLOBAL_FIELDS = ('global_head_dim', 'global_n_kv_head', 'rope_proportion')
MOE_DENSE_CANNOT = ('router', 'n_expert_group', 'topk_group', 'n_shared_expert', 'routed_scaling', 'moe_every',
                    'first_dense_layers', 'moe_scale_input', 'swiglu_limit', 'moe_bias', 'router_norm_topk')


def _shared_kinds(c):
    """The kinds of the last kv_shared_layers layers (Gemma 4's K/V sharing)."""
    return c.layer_kinds[c.n_layer - c.kv_shared_layers:] if c.kv_shared_layers else []


def _layers_ok(c):
    return c.layers is None or (isinstance(c.layers, str) and c.layers and not set(c.layers) - set(LAYER_KINDS)
                                and len(c.layers) <= c.n_layer)


# How fields depend on each other, in the order checked: [(whether config breaks the rule, the message)]. The
# messages say how to fix the mistake. Sizes that must fit together:
SHAPES = [
    (lambda c: c.n_expert % c.n_expert_group != 0 or c.topk_group > c.n_expert_group,
     lambda c: f"n_expert_group ({c.n_expert_group}) must divide n_expert ({c.n_expert}) and be >= topk_group "
               f"({c.topk_group})"),
    (lambda c: c.n_expert_active > c.topk_group * c.n_expert // c.n_expert_group,
     lambda c: f"n_expert_active ({c.n_expert_active}) is more than the experts of topk_group ({c.topk_group}) groups "
               f"hold"),
    (lambda c: c.head_dim is None and c.n_embd % c.n_head != 0,
     lambda c: f"n_embd ({c.n_embd}) must be divisible by n_head ({c.n_head}), or set head_dim"),
    (lambda c: c.n_kv_head is not None and c.n_head % c.n_kv_head != 0,
     lambda c: f"n_head ({c.n_head}) must be divisible by n_kv_head ({c.n_kv_head})"),
]
# "X needs Y" and "X applies only with Z":
DEPENDS = [
    (lambda c: c.attn == 'mla' and _mla_cannot(c),
     lambda c: f"attn='mla' makes its own keys and values: {_flag_list(c, _mla_cannot(c))} cannot apply (set "
               f"{' '.join(f'--{k}={GPTConfig.__dataclass_fields__[k].default}' for k in _mla_cannot(c))})"),
    (lambda c: c.attn == 'mla' and c.pos == 'learned' and c.qk_rope_head_dim,
     lambda c: f"qk_rope_head_dim={c.qk_rope_head_dim} needs pos='rope' (learned positions rotate nothing): set "
               f"--pos=rope or --qk_rope_head_dim=None"),
    (lambda c: c.attn == 'mla' and c.pos == 'rope' and c.qk_rope_head_dim == 0,
     lambda c: "qk_rope_head_dim=0 with pos='rope': the rotated part needs a width"),
    (lambda c: c.attn != 'mla' and [k for k in MLA_FIELDS if getattr(c, k) is not None],
     lambda c: f"{', '.join(k for k in MLA_FIELDS if getattr(c, k) is not None)} apply to attn='mla' only, got "
               f"attn={c.attn!r} (set --attn=mla, or "
               f"{' '.join(f'--{k}=None' for k in MLA_FIELDS if getattr(c, k) is not None)})"),
    (lambda c: not _layers_ok(c),
     lambda c: f"layers must be a string of {', '.join(map(repr, LAYER_KINDS))} "
               f"({', '.join(about for about, _ in LAYER_KINDS.values())}) at most n_layer={c.n_layer} long, tiled "
               f"over the layers; got {c.layers!r}"),
    (lambda c: c.layers is not None and 'L' in c.layers and c.sliding_window is None,
     lambda c: f"layers={c.layers!r} has local ('L') layers: set sliding_window, their window"),
    (lambda c: c.layers is not None and 'N' in c.layers and c.pos != 'rope',
     lambda c: f"layers={c.layers!r} has layers without RoPE ('N'): that needs pos='rope', got pos={c.pos!r}"),
    (lambda c: c.sliding_window is not None and 'L' not in c.layer_kinds,
     lambda c: f"sliding_window={c.sliding_window} applies to local ('L') layers and layers={c.layers!r} has none: "
               f"add 'L' to layers or set --sliding_window=None"),
    (lambda c: c.rope_local_theta is not None and 'L' not in c.layer_kinds,
     lambda c: f"rope_local_theta={c.rope_local_theta} applies to local ('L') layers and there are none: set layers "
               f"(e.g. 'LLLLLG') and sliding_window, or rope_local_theta=None"),
    (lambda c: c.rope_local_theta is not None and c.pos != 'rope',
     lambda c: f"rope_local_theta needs pos='rope', got pos={c.pos!r}"),
    (lambda c: c.linear_dims['v_heads'] % c.linear_dims['k_heads'] != 0,
     lambda c: f"linear_n_value_head ({c.linear_dims['v_heads']}) must be a multiple of linear_n_key_head "
               f"({c.linear_dims['k_heads']}): each key head serves a group of value heads"),
    (lambda c: _changed(c, LINEAR_FIELDS) and not set('DK') & set(c.layer_kinds),
     lambda c: f"{', '.join(_changed(c, LINEAR_FIELDS))} apply to Gated DeltaNet ('D') and Kimi Delta Attention ('K') "
               f"layers and layers={c.layers!r} has none: add 'D' or 'K' to layers or leave them at their defaults"),
    (lambda c: c.linear_norm_position not in (None, c.norm_position) and 'post' in (c.norm_position,
                                                                         c.linear_norm_position),
     lambda c: f"linear_norm_position={c.linear_norm_position!r} with norm_position={c.norm_position!r}: a 'post' "
               f"block ends in its own norm and the others need a final one; use 'post' for both or neither"),
    (lambda c: c.kda_rank is not None and 'K' not in c.layer_kinds,
     lambda c: f"kda_rank={c.kda_rank} applies to Kimi Delta Attention ('K') layers and layers={c.layers!r} has none: "
               f"add 'K' to layers or set --kda_rank=None"),
    (lambda c: c.pos == 'rope' and (c.rope_dim % 2 != 0 or c.rope_dim < 2),
     lambda c: f"pos='rope' needs an even number of rotated dims per head (head_dim * rope_fraction, or "
               f"qk_rope_head_dim with MLA), got {c.rope_dim}"),
    (lambda c: c.rope_scaling is not None and c.pos != 'rope',
     lambda c: f"rope_scaling={c.rope_scaling!r} needs pos='rope', got pos={c.pos!r} (set --pos=rope or "
               f"--rope_scaling=None)"),
    (lambda c: not c.rope_high_freq_factor > c.rope_low_freq_factor,
     lambda c: f"rope_high_freq_factor ({c.rope_high_freq_factor}) must be greater than rope_low_freq_factor "
               f"({c.rope_low_freq_factor})"),
    # a scaling's own flags do nothing without it: refused rather than recorded as if they applied
    *[(lambda c, name=name: name in _changed(c, (name,)) and c.rope_scaling not in ROPE_SCALING_FLAGS[name],
       lambda c, name=name: f"{name}={getattr(c, name)!r} applies only with rope_scaling="
                            f"{' or '.join(map(repr, ROPE_SCALING_FLAGS[name]))}, got rope_scaling={c.rope_scaling!r} "
                            f"(set --rope_scaling, or --{name}={GPTConfig.__dataclass_fields__[name].default})")
      for name in ROPE_SCALING_FLAGS],
    (lambda c: c.shared_expert_gate and not c.n_shared_expert,
     lambda c: "shared_expert_gate=True gates the shared experts: set n_shared_expert >= 1"),
    (lambda c: c.qk_norm_all_heads and not c.qk_norm,
     lambda c: "qk_norm_all_heads=True says how qk_norm normalizes: set qk_norm=True too"),
    (lambda c: _changed(c, EXPERT_ONLY_FIELDS) and c.mlp != 'moe',
     lambda c: f"{_flag_list(c, _changed(c, EXPERT_ONLY_FIELDS))} apply to mlp='moe' only, got mlp={c.mlp!r}"),
    # Llama 4's
    (lambda c: 'C' in c.layer_kinds and c.attention_chunk_size is None,
     lambda c: f"layers={c.layers!r} has chunked ('C') layers: set attention_chunk_size, their chunk"),
    (lambda c: c.attention_chunk_size is not None and 'C' not in c.layer_kinds,
     lambda c: f"attention_chunk_size={c.attention_chunk_size} applies to chunked ('C') layers and layers={c.layers!r} "
               f"has none: add 'C' to layers or set --attention_chunk_size=None"),
    (lambda c: c.nope_temperature is not None and 'N' not in c.layer_kinds,
     lambda c: f"nope_temperature={c.nope_temperature} applies to layers without RoPE ('N') and layers={c.layers!r} "
               f"has none: add 'N' to layers or set --nope_temperature=None"),
    (lambda c: c.rope_qk_norm and c.pos != 'rope',
     lambda c: f"rope_qk_norm=True normalizes queries and keys after RoPE: that needs pos='rope', got pos={c.pos!r}"),
    (lambda c: c.attn == 'mla' and (c.rope_qk_norm or c.nope_temperature is not None),
     lambda c: "rope_qk_norm and nope_temperature apply to attn='mha' only (MLA makes its own queries and keys)"),
    (lambda c: _changed(c, ('moe_every', 'moe_scale_input')) and c.mlp != 'moe',
     lambda c: f"{_flag_list(c, _changed(c, ('moe_every', 'moe_scale_input')))} apply to mlp='moe' only, "
               f"got mlp={c.mlp!r}"),
    (lambda c: c.moe_every > c.n_layer,
     lambda c: f"moe_every={c.moe_every} is more than n_layer={c.n_layer}: no layer would have experts"),
    (lambda c: _changed(c, ('short_conv_kernel',)) and 'V' not in c.layer_kinds,
     lambda c: f"short_conv_kernel={c.short_conv_kernel} applies to gated short convolution ('V') layers and "
               f"layers={c.layers!r} has none: add 'V' to layers or leave it at 3"),
    (lambda c: c.ssm_dims['heads'] % c.ssm_n_groups != 0,
     lambda c: f"ssm_n_groups ({c.ssm_n_groups}) must divide the 'S' layers' heads ({c.ssm_dims['heads']}): each "
               f"group's B and C serve a group of heads"),
    (lambda c: _changed(c, SSM_FIELDS) and 'S' not in c.layer_kinds,
     lambda c: f"{', '.join(_changed(c, SSM_FIELDS))} apply to Mamba-2 ('S') layers and layers={c.layers!r} has none: "
               f"add 'S' to layers or leave them at their defaults"),
    (lambda c: ('-' in c.layer_kinds or not c.mlp_with_mixer) and c.norm_position != 'pre',
     lambda c: f"layers of one part (layers={c.layers!r}, mlp_with_mixer={c.mlp_with_mixer}) need norm_position='pre', "
               f"got {c.norm_position!r}"),
    # DeepSeek Sparse Attention
    (lambda c: _changed(c, INDEX_FIELDS) and c.index_topk is None,
     lambda c: f"{_flag_list(c, _changed(c, INDEX_FIELDS))} apply to sparse attention only: set index_topk (the "
               f"keys each query reads) or leave them at their defaults"),
    (lambda c: c.index_topk is not None and not {'G', 'N'} & set(c.layer_kinds),
     lambda c: f"index_topk={c.index_topk} picks keys in global attention layers ('G', 'N') and layers={c.layers!r} "
               f"has none: add one or set --index_topk=None"),
    (lambda c: c.index_topk is not None and c.index_share is not None and _unshared(c) is not None,
     lambda c: f"index_share={c.index_share!r} marks layer {_unshared(c)} 'S' but it has no earlier global layer with an "
               f"indexer of its own to share (or is no global layer): make it 'F'"),
    # multi-token prediction
    (lambda c: _changed(c, ('mtp_loss_coef',)) and not c.mtp_depth,
     lambda c: f"mtp_loss_coef={c.mtp_loss_coef} applies to multi-token prediction only: set mtp_depth >= 1 or leave "
               f"it at its default"),
    (lambda c: c.mtp_depth and c.index_topk is not None,
     lambda c: f"mtp_depth={c.mtp_depth} with sparse attention (index_topk={c.index_topk}) is not supported yet: set one "
               f"of them off"),
    (lambda c: c.index_topk is not None and c.pos == 'rope' and c.index_head_dim < c.rope_dim,
     lambda c: f"index_head_dim ({c.index_head_dim}) must be at least the rotated width of a head ({c.rope_dim}): "
               f"the indexer rotates its first dims with the attention's tables"),
    # Gemma 4's
    (lambda c: c.global_n_kv_head is not None and c.n_head % c.global_n_kv_head != 0,
     lambda c: f"n_head ({c.n_head}) must be divisible by global_n_kv_head ({c.global_n_kv_head})"),
    (lambda c: _changed(c, GLOBAL_FIELDS) and c.attn != 'mha',
     lambda c: f"{_flag_list(c, _changed(c, GLOBAL_FIELDS))} apply to attn='mha' only, got attn={c.attn!r}"),
    (lambda c: _changed(c, GLOBAL_FIELDS) and not set(c.layer_kinds) & set(GLOBAL_KINDS),
     lambda c: f"{_flag_list(c, _changed(c, GLOBAL_FIELDS))} apply to global layers ('G', 'N') and layers={c.layers!r} "
               f"has none: add one or leave them at None"),
    (lambda c: c.pos == 'rope' and _changed(c, ('global_head_dim', 'rope_proportion')) and 'C' in c.layer_kinds,
     lambda c: f"{_flag_list(c, _changed(c, ('global_head_dim', 'rope_proportion')))} change the global layers' RoPE, "
               f"which chunked ('C') layers share: leave them at None with 'C' layers"),
    (lambda c: c.pos == 'rope' and _changed(c, ('global_head_dim', 'rope_proportion')) and 'L' in c.layer_kinds
     and c.rope_local_theta is None,
     lambda c: f"{_flag_list(c, _changed(c, ('global_head_dim', 'rope_proportion')))} change the global layers' RoPE: "
               f"local ('L') layers then need tables of their own, set rope_local_theta"),
    (lambda c: c.rope_proportion is not None and (c.pos != 'rope' or c.rope_scaling is not None or c.rope_fraction != 1),
     lambda c: f"rope_proportion={c.rope_proportion} needs pos='rope' without rope_scaling and rope_fraction=1 (it "
               f"chooses the pairs that turn itself), got pos={c.pos!r}, rope_scaling={c.rope_scaling!r}, "
               f"rope_fraction={c.rope_fraction}"),
    (lambda c: c.pos == 'rope' and c.global_head_dim is not None and int(c.global_head_dim * c.rope_fraction) % 2,
     lambda c: f"global_head_dim={c.global_head_dim} with pos='rope' needs an even number of rotated dims (times "
               f"rope_fraction={c.rope_fraction})"),
    (lambda c: _changed(c, ('moe_dense_mlp', 'moe_activation')) and c.mlp != 'moe',
     lambda c: f"{_flag_list(c, _changed(c, ('moe_dense_mlp', 'moe_activation')))} apply to mlp='moe' only, "
               f"got mlp={c.mlp!r}"),
    (lambda c: c.moe_dense_mlp and _changed(c, MOE_DENSE_CANNOT),
     lambda c: f"moe_dense_mlp=True routes as Gemma 4 does (softmax, no groups, no shared experts, no scaling, every "
               f"layer): {_flag_list(c, _changed(c, MOE_DENSE_CANNOT))} cannot apply"),
    (lambda c: c.v_norm and c.attn != 'mha',
     lambda c: f"v_norm=True normalizes the values of attn='mha', got attn={c.attn!r}"),
    (lambda c: c.attn_k_eq_v and c.attn != 'mha',
     lambda c: f"attn_k_eq_v=True makes the values of attn='mha' from its keys, got attn={c.attn!r}"),
    (lambda c: c.attn_k_eq_v and not set(c.layer_kinds) & set(GLOBAL_KINDS),
     lambda c: f"attn_k_eq_v=True applies to global layers ('G', 'N') and layers={c.layers!r} has none: add one or "
               f"set --attn_k_eq_v=False"),
    (lambda c: c.kv_shared_layers and c.attn != 'mha',
     lambda c: f"kv_shared_layers={c.kv_shared_layers} shares keys and values of attn='mha' only, got attn={c.attn!r}"),
    (lambda c: set(_shared_kinds(c)) - set(KV_SHARING_KINDS),
     lambda c: f"kv_shared_layers={c.kv_shared_layers} covers layers of kinds "
               f"{''.join(sorted(set(_shared_kinds(c))))!r}; only attention layers "
               f"({', '.join(map(repr, KV_SHARING_KINDS))}) share keys and values"),
    (lambda c: set(_shared_kinds(c)) - set(c.layer_kinds[:c.n_layer - c.kv_shared_layers]),
     lambda c: f"kv_shared_layers={c.kv_shared_layers}: the shared layers' kinds "
               f"{''.join(sorted(set(_shared_kinds(c)) - set(c.layer_kinds[:c.n_layer - c.kv_shared_layers])))!r} have "
               f"no earlier layer to share from (share fewer layers)"),
]


def check_config(config):
    """GPTConfig's checks, one ValueError naming the field and what is allowed: each field's type and range
    (FIELD_TYPES), the kind each naming field names (a key of its registry), then SHAPES and DEPENDS."""
    for name, (ok, allowed) in FIELD_TYPES.items():
        value = getattr(config, name)
        if not ok(value, config):
            raise ValueError(f"{name} must be {allowed(config) if callable(allowed) else allowed}, got {value!r}")
    for name, kinds in _choices().items():
        if getattr(config, name) not in kinds:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, kinds))}; got {getattr(config, name)!r}")
    for broken, message in SHAPES + DEPENDS:
        if broken(config):
            raise ValueError(message(config))
