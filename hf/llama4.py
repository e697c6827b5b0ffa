"""Llama 4 (text): chunked RoPE layers and NoPE layers ('C', 'N'), L2 QK-norm, MoE on every k-th layer."""

from functools import partial

import torch

from .engine import _TRANSFORMS, ANY, HF_FAMILIES, HFFamily
from .gpt_oss import _GPT_OSS_TRANSFORMS
from .shared import (_LLAMA_ATTN_NAMES, _LLAMA_LIKE, _MOE, _llama_like_read, _llama_like_write, _made_of, _moe_read,
                     _moe_write, _tiling)


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
                    'stacked_T': _GPT_OSS_TRANSFORMS['oss_down']})  # (E, d, 2h) as x @ W, ours (E, 2h, d): transposed
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
