"""Kimi Linear (hf/kimi_linear.py), both ways."""

import pytest
import torch

from export import to_hf
from hf_tiny import BLOCK, GPT, VOCAB, GPTConfig, check_parity, randomized, transformers
from hf.tiny import kimi_linear

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('moe', [True, False], ids=['moe', 'dense'])
def test_kimi_linear_delta_attention_and_mla_without_positions(moe, tmp_path):
    """MoE: the shared key part 4 wide; dense: none at all (qk_rope_head_dim=0) and a query bottleneck."""
    extra = {} if moe else dict(mlp_layer_types=['dense'] * 3, qk_rope_head_dim=0, q_lora_rank=8)
    torch.manual_seed(0)
    hf = randomized(transformers.KimiLinearForCausalLM(kimi_linear(**extra)), seed=10)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layers == 'KKG' and cfg.pos == 'none' and cfg.attn == 'mla' and cfg.mla_dims['rope'] == (4 if moe else 0)
    assert cfg.linear_dims == {'k_heads': 4, 'v_heads': 4, 'k_dim': 8, 'v_dim': 8}
    if moe:
        assert cfg.mlp == 'moe' and cfg.first_dense_layers == 1 and cfg.router == 'sigmoid' and cfg.n_expert_group == 2
    else:
        assert cfg.mlp == 'swiglu' and cfg.mla_dims['q_latent'] == 8


@pytest.mark.parametrize('flags, named', [
    (dict(pos='rope'), "pos='rope'"),  # Kimi Linear has no positions
    (dict(attn='mha'), "attn='mha'"),  # its full layers are MLA
    (dict(linear_value_dim=6), 'linear_value_dim (6)'),  # one head width for keys and values
])
def test_a_kda_model_kimi_linear_cannot_carry_is_refused_in_one_line(flags, named):
    config = GPTConfig(**{**dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, layers='KG',
                                 pos='none', attn='mla', norm='rms', mlp='swiglu', bias=False), **flags})
    with pytest.raises(ValueError) as e:
        to_hf(GPT(config), family='kimi_linear')
    assert named in str(e.value) and '\n' not in str(e.value)
