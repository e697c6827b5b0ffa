"""GLM-5.3-Flash (hf/glm5_next.py), its text model, both ways: transformers' Glm5NextForConditionalGeneration
(lm_head over Glm5NextTextModel; its vision tower the smallest its config builds, never run on text)."""

import pytest
import torch

from export import to_hf
from hf_tiny import (BLOCK, GPT, HF_FAMILIES, NEW, PROMPT, VOCAB, GPTConfig, check_export_choice, check_parity,
                     randomized, transformers)
from hf.tiny import glm5_next

pytestmark = pytest.mark.usefixtures('single_thread')


def build(config, seed=10):
    """The model, 1-d weights off their init (randomized) and KPool's gate and position term (2-d, ones and
    zeros at init) drawn, so a wrong mapping of any shows."""
    torch.manual_seed(0)
    hf = randomized(transformers.Glm5NextForConditionalGeneration(config), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(('index_kpool_compress_gate', 'index_kpool_compress_ape')):
                p.copy_(torch.randn(p.shape, generator=g))
    return hf


@pytest.mark.parametrize('overrides', [
    {},
    dict(num_hidden_layers=3, mlp_layer_types=['dense', 'sparse', 'sparse'], indexer_types=['full', 'full', 'shared'],
         layer_types=['linear_attention', 'indexed_attention', 'indexed_attention'], linear_lower_bound=None,
         index_kpool=2, index_topk=6),
], ids=['kkpool-safe-gate', 'shared-picks-softplus-gate'])
def test_glm5_next_text_model_both_ways(overrides, tmp_path):
    """Logits within 1e-5 of transformers' (check_parity: greedy tokens through our cache, and the export back,
    too); the text model is what runs (lm_head over Glm5NextTextModel). The second: a layer reading the
    previous layer's picks (indexer_types 'shared') and KDA's own gate (linear_lower_bound=None)."""
    hf = build(glm5_next(**overrides))
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.pos == 'none' and cfg.attn == 'mla' and cfg.mla_dims['rope'] == 0 and cfg.mla_dims['q_latent'] == 8
    assert (cfg.hc_mult, cfg.hc_kind, cfg.hc_final) == (3, 'mhc', 'mean')
    assert (cfg.index_block_pool, cfg.index_tail, cfg.index_local_blocks) == ('learned', 'keep', 0)
    assert (cfg.swiglu_limit, cfg.swiglu_form, cfg.first_dense_layers) == (1.0, 'plain_all', 1)
    assert cfg.norm_eps == cfg.mla_norm_eps == 1e-5
    if overrides:
        assert cfg.layers == 'KGG' and cfg.index_share == 'FFS' and cfg.kda_lower_bound is None
        assert (cfg.index_block_size, cfg.index_topk) == (2, 6)
    else:
        assert cfg.layers == 'KG' and cfg.index_share is None and cfg.kda_lower_bound == -5.0
        assert (cfg.index_block_size, cfg.index_topk) == (4, 8)
    idx = torch.randint(0, VOCAB, (2, PROMPT + NEW), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(idx).logits
        text = hf.model.language_model(input_ids=idx).last_hidden_state
        torch.testing.assert_close(hf.lm_head(text), expected, atol=0, rtol=0)  # the text model and its head
        assert (ours(idx)[0] - expected).abs().max() < 1e-5


@torch.no_grad()
def test_each_part_of_glm5_next_moves_the_logits(tmp_path):
    """Each part the parity test passes through changes the logits when taken away, so the parity shows it mapped:
    the safe gate, KPool's position term and gate, the block picks (every key read instead), the Sinkhorn mix, the
    dense and shared MLPs' clamp."""
    hf = build(glm5_next())
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    idx = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    expected = ours(idx)[0]
    torch.testing.assert_close(expected, hf(idx).logits, atol=1e-5, rtol=0)
    state = ours.state_dict()

    def moved(flags=None, **changed):
        other = GPT(GPTConfig(**{**vars(ours.config), **(flags or {})})).eval()
        other.load_state_dict({k: v for k, v in {**state, **changed}.items() if k in other.state_dict()})
        return (other(idx)[0] - expected).abs().max().item()

    assert moved(dict(kda_lower_bound=None)) > 1e-3
    assert moved(**{k: torch.zeros_like(v) for k, v in state.items() if k.endswith('indexer.pool_pos')}) > 1e-3
    assert moved(**{k: torch.zeros_like(v) for k, v in state.items() if k.endswith('indexer.pool_gate.weight')}) > 1e-3
    assert moved(dict(index_topk=64)) > 1e-3
    assert moved(dict(hc_sinkhorn_iters=1)) > 1e-3
    assert moved(dict(swiglu_form='plain_routed')) > 1e-3
    assert moved(dict(mla_norm_eps=None)) > 1e-5  # DeepSeek's 1e-6 on the latents: a small move, but past 1e-5


@pytest.mark.parametrize('overrides, named', [
    (dict(index_kpool_always_select_tail=False), 'index_kpool_always_select_tail=False is not supported'),
    (dict(indexer_types=['full', 'full', 'full', 'shared']), "layer 3 'shared' but layer 2"),
    (dict(hc_mult=1), 'hc_mult=1 is not supported'),
    (dict(mlp_layer_types=['dense'] * 4), 'without MoE layers is not supported'),
])
def test_what_glm5_next_we_cannot_load_is_refused_in_one_line(overrides, named):
    with pytest.raises(ValueError) as e:
        HF_FAMILIES['glm5_next'].read_config(glm5_next(**overrides))
    assert named in str(e.value) and '\n' not in str(e.value)


GLM5_FLAGS = dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, norm='rms', pos='none',
                  bias=False, layers='KG', attn='mla', q_lora_rank=8, kv_lora_rank=16, qk_nope_head_dim=8,
                  qk_rope_head_dim=0, v_head_dim=6, index_topk=8, index_n_heads=4, index_head_dim=8,
                  index_block_size=4, index_block_pool='learned', index_local_blocks=0, index_tail='keep',
                  linear_key_dim=8, linear_value_dim=8, kda_lower_bound=-5.0, mlp='moe', n_expert=4,
                  n_expert_active=2, moe_hidden=16, n_shared_expert=1, router='sigmoid', first_dense_layers=1,
                  swiglu_limit=1.0, swiglu_form='plain_all', hc_mult=3, hc_final='mean', norm_eps=1e-6)


@pytest.mark.parametrize('flags, named', [
    (dict(), None),  # a model built here, not loaded: exported to glm5_next
    (dict(hc_final='learned'), "hc_final='learned'"),
    (dict(index_local_blocks=1), 'index_local_blocks=1'),
    (dict(swiglu_form='plain'), "swiglu_form='plain'"),
])
def test_export_picks_glm5_next_or_names_what_it_cannot_carry(flags, named):
    config = GPTConfig(**{**GLM5_FLAGS, **flags})
    check_export_choice(config, 'glm5_next', named)
    if named is not None:
        return
    torch.manual_seed(0)
    ours = GPT(config).eval()
    with torch.no_grad():
        for name, t in list(ours.named_parameters()) + list(ours.named_buffers()):  # off their init
            if name.endswith(('expert_bias', '.base', 'pool_pos')):
                t.normal_()
        idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
        hf = to_hf(ours)
        torch.testing.assert_close(hf(idx).logits, ours(idx)[0], atol=1e-5, rtol=0)
        assert all(not t.any() for k, t in hf.state_dict().items() if k.startswith('model.visual.'))


def test_export_refuses_mla_latent_norms_other_than_the_models():
    """transformers normalizes the latents with rms_norm_eps: a model whose latent epsilon (mla_norm_eps, None:
    1e-6) differs from its norm_eps is refused in one line."""
    with pytest.raises(ValueError, match='mla_norm_eps=1e-06 must equal norm_eps=1e-05') as e:
        to_hf(GPT(GPTConfig(**{**GLM5_FLAGS, 'norm_eps': 1e-5})))
    assert '\n' not in str(e.value)
