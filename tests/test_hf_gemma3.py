"""Gemma 3 (text) (hf/gemma3.py), both ways."""

import pytest
import torch

from hf import HF_FAMILIES
from hf_tiny import NEW, PROMPT, WINDOW, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def test_gemma3_text_sandwich_norms_and_local_layers(tmp_path):
    """(1 + w) norms before and after each branch, the embedding scale, per-head QK-norm, a query scale of
    its own, GEGLU, the logit soft-cap; local layers with their own RoPE base, linear scaling on the global."""
    rope = {'sliding_attention': {'rope_type': 'default', 'rope_theta': 10.0},
            'full_attention': {'rope_type': 'linear', 'factor': 4.0, 'rope_theta': 1000.0}}
    hf = randomized(transformers.Gemma3ForCausalLM(tiny(
        transformers.Gemma3TextConfig, num_hidden_layers=3, head_dim=12, query_pre_attn_scalar=20,
        layer_types=['sliding_attention', 'sliding_attention', 'full_attention'], sliding_window=WINDOW,
        final_logit_softcapping=3.0, rope_parameters=rope, initializer_range=0.2, tie_word_embeddings=True)), 9)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layers, cfg.sliding_window, cfg.norm_position, cfg.mlp) == ('LLG', WINDOW, 'sandwich', 'geglu')
    assert (cfg.rope_local_theta, cfg.rope_theta, cfg.rope_scaling, cfg.rope_factor) == (10.0, 1000.0, 'linear', 4.0)
    assert cfg.attn_scale == 20 ** -0.5 and cfg.logit_softcap == 3.0 and cfg.embed_scale and cfg.qk_norm
    torch.testing.assert_close(ours.transformer.h[0].ln_1_out.weight,
                               1 + hf.model.layers[0].post_attention_layernorm.weight, atol=0, rtol=0)
    # the local layers cache their window only: 2 (k, v) * 2 kv heads * 12 dims * 4 bytes per position
    assert ours.kv_cache_bytes(1, PROMPT + NEW) == 2 * 2 * 12 * 4 * (WINDOW + WINDOW + PROMPT + NEW)


@pytest.mark.parametrize('change,match', [
    ({'rope_parameters': {'sliding_attention': {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 10.0},
                          'full_attention': {'rope_type': 'default', 'rope_theta': 1000.0}}}, 'sliding_attention'),
    ({'attention_bias': True}, 'attention_bias'),
    ({'hidden_activation': 'gelu'}, 'hidden_activation'),
], ids=['scaled-local-rope', 'attention-bias', 'erf-gelu'])
def test_gemma3_text_features_we_lack_are_refused(change, match):
    c = tiny(transformers.Gemma3TextConfig, layer_types=['sliding_attention', 'full_attention'], **change)
    with pytest.raises(ValueError, match=match) as e:
        HF_FAMILIES['gemma3_text'].read_config(c)
    assert '\n' not in str(e.value)
