"""Tests for chapters/long_context.py, RoPE past the trained length: its flags' checks (the scalings themselves run in
test_model.py's flag combinations, and with a cache in test_generate.py)."""
import pytest

from tiny_models import config_id, tiny_config

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('overrides, fragments', [
    (dict(pos='rope', rope_factor=4.0), ['rope_factor=4.0', 'rope_scaling=None', '--rope_factor=None']),
    (dict(pos='rope', rope_original_length=8), ['rope_original_length=8', 'rope_scaling']),
    (dict(pos='rope', rope_scaling='linear', yarn_beta_fast=16.0), ['yarn_beta_fast=16.0', "'yarn'", "'linear'"]),
    (dict(pos='rope', rope_scaling='yarn', rope_low_freq_factor=2.0), ['rope_low_freq_factor', "'llama3'"]),
    (dict(pos='rope', rope_attention_factor=1.2), ['rope_attention_factor', 'rope_scaling']),
])
def test_a_rope_scalings_flag_without_it_is_refused(overrides, fragments):
    """--rope_factor=4 without rope_scaling would be saved in model_args as if it applied."""
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert all(f in str(e.value) for f in fragments), str(e.value)
    tiny_config(pos='rope', rope_scaling='yarn', rope_factor=4.0, yarn_beta_fast=16.0)  # with it: fine


@pytest.mark.parametrize('overrides,field', [
    (dict(rope_scaling='yarn'), 'rope_scaling'),  # with learned positions
    (dict(pos='rope', rope_scaling='ntk'), 'rope_scaling'),
    (dict(pos='rope', rope_scaling='yarn', rope_factor=0), 'rope_factor'),
    (dict(pos='rope', rope_original_length=0), 'rope_original_length'),
    (dict(pos='rope', rope_low_freq_factor=4.0, rope_high_freq_factor=1.0), 'rope_high_freq_factor'),
    (dict(pos='rope', yarn_mscale=-1.0), 'yarn_mscale'),
], ids=config_id)
def test_invalid_configs_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)
