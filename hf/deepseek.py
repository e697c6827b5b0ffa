"""DeepSeek-V3 and V2: multi-head latent attention (MLA), its checkpoints' rotated rows in pairs reordered to our
halves, experts with a shared one, in groups; V3's sigmoid router, V2's softmax."""

import torch

from .engine import _TRANSFORMS, ANY, HF_FAMILIES, HFFamily
from .shared import _LLAMA_LIKE, _LLAMA_NAMES, _MOE, _llama_like_read, _llama_like_write


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


_TRANSFORMS.update({
    'rope_q': (lambda t, c: _rope_rows(t, c, _q_rope_rows, False), lambda t, c: _rope_rows(t, c, _q_rope_rows, True)),
    'rope_kv': (lambda t, c: _rope_rows(t, c, _kv_rope_rows, False),
                lambda t, c: _rope_rows(t, c, _kv_rope_rows, True)),
})

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


HF_FAMILIES['deepseek_v3'] = HFFamily(
    'deepseek_v3', 'DeepseekV3ForCausalLM',
    {**_DEEPSEEK, 'router': ('sigmoid',), 'router_norm_topk': ANY, 'moe_bias_update_rate': ANY},
    _DEEPSEEK_NAMES, _deepseek_read, _deepseek_write)
HF_FAMILIES['deepseek_v2'] = HFFamily(
    'deepseek_v2', 'DeepseekV2ForCausalLM', {**_DEEPSEEK, 'router': ('softmax',), 'router_norm_topk': (False,)},
    _DEEPSEEK_NAMES, _deepseek_read, _deepseek_v2_write)
