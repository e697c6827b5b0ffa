"""DeepSeek-V3 and V2 (hf/deepseek.py), both ways."""

import pytest
import torch

from hf_tiny import YARN_DEEPSEEK, check_parity, deepseek, randomized, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('moe,q_lora,rope', [(False, None, None), (False, 24, YARN_DEEPSEEK), (True, 24, None),
                                             (True, None, YARN_DEEPSEEK)],
                         ids=['dense', 'dense-qlora-yarn', 'moe-qlora', 'moe-yarn'])
def test_deepseek_v3_latent_attention_and_experts(moe, q_lora, rope, tmp_path):
    extra = {'rope_parameters': dict(rope)} if rope else {}
    hf = randomized(transformers.DeepseekV3ForCausalLM(deepseek(transformers.DeepseekV3Config, moe, q_lora_rank=q_lora,
                                                                **extra)), 7)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.attn == 'mla' and cfg.mla_dims == {'latent': 16, 'q_latent': q_lora or 0, 'nope': 8, 'rope': 4, 'v': 6}
    assert cfg.mlp == ('moe' if moe else 'swiglu')
    if moe:
        assert (cfg.router, cfg.n_expert_group, cfg.n_shared_expert, cfg.first_dense_layers) == ('sigmoid', 2, 1, 1)
        bias = ours.transformer.h[1].mlp.expert_bias
        assert torch.equal(bias, hf.model.layers[1].mlp.gate.e_score_correction_bias) and bias.abs().sum() > 0
    # the cache holds the latent and the shared rotated key only: (16 + 4) numbers per token and layer
    assert ours.kv_cache_bytes(1, 10) == 2 * 10 * (16 + 4) * 4


@pytest.mark.parametrize('topk_method', ['greedy', 'group_limited_greedy'])
def test_deepseek_v2_softmax_experts(topk_method, tmp_path):
    hf = randomized(transformers.DeepseekV2ForCausalLM(deepseek(transformers.DeepseekV2Config, True,
                                                                topk_method=topk_method, routed_scaling_factor=1.5)), 8)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.router, cfg.router_norm_topk, cfg.routed_scaling) == ('softmax', False, 1.5)
    assert cfg.n_expert_group == (2 if topk_method == 'group_limited_greedy' else 1)
