"""Gemma 4 (text) (hf/gemma4.py), both ways, and Gemma 4's flags on Gemma 3's block."""

import pytest
import torch

from chapters import gemma4
from export import to_hf
from hf import HF_FAMILIES
from hf_tiny import (BLOCK, GPT, M, NEW, PROMPT, VOCAB, WINDOW, GPTConfig, check_export_choice, check_parity,
                     randomized, transformers)
from hf.tiny import gemma4_text

pytestmark = pytest.mark.usefixtures('single_thread')


def test_gemma4_text_dense_block(tmp_path):
    """Gemma 4's dense block: sandwich norms (x * w), QK-norm and the value norm, K = V on the global layers with
    their own head width and K/V heads, proportional RoPE, the last layers sharing K/V, per-layer embeddings, the
    layer scalar: same logits, same greedy tokens, exported back."""
    hf = randomized(transformers.Gemma4ForCausalLM(gemma4_text()), 20)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layer_kinds, cfg.kv_shared_layers, cfg.per_layer_embd) == (['L', 'G', 'L', 'G', 'G'], 2, 8)
    assert (cfg.global_head_dim, cfg.global_n_kv_head, cfg.rope_proportion, cfg.attn_k_eq_v) == (16, 1, 0.25, True)
    assert [gemma4.kv_source(cfg, i) for i in range(5)] == [None, None, None, 1, 1]  # the last global one unshared
    # the cache: two local layers' windows of 2 K/V heads of 8, one global layer's 1 head of 16 (k and v, fp32)
    assert ours.kv_cache_bytes(1, PROMPT + NEW) == 2 * 4 * (2 * WINDOW * 2 * 8 + (PROMPT + NEW) * 16)


def test_gemma4_text_without_its_options(tmp_path):
    """Gemma 4's large dense shape: no per-layer embeddings, no sharing, K and V apart, plain RoPE on global layers of
    the local layers' shapes."""
    rope = {'sliding_attention': {'rope_type': 'default', 'rope_theta': 100.0},
            'full_attention': {'rope_type': 'default', 'rope_theta': 10000.0}}
    hf = randomized(transformers.Gemma4ForCausalLM(gemma4_text(
        num_hidden_layers=3, layer_types=['sliding_attention', 'sliding_attention', 'full_attention'],
        global_head_dim=8, num_global_key_value_heads=None, attention_k_eq_v=False, num_kv_shared_layers=0,
        hidden_size_per_layer_input=0, rope_parameters=rope)), 21)
    cfg = check_parity(hf, tmp_path).config
    assert (cfg.per_layer_embd, cfg.kv_shared_layers, cfg.attn_k_eq_v, cfg.global_head_dim, cfg.rope_proportion) == (
        0, 0, False, None, None)


@pytest.mark.parametrize('change, match', [
    (dict(use_double_wide_mlp=True), 'use_double_wide_mlp'),
    (dict(vocab_size_per_layer_input=50), 'vocab_size_per_layer_input=50'),
    (dict(hidden_activation='gelu'), 'hidden_activation'),
    (dict(use_bidirectional_attention='all'), 'use_bidirectional_attention'),
], ids=['double-wide-mlp', 'per-layer-vocab', 'erf-gelu', 'bidirectional'])
def test_gemma4_text_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match) as e:
        HF_FAMILIES['gemma4_text'].read_config(gemma4_text(**change))
    assert '\n' not in str(e.value)


def test_gemma4_text_global_kv_heads_without_k_eq_v_are_refused_on_export():
    """transformers reads num_global_key_value_heads only with attention_k_eq_v: export says so in one line."""
    flags = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, block_size=BLOCK, bias=False, norm='rms',
                 mlp='geglu', pos='rope', norm_position='sandwich', embed_scale=True, qk_norm=True, v_norm=True,
                 attn_scale=1.0, layer_scalar=True, layers='LG', sliding_window=8, rope_local_theta=10.0)
    from export import hf_family
    assert hf_family(GPTConfig(**flags, global_n_kv_head=1, attn_k_eq_v=True)).model_type == 'gemma4_text'
    with pytest.raises(ValueError, match='global_n_kv_head=1 only with attn_k_eq_v=True') as e:
        to_hf(GPT(GPTConfig(**flags, global_n_kv_head=1)))
    assert '\n' not in str(e.value)


def test_gemma4_text_moe_block(tmp_path):
    """Gemma 4's MoE block: in every layer a dense GEGLU MLP beside GEGLU experts, each branch normalized on both
    sides, routed from the stream itself (a weightless norm, a learned scale, softmax top-k renormalized, a scale per
    expert): same logits, same greedy tokens, exported back."""
    hf = randomized(transformers.Gemma4ForCausalLM(gemma4_text(
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)), 22)
    cfg = check_parity(hf, tmp_path).config
    assert (cfg.mlp, cfg.n_expert, cfg.n_expert_active, cfg.expert_hidden, cfg.moe_dense_mlp, cfg.mlp_width) == (
        'moe', 4, 2, 16, True, 48)


@pytest.mark.parametrize('flags, refused', [(dict(kv_shared_layers=2), 'kv_shared_layers=2'),
                                             (dict(attn_k_eq_v=True), 'attn_k_eq_v=True'),
                                             (dict(per_layer_embd=8), 'per_layer_embd=8'),
                                             (dict(v_norm=True), 'v_norm=True'),
                                             (dict(layer_scalar=True), 'layer_scalar=True'),
                                             (dict(global_head_dim=16, rope_local_theta=10.0), 'global_head_dim=16')])
def test_export_refuses_gemma4_flags_on_a_gemma3_block(flags, refused):
    """Gemma 3's block with one of Gemma 4's flags: gemma3_text cannot carry them and gemma4_text needs the rest of
    its block (value norm, layer scalar, softmax scale 1), so export refuses each in one line naming the flag."""
    check_export_choice(GPTConfig(n_layer=4, n_head=4, n_embd=32, vocab_size=VOCAB, block_size=BLOCK, bias=False,
                                  norm='rms', mlp='geglu', pos='rope', norm_position='sandwich', embed_scale=True,
                                  qk_norm=True, layers='LG', sliding_window=8, **flags), 'gemma3_text', refused)


@pytest.mark.parametrize('proportion, head_dim', [(0.25, 16), (0.25, 512), (0.5, 12), (1.0, 8)])
def test_proportional_rope_frequencies_are_transformers(proportion, head_dim):
    """rope_proportion's frequencies, laid out as transformers' 'proportional' RoPE for Gemma 4's global layers."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = transformers.Gemma4TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=head_dim,
        num_hidden_layers=2, layer_types=['sliding_attention', 'full_attention'], vocab_size=VOCAB,
        rope_parameters={'sliding_attention': {'rope_type': 'default', 'rope_theta': 10_000.0},
                         'full_attention': {'rope_type': 'proportional', 'partial_rotary_factor': proportion,
                                            'rope_theta': 1e6}})
    theirs, _ = ROPE_INIT_FUNCTIONS['proportional'](config, None, layer_type='full_attention')
    torch.testing.assert_close(gemma4.proportional_frequencies(proportion, 1e6, head_dim), theirs, atol=0, rtol=0)
