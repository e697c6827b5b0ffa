"""MiniMax-M3 (hf/minimax_m3_vl.py), its text model, both ways: transformers' MiniMaxM3VLForCausalLM."""

import pytest
import torch

from export import to_hf
from hf_tiny import (BLOCK, GPT, HF_FAMILIES, VOCAB, GPTConfig, check_export_choice, check_parity, randomized, tiny,
                     transformers)

pytestmark = pytest.mark.usefixtures('single_thread')

PARTIAL = {'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 0.5}


def minimax_m3(**overrides):
    """MiniMax-M3's shapes: GQA (4 heads of 12, 2 K/V heads), half of each head rotated; a dense layer then experts
    (4, 2 active, 2 shared experts' width); dense and sparse attention layers in turn, the sparse ones' indexer (2
    heads of 8, one per K/V group) picking 3 blocks of 4 keys, the query's own always; every SwiGLU clamped at 1,
    low enough to bite. Weights drawn 5x wider than its init, so the logits are of order 1. No pad token: transformers
    zeros its embedding row, and on a sparse first layer that token's indexer scores would all tie (0), broken by
    the earliest block here, by topk's order there."""
    args = dict(head_dim=12, num_key_value_heads=2, num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2,
                intermediate_size=16, shared_intermediate_size=32, dense_intermediate_size=40,
                mlp_layer_types=['dense', 'sparse', 'sparse', 'sparse'],
                layer_types=['full_attention', 'minimax_m3_sparse'] * 2, index_n_heads=2, index_head_dim=8,
                index_block_size=4, index_topk_blocks=3, index_local_blocks=1, swiglu_limit=1.0,
                routed_scaling_factor=2.0, initializer_range=0.1, rope_parameters=dict(PARTIAL), pad_token_id=None)
    return tiny(transformers.MiniMaxM3VLTextConfig, **{**args, **overrides})


def build(config, seed=12):
    """The model with its 1-d weights off their init (randomized: the (1 + w) gains, the balancing bias)."""
    torch.manual_seed(0)
    return randomized(transformers.MiniMaxM3VLForCausalLM(config), seed)


@pytest.mark.parametrize('overrides', [
    {},
    dict(num_hidden_layers=3, mlp_layer_types=['sparse'] * 3, layer_types=['minimax_m3_sparse'] * 3,
         index_block_size=2, index_topk_blocks=4, index_local_blocks=2, shared_intermediate_size=16, index_head_dim=12,
         rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0}, tie_word_embeddings=True),
], ids=['dense-and-sparse-partial-rope', 'all-sparse-two-local-blocks-tied'])
def test_minimax_m3_text_model_both_ways(overrides, tmp_path):
    """Logits within 1e-5 of transformers' (check_parity: greedy tokens through our cache, and the export back,
    too). The second: every layer sparse and MoE, blocks of 2 with the 2 most recent always read, one shared expert,
    the whole head rotated, the head tied."""
    hf = build(minimax_m3(**overrides))
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.qk_norm, cfg.qk_norm_all_heads, cfg.router, cfg.router_norm_topk) == (True, False, 'sigmoid', True)
    assert (cfg.swiglu_limit, cfg.swiglu_form, cfg.index_score) == (1.0, 'gpt-oss_all', 'dot_per_group')
    assert (cfg.index_block_pool, cfg.index_tail) == ('max', 'score')
    shape = (cfg.first_dense_layers, cfg.n_shared_expert, cfg.index_local_blocks, cfg.rope_fraction)
    if overrides:
        assert cfg.index_dense_layers is None and (cfg.index_block_size, cfg.index_topk) == (2, 8)
        assert shape == (0, 1, 2, 1.0) and cfg.tie_embeddings
    else:
        assert cfg.index_dense_layers == 'DI' and (cfg.index_block_size, cfg.index_topk) == (4, 12)
        assert shape == (1, 2, 1, 0.5)
        assert [b.attn.indexer is None for b in ours.transformer.h] == [True, False, True, False]
    idx = torch.randint(0, VOCAB, (5, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(idx).logits
        diff = (ours(idx)[0] - expected).abs().max().item()
    print(f"max |logits - transformers'| = {diff:.2e} (logits up to {expected.abs().max():.2f})")
    assert diff < 1e-5


def _first_group_for_all(indexer):
    """The indexer's picks with K/V group 0's read by every query head: one selection for all heads."""
    grouped = indexer.grouped

    def first(mask, slots=None):
        mask, slots = grouped(mask, slots)
        return mask[:, :1].expand_as(mask).contiguous(), slots
    return first


@torch.no_grad()
def test_each_part_of_minimax_m3_moves_the_logits(tmp_path):
    """Each part the parity test passes through changes the logits when taken away, so the parity shows it mapped:
    the block picks (every key read instead), a sparse layer made dense, the recent block forced, one selection per
    K/V group, the indexer's and the attention's (1 + w) norm gains, partial RoPE, the shared and dense MLPs'
    clamp, the routed scaling and the balancing bias."""
    hf = build(minimax_m3())
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    idx = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    expected = ours(idx)[0]
    torch.testing.assert_close(expected, hf(idx).logits, atol=1e-5, rtol=0)
    state = ours.state_dict()

    def moved(flags=None, patch=None, **changed):
        other = GPT(GPTConfig(**{**vars(ours.config), **(flags or {})})).eval()
        other.load_state_dict({k: v for k, v in {**state, **changed}.items() if k in other.state_dict()})
        for block in other.transformer.h if patch else ():
            if block.attn.indexer is not None:
                block.attn.indexer.grouped = patch(block.attn.indexer)
        return (other(idx)[0] - expected).abs().max().item()

    ones = lambda suffix: {k: torch.ones_like(v) for k, v in state.items() if k.endswith(suffix)}
    assert moved(dict(index_topk=64)) > 1e-3
    assert moved(dict(index_dense_layers='DDDI')) > 1e-3
    assert moved(dict(index_local_blocks=0)) > 1e-3
    assert moved(patch=_first_group_for_all) > 1e-3
    assert moved(**ones('indexer.q_norm.weight')) > 1e-3
    assert moved(**ones('indexer.k_norm.weight')) > 1e-3
    assert moved(**ones('attn.q_norm.weight')) > 1e-3
    assert moved(dict(rope_fraction=1 / 3)) > 1e-3  # 4 of 12 dims rotated, not 6
    assert moved(dict(swiglu_form='gpt-oss')) > 1e-3
    assert moved(dict(routed_scaling=1.0)) > 1e-3
    assert moved(**{k: torch.zeros_like(v) for k, v in state.items() if k.endswith('expert_bias')}) > 1e-3


@pytest.mark.parametrize('overrides, named', [
    (dict(swiglu_alpha=1.5), 'swiglu_alpha=1.5 is not supported'),
    (dict(layer_types=['full_attention', 'sliding_attention'] * 2), "layer_types ['sliding_attention'] are not"),
    (dict(index_n_heads=4), 'index_n_heads=4 with num_key_value_heads=2 is not supported'),
    (dict(shared_intermediate_size=24), 'shared_intermediate_size=24 is not supported'),
    (dict(mlp_layer_types=['dense'] * 4), 'without MoE layers is not supported'),
    (dict(mlp_layer_types=['sparse', 'dense', 'sparse', 'sparse']), 'dense layers other than the first ones'),
])
def test_what_minimax_m3_we_cannot_load_is_refused_in_one_line(overrides, named):
    with pytest.raises(ValueError) as e:
        HF_FAMILIES['minimax_m3_vl_text'].read_config(minimax_m3(**overrides))
    assert named in str(e.value) and '\n' not in str(e.value)


def test_an_indexer_narrower_than_the_rotated_dims_is_refused_in_one_line():
    """transformers turns the indexer's dims with the attention's tables cut to its width, which is no rotation when
    it is narrower than them: the config read is refused by our check."""
    flags = HF_FAMILIES['minimax_m3_vl_text'].read_config(minimax_m3(rope_parameters={'rope_type': 'default',
                                                                                      'rope_theta': 10000.0}))
    with pytest.raises(ValueError, match=r'index_head_dim \(8\) must be at least the rotated width') as e:
        GPTConfig(**flags)
    assert '\n' not in str(e.value)


M3_FLAGS = dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, head_dim=12,
                norm='rms', norm_eps=1e-6, pos='rope', rope_fraction=0.5, bias=False, qk_norm=True, mlp='moe',
                ffn_hidden=40, n_expert=4, n_expert_active=2, moe_hidden=16, n_shared_expert=1, router='sigmoid',
                routed_scaling=2.0, first_dense_layers=1, swiglu_limit=1.0, swiglu_form='gpt-oss_all',
                index_topk=8, index_n_heads=2, index_head_dim=8, index_block_size=4, index_score='dot_per_group',
                index_dense_layers='DI')


@pytest.mark.parametrize('flags, named', [
    (dict(), None),  # a model built here, not loaded: exported to minimax_m3_vl_text
    (dict(swiglu_form='gpt-oss'), "swiglu_form='gpt-oss'"),
    (dict(router_norm_topk=False), 'router_norm_topk=False'),
    (dict(index_tail='keep'), "index_tail='keep'"),
])
def test_export_picks_minimax_m3_or_names_what_it_cannot_carry(flags, named):
    config = GPTConfig(**{**M3_FLAGS, **flags})
    check_export_choice(config, 'minimax_m3_vl_text', named)
    if named is not None:
        return
    torch.manual_seed(0)
    ours = GPT(config).eval()
    with torch.no_grad():
        for name, t in list(ours.named_parameters()) + list(ours.named_buffers()):  # off their init
            if name.endswith(('expert_bias', 'norm.weight')):
                t.normal_()
        idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
        hf = to_hf(ours)
        torch.testing.assert_close(hf(idx).logits, ours(idx)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize('flags, named', [
    (dict(index_score='weighted_relu', index_n_heads=4), "index_score='weighted_relu' needs 'dot_per_group'"),
    (dict(index_norm_eps=1e-5), 'index_norm_eps=1e-05 must equal norm_eps=1e-06'),
])
def test_export_refuses_an_indexer_minimax_m3_does_not_run(flags, named):
    """Export refuses, in one line, a DeepSeek indexer and an indexer norm's epsilon other than the model's."""
    with pytest.raises(ValueError, match=named) as e:
        to_hf(GPT(GPTConfig(**{**M3_FLAGS, **flags})), family='minimax_m3_vl_text')
    assert '\n' not in str(e.value)
