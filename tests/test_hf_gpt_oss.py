"""gpt-oss (hf/gpt_oss.py), both ways."""

import pytest
import torch

from hf import HF_FAMILIES
from hf_tiny import NEW, PROMPT, ROPES, check_parity, randomized_experts, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def test_gpt_oss_sinks_local_layers_and_clamped_experts(tmp_path):
    torch.manual_seed(0)  # the same random model every run: an MoE's top-k may not stand on a near-tie
    # swiglu_limit 1 so the clamps bite; yarn without truncation on every layer, local and global
    hf = randomized_experts(transformers.GptOssForCausalLM(tiny(
        transformers.GptOssConfig, head_dim=8, num_local_experts=4, num_experts_per_tok=2, swiglu_limit=1.0,
        sliding_window=8, layer_types=['sliding_attention', 'full_attention'], initializer_range=0.2,
        rope_parameters=dict(ROPES['yarn-untruncated']))), 9)
    assert hf.model.layers[0].self_attn.sinks.std() > 0.1 and hf.model.layers[0].mlp.router.bias.abs().sum() > 0
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layers, cfg.sliding_window, cfg.attn_sinks, cfg.bias, cfg.yarn_truncate) == ('LG', 8, True, True, False)
    assert (cfg.mlp, cfg.router, cfg.router_norm_topk, cfg.moe_bias, cfg.swiglu_limit) == \
        ('moe', 'softmax', True, True, 1.0)
    # the interleaved [gate, up] columns became our [gate | up] rows
    up = hf.model.layers[1].mlp.experts.gate_up_proj[2][:, 1::2]
    assert torch.equal(ours.transformer.h[1].mlp.experts.c_fc[2][48:], up.t())
    per_position = ours.kv_cache_bytes(1, 1) // 2  # of one layer
    assert ours.kv_cache_bytes(1, PROMPT + NEW) == per_position * (PROMPT + NEW + 8)  # the local layer keeps 8


def test_gpt_oss_other_swiglu_alpha_is_refused():
    config = tiny(transformers.GptOssConfig, head_dim=8, num_local_experts=4, num_experts_per_tok=2, swiglu_alpha=1.5)
    with pytest.raises(ValueError, match='swiglu_alpha=1.5') as e:
        HF_FAMILIES['gpt_oss'].read_config(config)
    assert '\n' not in str(e.value)
