"""Nemotron-H: layers of one part, Mamba-2 ('S'), attention without RoPE ('N') or a squared-ReLU MLP ('-')"""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import _SIZES, _tiling


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
    floor, ceiling = (float(t) for t in c.time_step_limit)
    if ceiling != float('inf'):
        raise ValueError(f"time_step_limit={list(c.time_step_limit)} is not supported (a floor only: the upper "
                         f"limit must be inf)")
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
                     ssm_dt_min=floor)  # time_step_min only seeds dt_bias (NVIDIA's code; transformers 5.25)
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
                chunk_size=cfg.ssm_chunk_size, time_step_limit=(cfg.ssm_dt_min, float('inf')),
                attention_dropout=cfg.dropout)


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
                         'ssm_chunk_size', 'ssm_dt_min')}},
    _NEMOTRON_H_NAMES, _nemotron_h_read, _nemotron_h_write)
