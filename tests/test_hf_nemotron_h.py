"""Nemotron-H (hf/nemotron_h.py), both ways."""

import pytest
import torch

from hf import HF_FAMILIES
from hf_tiny import GPT, NEW, PROMPT, VOCAB, GPTConfig, check_export_choice, check_parity, randomized, transformers
from hf.tiny import nemotron_h

pytestmark = pytest.mark.usefixtures('single_thread')


def test_nemotron_h_mamba2_attention_and_mlp_layers(tmp_path):
    torch.manual_seed(0)
    hf = randomized(transformers.NemotronHForCausalLM(nemotron_h()), seed=13)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layer_kinds == ['S', '-', 'S', 'N', '-'] and not cfg.mlp_with_mixer and cfg.mlp == 'relu2'
    assert cfg.ssm_dims == {'heads': 8, 'head_dim': 6, 'state': 5, 'groups': 2} and cfg.ssm_chunk_size == 7
    assert ours.transformer.h[1].attn.cache_states() == {} and ours.transformer.h[0].mlp is None


@pytest.mark.parametrize('limits, floor', [
    (dict(time_step_limit=(0.5, float('inf'))), 0.5),
    (dict(time_step_min=0.5), 0.0),
], ids=['time_step_limit', 'time_step_min-seeds-only'])
def test_nemotron_h_time_steps_below_its_floor_are_raised_to_it(limits, floor, tmp_path):
    """The floor is time_step_limit's first value, as NVIDIA's code and transformers' chunked form (its forward,
    from 5.25) apply it; time_step_min only seeds dt_bias (transformers 5.24 floored at it: a bug, fixed in 5.25).
    Mamba-2 layers whose dt_bias makes every step ~5e-5 give its logits only with that floor (its recurrent form,
    in its generate, does not raise them: its own two forms disagree there, so greedy decoding is not compared)."""
    torch.manual_seed(0)
    hf = randomized(transformers.NemotronHForCausalLM(nemotron_h(**limits)), seed=14)
    with torch.no_grad():
        for i in (0, 2):
            hf.model.layers[i].mixer.dt_bias.fill_(-10.0)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    assert ours.config.ssm_dt_min == floor
    idx = torch.randint(0, VOCAB, (2, PROMPT + NEW), generator=torch.Generator().manual_seed(15))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize('change, match', [
    (dict(layers_block_type=['linear_attention', 'moe']), "'moe'"),
    (dict(mlp_hidden_act='silu'), 'mlp_hidden_act'),
    (dict(use_bias=True), 'use_bias'),
    (dict(use_conv_bias=False), 'use_conv_bias'),
    (dict(time_step_limit=(0.0, 1.0)), 'time_step_limit'),
], ids=['moe-layers', 'silu-mlp', 'biases', 'no-conv-bias', 'time-step-ceiling'])
def test_nemotron_h_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match) as e:
        HF_FAMILIES['nemotron_h'].read_config(nemotron_h(**change))
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('flags, refused', [
    (dict(layers='S-S-N-', mlp_with_mixer=False, ssm_dt_min=1e-3), None),
    (dict(layers='S-S-N-', mlp_with_mixer=False), None),  # no floor: time_step_limit (0, inf), as published
    (dict(layers='S-S-N-', ssm_dt_min=1e-3), 'mlp_with_mixer=True'),  # a Nemotron-H layer is one part
    (dict(layers='S-S-G-', mlp_with_mixer=False, ssm_dt_min=1e-3), "layers='S-S-G-'"),  # its attention has no RoPE
], ids=['nemotron_h', 'no-floor', 'two-part-layers', 'rope-attention'])
def test_export_takes_mamba2_layers_to_nemotron_h_or_refuses(flags, refused):
    check_export_choice(GPTConfig(n_layer=6, n_head=4, n_embd=32, pos='rope', norm='rms', mlp='relu2', bias=False,
                                  **flags), 'nemotron_h', refused)
