"""GLM-4.5 (hf/glm4_moe.py), both ways."""

import pytest
import torch

from hf_tiny import check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def test_glm4_moe_partial_rope_and_grouped_sigmoid_experts(tmp_path):
    torch.manual_seed(0)
    hf = randomized(transformers.Glm4MoeForCausalLM(tiny(
        transformers.Glm4MoeConfig, head_dim=12, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        use_qk_norm=True, attention_bias=True, initializer_range=0.2)), 10)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.rope_fraction, cfg.rope_dim, cfg.qkv_bias, cfg.bias, cfg.qk_norm, cfg.qk_norm_all_heads) == \
        (0.5, 6, True, False, True, False)
    assert (cfg.router, cfg.n_expert_group, cfg.topk_group, cfg.routed_scaling, cfg.n_shared_expert,
            cfg.first_dense_layers, cfg.moe_hidden, cfg.ffn_hidden) == ('sigmoid', 2, 1, 2.5, 1, 1, 16, 48)
    bias = ours.transformer.h[1].mlp.expert_bias
    assert torch.equal(bias, hf.model.layers[1].mlp.gate.e_score_correction_bias) and bias.abs().sum() > 0
    assert ours.transformer.h[0].attn.c_proj.bias is None  # GLM's o_proj has none
