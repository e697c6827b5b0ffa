"""BailingHybrid (hf/bailing_hybrid.py), both ways."""

import pytest
import torch

from export import to_hf
from hf_tiny import (BLOCK, GPT, HF_FAMILIES, NEW, PROMPT, VOCAB, YARN_DEEPSEEK, GPTConfig, check_export_choice,
                     check_parity, randomized, transformers)
from hf.tiny import bailing_hybrid

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('moe', [True, False], ids=['moe-safe-gate-yarn', 'dense-kda-gate-q-lora'])
def test_bailing_hybrid_kda_and_gated_mla(moe, tmp_path):
    """MoE: the safe gate (L = -5), YaRN with DeepSeek's softmax scale; dense: KDA's own gate (kda_safe_gate=False)
    and a query bottleneck. Logits within 1e-5 of transformers' (check_parity: greedy tokens and the export back
    too), and each of the family's own parts moves them by far more than that."""
    extra = dict(rope_parameters=YARN_DEEPSEEK) if moe else dict(first_k_dense_replace=3, kda_safe_gate=False,
                                                                   q_lora_rank=8)
    torch.manual_seed(0)
    hf = randomized(transformers.BailingHybridForCausalLM(bailing_hybrid(**extra)), seed=10)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layers == 'KKG' and cfg.pos == 'rope' and cfg.attn == 'mla' and cfg.mla_head_gate
    assert cfg.kda_rank == 0 and cfg.kda_lower_bound == (-5.0 if moe else None)
    assert cfg.linear_dims == {'k_heads': 4, 'v_heads': 4, 'k_dim': 8, 'v_dim': 8} and cfg.mla_dims['rope'] == 4
    if moe:
        assert cfg.mlp == 'moe' and cfg.first_dense_layers == 1 and cfg.n_expert_group == 2
        assert cfg.rope_scaling == 'yarn' and cfg.yarn_mscale_all_dim == 0.707
    else:
        assert cfg.mlp == 'swiglu' and cfg.mla_dims['q_latent'] == 8
    idx = torch.randint(0, VOCAB, (2, PROMPT + NEW), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(idx).logits
        assert (ours(idx)[0] - expected).abs().max() < 1e-5
        mla, kda = ours.transformer.h[2].attn, ours.transformer.h[0].attn
        mla.c_gate, gate = None, mla.c_gate  # without the gate per head
        assert (ours(idx)[0] - expected).abs().max() > 1e-2
        mla.c_gate = gate
        for block in ours.transformer.h[:2]:  # the other forget gate
            block.attn.lower_bound = None if moe else -5.0
        assert (ours(idx)[0] - expected).abs().max() > 1e-2
        assert kda.decay_a is None and kda.gate_a is None


def test_a_model_with_bailing_hybrids_parts_exports_to_it():
    config = GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, layers='KG', pos='rope',
                       attn='mla', mla_head_gate=True, kda_rank=0, kda_lower_bound=-5.0, norm='rms', mlp='swiglu',
                       bias=False)
    check_export_choice(config, 'bailing_hybrid', None)
    ours = GPT(config).eval()
    idx = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(to_hf(ours)(idx).logits, ours(idx)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize('flags, named', [
    (dict(mla_head_gate=False), 'mla_head_gate=False'),  # its MLA layers always gate their heads
    (dict(pos='none', qk_rope_head_dim=0), "pos='none'"),  # they rotate a shared key part
    (dict(kda_rank=None), 'kda_rank must be 0'),  # its decay and gate projections are full-rank
    (dict(linear_value_dim=6), 'linear_value_dim 6'),  # one head width for keys and values
])
def test_a_model_bailing_hybrid_cannot_carry_is_refused_in_one_line(flags, named):
    config = GPTConfig(**{**dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, layers='KG',
                                 pos='rope', attn='mla', mla_head_gate=True, kda_rank=0, norm='rms', mlp='swiglu',
                                 bias=False), **flags})
    with pytest.raises(ValueError) as e:
        to_hf(GPT(config), family='bailing_hybrid')
    assert named in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('overrides, named', [
    (dict(attention_bias=True), 'attention_bias'),
    (dict(n_shared_experts=0), 'n_shared_experts=0'),
    (dict(mlp_layer_types=['sparse', 'dense', 'sparse']), 'dense layers other than the first ones'),
])
def test_a_checkpoint_setting_we_cannot_represent_is_refused_in_one_line(overrides, named):
    with pytest.raises(ValueError) as e:
        HF_FAMILIES['bailing_hybrid'].read_config(bailing_hybrid(**overrides))
    assert named in str(e.value) and '\n' not in str(e.value)
