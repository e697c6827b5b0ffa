"""Qwen3-Next and Qwen3.5 (text): Gated DeltaNet layers among gated full attention, (1 + w) norms, Qwen3-Next's
gated shared expert; their packed projections split into our parts and back."""

from types import SimpleNamespace

import torch

from .engine import _MOE_SETTINGS, ANY, HF_FAMILIES, HFFamily
from .shared import (_LLAMA_LIKE, _MOE, _decoder_names, _llama_like_read, _llama_like_write, _made_of, _moe_read,
                     _rope_write, _tiling)


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
