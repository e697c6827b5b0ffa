"""
The Hugging Face families: which transformers architectures our GPT can be loaded from and exported to, and
how their configs and weight names map onto GPTConfig's flags and our parameter names. model.py is the model;
this file only translates, so adding a family is a change here alone. Entry points: GPT.from_pretrained
(model.py, which calls from_pretrained below) and export.to_hf.
"""

import math
from dataclasses import dataclass, fields
from functools import partial
from types import SimpleNamespace

import torch

from chapters import GPT, GPTConfig
from chapters.long_context import ROPE_SCALINGS

# One entry per transformers architecture: the flag values it can carry (every other flag must keep its
# default), its config read into our flags and written back, and one name table used both ways.
# A table row is (our name, HF name or names, how): several HF names are concatenated along dim 0 in our
# tensor (q, k, v into c_attn; gate, up into c_fc); `how` names a transform of _TRANSFORMS ('T': GPT-2's Conv1D
# matrices are transposed; 'rope_q', 'rope_kv': DeepSeek's rotated rows reordered). {i} is the layer, {b}
# 'weight' or 'bias'; rows whose tensor a model does not have are skipped.

ANY = None  # in a family's `carries`: any value of that flag
_MOE_SETTINGS = ('n_expert', 'n_expert_active', 'moe_hidden', 'n_shared_expert', 'shared_expert_gate', 'router',
                 'router_norm_topk',
                 'n_expert_group', 'topk_group', 'routed_scaling', 'first_dense_layers', 'moe_aux_loss_coef',
                 'moe_z_loss_coef', 'moe_bias_update_rate')


@dataclass
class HFFamily:
    model_type: str
    hf_class: str  # the transformers class export builds
    carries: dict  # flag -> tuple of values it can represent, ANY, or a test (value -> bool)
    names: list  # the name table
    read_config: callable  # HF config -> our flags
    write_config: callable  # GPTConfig -> HF config kwargs
    # HF state -> the same with packed tensors split under names of their parts, and back: for a family whose
    # one tensor holds parts of several of ours (Qwen3-Next's q_proj holds q and the output gate)
    unpack: callable = None  # (hf_state, config) -> hf_state
    pack: callable = None  # (hf_state, config) -> hf_state

    def blocking(self, config):
        """The flags (name=value) of config this family cannot represent (a dense model's MoE settings, which
        change nothing, aside)."""
        defaults = GPTConfig.__dataclass_fields__
        out = []
        for f in fields(config):
            if f.name in _MOE_SETTINGS and config.mlp != 'moe':
                continue
            value = getattr(config, f.name)
            allowed = self.carries.get(f.name, (defaults[f.name].default,))
            if allowed is not ANY and not (allowed(value) if callable(allowed) else value in allowed):
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
                n_head=cfg.n_head, n_inner=cfg.mlp_width, activation_function='gelu_new',
                layer_norm_epsilon=cfg.norm_eps, resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
                attn_pdrop=cfg.dropout, tie_word_embeddings=cfg.tie_embeddings, bos_token_id=special,
                eos_token_id=special)


def _rope_read(c, partial=False):
    """Our RoPE flags from a transformers 5 config (its rope_parameters also hold an old rope_scaling).
    partial: the family rotates only partial_rotary_factor of each head (GLM-4.5, MiniMax-M2). The other families'
    transformers code ignores the factor in plain RoPE, as we do, and cannot run it with a scaling: refused."""
    params = dict(getattr(c, 'rope_parameters', None) or {})
    kind = params.get('rope_type', params.get('type', 'default'))
    flags = dict(pos='rope', rope_theta=float(params.get('rope_theta', getattr(c, 'rope_theta', 10000.0))))
    fraction = float(params.get('partial_rotary_factor') or 1.0)
    if partial:
        flags['rope_fraction'] = fraction
    if kind == 'default':
        return flags
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"rope_type {kind!r} is not supported ({', '.join(map(repr, ROPE_SCALINGS[1:]))} are)")
    if fraction != 1.0 and not partial:
        raise ValueError(f"partial_rotary_factor={fraction} is not supported with {c.model_type}'s rope_type {kind!r}")
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
                     rope_attention_factor=params.get('attention_factor'),
                     yarn_truncate=bool(params.get('truncate', True)))
    return flags


def _rope_write(cfg, partial=False):
    """rope_parameters (and max_position_embeddings) for a transformers config; partial: the family reads
    partial_rotary_factor (and GLM-4.5's config fills in 0.5 where it is missing)."""
    params = {'rope_type': cfg.rope_scaling or 'default', 'rope_theta': cfg.rope_theta}
    if partial:
        params['partial_rotary_factor'] = cfg.rope_fraction
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
        if not cfg.yarn_truncate:
            params['truncate'] = False
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


def _llama_like_read(c, partial=False):
    """The flags every Llama-style family shares (rms, swiglu, rope, n_kv_head, head_dim); partial: as _rope_read."""
    if c.hidden_act != 'silu':
        raise ValueError(f"hidden_act {c.hidden_act!r} is not supported (only 'silu': SwiGLU)")
    head_dim = getattr(c, 'head_dim', None)
    flags = dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                 n_kv_head=c.num_key_value_heads or c.num_attention_heads, block_size=c.max_position_embeddings,
                 head_dim=None if head_dim in (None, c.hidden_size // c.num_attention_heads) else head_dim,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.rms_norm_eps, mlp='swiglu',
                 ffn_hidden=c.intermediate_size, tie_embeddings=bool(c.tie_word_embeddings))
    flags.update(_rope_read(c, partial))  # it may set block_size
    return flags


def _llama_like_write(cfg):
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_width,
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


# ----- Gemma 3 (text), OLMo 2, OLMo 3, SmolLM3: layers of several kinds, and their norms


def _made_of(letters):
    """In a family's `carries`, for `layers`: None or any string of these layer kinds."""
    return lambda layers: layers is None or set(layers) <= set(letters)


def _tiling(kinds):
    """The shortest string that, tiled over the layers, gives each layer's kind; None when all are global."""
    if set(kinds) == {'G'}:
        return None
    return next(''.join(kinds[:n]) for n in range(1, len(kinds) + 1)
                if all(k == kinds[i % n] for i, k in enumerate(kinds)))


def _layer_types_read(c):
    """Each layer's kind from layer_types: 'L' sliding, 'G' full."""
    known = {'sliding_attention': 'L', 'full_attention': 'G'}
    types = getattr(c, 'layer_types', None) or ['full_attention'] * c.num_hidden_layers
    unknown = set(types) - set(known)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only {', '.join(map(repr, known))})")
    return [known[t] for t in types[:c.num_hidden_layers]]


def _layer_types_write(cfg):
    return [{'L': 'sliding_attention', 'G': 'full_attention'}[k] for k in cfg.layer_kinds]


def _rope_kinds_read(c, kinds):
    """RoPE flags of a config with rope_parameters per layer type (Gemma 3, OLMo 3): the full layers' (scaling
    included) as ours, the sliding layers' base as rope_local_theta (those layers take no scaling)."""
    params = c.rope_parameters
    full, local = dict(params['full_attention']), dict(params['sliding_attention'])
    for kind, p in (('full_attention', full), ('sliding_attention', local)):
        if p.get('partial_rotary_factor', 1.0) != 1.0:
            raise ValueError(f"rope_parameters[{kind!r}] with a partial_rotary_factor is not supported")
    if local.get('rope_type', 'default') != 'default' and 'L' in kinds:
        raise ValueError(f"rope_parameters['sliding_attention'] with rope_type {local['rope_type']!r} is not "
                         f"supported (sliding layers rotate by their base alone)")
    flags = _rope_read(SimpleNamespace(rope_parameters=full, max_position_embeddings=c.max_position_embeddings))
    if 'L' in kinds:
        flags['rope_local_theta'] = float(local['rope_theta'])
    return flags


def _rope_kinds_write(cfg, family):
    out = _rope_write(cfg)
    if 'L' in cfg.layer_kinds and cfg.rope_local_theta is None and cfg.rope_scaling:
        raise ValueError(f"{family} scales the RoPE of full-attention layers only; this model scales its local "
                         f"layers too (rope_scaling={cfg.rope_scaling!r}, rope_local_theta=None)")
    local = {'rope_type': 'default', 'rope_theta': cfg.rope_local_theta or cfg.rope_theta}
    out['rope_parameters'] = {'full_attention': out['rope_parameters'], 'sliding_attention': local}
    return out


def _gemma3_text_read(c):
    if c.hidden_activation not in ('gelu_pytorch_tanh', 'gelu_new'):
        raise ValueError(f"hidden_activation {c.hidden_activation!r} is not supported (only the tanh GELU "
                         f"'gelu_pytorch_tanh': GEGLU)")
    if c.attention_bias or c.use_bidirectional_attention:
        raise ValueError("Gemma 3 with attention_bias or use_bidirectional_attention is not supported")
    kinds = _layer_types_read(c)
    head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
    flags = dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                 n_kv_head=c.num_key_value_heads, block_size=c.max_position_embeddings,
                 head_dim=None if head_dim == c.hidden_size // c.num_attention_heads else head_dim,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.rms_norm_eps,
                 norm_position='sandwich', mlp='geglu', ffn_hidden=c.intermediate_size,
                 tie_embeddings=bool(c.tie_word_embeddings), embed_scale=True, qk_norm=True,
                 attn_scale=None if c.query_pre_attn_scalar == head_dim else c.query_pre_attn_scalar ** -0.5,
                 logit_softcap=c.final_logit_softcapping, layers=_tiling(kinds),
                 sliding_window=c.sliding_window if 'L' in kinds else None)
    flags.update(_rope_kinds_read(c, kinds))  # it may set block_size
    return flags


def _gemma3_text_write(cfg):
    # the softmax scale is query_pre_attn_scalar**-0.5 with an integer scalar
    scalar = cfg.head_size if cfg.attn_scale is None else round(cfg.attn_scale ** -2)
    if cfg.attn_scale is not None and not math.isclose(scalar ** -0.5, cfg.attn_scale, rel_tol=1e-9):
        raise ValueError(f"gemma3_text writes attn_scale as query_pre_attn_scalar**-0.5 with an integer scalar; "
                         f"attn_scale={cfg.attn_scale} is not one")
    out = _llama_like_write(cfg)
    del out['hidden_act']
    # Gemma builds a sliding mask whatever the layers are: a window no layer uses when none is local
    return {**out, **_rope_kinds_write(cfg, 'gemma3_text'), 'hidden_activation': 'gelu_pytorch_tanh',
            'query_pre_attn_scalar': scalar, 'final_logit_softcapping': cfg.logit_softcap,
            'layer_types': _layer_types_write(cfg), 'sliding_window': cfg.sliding_window or cfg.block_size,
            'attention_bias': False}


def _olmo2_read(c):
    if getattr(c, 'attention_bias', False):
        raise ValueError("OLMo with attention_bias is not supported (its q, k, v and o have biases, its MLP none)")
    return {**_llama_like_read(c), 'norm_position': 'after', 'qk_norm': True, 'qk_norm_all_heads': True}


def _olmo2_write(cfg):
    return {**_llama_like_write(cfg), 'attention_bias': False}


def _olmo3_read(c):
    kinds = _layer_types_read(c)
    # _olmo2_read reads the rope_parameters of one type; OLMo 3's are per type, read here
    return {**_olmo2_read(c), 'layers': _tiling(kinds), 'sliding_window': c.sliding_window if 'L' in kinds
            else None, **_rope_kinds_read(c, kinds)}


def _olmo3_write(cfg):
    return {**_olmo2_write(cfg), **_rope_kinds_write(cfg, 'olmo3'), 'layer_types': _layer_types_write(cfg),
            'sliding_window': cfg.sliding_window or cfg.block_size}


def _smollm3_read(c):
    if 'sliding_attention' in c.layer_types[:c.num_hidden_layers]:
        raise ValueError("SmolLM3 with sliding layers (use_sliding_window) is not supported: its windows are on "
                         "the layers without RoPE, and our local layers rotate")
    kinds = ['G' if rope else 'N' for rope in c.no_rope_layers[:c.num_hidden_layers]]  # 1: RoPE, 0: none
    return {**_llama_read(c), 'layers': _tiling(kinds)}


def _smollm3_write(cfg):
    return {**_llama_write(cfg), 'no_rope_layers': [int(k != 'N') for k in cfg.layer_kinds],
            'use_sliding_window': False, 'layer_types': ['full_attention'] * cfg.n_layer,
            'pad_token_id': None}  # its default (128004) is past a smaller vocabulary, which transformers refuses


def _decoder_names(norms, norm_how=None):
    """A Llama-style name table with these (ours, HF) norm rows (and the final norm), each transformed by
    norm_how, as are the QK-norms."""
    layer = 'model.layers.{i}.'
    return [
        ('transformer.wte.weight', 'model.embed_tokens.weight', None),
        ('transformer.ln_f.weight', 'model.norm.weight', norm_how),
        ('lm_head.weight', 'lm_head.weight', None),
        *[(f'transformer.h.{{i}}.{ours}.weight', f'{layer}{hf}.weight', norm_how) for ours, hf in norms],
        ('transformer.h.{i}.attn.c_attn.weight', tuple(f'{layer}self_attn.{n}_proj.weight' for n in 'qkv'), None),
        ('transformer.h.{i}.attn.c_proj.weight', layer + 'self_attn.o_proj.weight', None),
        ('transformer.h.{i}.attn.q_norm.weight', layer + 'self_attn.q_norm.weight', norm_how),
        ('transformer.h.{i}.attn.k_norm.weight', layer + 'self_attn.k_norm.weight', norm_how),
        ('transformer.h.{i}.mlp.c_fc.weight', (layer + 'mlp.gate_proj.weight', layer + 'mlp.up_proj.weight'), None),
        ('transformer.h.{i}.mlp.c_proj.weight', layer + 'mlp.down_proj.weight', None),
    ]


# Gemma's norms compute x * (1 + w): '1+w' keeps ours = 1 + theirs
_GEMMA3_NAMES = _decoder_names([('ln_1', 'input_layernorm'), ('ln_1_out', 'post_attention_layernorm'),
                                ('ln_2', 'pre_feedforward_layernorm'), ('ln_2_out', 'post_feedforward_layernorm')],
                               '1+w')
# OLMo's norms are on the branches' outputs, where our 'after' blocks put ln_1 and ln_2
_OLMO_NAMES = _decoder_names([('ln_1', 'post_attention_layernorm'), ('ln_2', 'post_feedforward_layernorm')])


def _moe_read(c, experts, hidden, **flags):
    return dict(mlp='moe', n_expert=experts, n_expert_active=c.num_experts_per_tok, moe_hidden=hidden,
                router='softmax', **flags)


def _moe_write(cfg):
    return dict(num_experts_per_tok=cfg.n_expert_active, router_aux_loss_coef=cfg.moe_aux_loss_coef)


def _mixtral_read(c):
    return {**_mistral_read(c), **_moe_read(c, c.num_local_experts, c.intermediate_size, router_norm_topk=True)}


def _mixtral_write(cfg):
    return {**_mistral_write(cfg), **_moe_write(cfg), 'num_local_experts': cfg.n_expert,
            'intermediate_size': cfg.expert_hidden}


def _qwen3_moe_read(c):
    dense = list(getattr(c, 'mlp_only_layers', None) or [])
    if c.decoder_sparse_step != 1 or dense != list(range(len(dense))):
        raise ValueError(f"dense layers other than the first ones (decoder_sparse_step={c.decoder_sparse_step}, "
                         f"mlp_only_layers={dense}) are not supported")
    return {**_qwen3_read(c), **_moe_read(c, c.num_experts, c.moe_intermediate_size,
                                          router_norm_topk=bool(c.norm_topk_prob), first_dense_layers=len(dense))}


def _qwen3_moe_write(cfg):
    return {**_qwen3_write(cfg), **_moe_write(cfg), 'num_experts': cfg.n_expert, 'moe_intermediate_size': cfg.expert_hidden,
            'norm_topk_prob': cfg.router_norm_topk, 'decoder_sparse_step': 1,
            'mlp_only_layers': list(range(cfg.first_dense_layers))}


def _deepseek_read(c):
    if getattr(c, 'rope_interleave', True) is not True:
        raise ValueError("rope_interleave=False is not supported (DeepSeek's checkpoints rotate pairs)")
    if c.hidden_act != 'silu' or getattr(c, 'mlp_bias', False) or getattr(c, 'attention_bias', False):
        raise ValueError("DeepSeek checkpoints with biases or an activation other than silu are not supported")
    flags = {**_llama_like_read(c), 'n_kv_head': None, 'head_dim': None, 'attn': 'mla', 'kv_lora_rank': c.kv_lora_rank,
             'q_lora_rank': c.q_lora_rank or None, 'qk_nope_head_dim': c.qk_nope_head_dim,
             'qk_rope_head_dim': c.qk_rope_head_dim, 'v_head_dim': c.v_head_dim}
    if c.first_k_dense_replace < c.num_hidden_layers:  # MoE layers after the first dense ones
        v3 = c.model_type == 'deepseek_v3'
        if not v3 and c.topk_method not in ('greedy', 'group_limited_greedy'):
            raise ValueError(f"topk_method {c.topk_method!r} is not supported")
        groups = (c.n_group or 1) if v3 or c.topk_method == 'group_limited_greedy' else 1
        flags.update(mlp='moe', n_expert=c.n_routed_experts, n_expert_active=c.num_experts_per_tok,
                     moe_hidden=c.moe_intermediate_size, n_shared_expert=c.n_shared_experts or 0,
                     router='sigmoid' if v3 else 'softmax', router_norm_topk=bool(c.norm_topk_prob) if v3 else False,
                     n_expert_group=groups, topk_group=(c.topk_group or 1) if groups > 1 else 1,
                     routed_scaling=float(c.routed_scaling_factor), first_dense_layers=c.first_k_dense_replace)
    return flags


def _deepseek_write(cfg):
    dims = cfg.mla_dims
    moe = cfg.mlp == 'moe'
    out = {**_llama_like_write(cfg), 'num_key_value_heads': cfg.n_head, 'kv_lora_rank': dims['latent'],
           'q_lora_rank': dims['q_latent'] or None, 'qk_nope_head_dim': dims['nope'],
           'qk_rope_head_dim': dims['rope'], 'v_head_dim': dims['v'],
           'first_k_dense_replace': cfg.first_dense_layers if moe else cfg.n_layer,
           'n_routed_experts': cfg.n_expert, 'num_experts_per_tok': cfg.n_expert_active,
           'moe_intermediate_size': cfg.expert_hidden, 'n_shared_experts': cfg.n_shared_expert,
           'routed_scaling_factor': float(cfg.routed_scaling), 'n_group': cfg.n_expert_group,
           'topk_group': cfg.topk_group, 'norm_topk_prob': cfg.router_norm_topk}
    del out['head_dim']  # DeepSeek derives its own
    return out


def _deepseek_v2_write(cfg):
    return {**_deepseek_write(cfg), 'topk_method': 'group_limited_greedy' if cfg.n_expert_group > 1 else 'greedy'}


# gpt-oss, GLM-4.5 (glm4_moe) and MiniMax-M2: layer kinds, sinks, partial RoPE and their experts

def _layers_read(c):
    """layers and sliding_window from a config's layer_types (every layer full when it has none)."""
    kinds = _layer_types_read(c)
    return dict(layers=_tiling(kinds), sliding_window=c.sliding_window if 'L' in kinds else None)


def _layers_write(cfg):
    return dict(layer_types=_layer_types_write(cfg), sliding_window=cfg.sliding_window)


def _gpt_oss_read(c):
    if c.swiglu_alpha != 1.702:
        raise ValueError(f"swiglu_alpha={c.swiglu_alpha} is not supported (gpt-oss's experts use 1.702)")
    return {**_llama_like_read(c), **_layers_read(c), 'bias': bool(c.attention_bias), 'attn_sinks': True,
            **_moe_read(c, c.num_local_experts, c.intermediate_size, router_norm_topk=True, moe_bias=True,
                        swiglu_limit=float(c.swiglu_limit))}


def _gpt_oss_write(cfg):
    return {**_llama_like_write(cfg), **_moe_write(cfg), **_layers_write(cfg), 'num_local_experts': cfg.n_expert,
            'intermediate_size': cfg.expert_hidden, 'attention_bias': cfg.bias, 'swiglu_limit': cfg.swiglu_limit,
            'swiglu_alpha': 1.702}


def _glm4_moe_read(c):
    flags = {**_llama_like_read(c, partial=True), 'qkv_bias': bool(c.attention_bias), 'qk_norm': bool(c.use_qk_norm)}
    if c.first_k_dense_replace < c.num_hidden_layers:  # MoE layers after the first dense ones
        flags.update(_moe_read(c, c.n_routed_experts, c.moe_intermediate_size, router_norm_topk=bool(c.norm_topk_prob),
                               n_shared_expert=c.n_shared_experts, n_expert_group=c.n_group, topk_group=c.topk_group,
                               routed_scaling=float(c.routed_scaling_factor),
                               first_dense_layers=c.first_k_dense_replace), router='sigmoid')
    return flags


def _glm4_moe_write(cfg):
    moe = cfg.mlp == 'moe'
    return {**_llama_like_write(cfg), **_rope_write(cfg, partial=True), 'attention_bias': cfg.qkv_bias,
            'use_qk_norm': cfg.qk_norm, 'n_routed_experts': cfg.n_expert, 'num_experts_per_tok': cfg.n_expert_active,
            'moe_intermediate_size': cfg.expert_hidden, 'n_shared_experts': cfg.n_shared_expert,
            'routed_scaling_factor': float(cfg.routed_scaling), 'n_group': cfg.n_expert_group,
            'topk_group': cfg.topk_group, 'norm_topk_prob': cfg.router_norm_topk,
            'first_k_dense_replace': cfg.first_dense_layers if moe else cfg.n_layer}


def _minimax_m2_read(c):
    return {**_llama_like_read(c, partial=True), 'qk_norm': True, 'qk_norm_all_heads': True,
            **_moe_read(c, c.num_local_experts, c.intermediate_size, router_norm_topk=True), 'router': 'sigmoid'}


def _minimax_m2_write(cfg):
    return {**_llama_like_write(cfg), **_rope_write(cfg, partial=True), **_moe_write(cfg),
            'num_local_experts': cfg.n_expert, 'intermediate_size': cfg.expert_hidden}


def _interleaved(t):
    """[gate | up] along the last dim as gpt-oss keeps it: gate in the even columns, up in the odd ones."""
    return torch.stack(t.chunk(2, dim=-1), dim=-1).flatten(-2)


def _split(t):
    """gpt-oss's interleaved gate and up columns as our [gate | up]."""
    return torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)


_GPT_OSS_TRANSFORMS = {  # gpt-oss multiplies x @ W (E, d, 2h), gate and up interleaved; we F.linear by (E, 2h, d)
    'oss_gate_up': (lambda t, c: _split(t).transpose(1, 2).contiguous(),
                    lambda t, c: _interleaved(t.transpose(1, 2)).contiguous()),
    'oss_gate_up_bias': (lambda t, c: _split(t), lambda t, c: _interleaved(t)),
    'oss_down': (lambda t, c: t.transpose(1, 2).contiguous(), lambda t, c: t.transpose(1, 2).contiguous()),
}


def _rope_rows(tensor, config, rows_of, inverse):
    """DeepSeek's checkpoints rotate pairs (x[2j], x[2j+1]); we rotate halves (x[j], x[j + d/2]): reorder the
    rows that make the rotated parts (the same rotation, so the same attention)."""
    d = config.mla_dims['rope']
    order = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    order = order.argsort() if inverse else order
    tensor = tensor.clone()
    for start in rows_of(config):
        tensor[start:start + d] = tensor[start:start + d][order]
    return tensor


def _q_rope_rows(config):
    dims = config.mla_dims
    width = dims['nope'] + dims['rope']
    return [h * width + dims['nope'] for h in range(config.n_head)]


def _kv_rope_rows(config):
    return [config.mla_dims['latent']]


_TRANSFORMS = {  # how -> (HF to ours, ours to HF), each (tensor, config) -> tensor
    'T': (lambda t, c: t.t() if t.dim() == 2 else t, lambda t, c: t.t().contiguous() if t.dim() == 2 else t),
    '1+w': (lambda t, c: t + 1, lambda t, c: t - 1),  # Gemma's norm gains (1 + w)
    **_GPT_OSS_TRANSFORMS,
    'rope_q': (lambda t, c: _rope_rows(t, c, _q_rope_rows, False), lambda t, c: _rope_rows(t, c, _q_rope_rows, True)),
    'rope_kv': (lambda t, c: _rope_rows(t, c, _kv_rope_rows, False),
                lambda t, c: _rope_rows(t, c, _kv_rope_rows, True)),
}


# sizes and what only training reads (dropout, the init): every family carries them
_SIZES = {k: ANY for k in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'dropout', 'norm_eps',
                           'ffn_hidden', 'multiple_of', 'tie_embeddings', 'zero_init')}
_ROPE = {k: ANY for k in ('rope_theta', 'rope_scaling', 'rope_factor', 'rope_original_length', 'rope_low_freq_factor',
                          'rope_high_freq_factor', 'yarn_beta_fast', 'yarn_beta_slow', 'yarn_mscale',
                          'yarn_mscale_all_dim', 'rope_attention_factor', 'yarn_truncate')}
_LLAMA_LIKE = {**_SIZES, **_ROPE, 'norm': ('rms',), 'mlp': ('swiglu',), 'pos': ('rope',), 'n_kv_head': ANY,
               'head_dim': ANY}
_GPT2_NAMES = [(n, n, None) for n in ('transformer.wte.weight', 'transformer.wpe.weight', 'transformer.ln_f.{b}',
                                      'transformer.h.{i}.ln_1.{b}', 'transformer.h.{i}.ln_2.{b}', 'lm_head.weight')] + [
    (n, n, 'T') for n in ('transformer.h.{i}.attn.c_attn.{b}', 'transformer.h.{i}.attn.c_proj.{b}',
                          'transformer.h.{i}.mlp.c_fc.{b}', 'transformer.h.{i}.mlp.c_proj.{b}')]
_LLAMA_ATTN_NAMES = [  # the embeddings, norms and attention of every Llama-style family
    ('transformer.wte.weight', 'model.embed_tokens.weight', None),
    ('transformer.ln_f.weight', 'model.norm.weight', None),
    ('lm_head.weight', 'lm_head.weight', None),
    ('transformer.h.{i}.ln_1.weight', 'model.layers.{i}.input_layernorm.weight', None),
    ('transformer.h.{i}.ln_2.weight', 'model.layers.{i}.post_attention_layernorm.weight', None),
    ('transformer.h.{i}.attn.c_attn.{b}', tuple(f'model.layers.{{i}}.self_attn.{n}_proj.{{b}}' for n in 'qkv'), None),
    ('transformer.h.{i}.attn.c_proj.{b}', 'model.layers.{i}.self_attn.o_proj.{b}', None),
    ('transformer.h.{i}.attn.q_norm.weight', 'model.layers.{i}.self_attn.q_norm.weight', None),
    ('transformer.h.{i}.attn.k_norm.weight', 'model.layers.{i}.self_attn.k_norm.weight', None),
]
_LLAMA_NAMES = _LLAMA_ATTN_NAMES + [
    ('transformer.h.{i}.mlp.c_fc.{b}', ('model.layers.{i}.mlp.gate_proj.{b}', 'model.layers.{i}.mlp.up_proj.{b}'), None),
    ('transformer.h.{i}.mlp.c_proj.{b}', 'model.layers.{i}.mlp.down_proj.{b}', None),
    # MoE layers: transformers keeps its experts stacked as we do, [gate | up] too
    ('transformer.h.{i}.mlp.router.weight', 'model.layers.{i}.mlp.gate.weight', None),
    ('transformer.h.{i}.mlp.expert_bias', 'model.layers.{i}.mlp.gate.e_score_correction_bias', None),
    ('transformer.h.{i}.mlp.experts.c_fc', 'model.layers.{i}.mlp.experts.gate_up_proj', None),
    ('transformer.h.{i}.mlp.experts.c_proj', 'model.layers.{i}.mlp.experts.down_proj', None),
    ('transformer.h.{i}.mlp.shared.c_fc.weight', ('model.layers.{i}.mlp.shared_experts.gate_proj.weight',
                                                  'model.layers.{i}.mlp.shared_experts.up_proj.weight'), None),
    ('transformer.h.{i}.mlp.shared.c_proj.weight', 'model.layers.{i}.mlp.shared_experts.down_proj.weight', None),
]
_GPT_OSS_NAMES = _LLAMA_ATTN_NAMES + [
    ('transformer.h.{i}.attn.sinks', 'model.layers.{i}.self_attn.sinks', None),
    ('transformer.h.{i}.mlp.router.{b}', 'model.layers.{i}.mlp.router.{b}', None),
    ('transformer.h.{i}.mlp.experts.c_fc', 'model.layers.{i}.mlp.experts.gate_up_proj', 'oss_gate_up'),
    ('transformer.h.{i}.mlp.experts.c_fc_bias', 'model.layers.{i}.mlp.experts.gate_up_proj_bias', 'oss_gate_up_bias'),
    ('transformer.h.{i}.mlp.experts.c_proj', 'model.layers.{i}.mlp.experts.down_proj', 'oss_down'),
    ('transformer.h.{i}.mlp.experts.c_proj_bias', 'model.layers.{i}.mlp.experts.down_proj_bias', None),
]
_MINIMAX_M2_NAMES = _LLAMA_ATTN_NAMES + [  # the experts as Mixtral's, the balancing bias on the MoE block
    ('transformer.h.{i}.mlp.router.weight', 'model.layers.{i}.mlp.gate.weight', None),
    ('transformer.h.{i}.mlp.expert_bias', 'model.layers.{i}.mlp.e_score_correction_bias', None),
    ('transformer.h.{i}.mlp.experts.c_fc', 'model.layers.{i}.mlp.experts.gate_up_proj', None),
    ('transformer.h.{i}.mlp.experts.c_proj', 'model.layers.{i}.mlp.experts.down_proj', None),
]
_MOE = {k: ANY for k in ('n_expert', 'n_expert_active', 'moe_hidden', 'moe_aux_loss_coef', 'moe_z_loss_coef')}
_DEEPSEEK_NAMES = [row for row in _LLAMA_NAMES if '.attn.' not in row[0]] + [
    ('transformer.h.{i}.attn.q_proj.weight', 'model.layers.{i}.self_attn.q_proj.weight', 'rope_q'),
    ('transformer.h.{i}.attn.q_a.weight', 'model.layers.{i}.self_attn.q_a_proj.weight', None),
    ('transformer.h.{i}.attn.q_a_norm.weight', 'model.layers.{i}.self_attn.q_a_layernorm.weight', None),
    ('transformer.h.{i}.attn.q_b.weight', 'model.layers.{i}.self_attn.q_b_proj.weight', 'rope_q'),
    ('transformer.h.{i}.attn.kv_a.weight', 'model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight', 'rope_kv'),
    ('transformer.h.{i}.attn.kv_norm.weight', 'model.layers.{i}.self_attn.kv_a_layernorm.weight', None),
    ('transformer.h.{i}.attn.kv_b.weight', 'model.layers.{i}.self_attn.kv_b_proj.weight', None),
    ('transformer.h.{i}.attn.c_proj.weight', 'model.layers.{i}.self_attn.o_proj.weight', None),
]
_DEEPSEEK = {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'attn': ('mla',), 'n_kv_head': (None,), 'head_dim': (None,),
             'mlp': ('swiglu', 'moe'), 'n_shared_expert': ANY, 'routed_scaling': ANY, 'n_expert_group': ANY,
             'topk_group': ANY, 'first_dense_layers': ANY, 'kv_lora_rank': ANY, 'q_lora_rank': ANY,
             'qk_nope_head_dim': ANY, 'qk_rope_head_dim': ANY, 'v_head_dim': ANY}

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
    'gemma3_text': HFFamily('gemma3_text', 'Gemma3ForCausalLM',
                            {**_LLAMA_LIKE, 'bias': (False,), 'mlp': ('geglu',), 'norm_position': ('sandwich',),
                             'embed_scale': (True,), 'qk_norm': (True,), 'attn_scale': ANY, 'logit_softcap': ANY,
                             'layers': _made_of('LG'), 'sliding_window': ANY, 'rope_local_theta': ANY},
                            _GEMMA3_NAMES, _gemma3_text_read, _gemma3_text_write),
    'olmo2': HFFamily('olmo2', 'Olmo2ForCausalLM', {**_LLAMA_LIKE, 'bias': (False,), 'norm_position': ('after',),
                                                    'qk_norm': (True,), 'qk_norm_all_heads': (True,)},
                      _OLMO_NAMES, _olmo2_read, _olmo2_write),
    'olmo3': HFFamily('olmo3', 'Olmo3ForCausalLM',
                      {**_LLAMA_LIKE, 'bias': (False,), 'norm_position': ('after',), 'qk_norm': (True,),
                       'qk_norm_all_heads': (True,), 'layers': _made_of('LG'), 'sliding_window': ANY,
                       'rope_local_theta': ANY}, _OLMO_NAMES, _olmo3_read, _olmo3_write),
    'smollm3': HFFamily('smollm3', 'SmolLM3ForCausalLM', {**_LLAMA_LIKE, 'bias': ANY, 'layers': _made_of('GN')},
                        _LLAMA_NAMES, _smollm3_read, _smollm3_write),
    'mixtral': HFFamily('mixtral', 'MixtralForCausalLM', {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'mlp': ('moe',),
                                                          'sliding_window': ANY}, _LLAMA_NAMES, _mixtral_read,
                        _mixtral_write),
    'qwen3_moe': HFFamily('qwen3_moe', 'Qwen3MoeForCausalLM',
                          {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'qk_norm': (True,), 'mlp': ('moe',),
                           'sliding_window': ANY, 'router_norm_topk': ANY, 'first_dense_layers': ANY},
                          _LLAMA_NAMES, _qwen3_moe_read, _qwen3_moe_write),
    'deepseek_v3': HFFamily('deepseek_v3', 'DeepseekV3ForCausalLM',
                            {**_DEEPSEEK, 'router': ('sigmoid',), 'router_norm_topk': ANY, 'moe_bias_update_rate': ANY},
                            _DEEPSEEK_NAMES, _deepseek_read, _deepseek_write),
    'deepseek_v2': HFFamily('deepseek_v2', 'DeepseekV2ForCausalLM', {**_DEEPSEEK, 'router': ('softmax',),
                                                                      'router_norm_topk': (False,)},
                            _DEEPSEEK_NAMES, _deepseek_read, _deepseek_v2_write),
    'gpt_oss': HFFamily('gpt_oss', 'GptOssForCausalLM',
                        {**_LLAMA_LIKE, **_MOE, 'bias': ANY, 'mlp': ('moe',), 'attn_sinks': (True,),
                         'moe_bias': (True,), 'swiglu_limit': lambda v: v is not None,
                         'layers': _made_of('LG'), 'sliding_window': ANY},
                        _GPT_OSS_NAMES, _gpt_oss_read, _gpt_oss_write),
    'glm4_moe': HFFamily('glm4_moe', 'Glm4MoeForCausalLM',
                         {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'qkv_bias': ANY, 'qk_norm': ANY,
                          'rope_fraction': ANY, 'mlp': ('swiglu', 'moe'), 'router': ('sigmoid',),
                          'router_norm_topk': ANY, 'n_shared_expert': lambda v: v >= 1, 'n_expert_group': ANY,
                          'topk_group': ANY, 'routed_scaling': ANY, 'first_dense_layers': ANY,
                          'moe_bias_update_rate': ANY},
                         _LLAMA_NAMES, _glm4_moe_read, _glm4_moe_write),
    'minimax_m2': HFFamily('minimax_m2', 'MiniMaxM2ForCausalLM',
                           {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'qk_norm': (True,), 'qk_norm_all_heads': (True,),
                            'rope_fraction': ANY, 'mlp': ('moe',), 'router': ('sigmoid',),
                            'moe_bias_update_rate': ANY},
                           _MINIMAX_M2_NAMES, _minimax_m2_read, _minimax_m2_write),
}


# ----- DeepSeek-V3.2: DeepSeek-V3 with a lightning indexer in every layer (DeepSeek Sparse Attention, index_topk)

def _dense_first(c):
    """How many layers lead with a dense MLP, from mlp_layer_types; refused unless all the dense ones come first."""
    types = list(c.mlp_layer_types[:c.num_hidden_layers])
    dense = next((i for i, t in enumerate(types) if t != 'dense'), len(types))
    if types != ['dense'] * dense + ['sparse'] * (len(types) - dense):
        raise ValueError(f"mlp_layer_types with dense layers other than the first ones ({types}) are not supported")
    return dense


def _deepseek_v32_read(c):
    # DeepSeek-V3's config under V3.2's names: its experts are V3's (sigmoid router, groups)
    v3 = SimpleNamespace(**{**c.to_dict(), 'model_type': 'deepseek_v3', 'first_k_dense_replace': _dense_first(c)})
    return {**_deepseek_read(v3), 'index_topk': c.index_topk, 'index_n_heads': c.index_n_heads,
            'index_head_dim': c.index_head_dim}


def _deepseek_v32_write(cfg):
    return {**_deepseek_write(cfg), 'index_topk': cfg.index_topk, 'index_n_heads': cfg.index_n_heads,
            'index_head_dim': cfg.index_head_dim}


# the indexer's rotated dims are its first ones, turned in halves as ours (its attention's rotate pairs: rope_q)
_INDEXER_NAMES = [(f'transformer.h.{{i}}.attn.indexer.{ours}', f'model.layers.{{i}}.self_attn.indexer.{theirs}', None)
                  for ours, theirs in (('wq.weight', 'wq_b.weight'), ('wk.weight', 'wk.weight'),
                                       ('k_norm.weight', 'k_norm.weight'), ('k_norm.bias', 'k_norm.bias'),
                                       ('weights.weight', 'weights_proj.weight'))]
# what a model with indexers may hold: the stage that reads the top-k, and what only training reads
_DSA = {'index_topk': lambda v: v is not None, 'index_n_heads': ANY, 'index_head_dim': ANY,
        'index_stage': ('sparse',), 'index_loss_coef': ANY}
HF_FAMILIES['deepseek_v32'] = HFFamily(
    'deepseek_v32', 'DeepseekV32ForCausalLM',
    {**HF_FAMILIES['deepseek_v3'].carries, **_DSA, 'q_lora_rank': lambda v: bool(v)},
    _DEEPSEEK_NAMES + _INDEXER_NAMES, _deepseek_v32_read, _deepseek_v32_write)


# ----- GLM-5 (glm_moe_dsa): DeepSeek-V3.2's block, layers sharing an earlier indexer's top-k (IndexCache:
# index_share), the indexer's rotated dims in pairs as its attention's

def _glm_moe_dsa_read(c):
    shares = ['S' if t == 'shared' else 'F' for t in c.indexer_types[:c.num_hidden_layers]]
    return {**_deepseek_v32_read(c), 'index_share': _tiling(shares) if 'S' in shares else None}


def _glm_moe_dsa_write(cfg):
    return {**_deepseek_v32_write(cfg), 'indexer_types': ['shared' if s else 'full' for s in cfg.index_shares]}


def _index_q_rope_rows(config):
    return [h * config.index_head_dim for h in range(config.index_n_heads)]


_TRANSFORMS.update({  # the indexer's first rope_dim rows of each query head and of its key (and the key's norm)
    'rope_index_q': (lambda t, c: _rope_rows(t, c, _index_q_rope_rows, False),
                     lambda t, c: _rope_rows(t, c, _index_q_rope_rows, True)),
    'rope_index_k': (lambda t, c: _rope_rows(t, c, lambda config: [0], False),
                     lambda t, c: _rope_rows(t, c, lambda config: [0], True)),
})
_GLM_INDEXER_HOW = {'wq.weight': 'rope_index_q', 'wk.weight': 'rope_index_k', 'k_norm.weight': 'rope_index_k',
                    'k_norm.bias': 'rope_index_k'}
HF_FAMILIES['glm_moe_dsa'] = HFFamily(
    'glm_moe_dsa', 'GlmMoeDsaForCausalLM', {**HF_FAMILIES['deepseek_v32'].carries, 'index_share': ANY},
    _DEEPSEEK_NAMES + [(ours, theirs, _GLM_INDEXER_HOW.get(ours.split('indexer.')[1]))
                       for ours, theirs, _ in _INDEXER_NAMES],
    _glm_moe_dsa_read, _glm_moe_dsa_write)


# ----- Qwen3-Next: Gated DeltaNet layers ('D') and gated full attention ('G'), (1 + w) norms, a gated shared expert

_LAYER_TYPES = {'linear_attention': 'D', 'full_attention': 'G'}


def _qwen3_next_read(c):
    if getattr(c, 'attention_bias', False):
        raise ValueError("Qwen3-Next with attention_bias is not supported")
    types = list(c.layer_types[:c.num_hidden_layers])
    unknown = set(types) - set(_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only {', '.join(map(repr, _LAYER_TYPES))})")
    kinds = [_LAYER_TYPES[t] for t in types]
    flags = {**_llama_like_read(c, partial=True), 'qk_norm': True, 'attn_gate': True, 'layers': _tiling(kinds)}
    if 'D' in kinds:
        flags.update(linear_n_key_head=c.linear_num_key_heads, linear_n_value_head=c.linear_num_value_heads,
                     linear_key_dim=c.linear_key_head_dim, linear_value_dim=c.linear_value_head_dim,
                     linear_conv_kernel=c.linear_conv_kernel_dim)
    if c.num_experts > 0:
        dense = list(c.mlp_only_layers or [])
        if c.decoder_sparse_step != 1 or dense != list(range(len(dense))):
            raise ValueError(f"dense layers other than the first ones (decoder_sparse_step={c.decoder_sparse_step}, "
                             f"mlp_only_layers={dense}) are not supported")
        shared, hidden = c.shared_expert_intermediate_size, c.moe_intermediate_size
        if shared % hidden != 0 or shared == 0:
            raise ValueError(f"shared_expert_intermediate_size={shared} must be a positive multiple of "
                             f"moe_intermediate_size={hidden} (our shared experts are each an expert wide)")
        flags.update(_moe_read(c, c.num_experts, hidden, router_norm_topk=bool(c.norm_topk_prob),
                               first_dense_layers=len(dense), n_shared_expert=shared // hidden,
                               shared_expert_gate=True))
    return flags


def _qwen3_next_write(cfg):
    dims, moe = cfg.linear_dims, cfg.mlp == 'moe'
    return {**_llama_like_write(cfg), **_rope_write(cfg, partial=True), 'attention_bias': False,
            'layer_types': [{'D': 'linear_attention', 'G': 'full_attention'}[k] for k in cfg.layer_kinds],
            'linear_num_key_heads': dims['k_heads'], 'linear_num_value_heads': dims['v_heads'],
            'linear_key_head_dim': dims['k_dim'], 'linear_value_head_dim': dims['v_dim'],
            'linear_conv_kernel_dim': cfg.linear_conv_kernel, 'num_experts': cfg.n_expert if moe else 0,
            'num_experts_per_tok': cfg.n_expert_active, 'moe_intermediate_size': cfg.expert_hidden,
            'shared_expert_intermediate_size': cfg.n_shared_expert * cfg.expert_hidden,
            'norm_topk_prob': cfg.router_norm_topk, 'decoder_sparse_step': 1,
            'mlp_only_layers': list(range(cfg.first_dense_layers)) if moe else [],
            'router_aux_loss_coef': cfg.moe_aux_loss_coef}


def _qwen3_5_text_read(c):
    return _qwen3_next_read(SimpleNamespace(**{**c.to_dict(), 'num_experts': 0}))


def _qwen3_5_text_write(cfg):
    moe = ('num_experts', 'num_experts_per_tok', 'moe_intermediate_size', 'shared_expert_intermediate_size',
           'norm_topk_prob', 'decoder_sparse_step', 'mlp_only_layers', 'router_aux_loss_coef')
    return {k: v for k, v in _qwen3_next_write(cfg).items() if k not in moe}


def _qwen3_next_parts(cfg, linear=True):
    """Per layer, the packed tensors and the named parts each splits into, as (packed name, groups, [(part
    name, rows per group)]): q_proj is per head [q | gate]; in_proj_qkvz per key head [q | k | v | z] and
    in_proj_ba [b | a], the v, z, b and a of the value heads that key head serves (linear=False: Qwen3.5's
    checkpoints keep them apart already)."""
    dims, hd = cfg.linear_dims, cfg.head_size
    Hk, r, dk, dv = dims['k_heads'], dims['v_heads'] // dims['k_heads'], dims['k_dim'], dims['v_dim']
    for i, kind in enumerate(cfg.layer_kinds):
        pre = f'model.layers.{i}.'
        if kind == 'G':
            yield pre + 'self_attn.q_proj.weight', cfg.n_head, [(pre + 'self_attn.q_proj.weight', hd),
                                                                (pre + 'self_attn.gate_proj.weight', hd)]
        elif linear:
            at = pre + 'linear_attn.'
            yield at + 'in_proj_qkvz.weight', Hk, [(at + 'q', dk), (at + 'k', dk), (at + 'v', r * dv), (at + 'z', r * dv)]
            yield at + 'in_proj_ba.weight', Hk, [(at + 'in_proj_b.weight', r), (at + 'in_proj_a.weight', r)]


def _split_rows(tensor, groups, parts):
    """[(name, rows)] of a matrix whose rows are `groups` groups of the parts, each part's rows together."""
    pieces = tensor.view(groups, -1, tensor.size(-1)).split([n for _, n in parts], dim=1)
    return [(name, piece.reshape(-1, tensor.size(-1))) for (name, _), piece in zip(parts, pieces)]


def _join_rows(pieces, groups):
    width = pieces[0].size(-1)
    return torch.cat([p.reshape(groups, -1, width) for p in pieces], dim=1).reshape(-1, width)


def _qwen3_next_unpack(hf_state, cfg):
    out = dict(hf_state)
    for packed, groups, parts in _qwen3_next_parts(cfg):
        out.update(_split_rows(out.pop(packed), groups, parts))
    for i, kind in enumerate(cfg.layer_kinds):  # q, k and v are one matrix in ours, as in Qwen3.5's checkpoints
        at = f'model.layers.{i}.linear_attn.'
        if kind == 'D':
            out[at + 'in_proj_qkv.weight'] = torch.cat([out.pop(at + n) for n in 'qkv'])
            out[at + 'in_proj_z.weight'] = out.pop(at + 'z')
    return out


def _qwen3_next_pack(hf_state, cfg):
    out, dims = dict(hf_state), cfg.linear_dims
    for i, kind in enumerate(cfg.layer_kinds):
        at = f'model.layers.{i}.linear_attn.'
        if kind == 'D':
            q, k, v = out.pop(at + 'in_proj_qkv.weight').split(
                [dims['k_heads'] * dims['k_dim']] * 2 + [dims['v_heads'] * dims['v_dim']])
            out.update({at + 'q': q, at + 'k': k, at + 'v': v, at + 'z': out.pop(at + 'in_proj_z.weight')})
    for packed, groups, parts in _qwen3_next_parts(cfg):
        out[packed] = _join_rows([out.pop(name) for name, _ in parts], groups)
    return out


_QWEN3_NEXT_NAMES = _decoder_names([('ln_1', 'input_layernorm'), ('ln_2', 'post_attention_layernorm')], '1+w') + [
    ('transformer.h.{i}.attn.c_gate.weight', 'model.layers.{i}.self_attn.gate_proj.weight', None),
    *[(f'transformer.h.{{i}}.attn.{n}.weight', f'model.layers.{{i}}.linear_attn.{n}.weight', None)
      for n in ('in_proj_qkv', 'in_proj_z', 'in_proj_b', 'in_proj_a', 'conv1d')],
    ('transformer.h.{i}.attn.A_log', 'model.layers.{i}.linear_attn.A_log', None),
    ('transformer.h.{i}.attn.dt_bias', 'model.layers.{i}.linear_attn.dt_bias', None),
    ('transformer.h.{i}.attn.norm', 'model.layers.{i}.linear_attn.norm.weight', None),  # a plain gain, not 1 + w
    ('transformer.h.{i}.attn.c_proj.weight', 'model.layers.{i}.linear_attn.out_proj.weight', None),
    ('transformer.h.{i}.mlp.router.weight', 'model.layers.{i}.mlp.gate.weight', None),
    ('transformer.h.{i}.mlp.experts.c_fc', 'model.layers.{i}.mlp.experts.gate_up_proj', None),
    ('transformer.h.{i}.mlp.experts.c_proj', 'model.layers.{i}.mlp.experts.down_proj', None),
    ('transformer.h.{i}.mlp.shared.c_fc.weight', ('model.layers.{i}.mlp.shared_expert.gate_proj.weight',
                                                  'model.layers.{i}.mlp.shared_expert.up_proj.weight'), None),
    ('transformer.h.{i}.mlp.shared.c_proj.weight', 'model.layers.{i}.mlp.shared_expert.down_proj.weight', None),
    ('transformer.h.{i}.mlp.shared_gate.weight', 'model.layers.{i}.mlp.shared_expert_gate.weight', None),
]
HF_FAMILIES['qwen3_next'] = HFFamily(
    'qwen3_next', 'Qwen3NextForCausalLM',
    {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'qk_norm': (True,), 'attn_gate': (True,), 'rope_fraction': ANY,
     'layers': _made_of('DG'), 'mlp': ('swiglu', 'moe'), 'router_norm_topk': ANY, 'first_dense_layers': ANY,
     'n_shared_expert': lambda v: v >= 1, 'shared_expert_gate': (True,),
     **{k: ANY for k in ('linear_n_key_head', 'linear_n_value_head', 'linear_key_dim', 'linear_value_dim',
                         'linear_conv_kernel', 'linear_chunk_size')}},
    _QWEN3_NEXT_NAMES, _qwen3_next_read, _qwen3_next_write, _qwen3_next_unpack, _qwen3_next_pack)


def _qwen3_5_split_q(hf_state, cfg):
    return dict(hf_state) | {name: t for packed, groups, parts in _qwen3_next_parts(cfg, linear=False)
                             for name, t in _split_rows(hf_state[packed], groups, parts)}


def _qwen3_5_join_q(hf_state, cfg):
    out = dict(hf_state)
    for packed, groups, parts in _qwen3_next_parts(cfg, linear=False):
        out[packed] = _join_rows([out.pop(name) for name, _ in parts], groups)
    return out


# Qwen3.5's text model: Qwen3-Next's dense block, its DeltaNet projections in separate tensors (its MRoPE sections
# all read the one text position: plain RoPE)
HF_FAMILIES['qwen3_5_text'] = HFFamily(
    'qwen3_5_text', 'Qwen3_5ForCausalLM',
    {**{k: v for k, v in HF_FAMILIES['qwen3_next'].carries.items() if k not in _MOE_SETTINGS}, 'mlp': ('swiglu',)},
    _QWEN3_NEXT_NAMES, _qwen3_5_text_read, _qwen3_5_text_write, _qwen3_5_split_q, _qwen3_5_join_q)


# ----- Kimi Linear: Kimi Delta Attention layers ('K') and MLA without positions ('G', pos='none'), DeepSeek-V3's MoE

_KIMI_LAYER_TYPES = {'linear_attention': 'K', 'full_attention': 'G'}


def _kimi_linear_read(c):
    if c.hidden_act != 'silu' or getattr(c, 'attention_bias', False):
        raise ValueError("Kimi Linear checkpoints with attention_bias or an activation other than silu are not supported")
    n = c.num_hidden_layers
    unknown = set(c.layer_types[:n]) - set(_KIMI_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only "
                         f"{', '.join(map(repr, _KIMI_LAYER_TYPES))})")
    kinds = [_KIMI_LAYER_TYPES[t] for t in c.layer_types[:n]]
    flags = dict(n_layer=n, n_head=c.num_attention_heads, n_embd=c.hidden_size, block_size=c.max_position_embeddings,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.rms_norm_eps, mlp='swiglu',
                 ffn_hidden=c.intermediate_size, tie_embeddings=bool(c.tie_word_embeddings), pos='none', attn='mla',
                 kv_lora_rank=c.kv_lora_rank, q_lora_rank=c.q_lora_rank or None, qk_nope_head_dim=c.qk_nope_head_dim,
                 qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim, layers=_tiling(kinds))
    if 'K' in kinds:
        flags.update(linear_n_key_head=c.linear_num_heads, linear_key_dim=c.linear_head_dim,
                     linear_value_dim=c.linear_head_dim, linear_conv_kernel=c.linear_conv_kernel_dim)
    dense = [t == 'dense' for t in c.mlp_layer_types[:n]]
    first_sparse = dense.index(False) if False in dense else n
    if any(dense[first_sparse:]):
        raise ValueError(f"dense layers other than the first ones (mlp_layer_types={c.mlp_layer_types}) are not "
                         f"supported")
    if first_sparse < n:
        groups = c.num_expert_group or 1
        flags.update(mlp='moe', n_expert=c.num_experts, n_expert_active=c.num_experts_per_token,
                     moe_hidden=c.moe_intermediate_size, n_shared_expert=c.num_shared_experts, router='sigmoid',
                     router_norm_topk=bool(c.moe_renormalize), n_expert_group=groups,
                     topk_group=(c.topk_group or 1) if groups > 1 else 1, routed_scaling=float(c.routed_scaling_factor),
                     first_dense_layers=first_sparse)
    return flags


def _kimi_linear_write(cfg):
    dims, linear, moe = cfg.mla_dims, cfg.linear_dims, cfg.mlp == 'moe'
    if linear['k_dim'] != linear['v_dim']:
        raise ValueError(f"kimi_linear has one head width for keys and values: linear_key_dim ({linear['k_dim']}) "
                         f"!= linear_value_dim ({linear['v_dim']})")
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_width,
                num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
                rms_norm_eps=cfg.norm_eps, hidden_act='silu', attention_dropout=cfg.dropout, attention_bias=False,
                tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.block_size,
                kv_lora_rank=dims['latent'], q_lora_rank=dims['q_latent'] or None, qk_nope_head_dim=dims['nope'],
                qk_rope_head_dim=dims['rope'], v_head_dim=dims['v'],
                layer_types=[{'K': 'linear_attention', 'G': 'full_attention'}[k] for k in cfg.layer_kinds],
                linear_num_heads=linear['k_heads'], linear_head_dim=linear['k_dim'],
                linear_conv_kernel_dim=cfg.linear_conv_kernel,
                mlp_layer_types=['sparse' if moe and i >= cfg.first_dense_layers else 'dense' for i in range(cfg.n_layer)],
                num_local_experts=cfg.n_expert, num_experts_per_tok=cfg.n_expert_active,
                moe_intermediate_size=cfg.expert_hidden, n_shared_experts=cfg.n_shared_expert,
                routed_scaling_factor=float(cfg.routed_scaling), n_group=cfg.n_expert_group, topk_group=cfg.topk_group,
                norm_topk_prob=cfg.router_norm_topk, pad_token_id=None)  # its default is past a smaller vocabulary


_TRANSFORMS['A_log (1, 1, H, 1)'] = (lambda t, c: t.reshape(-1), lambda t, c: t.view(1, 1, -1, 1))
_KIMI_LINEAR_NAMES = [(ours, hf, None) for ours, hf, _ in _DEEPSEEK_NAMES] + [  # nothing rotates: rows as they are
    ('transformer.h.{i}.attn.in_proj_qkv.weight', tuple(f'model.layers.{{i}}.self_attn.{n}_proj.weight' for n in 'qkv'),
     None),
    *[(f'transformer.h.{{i}}.attn.{ours}', f'model.layers.{{i}}.self_attn.{hf}', how) for ours, hf, how in (
        ('conv1d.weight', 'conv1d.weight', None), ('in_proj_b.weight', 'b_proj.weight', None),
        ('decay_a.weight', 'forget_gate.f_a_proj.weight', None), ('decay_b.weight', 'forget_gate.f_b_proj.weight', None),
        ('dt_bias', 'forget_gate.dt_bias', None), ('A_log', 'forget_gate.A_log', 'A_log (1, 1, H, 1)'),
        ('gate_a.weight', 'g_a_proj.weight', None), ('gate_b.weight', 'g_b_proj.weight', None),
        ('norm', 'o_norm.weight', None))],
]
HF_FAMILIES['kimi_linear'] = HFFamily(
    'kimi_linear', 'KimiLinearForCausalLM',
    {**_SIZES, **_MOE, 'norm': ('rms',), 'bias': (False,), 'pos': ('none',), 'attn': ('mla',), 'layers': _made_of('KG'),
     'mlp': ('swiglu', 'moe'), 'router': ('sigmoid',), 'router_norm_topk': ANY, 'n_shared_expert': lambda v: v >= 1,
     'n_expert_group': ANY, 'topk_group': ANY, 'routed_scaling': ANY, 'first_dense_layers': ANY,
     'moe_bias_update_rate': ANY,
     **{k: ANY for k in ('kv_lora_rank', 'q_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim',
                         'linear_n_key_head', 'linear_key_dim', 'linear_value_dim', 'linear_conv_kernel',
                         'linear_chunk_size')}},
    _KIMI_LINEAR_NAMES, _kimi_linear_read, _kimi_linear_write)


# ----- OLMo hybrid: Gated DeltaNet layers ('D', pre-norm, beta in [0, 2]) and OLMo 3's attention layers ('G',
# norms after each branch, QK-norm over all heads), with RoPE or none (its released checkpoints)

def _olmo_hybrid_read(c):
    if c.hidden_act != 'silu' or c.attention_bias:
        raise ValueError("OLMo hybrid checkpoints with attention_bias or an activation other than silu are not supported")
    unknown = set(c.layer_types[:c.num_hidden_layers]) - set(_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only {', '.join(map(repr, _LAYER_TYPES))})")
    nope = (getattr(c, 'rope_parameters', None) or {}).get('rope_theta') is None  # no rotary embedding at all
    flags = _llama_like_read(SimpleNamespace(**{**c.to_dict(), 'rope_parameters': None}) if nope else c)
    if nope:
        flags.update(pos='none', rope_theta=GPTConfig.rope_theta)
    kinds = [_LAYER_TYPES[t] for t in c.layer_types[:c.num_hidden_layers]]
    return {**flags, 'layers': _tiling(kinds), 'norm_position': 'after', 'qk_norm': True, 'qk_norm_all_heads': True,
            'linear_n_key_head': c.linear_num_key_heads, 'linear_n_value_head': c.linear_num_value_heads,
            'linear_key_dim': c.linear_key_head_dim, 'linear_value_dim': c.linear_value_head_dim,
            'linear_conv_kernel': c.linear_conv_kernel_dim, 'linear_neg_eigval': bool(c.linear_allow_neg_eigval),
            'linear_norm_eps': 1e-5, 'linear_norm_position': 'pre'}  # its DeltaNet's norm: FLA's epsilon


def _olmo_hybrid_write(cfg):
    dims = cfg.linear_dims
    out = {**_llama_like_write(cfg), 'attention_bias': False, 'pad_token_id': None,
           'layer_types': [{'D': 'linear_attention', 'G': 'full_attention'}[k] for k in cfg.layer_kinds],
           'linear_num_key_heads': dims['k_heads'], 'linear_num_value_heads': dims['v_heads'],
           'linear_key_head_dim': dims['k_dim'], 'linear_value_head_dim': dims['v_dim'],
           'linear_conv_kernel_dim': cfg.linear_conv_kernel, 'linear_allow_neg_eigval': cfg.linear_neg_eigval}
    if cfg.pos == 'none':
        out.update(rope_parameters=None, rope_theta=None)  # no rotary embedding
    return out


def _olmo_hybrid_norms(cfg):
    """(layer, its HF norm, the name our ln_1 or ln_2 row reads) per layer: a DeltaNet block's norms are before
    each branch (input_layernorm, post_attention_layernorm), an attention block's after (post_attention_layernorm,
    post_feedforward_layernorm): the same HF name is ln_1 in one kind and ln_2 in the other."""
    for i, kind in enumerate(cfg.layer_kinds):
        pre = f'model.layers.{i}.'
        names = ('input_layernorm', 'post_attention_layernorm') if kind == 'D' else \
            ('post_attention_layernorm', 'post_feedforward_layernorm')
        for hf_name, ours in zip(names, ('ln_1', 'ln_2')):
            yield pre + hf_name + '.weight', pre + ours + '.weight'


def _olmo_hybrid_unpack(hf_state, cfg):
    out = dict(hf_state)
    out.update({ours: hf_state[hf_name] for hf_name, ours in _olmo_hybrid_norms(cfg)})
    for hf_name, _ in _olmo_hybrid_norms(cfg):
        del out[hf_name]
    return out


def _olmo_hybrid_pack(hf_state, cfg):
    out = dict(hf_state)
    out.update({hf_name: out.pop(ours) for hf_name, ours in _olmo_hybrid_norms(cfg)})
    return out


# the norms under the names unpack gives them (model.layers.{i}.ln_1.weight, ...)
_OLMO_HYBRID_NAMES = _decoder_names([('ln_1', 'ln_1'), ('ln_2', 'ln_2')]) + [
    ('transformer.h.{i}.attn.in_proj_qkv.weight', tuple(f'model.layers.{{i}}.linear_attn.{n}_proj.weight' for n in 'qkv'),
     None),
    *[(f'transformer.h.{{i}}.attn.{ours}', f'model.layers.{{i}}.linear_attn.{hf}', None) for ours, hf in (
        ('in_proj_z.weight', 'g_proj.weight'), ('in_proj_b.weight', 'b_proj.weight'),
        ('in_proj_a.weight', 'a_proj.weight'), ('conv1d.weight', 'conv1d.weight'), ('A_log', 'A_log'),
        ('dt_bias', 'dt_bias'), ('norm', 'o_norm.weight'), ('c_proj.weight', 'o_proj.weight'))],
]
HF_FAMILIES['olmo_hybrid'] = HFFamily(
    'olmo_hybrid', 'OlmoHybridForCausalLM',
    {**_SIZES, 'rope_theta': ANY, 'norm': ('rms',), 'mlp': ('swiglu',), 'pos': ('rope', 'none'), 'n_kv_head': ANY,
     'bias': (False,), 'norm_position': ('after',), 'qk_norm': (True,), 'qk_norm_all_heads': (True,),
     'layers': lambda v: v is not None and set(v) == set('DG'), 'linear_norm_position': ('pre',),
     'linear_norm_eps': (1e-5,), 'linear_neg_eigval': ANY,
     **{k: ANY for k in ('linear_n_key_head', 'linear_n_value_head', 'linear_key_dim', 'linear_value_dim',
                         'linear_conv_kernel', 'linear_chunk_size')}},
    _OLMO_HYBRID_NAMES, _olmo_hybrid_read, _olmo_hybrid_write, _olmo_hybrid_unpack, _olmo_hybrid_pack)


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
    if family.unpack:
        hf_state = family.unpack(hf_state, model.config)
    state, used = {}, set()
    for name, hf_names, how in _rows(family, model.config):
        if name not in ours or not all(h in hf_state for h in hf_names):
            continue
        tensor = torch.cat([hf_state[h] for h in hf_names]) if len(hf_names) > 1 else hf_state[hf_names[0]]
        state[name] = _TRANSFORMS[how][0](tensor, model.config) if how else tensor
        used.update(hf_names)
    if model.config.tie_embeddings:
        state['lm_head.weight'] = state['transformer.wte.weight']
        used.add('lm_head.weight')
    # causal-mask buffers of older GPT-2 checkpoints and rotary tables are not weights
    unused = {k for k in hf_state if k not in used and not k.endswith(('.attn.bias', '.attn.masked_bias', 'inv_freq'))}
    return state, unused


def ours_to_hf(model, hf_state, family):
    """A transformers state dict from ours, shaped like hf_state (the target model's own)."""
    out, ours = {}, model.state_dict()
    if family.unpack:
        hf_state = family.unpack(hf_state, model.config)
    for name, hf_names, how in _rows(family, model.config):
        if name not in ours or not all(h in hf_state for h in hf_names):  # a row of another layer kind
            continue
        tensor = ours[name].detach().clone()
        tensor = _TRANSFORMS[how][1](tensor, model.config) if how else tensor
        parts = tensor.split([hf_state[h].size(0) for h in hf_names]) if len(hf_names) > 1 else (tensor,)
        out.update(zip(hf_names, parts))
    # a family whose layers always have biases (GPT-2) gets zeros where our bias=False model has none
    out.update({k: torch.zeros_like(v) for k, v in hf_state.items() if k not in out and k.endswith('.bias')})
    return family.pack(out, model.config) if family.pack else out


def from_pretrained(name_or_path, override_args=None):
    """Our GPT holding a Hugging Face checkpoint (a hub name or a local directory) of one of HF_FAMILIES, in the
    config that computes the same logits (GPT.from_pretrained calls this)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    override_args = dict(override_args or {})
    unknown = set(override_args) - {'dropout'}
    if unknown:
        raise ValueError(f"override_args may only set 'dropout', got {sorted(unknown)}")
    hf_config = AutoConfig.from_pretrained(name_or_path)
    if hf_config.model_type == 'qwen3_5':  # Qwen3.5's vision-language checkpoint: its text model (what
        hf_config = hf_config.text_config  # AutoModelForCausalLM loads of it)
    family = HF_FAMILIES.get(hf_config.model_type)
    if family is None:
        raise ValueError(f"{name_or_path}: model_type {hf_config.model_type!r} is not supported "
                         f"({', '.join(map(repr, HF_FAMILIES))})")
    model = GPT(GPTConfig(**{**family.read_config(hf_config), **override_args}))
    hf_state = AutoModelForCausalLM.from_pretrained(name_or_path).state_dict()
    state, unused = hf_to_ours(hf_state, model, family)
    if unused:
        raise ValueError(f"{name_or_path}: weights this model has no place for: {sorted(unused)[:5]}")
    model.load_state_dict(state)
    # export goes back to this family by default (where several carry the same flags, as Qwen3-Next and
    # Qwen3.5 do, the flags alone cannot say); checkpoints carry it on (common.new_checkpoint)
    model.hf_family = family.model_type
    return model


# ----- nanochat: weightless norms (one on the embeddings too), QK-norm after its RoPE, squared ReLU, a soft-cap

def _nanochat_read(c):
    if c.hidden_act != 'relu2':
        raise ValueError(f"nanochat with hidden_act {c.hidden_act!r} is not supported (only 'relu2', squared ReLU)")
    if c.attention_bias:
        raise ValueError("nanochat with attention_bias is not supported")
    llama_like = _llama_like_read(SimpleNamespace(**{**c.to_dict(), 'hidden_act': 'silu'}))  # its MLP set below
    return {**llama_like, 'head_dim': None, 'mlp': 'relu2', 'norm_gain': False, 'embed_norm': True, 'qk_norm': True,
            'logit_softcap': c.final_logit_softcapping}


def _nanochat_write(cfg):
    out = {**_llama_like_write(cfg), 'hidden_act': 'relu2', 'final_logit_softcapping': cfg.logit_softcap,
           'attention_bias': False}
    del out['head_dim']  # nanochat's heads are n_embd / n_head wide
    return out


def _rope_turned_back(t, config):
    """nanochat rotates each pair (x[j], x[j + d/2]) by minus our angle: the same rotation as ours of the pair
    with its second half negated, so the rows giving the second half of each q and k head change sign (q.k keeps
    its value; a weightless QK-norm does not see signs). Its own inverse, so used both ways."""
    hs, rows = config.head_size, (config.n_head + config.kv_heads) * config.head_size
    t = t.clone()
    heads = t[:rows].view(-1, 2, hs // 2, t.size(-1))
    heads[:, 1] = -heads[:, 1]
    return t


_TRANSFORMS['rope_turned_back'] = (_rope_turned_back, _rope_turned_back)
_NANOCHAT_NAMES = [
    ('transformer.wte.weight', 'model.embed_tokens.weight', None),
    ('lm_head.weight', 'lm_head.weight', None),
    ('transformer.h.{i}.attn.c_attn.weight', tuple(f'model.layers.{{i}}.self_attn.{n}_proj.weight' for n in 'qkv'),
     'rope_turned_back'),
    ('transformer.h.{i}.attn.c_proj.weight', 'model.layers.{i}.self_attn.o_proj.weight', None),
    ('transformer.h.{i}.mlp.c_fc.weight', 'model.layers.{i}.mlp.fc1.weight', None),
    ('transformer.h.{i}.mlp.c_proj.weight', 'model.layers.{i}.mlp.fc2.weight', None),
]
HF_FAMILIES['nanochat'] = HFFamily(
    'nanochat', 'NanoChatForCausalLM',
    {**_LLAMA_LIKE, 'head_dim': (None,), 'bias': (False,), 'mlp': ('relu2',), 'norm_gain': (False,),
     'embed_norm': (True,), 'qk_norm': (True,), 'logit_softcap': ANY},
    _NANOCHAT_NAMES, _nanochat_read, _nanochat_write)


# ----- Llama 4 (text): chunked RoPE layers and NoPE layers ('C', 'N'), L2 QK-norm, MoE on every k-th layer

def _llama4_kinds(c):
    """Each layer's kind: 'N' without RoPE (no_rope_layers 0), 'C' chunked, 'G' full attention with RoPE."""
    kinds = []
    for rope, kind in zip(c.no_rope_layers[:c.num_hidden_layers], c.layer_types[:c.num_hidden_layers]):
        if kind not in ('chunked_attention', 'full_attention'):
            raise ValueError(f"llama4_text layer type {kind!r} is not supported (only 'chunked_attention', "
                             f"'full_attention')")
        if not rope and kind == 'chunked_attention':
            raise ValueError("llama4_text chunked layers without RoPE are not supported (our 'C' layers rotate)")
        kinds.append('N' if not rope else 'C' if kind == 'chunked_attention' else 'G')
    return kinds


def _llama4_read(c):
    if c.attention_bias:
        raise ValueError("llama4_text with attention_bias is not supported")
    kinds, n = _llama4_kinds(c), c.num_hidden_layers
    flags = {**_llama_like_read(c), 'ffn_hidden': c.intermediate_size_mlp, 'layers': _tiling(kinds),
             'rope_qk_norm': bool(c.use_qk_norm) and kinds != ['N'] * n}
    if 'C' in kinds:
        flags['attention_chunk_size'] = c.attention_chunk_size
    if 'N' in kinds and c.attn_temperature_tuning:
        flags.update(nope_temperature=float(c.attn_scale), nope_temperature_floor=int(c.floor_scale))
    moe = list(c.moe_layers)
    if moe:
        every = moe[0] + 1
        if moe != list(range(every - 1, n, every)):
            raise ValueError(f"llama4_text moe_layers={moe} are not every k-th layer (k-1, 2k-1, ...): not supported")
        flags.update(_moe_read(c, c.num_local_experts, c.intermediate_size, router_norm_topk=False, n_shared_expert=1,
                               moe_bias_update_rate=0.0, moe_scale_input=True, moe_every=every), router='sigmoid')
    return flags


def _llama4_write(cfg):
    moe = cfg.mlp == 'moe'
    return {**_llama_like_write(cfg), **_moe_write(cfg), 'intermediate_size': cfg.expert_hidden,
            'intermediate_size_mlp': cfg.mlp_width, 'num_local_experts': cfg.n_expert,
            'moe_layers': [i for i in range(cfg.n_layer) if moe and cfg.mlp_of(i) == 'moe'],
            'no_rope_layers': [int(k != 'N') for k in cfg.layer_kinds],
            'layer_types': ['chunked_attention' if k == 'C' else 'full_attention' for k in cfg.layer_kinds],
            'attention_chunk_size': cfg.attention_chunk_size, 'use_qk_norm': cfg.rope_qk_norm,
            'attn_temperature_tuning': cfg.nope_temperature is not None,
            'attn_scale': cfg.nope_temperature or 0.1, 'floor_scale': cfg.nope_temperature_floor,
            'attention_bias': False}


def _pairs_to_halves(t, config, inverse=False):
    """Llama 4 rotates pairs (x[2j], x[2j+1]) of each q and k head, we rotate halves (x[j], x[j + d/2]): its
    rows reordered (every layer's: without RoPE the same order on q and k leaves q.k as it was)."""
    d, heads = config.head_size, config.n_head + config.kv_heads
    order = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    order = order.argsort() if inverse else order
    rows = torch.arange(t.size(0))
    rows[:heads * d] = (torch.arange(heads)[:, None] * d + order).flatten()
    return t[rows]


_LLAMA4_NO_BIAS = 'model.layers.{i}.feed_forward.router_bias'  # our sigmoid router's balancing bias, not in Llama 4


def _llama4_unpack(hf_state, cfg):
    """Llama 4 chooses experts by the router alone: our balancing bias, a zero that cannot move (its update rate is
    0), given a name so that it loads."""
    out = dict(hf_state)
    for i in range(cfg.n_layer):
        router = f'model.layers.{i}.feed_forward.router.weight'
        if router in out:
            out[_LLAMA4_NO_BIAS.format(i=i)] = out[router].new_zeros(cfg.n_expert)
    return out


def _llama4_pack(hf_state, cfg):
    out = dict(hf_state)
    for i in range(cfg.n_layer):
        bias = out.pop(_LLAMA4_NO_BIAS.format(i=i), None)
        if bias is not None and bias.any():
            raise ValueError(f"llama4_text chooses experts without a bias: layer {i}'s expert_bias is not zero")
    return out


_TRANSFORMS.update({'pairs_to_halves': (_pairs_to_halves, partial(_pairs_to_halves, inverse=True)),
                    'stacked_T': _TRANSFORMS['oss_down']})  # (E, d, 2h) as x @ W, ours (E, 2h, d): transposed
_LLAMA4_NAMES = [(ours, hf, 'pairs_to_halves' if '.c_attn.' in ours else how)
                 for ours, hf, how in _LLAMA_ATTN_NAMES] + [
    *[(f'transformer.h.{{i}}.mlp.{ours}', tuple(f'model.layers.{{i}}.feed_forward.{h}' for h in hf)
       if isinstance(hf, tuple) else f'model.layers.{{i}}.feed_forward.{hf}', how) for ours, hf, how in (
        ('c_fc.weight', ('gate_proj.weight', 'up_proj.weight'), None), ('c_proj.weight', 'down_proj.weight', None),
        ('router.weight', 'router.weight', None), ('experts.c_fc', 'experts.gate_up_proj', 'stacked_T'),
        ('experts.c_proj', 'experts.down_proj', 'stacked_T'),
        ('shared.c_fc.weight', ('shared_expert.gate_proj.weight', 'shared_expert.up_proj.weight'), None),
        ('shared.c_proj.weight', 'shared_expert.down_proj.weight', None))],
    ('transformer.h.{i}.mlp.expert_bias', _LLAMA4_NO_BIAS, None),
]
HF_FAMILIES['llama4_text'] = HFFamily(
    'llama4_text', 'Llama4ForCausalLM',
    {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'layers': _made_of('GCN'), 'attention_chunk_size': ANY,
     'nope_temperature': ANY, 'nope_temperature_floor': ANY, 'rope_qk_norm': ANY, 'mlp': ('swiglu', 'moe'),
     'router': ('sigmoid',), 'router_norm_topk': (False,), 'n_shared_expert': (1,), 'moe_bias_update_rate': (0,),
     'moe_scale_input': (True,), 'moe_every': ANY},
    _LLAMA4_NAMES, _llama4_read, _llama4_write, _llama4_unpack, _llama4_pack)
_MOE_SETTINGS += ('moe_scale_input', 'moe_every')  # as the other MoE settings: a dense model's change nothing
# ----- LFM2: gated short convolutions ('V') among QK-normed attention layers ('G')

_LFM2_LAYER_TYPES = {'conv': 'V', 'full_attention': 'G'}


def _lfm2_mlp_width(c):
    """The SwiGLU width LFM2 builds: with block_auto_adjust_ff_dim, 2/3 of intermediate_size, times
    block_ffn_dim_multiplier, rounded up to block_multiple_of."""
    width = c.intermediate_size
    if c.block_auto_adjust_ff_dim:
        width = int(2 * width / 3)
        if c.block_ffn_dim_multiplier is not None:
            width = int(c.block_ffn_dim_multiplier * width)
            width = c.block_multiple_of * -(-width // c.block_multiple_of)
    return width


def _lfm2_read(c):
    if c.conv_bias:
        raise ValueError("LFM2 with conv_bias is not supported (its attention has no biases)")
    types = list(c.layer_types[:c.num_hidden_layers])
    unknown = set(types) - set(_LFM2_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported "
                         f"(only {', '.join(map(repr, _LFM2_LAYER_TYPES))})")
    kinds = [_LFM2_LAYER_TYPES[t] for t in types]
    head_dim = getattr(c, 'head_dim', None)
    flags = dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                 n_kv_head=c.num_key_value_heads, block_size=c.max_position_embeddings,
                 head_dim=None if head_dim in (None, c.hidden_size // c.num_attention_heads) else head_dim,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.norm_eps, mlp='swiglu',
                 ffn_hidden=_lfm2_mlp_width(c), tie_embeddings=bool(c.tie_word_embeddings), qk_norm=True,
                 layers=_tiling(kinds))
    if 'V' in kinds:
        flags['short_conv_kernel'] = c.conv_L_cache
    flags.update(_rope_read(c))  # it may set block_size
    return flags


def _lfm2_write(cfg):
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
                num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_size,
                norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
                intermediate_size=cfg.mlp_width, block_auto_adjust_ff_dim=False,  # the width as it is
                layer_types=[{'V': 'conv', 'G': 'full_attention'}[k] for k in cfg.layer_kinds],
                conv_L_cache=cfg.short_conv_kernel, conv_bias=False, **_rope_write(cfg))


_LFM2_NAMES = [
    ('transformer.wte.weight', 'model.embed_tokens.weight', None),
    ('transformer.ln_f.weight', 'model.embedding_norm.weight', None),  # LFM2's final norm, despite its name
    ('lm_head.weight', 'lm_head.weight', None),
    ('transformer.h.{i}.ln_1.weight', 'model.layers.{i}.operator_norm.weight', None),
    ('transformer.h.{i}.ln_2.weight', 'model.layers.{i}.ffn_norm.weight', None),
    ('transformer.h.{i}.attn.c_attn.weight', tuple(f'model.layers.{{i}}.self_attn.{n}_proj.weight' for n in 'qkv'),
     None),
    ('transformer.h.{i}.attn.c_proj.weight', 'model.layers.{i}.self_attn.out_proj.weight', None),
    ('transformer.h.{i}.attn.q_norm.weight', 'model.layers.{i}.self_attn.q_layernorm.weight', None),
    ('transformer.h.{i}.attn.k_norm.weight', 'model.layers.{i}.self_attn.k_layernorm.weight', None),
    # a 'V' layer's mixer: rows of the layers that have it (the attention layers' rows are absent there)
    ('transformer.h.{i}.attn.in_proj.weight', 'model.layers.{i}.conv.in_proj.weight', None),
    ('transformer.h.{i}.attn.conv1d.weight', 'model.layers.{i}.conv.conv.weight', None),
    ('transformer.h.{i}.attn.c_proj.weight', 'model.layers.{i}.conv.out_proj.weight', None),
    ('transformer.h.{i}.mlp.c_fc.weight', ('model.layers.{i}.feed_forward.w1.weight',
                                           'model.layers.{i}.feed_forward.w3.weight'), None),
    ('transformer.h.{i}.mlp.c_proj.weight', 'model.layers.{i}.feed_forward.w2.weight', None),
]
HF_FAMILIES['lfm2'] = HFFamily(
    'lfm2', 'Lfm2ForCausalLM',
    {**_LLAMA_LIKE, 'bias': (False,), 'qk_norm': (True,), 'layers': _made_of('VG'), 'short_conv_kernel': ANY},
    _LFM2_NAMES, _lfm2_read, _lfm2_write)


# ----- Nemotron-H: layers of one part, Mamba-2 ('S'), attention without RoPE ('N') or a squared-ReLU MLP ('-')

_NEMOTRON_H_LAYER_TYPES = {'linear_attention': 'S', 'full_attention': 'N', 'mlp': '-'}


def _nemotron_h_read(c):
    types = list(c.layers_block_type)
    unknown = set(types) - set(_NEMOTRON_H_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layers_block_type {sorted(unknown)} are not supported "
                         f"(only {', '.join(map(repr, _NEMOTRON_H_LAYER_TYPES))})")
    if c.mlp_hidden_act != 'relu2' or c.mamba_hidden_act != 'silu':
        raise ValueError(f"Nemotron-H with mlp_hidden_act={c.mlp_hidden_act!r}, mamba_hidden_act={c.mamba_hidden_act!r} "
                         f"is not supported (only 'relu2' and 'silu')")
    if c.mlp_bias or c.use_bias or not c.use_conv_bias:
        raise ValueError("Nemotron-H with mlp_bias, use_bias or without use_conv_bias is not supported (its attention "
                         "has no biases; our Mamba-2 convolution always has one)")
    kinds = [_NEMOTRON_H_LAYER_TYPES[t] for t in types]
    head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
    flags = dict(n_layer=len(kinds), n_head=c.num_attention_heads, n_embd=c.hidden_size,
                 n_kv_head=c.num_key_value_heads, block_size=c.max_position_embeddings,
                 head_dim=None if head_dim == c.hidden_size // c.num_attention_heads else head_dim,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.layer_norm_epsilon, mlp='relu2',
                 ffn_hidden=c.intermediate_size, tie_embeddings=bool(c.tie_word_embeddings),
                 pos='rope', layers=_tiling(kinds), mlp_with_mixer=False)  # 'N': attention without RoPE
    if 'S' in kinds:
        flags.update(ssm_n_head=c.mamba_num_heads, ssm_head_dim=c.mamba_head_dim, ssm_state_dim=c.ssm_state_size,
                     ssm_n_groups=c.n_groups, ssm_conv_kernel=c.conv_kernel, ssm_chunk_size=c.chunk_size,
                     ssm_dt_min=float(c.time_step_min))
    return flags


def _nemotron_h_write(cfg):
    dims = cfg.ssm_dims
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
                layers_block_type=[{v: k for k, v in _NEMOTRON_H_LAYER_TYPES.items()}[k] for k in cfg.layer_kinds],
                num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_size,
                max_position_embeddings=cfg.block_size, intermediate_size=cfg.mlp_width, mlp_hidden_act='relu2',
                mlp_bias=False, use_bias=False, use_conv_bias=True, layer_norm_epsilon=cfg.norm_eps,
                tie_word_embeddings=cfg.tie_embeddings, mamba_num_heads=dims['heads'], mamba_head_dim=dims['head_dim'],
                ssm_state_size=dims['state'], n_groups=dims['groups'], conv_kernel=cfg.ssm_conv_kernel,
                chunk_size=cfg.ssm_chunk_size, time_step_min=cfg.ssm_dt_min, attention_dropout=cfg.dropout)


_NEMOTRON_H_NAMES = [
    ('transformer.wte.weight', 'model.embeddings.weight', None),
    ('transformer.ln_f.weight', 'model.norm_f.weight', None),
    ('lm_head.weight', 'lm_head.weight', None),
    # each layer's one norm: before its mixer, or in a '-' layer before its MLP
    ('transformer.h.{i}.ln_1.weight', 'model.layers.{i}.norm.weight', None),
    ('transformer.h.{i}.ln_2.weight', 'model.layers.{i}.norm.weight', None),
    ('transformer.h.{i}.attn.c_attn.weight', tuple(f'model.layers.{{i}}.mixer.{n}_proj.weight' for n in 'qkv'), None),
    ('transformer.h.{i}.attn.c_proj.weight', 'model.layers.{i}.mixer.o_proj.weight', None),
    *[(f'transformer.h.{{i}}.attn.{n}', f'model.layers.{{i}}.mixer.{n}', None)
      for n in ('in_proj.weight', 'conv1d.weight', 'conv1d.bias', 'A_log', 'dt_bias', 'D')],
    ('transformer.h.{i}.attn.norm', 'model.layers.{i}.mixer.norm.weight', None),  # the gated RMSNorm's gain
    ('transformer.h.{i}.attn.c_proj.weight', 'model.layers.{i}.mixer.out_proj.weight', None),
    ('transformer.h.{i}.mlp.c_fc.weight', 'model.layers.{i}.mixer.up_proj.weight', None),
    ('transformer.h.{i}.mlp.c_proj.weight', 'model.layers.{i}.mixer.down_proj.weight', None),
]
HF_FAMILIES['nemotron_h'] = HFFamily(
    'nemotron_h', 'NemotronHForCausalLM',
    {**_SIZES, 'bias': (False,), 'norm': ('rms',), 'mlp': ('relu2',), 'pos': ('rope',), 'n_kv_head': ANY,
     'head_dim': ANY, 'layers': lambda v: v is not None and set(v) <= set('SN-'), 'mlp_with_mixer': (False,),
     **{k: ANY for k in ('ssm_n_head', 'ssm_head_dim', 'ssm_state_dim', 'ssm_n_groups', 'ssm_conv_kernel',
                         'ssm_chunk_size')}, 'ssm_dt_min': lambda v: v > 0},  # transformers' init takes its log
    _NEMOTRON_H_NAMES, _nemotron_h_read, _nemotron_h_write)


# ----- Gemma 4 (text): K/V sharing, K = V, global layers' own shapes and proportional RoPE, per-layer embeddings

def _gemma4_rope_read(c, kinds):
    """The full layers' base and proportional share, the sliding layers' base."""
    full, local = dict(c.rope_parameters['full_attention']), dict(c.rope_parameters['sliding_attention'])
    if full.get('rope_type', 'default') not in ('default', 'proportional') or full.get('factor', 1.0) != 1.0 or (
            full.get('rope_type', 'default') == 'default' and full.get('partial_rotary_factor', 1.0) != 1.0):
        raise ValueError(f"rope_parameters['full_attention'] {full} is not supported (only 'default', or "
                         f"'proportional' without a factor)")
    if local.get('rope_type', 'default') != 'default' or local.get('partial_rotary_factor', 1.0) != 1.0:
        raise ValueError(f"rope_parameters['sliding_attention'] {local} is not supported (only 'default')")
    flags = dict(pos='rope', rope_theta=float(full['rope_theta']))
    if 'L' in kinds:
        flags['rope_local_theta'] = float(local['rope_theta'])
    if full.get('rope_type') == 'proportional' and 'G' in kinds:
        flags['rope_proportion'] = float(full.get('partial_rotary_factor', 1.0))
    return flags


def _gemma4_text_read(c):
    if c.hidden_activation not in ('gelu_pytorch_tanh', 'gelu_new'):
        raise ValueError(f"hidden_activation {c.hidden_activation!r} is not supported (only the tanh GELU "
                         f"'gelu_pytorch_tanh': GEGLU)")
    if c.attention_bias or c.use_bidirectional_attention:
        raise ValueError("Gemma 4 with attention_bias or use_bidirectional_attention is not supported")
    if c.use_double_wide_mlp and c.num_kv_shared_layers:
        raise ValueError("Gemma 4 with use_double_wide_mlp is not supported (the K/V-sharing layers' MLPs twice as "
                         "wide as the others)")
    if c.hidden_size_per_layer_input and c.vocab_size_per_layer_input != c.vocab_size:
        raise ValueError(f"vocab_size_per_layer_input={c.vocab_size_per_layer_input} other than vocab_size="
                         f"{c.vocab_size} is not supported")
    kinds = _layer_types_read(c)
    # the heads' shapes are per layer: the model's are the local layers' (or, without any, the global ones')
    shapes = c.per_layer_config[kinds.index('L') if 'L' in kinds else 0]
    head_dim, n_kv_head = shapes.head_dim, shapes.num_key_value_heads
    flags = dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                 n_kv_head=n_kv_head, block_size=c.max_position_embeddings,
                 head_dim=None if head_dim == c.hidden_size // c.num_attention_heads else head_dim,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.rms_norm_eps,
                 norm_position='sandwich', mlp='geglu', ffn_hidden=c.intermediate_size,
                 tie_embeddings=bool(c.tie_word_embeddings), embed_scale=True, qk_norm=True, v_norm=True,
                 attn_scale=1.0, logit_softcap=c.final_logit_softcapping, layers=_tiling(kinds),
                 sliding_window=c.sliding_window if 'L' in kinds else None, layer_scalar=True,
                 attn_k_eq_v=bool(c.attention_k_eq_v) and 'G' in kinds, kv_shared_layers=c.num_kv_shared_layers,
                 per_layer_embd=c.hidden_size_per_layer_input or 0, **_gemma4_rope_read(c, kinds))
    if c.enable_moe_block:  # experts beside the dense MLP in every layer
        flags.update(mlp='moe', n_expert=c.num_experts, n_expert_active=c.top_k_experts,
                     moe_hidden=c.moe_intermediate_size, moe_dense_mlp=True, moe_activation='gelu')
    if 'G' in kinds:  # the global layers' shapes where they differ
        full = c.per_layer_config[kinds.index('G')]
        flags['global_head_dim'] = None if full.head_dim == head_dim else full.head_dim
        flags['global_n_kv_head'] = None if full.num_key_value_heads == n_kv_head else full.num_key_value_heads
    return flags


def _gemma4_text_write(cfg):
    # transformers gives the global layers their own K/V heads only with attention_k_eq_v
    if cfg.global_n_kv_head is not None and not cfg.attn_k_eq_v:
        raise ValueError(f"gemma4_text carries global_n_kv_head={cfg.global_n_kv_head} only with attn_k_eq_v=True")
    moe = cfg.mlp == 'moe'
    if moe and not (cfg.moe_dense_mlp and cfg.moe_activation == 'gelu'):
        raise ValueError(f"gemma4_text's experts sit beside a dense GEGLU MLP: mlp='moe' needs moe_dense_mlp=True and "
                         f"moe_activation='gelu', got {cfg.moe_dense_mlp}, {cfg.moe_activation!r}")
    experts = dict(num_experts=cfg.n_expert, top_k_experts=cfg.n_expert_active,
                   moe_intermediate_size=cfg.expert_hidden) if moe else {}
    full = {'rope_type': 'default', 'rope_theta': cfg.rope_theta}
    local = {'rope_type': 'default', 'rope_theta': cfg.rope_local_theta or cfg.rope_theta}
    if cfg.rope_proportion is not None:
        full = {'rope_type': 'proportional', 'partial_rotary_factor': cfg.rope_proportion, 'rope_theta': cfg.rope_theta}
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_width,
                num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
                head_dim=cfg.head_size, global_head_dim=cfg.global_head_dim or cfg.head_size,
                num_global_key_value_heads=cfg.global_n_kv_head, rms_norm_eps=cfg.norm_eps,
                hidden_activation='gelu_pytorch_tanh', attention_dropout=cfg.dropout,
                tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.block_size,
                final_logit_softcapping=cfg.logit_softcap, layer_types=_layer_types_write(cfg),
                sliding_window=cfg.sliding_window or cfg.block_size, attention_bias=False,
                attention_k_eq_v=cfg.attn_k_eq_v, num_kv_shared_layers=cfg.kv_shared_layers,
                hidden_size_per_layer_input=cfg.per_layer_embd, vocab_size_per_layer_input=cfg.vocab_size,
                enable_moe_block=moe, **experts,
                rope_parameters={'full_attention': full, 'sliding_attention': local})


def _gemma4_unpack(hf_state, cfg):
    """A layer that shares K/V has a q_proj alone, one with K = V no v_proj: their missing K/V projections as empty
    tensors (no rows), so every layer's c_attn is the rows of its q, k and v."""
    out = dict(hf_state)
    for i in range(cfg.n_layer):
        q = out.get(f'model.layers.{i}.self_attn.q_proj.weight')
        for name in (f'model.layers.{i}.self_attn.{n}_proj.weight' for n in 'kv'):
            if q is not None and name not in out:
                out[name] = q.new_zeros(0, q.size(1))
    return out


def _gemma4_pack(hf_state, cfg):
    return {k: v for k, v in hf_state.items() if v.numel() or not k.endswith(('k_proj.weight', 'v_proj.weight'))}


_GEMMA4_LAYER = 'model.layers.{i}.'
_GEMMA4_NAMES = _decoder_names([('ln_1', 'input_layernorm'), ('ln_1_out', 'post_attention_layernorm'),
                                ('ln_2', 'pre_feedforward_layernorm'), ('ln_2_out', 'post_feedforward_layernorm')]) + [
    ('transformer.h.{i}.layer_scalar', _GEMMA4_LAYER + 'layer_scalar', None),
    ('transformer.h.{i}.per_layer.c_fc.weight', _GEMMA4_LAYER + 'per_layer_input_gate.weight', None),
    ('transformer.h.{i}.per_layer.c_proj.weight', _GEMMA4_LAYER + 'per_layer_projection.weight', None),
    ('transformer.h.{i}.per_layer.ln.weight', _GEMMA4_LAYER + 'post_per_layer_input_norm.weight', None),
    ('transformer.wte_per_layer.weight', 'model.embed_tokens_per_layer.weight', None),
    ('transformer.per_layer_proj.weight', 'model.per_layer_model_projection.weight', None),
    ('transformer.per_layer_norm.weight', 'model.per_layer_projection_norm.weight', None),
    # the MoE block: the dense MLP beside the experts, each branch's norms, the router
    ('transformer.h.{i}.mlp.ln.weight', _GEMMA4_LAYER + 'pre_feedforward_layernorm.weight', None),
    ('transformer.h.{i}.mlp.dense.c_fc.weight', tuple(f'{_GEMMA4_LAYER}mlp.{n}_proj.weight' for n in ('gate', 'up')),
     None),
    ('transformer.h.{i}.mlp.dense.c_proj.weight', _GEMMA4_LAYER + 'mlp.down_proj.weight', None),
    ('transformer.h.{i}.mlp.ln_dense_out.weight', _GEMMA4_LAYER + 'post_feedforward_layernorm_1.weight', None),
    ('transformer.h.{i}.mlp.ln_experts.weight', _GEMMA4_LAYER + 'pre_feedforward_layernorm_2.weight', None),
    ('transformer.h.{i}.mlp.ln_experts_out.weight', _GEMMA4_LAYER + 'post_feedforward_layernorm_2.weight', None),
    ('transformer.h.{i}.mlp.router.weight', _GEMMA4_LAYER + 'router.proj.weight', None),
    ('transformer.h.{i}.mlp.router_scale', _GEMMA4_LAYER + 'router.scale', None),
    ('transformer.h.{i}.mlp.expert_scale', _GEMMA4_LAYER + 'router.per_expert_scale', None),
    ('transformer.h.{i}.mlp.experts.c_fc', _GEMMA4_LAYER + 'experts.gate_up_proj', None),
    ('transformer.h.{i}.mlp.experts.c_proj', _GEMMA4_LAYER + 'experts.down_proj', None),
]
HF_FAMILIES['gemma4_text'] = HFFamily(
    'gemma4_text', 'Gemma4ForCausalLM',
    {**_SIZES, **_MOE, 'rope_theta': ANY, 'norm': ('rms',), 'mlp': ('geglu', 'moe'), 'moe_dense_mlp': ANY,
     'moe_activation': ANY, 'pos': ('rope',), 'n_kv_head': ANY,
     'head_dim': ANY, 'bias': (False,), 'norm_position': ('sandwich',), 'embed_scale': (True,), 'qk_norm': (True,),
     'v_norm': (True,), 'attn_scale': (1.0,), 'logit_softcap': ANY, 'layers': _made_of('LG'), 'sliding_window': ANY,
     'rope_local_theta': ANY, 'layer_scalar': (True,),
     **{k: ANY for k in ('rope_proportion', 'global_head_dim', 'global_n_kv_head', 'attn_k_eq_v', 'kv_shared_layers',
                         'per_layer_embd')}},
    _GEMMA4_NAMES, _gemma4_text_read, _gemma4_text_write, _gemma4_unpack, _gemma4_pack)
