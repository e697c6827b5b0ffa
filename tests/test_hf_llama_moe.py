"""Mixtral and Qwen3-MoE (hf/llama_moe.py), both ways."""

import pytest

from chapters import moe
from hf_tiny import M, ROPES, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def test_mixtral_experts_and_window(tmp_path):
    hf = randomized(transformers.MixtralForCausalLM(tiny(transformers.MixtralConfig, num_local_experts=4,
                                                         num_experts_per_tok=2, sliding_window=11)), 5)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.mlp, cfg.n_expert, cfg.n_expert_active, cfg.moe_hidden, cfg.router) == ('moe', 4, 2, 48, 'softmax')
    assert ours.get_num_params(active=True) < ours.get_num_params()


@pytest.mark.parametrize('norm_topk', [False, True])
def test_qwen3_moe_with_a_dense_first_layer(norm_topk, tmp_path):
    hf = randomized(transformers.Qwen3MoeForCausalLM(tiny(
        transformers.Qwen3MoeConfig, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, head_dim=16,
        norm_topk_prob=norm_topk, mlp_only_layers=[0], rope_parameters=dict(ROPES['yarn']))), 6)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.first_dense_layers, cfg.router_norm_topk, cfg.qk_norm, cfg.moe_hidden) == (1, norm_topk, True, 24)
    assert type(ours.transformer.h[0].mlp) is M.GatedMLP and type(ours.transformer.h[1].mlp) is moe.MoE
