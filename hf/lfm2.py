"""LFM2: gated short convolutions ('V') among QK-normed attention layers ('G')."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import _LLAMA_LIKE, _made_of, _rope_read, _rope_write, _tiling


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
