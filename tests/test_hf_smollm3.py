"""SmolLM3 (hf/smollm3.py), both ways."""

import pytest

from hf import HF_FAMILIES
from hf_tiny import WINDOW, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def test_smollm3_layers_without_rope(tmp_path):
    hf = randomized(transformers.SmolLM3ForCausalLM(tiny(
        transformers.SmolLM3Config, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0], attention_bias=True,
        mlp_bias=True, tie_word_embeddings=True, initializer_range=0.2)), 12)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layers, cfg.bias, cfg.tie_embeddings, cfg.sliding_window) == ('GGGN', True, True, None)


def test_smollm3_sliding_layers_are_refused():
    c = tiny(transformers.SmolLM3Config, num_hidden_layers=4, use_sliding_window=True, sliding_window=WINDOW)
    with pytest.raises(ValueError, match='use_sliding_window'):
        HF_FAMILIES['smollm3'].read_config(c)
