"""OLMo hybrid (hf/olmo_hybrid.py), both ways."""

import pytest
import torch

from export import to_hf
from hf import HF_FAMILIES
from hf_tiny import BLOCK, GPT, VOCAB, GPTConfig, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def olmo_hybrid(**overrides):
    """OLMo hybrid's shapes: two Gated DeltaNet layers (two key heads of 8 for four value heads of 6, beta in
    [0, 2]) then an attention layer (GQA, QK-norm over all heads, norms after the branches)."""
    args = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                layer_types=['linear_attention', 'linear_attention', 'full_attention'], num_hidden_layers=3)
    return tiny(transformers.OlmoHybridConfig, **{**args, **overrides})


@pytest.mark.parametrize('rope', [True, False], ids=['rope', 'nope'])
def test_olmo_hybrid_deltanet_with_negative_eigenvalues_and_norms_by_kind(rope, tmp_path):
    """With RoPE on the attention layers, or none at all (its released checkpoints)."""
    extra = {} if rope else dict(rope_theta=None)
    torch.manual_seed(0)
    hf = randomized(transformers.OlmoHybridForCausalLM(olmo_hybrid(**extra)), seed=11)
    assert (hf.model.rotary_emb is not None) == rope
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layers == 'DDG' and cfg.linear_neg_eigval and cfg.pos == ('rope' if rope else 'none')
    assert [block.norm_position for block in ours.transformer.h] == ['pre', 'pre', 'after']


@pytest.mark.parametrize('flags, named', [
    (dict(linear_norm_position=None), "linear_norm_position=None"),  # its DeltaNet blocks are pre-norm
    (dict(linear_norm_eps=None), 'linear_norm_eps=None'),  # and their output norm's epsilon FLA's 1e-5
    (dict(layers='D'), "layers='D'"),  # it needs an attention layer
])
def test_a_deltanet_model_olmo_hybrid_cannot_carry_is_refused_in_one_line(flags, named):
    config = GPTConfig(**{**dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, layers='DG',
                                 pos='rope', norm='rms', mlp='swiglu', bias=False, norm_position='after', qk_norm=True,
                                 qk_norm_all_heads=True, linear_norm_eps=1e-5, linear_norm_position='pre'), **flags})
    assert not HF_FAMILIES['olmo_hybrid'].blocking(GPTConfig(**{**config.__dict__, **dict(
        layers='DG', linear_norm_position='pre', linear_norm_eps=1e-5)}))
    with pytest.raises(ValueError) as e:
        to_hf(GPT(config), family='olmo_hybrid')
    assert named in str(e.value) and '\n' not in str(e.value)
