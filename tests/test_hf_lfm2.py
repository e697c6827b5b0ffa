"""LFM2 (hf/lfm2.py), both ways."""

import pytest
import torch

from hf import HF_FAMILIES
from hf_tiny import GPTConfig, check_export_choice, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def lfm2(**overrides):
    """LFM2's shapes: conv layers around a full-attention one, head_dim 16 (not 32 / 4), a kernel of 4, and the
    MLP width LFM2 derives from intermediate_size (2/3 of 72, rounded up to a multiple of 16: 48)."""
    args = dict(head_dim=16, layer_types=['conv', 'full_attention', 'conv'], num_hidden_layers=3, conv_L_cache=4,
                intermediate_size=72, block_multiple_of=16, norm_eps=1e-6)
    return tiny(transformers.Lfm2Config, **{**args, **overrides})


def test_lfm2_short_conv_and_attention_layers(tmp_path):
    torch.manual_seed(0)
    hf = randomized(transformers.Lfm2ForCausalLM(lfm2()), seed=12)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layer_kinds == ['V', 'G', 'V'] and cfg.short_conv_kernel == 4 and cfg.qk_norm and cfg.head_size == 16
    assert cfg.mlp_width == hf.model.layers[0].feed_forward.w1.out_features == 48


@pytest.mark.parametrize('change, match', [
    (dict(conv_bias=True), 'conv_bias'),
    (dict(layer_types=['conv', 'sliding_attention', 'conv']), 'sliding_attention'),
], ids=['conv_bias', 'unknown-layer-type'])
def test_lfm2_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match) as e:
        HF_FAMILIES['lfm2'].read_config(lfm2(**change))
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('flags, refused', [
    (dict(layers='VG', pos='rope', norm='rms', mlp='swiglu', bias=False, qk_norm=True), None),
    (dict(layers='VG', pos='rope', norm='rms', mlp='swiglu', bias=False), 'qk_norm=False'),  # LFM2's attention has it
    (dict(layers='VG', pos='rope', norm='rms', mlp='swiglu', bias=True, qk_norm=True), 'bias=True'),
    (dict(layers='VD', pos='rope', norm='rms', mlp='swiglu', bias=False, qk_norm=True), "layers='VD'"),
], ids=['lfm2', 'no-qk-norm', 'biases', 'with-deltanet'])
def test_export_takes_short_conv_layers_to_lfm2_or_refuses(flags, refused):
    check_export_choice(GPTConfig(n_layer=2, n_head=4, n_embd=32, **flags), 'lfm2', refused)
