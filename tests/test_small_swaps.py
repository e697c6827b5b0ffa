"""Tests for chapters/small_swaps.py: scaled embeddings and a logit soft cap (in one test with attention.py's
softmax scale), zero-initialized projections. Its other MLP activations: test_model.py's MLP formulas, init
statistics and flag combinations."""
import pytest
import torch

from tiny_models import N_EMBD, N_HEAD, VOCAB, assert_close, build, config_id, tiny_config

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('tied', [True, False])
def test_zero_init_starts_every_block_as_the_identity(tied):
    model = build(zero_init=True, tie_embeddings=tied, norm='rms', mlp='swiglu', pos='rope', bias=False)
    projections = [p for n, p in model.named_parameters() if n.endswith('c_proj.weight')]
    assert len(projections) == 2 * 2 and all(torch.count_nonzero(p) == 0 for p in projections)
    # a tied head is the embedding: it keeps its init, else the head starts at zero and every logit with it
    assert (torch.count_nonzero(model.lm_head.weight) > 0) == tied
    idx = torch.randint(0, VOCAB, (2, 8))
    hidden = model.hidden_states(idx)
    torch.testing.assert_close(hidden, model.transformer.ln_f(model.transformer.wte(idx)))
    if not tied:
        assert torch.count_nonzero(model(idx)[0]) == 0
    # and it learns: a zero head gets the first step's gradient, the zero projections the next (or at once, tied)
    model.train()
    opt = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95), 'cpu')
    for step in range(2):
        _, loss = model(idx, idx)
        loss.backward()
        assert model.lm_head.weight.grad.abs().sum() > 0
        assert all(p.grad.abs().sum() > 0 for p in projections) == (tied or step == 1)
        opt.step()
        opt.zero_grad()


@torch.no_grad()
def test_embedding_scale_softcap_and_query_scale():
    """embed_scale multiplies the embeddings by sqrt(n_embd); logit_softcap=c gives c*tanh(logits/c); attn_scale
    set to head_dim**-0.5 changes nothing and another value does."""
    plain = build(pos='rope', norm='rms')
    idx = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(58))
    capped = build(pos='rope', norm='rms', logit_softcap=0.5)
    assert_close(capped(idx)[0], 0.5 * torch.tanh(plain(idx)[0] / 0.5), atol=1e-6)
    # scaling the embeddings = an embedding table times sqrt(d) (untied, so the head keeps its weights)
    unscaled = build(pos='rope', norm='rms', tie_embeddings=False)
    unscaled.load_state_dict({**plain.state_dict(), 'transformer.wte.weight': plain.transformer.wte.weight * N_EMBD ** 0.5})
    scaled = build(pos='rope', norm='rms', tie_embeddings=False, embed_scale=True)
    scaled.load_state_dict(plain.state_dict())
    assert_close(scaled(idx)[0], unscaled(idx)[0], atol=1e-5)
    assert (scaled(idx)[0] - plain(idx)[0]).abs().max() > 1e-3
    same = build(pos='rope', norm='rms', attn_scale=(N_EMBD // N_HEAD) ** -0.5)
    assert_close(same(idx)[0], plain(idx)[0], atol=1e-6)
    assert (build(pos='rope', norm='rms', attn_scale=1.0)(idx)[0] - plain(idx)[0]).abs().max() > 1e-4


@pytest.mark.parametrize('overrides,field', [
    (dict(logit_softcap=-1.0), 'logit_softcap'),
    (dict(embed_scale=1), 'embed_scale'),
], ids=config_id)
def test_invalid_configs_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)
