"""gpt-oss: attention sinks, local and global layers, experts with biases whose gate and up columns interleave,
clamped SwiGLU."""

import torch

from .engine import _TRANSFORMS, ANY, HF_FAMILIES, HFFamily
from .shared import (_LLAMA_ATTN_NAMES, _LLAMA_LIKE, _MOE, _layer_types_read, _layer_types_write, _llama_like_read,
                     _llama_like_write, _made_of, _moe_read, _moe_write, _tiling)


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

_TRANSFORMS.update(_GPT_OSS_TRANSFORMS)
_GPT_OSS_NAMES = _LLAMA_ATTN_NAMES + [
    ('transformer.h.{i}.attn.sinks', 'model.layers.{i}.self_attn.sinks', None),
    ('transformer.h.{i}.mlp.router.{b}', 'model.layers.{i}.mlp.router.{b}', None),
    ('transformer.h.{i}.mlp.experts.c_fc', 'model.layers.{i}.mlp.experts.gate_up_proj', 'oss_gate_up'),
    ('transformer.h.{i}.mlp.experts.c_fc_bias', 'model.layers.{i}.mlp.experts.gate_up_proj_bias', 'oss_gate_up_bias'),
    ('transformer.h.{i}.mlp.experts.c_proj', 'model.layers.{i}.mlp.experts.down_proj', 'oss_down'),
    ('transformer.h.{i}.mlp.experts.c_proj_bias', 'model.layers.{i}.mlp.experts.down_proj_bias', None),
]

HF_FAMILIES['gpt_oss'] = HFFamily(
    'gpt_oss', 'GptOssForCausalLM',
    {**_LLAMA_LIKE, **_MOE, 'bias': ANY, 'mlp': ('moe',), 'attn_sinks': (True,), 'moe_bias': (True,),
     'swiglu_limit': lambda v: v is not None, 'layers': _made_of('LG'), 'sliding_window': ANY},
    _GPT_OSS_NAMES, _gpt_oss_read, _gpt_oss_write)
