"""
What several Hugging Face families share: their configs' RoPE, Llama-style and MoE fields read and written, layer
kinds tiled over the layers, the flags every family carries, and the name tables of the Llama-style block.
"""

from types import SimpleNamespace

from .engine import ANY, ROPE_SCALINGS


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


# ----- layers of several kinds (Gemma 3 and 4, OLMo 3, SmolLM3, gpt-oss, ...)


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


def _moe_read(c, experts, hidden, **flags):
    return dict(mlp='moe', n_expert=experts, n_expert_active=c.num_experts_per_tok, moe_hidden=hidden,
                router='softmax', **flags)


def _moe_write(cfg):
    return dict(num_experts_per_tok=cfg.n_expert_active, router_aux_loss_coef=cfg.moe_aux_loss_coef)


# sizes and what only training reads (dropout, the init): every family carries them
_SIZES = {k: ANY for k in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'dropout', 'norm_eps',
                           'ffn_hidden', 'multiple_of', 'tie_embeddings', 'zero_init')}
_ROPE = {k: ANY for k in ('rope_theta', 'rope_scaling', 'rope_factor', 'rope_original_length', 'rope_low_freq_factor',
                          'rope_high_freq_factor', 'yarn_beta_fast', 'yarn_beta_slow', 'yarn_mscale',
                          'yarn_mscale_all_dim', 'rope_attention_factor', 'yarn_truncate')}
_LLAMA_LIKE = {**_SIZES, **_ROPE, 'norm': ('rms',), 'mlp': ('swiglu',), 'pos': ('rope',), 'n_kv_head': ANY,
               'head_dim': ANY}

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

_MOE = {k: ANY for k in ('n_expert', 'n_expert_active', 'moe_hidden', 'moe_aux_loss_coef', 'moe_z_loss_coef')}


def _dense_first(c):
    """How many layers lead with a dense MLP, from mlp_layer_types; refused unless all the dense ones come first."""
    types = list(c.mlp_layer_types[:c.num_hidden_layers])
    dense = next((i for i, t in enumerate(types) if t != 'dense'), len(types))
    if types != ['dense'] * dense + ['sparse'] * (len(types) - dense):
        raise ValueError(f"mlp_layer_types with dense layers other than the first ones ({types}) are not supported")
    return dense
