"""GLM-4.5 (glm4_moe): partial RoPE, optional QK-norm and q, k, v biases, DeepSeek-style grouped sigmoid experts
with a shared one after dense first layers."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import _LLAMA_LIKE, _LLAMA_NAMES, _MOE, _llama_like_read, _llama_like_write, _moe_read, _rope_write


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


HF_FAMILIES['glm4_moe'] = HFFamily(
    'glm4_moe', 'Glm4MoeForCausalLM',
    {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'qkv_bias': ANY, 'qk_norm': ANY, 'rope_fraction': ANY,
     'mlp': ('swiglu', 'moe'), 'router': ('sigmoid',), 'router_norm_topk': ANY, 'n_shared_expert': lambda v: v >= 1,
     'n_expert_group': ANY, 'topk_group': ANY, 'routed_scaling': ANY, 'first_dense_layers': ANY,
     'moe_bias_update_rate': ANY},
    _LLAMA_NAMES, _glm4_moe_read, _glm4_moe_write)
