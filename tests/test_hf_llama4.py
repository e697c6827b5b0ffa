"""Llama 4 (text) (hf/llama4.py), both ways."""

import pytest
import torch

from export import to_hf
from hf import HF_FAMILIES
from hf_tiny import GPT, LLAMA3, check_parity, randomized, randomized_experts, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def llama4_text(**overrides):
    """Four layers: three chunked RoPE layers (chunks of 8, so the 40 test positions cross four), then one
    without RoPE whose temperature grows every 4 positions; experts on every second layer."""
    args = dict(intermediate_size=16, intermediate_size_mlp=48, num_hidden_layers=4, head_dim=8,
                attention_chunk_size=8, floor_scale=4, attn_scale=0.5, interleave_moe_layer_step=2, num_local_experts=4)
    return tiny(transformers.Llama4TextConfig, **{**args, **overrides})


@pytest.mark.parametrize('overrides', [
    {},
    # all layers MoE with two experts a token, full RoPE layers (no chunks), no QK-norm or temperature, llama3 RoPE
    dict(interleave_moe_layer_step=1, num_experts_per_tok=2, attention_chunk_size=None, use_qk_norm=False,
         attn_temperature_tuning=False, rope_parameters=LLAMA3),
    dict(moe_layers=[], no_rope_layer_interval=2),  # dense: every layer intermediate_size_mlp wide; 'CN'
], ids=['scout-like', 'maverick-like-moe-every-layer', 'dense-CN'])
def test_llama4_text_chunked_and_nope_layers_and_its_experts(overrides, tmp_path):
    torch.manual_seed(0)
    ours = check_parity(randomized_experts(randomized(transformers.Llama4ForCausalLM(llama4_text(**overrides)), 13), 14),
                        tmp_path)
    if not overrides:
        cfg = ours.config
        assert cfg.layers == 'CCCN' and cfg.attention_chunk_size == 8 and cfg.nope_temperature == 0.5
        assert cfg.rope_qk_norm and cfg.moe_every == 2 and cfg.moe_scale_input and cfg.n_expert_active == 1
        assert [type(b.mlp).__name__ for b in ours.transformer.h] == ['GatedMLP', 'MoE', 'GatedMLP', 'MoE']
        assert ours.kv_cache_bytes(1, 64) == (3 * 8 + 64) * 2 * 2 * 8 * 4  # chunked layers keep one chunk
        assert type(to_hf(GPT(cfg))) is transformers.Llama4ForCausalLM  # built here: the only family carrying it


@pytest.mark.parametrize('change, match', [
    (dict(attention_bias=True), 'attention_bias'),
    (dict(moe_layers=[0, 3]), 'moe_layers'),
    (dict(layer_types=['chunked_attention'] * 4), 'without RoPE'),
], ids=['attention_bias', 'moe-not-every-kth', 'chunked-nope'])
def test_llama4_text_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        HF_FAMILIES['llama4_text'].read_config(llama4_text(**change))


def test_llama4_text_export_refuses_a_moved_expert_bias(tmp_path):
    torch.manual_seed(0)
    transformers.Llama4ForCausalLM(llama4_text()).save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path))
    with torch.no_grad():
        ours.transformer.h[1].mlp.expert_bias[0] = 0.5
    with pytest.raises(ValueError, match="layer 1's expert_bias is not zero"):
        to_hf(ours)
