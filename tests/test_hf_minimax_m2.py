"""MiniMax-M2 (hf/minimax_m2.py), both ways."""

import pytest
import torch

from hf_tiny import ROPES, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def test_minimax_m2_qk_norm_over_all_heads_and_partial_yarn(tmp_path):
    torch.manual_seed(0)
    hf = randomized(transformers.MiniMaxM2ForCausalLM(tiny(
        transformers.MiniMaxM2Config, head_dim=12, rotary_dim=6, num_local_experts=4, num_experts_per_tok=2,
        initializer_range=0.2, rope_parameters=dict(ROPES['yarn']))), 11)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.rope_fraction, cfg.rope_scaling, cfg.qk_norm, cfg.qk_norm_all_heads) == (0.5, 'yarn', True, True)
    assert (cfg.router, cfg.router_norm_topk, cfg.n_shared_expert, cfg.moe_hidden) == ('sigmoid', True, 0, 48)
    assert ours.transformer.h[0].attn.q_norm.weight.shape == (4 * 12,)
    bias = ours.transformer.h[1].mlp.expert_bias
    assert torch.equal(bias, hf.model.layers[1].mlp.e_score_correction_bias) and bias.abs().sum() > 0
