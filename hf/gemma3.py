"""Gemma 3 (text): sandwich norms computing x * (1 + w), local and global layers with a RoPE base each, GEGLU, a
query scale of its own, the logit soft-cap."""

import math

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import (_LLAMA_LIKE, _decoder_names, _layer_types_read, _layer_types_write, _llama_like_write, _made_of,
                     _rope_kinds_read, _rope_kinds_write, _tiling)


def _gemma_refusals(c, gemma):
    """What a Gemma 3 or 4 (`gemma`) config may hold that we do not run: another activation, biases, bidirectional
    attention; ValueError, one line."""
    if c.hidden_activation not in ('gelu_pytorch_tanh', 'gelu_new'):
        raise ValueError(f"hidden_activation {c.hidden_activation!r} is not supported (only the tanh GELU "
                         f"'gelu_pytorch_tanh': GEGLU)")
    if c.attention_bias or c.use_bidirectional_attention:
        raise ValueError(f"{gemma} with attention_bias or use_bidirectional_attention is not supported")


def _gemma3_text_read(c):
    _gemma_refusals(c, 'Gemma 3')
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


# Gemma's norms compute x * (1 + w): '1+w' keeps ours = 1 + theirs
_GEMMA3_NAMES = _decoder_names([('ln_1', 'input_layernorm'), ('ln_1_out', 'post_attention_layernorm'),
                                ('ln_2', 'pre_feedforward_layernorm'), ('ln_2_out', 'post_feedforward_layernorm')],
                               '1+w')

HF_FAMILIES['gemma3_text'] = HFFamily(
    'gemma3_text', 'Gemma3ForCausalLM',
    {**_LLAMA_LIKE, 'bias': (False,), 'mlp': ('geglu',), 'norm_position': ('sandwich',), 'embed_scale': (True,),
     'qk_norm': (True,), 'attn_scale': ANY, 'logit_softcap': ANY, 'layers': _made_of('LG'), 'sliding_window': ANY,
     'rope_local_theta': ANY},
    _GEMMA3_NAMES, _gemma3_text_read, _gemma3_text_write)
