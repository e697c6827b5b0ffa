"""Tests for chapters/nanochat.py: weightless norms (norm_gain=False) and a norm on the embeddings (embed_norm)."""
import pytest
import torch

import model as M
from chapters import nanochat
from tiny_models import (VOCAB, assert_close, build, check_backward, check_cache_logits, check_causal,
                         check_generate_cache, losses_fall, tiny_config, train_a_few_steps)

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('overrides', [nanochat.NANOCHAT_BLOCK, dict(norm_gain=False, embed_norm=True, layers='LG',
                                                              sliding_window=5, pos='rope', norm_position='sandwich')],
                         ids=['nanochat', 'layernorm-local-sandwich'])
def test_the_nanochat_block_trains_and_decodes_past_block_size(overrides):
    model = build(**overrides)
    norms = [m for m in model.modules() if isinstance(m, (M.RMSNorm, M.LayerNorm))]
    assert len(norms) >= 2 * 2 + 2 and all(m.weight is None and getattr(m, 'bias', None) is None for m in norms)
    assert losses_fall(train_a_few_steps(model))
    check_backward(model)
    check_causal(model)
    check_cache_logits(model)
    check_generate_cache(model)  # past block_size, through the context shift


@torch.no_grad()
@pytest.mark.parametrize('norm', ['rms', 'layernorm'])
def test_weightless_norms_are_the_plain_formula(norm):
    x = torch.randn(3, 5, 8) * 4 + 1
    layer = M.NORMS[norm](8, tiny_config(norm=norm, norm_gain=False, norm_eps=1e-5))
    assert list(layer.parameters()) == []
    centered = x - x.mean(-1, keepdim=True) if norm == 'layernorm' else x
    assert_close(layer(x), centered / (centered.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt(), atol=1e-5)


@torch.no_grad()
def test_embed_norm_gives_the_first_block_unit_rms_tokens():
    model = build(norm='rms', pos='rope', embed_norm=True)
    model.transformer.wte.weight.mul_(50.0)  # far from unit RMS, and eps negligible
    x, _ = model.embed(torch.randint(0, VOCAB, (2, 6)))
    assert_close(x.pow(2).mean(-1), torch.ones(2, 6), atol=1e-4)
    assert 'transformer.ln_emb.weight' in model.state_dict()  # with gains, its own (norm_gain=True)
    assert 'transformer.ln_emb.weight' not in build(**nanochat.NANOCHAT_BLOCK).state_dict()


@pytest.mark.parametrize('field', ['norm_gain', 'embed_norm'])
def test_nanochat_flags_must_be_bools(field):
    with pytest.raises(ValueError, match=f"^{field} must be True or False, got 'no'$"):
        tiny_config(**{field: 'no'})
