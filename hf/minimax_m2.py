"""MiniMax-M2: partial RoPE, QK-norm over all heads, sigmoid-routed experts with a balancing bias."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import (_LLAMA_ATTN_NAMES, _LLAMA_LIKE, _MOE, _llama_like_read, _llama_like_write, _moe_read,
                     _moe_write, _rope_write)


def _minimax_m2_read(c):
    return {**_llama_like_read(c, partial=True), 'qk_norm': True, 'qk_norm_all_heads': True,
            **_moe_read(c, c.num_local_experts, c.intermediate_size, router_norm_topk=True), 'router': 'sigmoid'}


def _minimax_m2_write(cfg):
    return {**_llama_like_write(cfg), **_rope_write(cfg, partial=True), **_moe_write(cfg),
            'num_local_experts': cfg.n_expert, 'intermediate_size': cfg.expert_hidden}


_MINIMAX_M2_NAMES = _LLAMA_ATTN_NAMES + [  # the experts as Mixtral's, the balancing bias on the MoE block
    ('transformer.h.{i}.mlp.router.weight', 'model.layers.{i}.mlp.gate.weight', None),
    ('transformer.h.{i}.mlp.expert_bias', 'model.layers.{i}.mlp.e_score_correction_bias', None),
    ('transformer.h.{i}.mlp.experts.c_fc', 'model.layers.{i}.mlp.experts.gate_up_proj', None),
    ('transformer.h.{i}.mlp.experts.c_proj', 'model.layers.{i}.mlp.experts.down_proj', None),
]

HF_FAMILIES['minimax_m2'] = HFFamily(
    'minimax_m2', 'MiniMaxM2ForCausalLM',
    {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'qk_norm': (True,), 'qk_norm_all_heads': (True,), 'rope_fraction': ANY,
     'mlp': ('moe',), 'router': ('sigmoid',), 'moe_bias_update_rate': ANY},
    _MINIMAX_M2_NAMES, _minimax_m2_read, _minimax_m2_write)
