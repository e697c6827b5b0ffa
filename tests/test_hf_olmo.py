"""OLMo 2 and OLMo 3 (hf/olmo.py), both ways."""

import pytest

from hf import HF_FAMILIES
from hf_tiny import ROPES, WINDOW, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def test_olmo2_norms_after_branches_and_qk_norm_over_all_heads(tmp_path):
    hf = randomized(transformers.Olmo2ForCausalLM(tiny(transformers.Olmo2Config, initializer_range=0.2)), 10)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.norm_position, cfg.qk_norm, cfg.qk_norm_all_heads, cfg.layers) == ('after', True, True, None)
    assert ours.transformer.h[0].attn.k_norm.weight.shape == (2 * 8,)  # n_kv_head * head_dim


def test_olmo3_local_layers_with_a_rope_base_per_kind(tmp_path):
    rope = {'sliding_attention': {'rope_type': 'default', 'rope_theta': 10.0},
            'full_attention': dict(ROPES['yarn'], rope_theta=1000.0)}
    hf = randomized(transformers.Olmo3ForCausalLM(tiny(
        transformers.Olmo3Config, num_hidden_layers=4, sliding_window=WINDOW, rope_parameters=rope,
        layer_types=['sliding_attention'] * 3 + ['full_attention'], initializer_range=0.2)), 11)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layers, cfg.sliding_window, cfg.norm_position, cfg.qk_norm_all_heads) == ('LLLG', WINDOW, 'after', True)
    assert (cfg.rope_local_theta, cfg.rope_theta, cfg.rope_scaling) == (10.0, 1000.0, 'yarn')


def test_olmo_attention_bias_is_refused():
    with pytest.raises(ValueError, match='attention_bias'):
        HF_FAMILIES['olmo3'].read_config(tiny(transformers.Olmo3Config, attention_bias=True))
