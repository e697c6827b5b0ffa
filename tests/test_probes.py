"""probes.py: known answers for the attention-sink share and massive activations, on tiny models."""
import math

import pytest
import torch

import model as model_module
from chapters import GPT, GPTConfig
from probes import gradient_norms, probe, recording_attention, summarize


def tiny(**overrides):
    torch.manual_seed(0)
    config = dict(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16, bias=False)
    return GPT(GPTConfig(**{**config, **overrides})).eval()


def zero_queries(model):
    """Every query 0, so every score is equal: attention spreads evenly over the keys a query sees."""
    for block in model.transformer.h:
        block.attn.c_attn.weight.data[:block.attn.n_head * block.attn.head_size] = 0


def tokens(T=12, B=3):
    return torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("skip", [0, 3])
@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_equal_scores_give_the_first_position_a_share_of_the_mean_of_one_over_t_plus_one(skip, pos):
    model = tiny(pos=pos)
    zero_queries(model)
    T = 12
    report = probe(model, tokens(T), skip=skip)
    expected = sum(1 / (t + 1) for t in range(skip, T)) / (T - skip)
    for layer in report['sink_share']:
        assert layer == pytest.approx([expected] * 2, rel=1e-5)
    assert report['learned_sink_share'] == [None, None]


def test_a_learned_sink_is_one_more_key_in_every_denominator():
    """Equal scores and a sink logit of 0: query t shares among t + 1 keys and the sink, 1/(t+2) each; a large
    sink logit takes all attention from the keys."""
    model = tiny(attn_sinks=True)
    zero_queries(model)
    T = 10
    report = probe(model, tokens(T), skip=0)
    expected = sum(1 / (t + 2) for t in range(T)) / T
    for shares, sink in zip(report['sink_share'], report['learned_sink_share']):
        assert shares == pytest.approx([expected] * 2, rel=1e-5) and sink == pytest.approx([expected] * 2, rel=1e-5)
    model.transformer.h[1].attn.sinks.data[:] = 30.0
    report = probe(model, tokens(T), skip=0)
    assert report['learned_sink_share'][1] == pytest.approx([1.0, 1.0]) and max(report['sink_share'][1]) < 1e-9


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(pos="rope", attn_sinks=True, n_kv_head=1, layers="LG", sliding_window=4),
    dict(attn="mla", pos="rope", layers="DG"),
], ids=["mha", "gqa-sinks-window", "mla-deltanet"])
def test_the_explicit_attention_is_the_models_own(overrides):
    """While recording, attention runs as an explicit softmax: the model's outputs must not move, so the
    weights recorded are the ones the model uses; model.attend is itself again afterwards."""
    model = tiny(**overrides)
    idx = tokens()
    with torch.no_grad():
        expected, _ = model(idx)
        attend = model_module.attend
        with recording_attention(model) as records:
            recorded, _ = model(idx)
    assert model_module.attend is attend
    torch.testing.assert_close(recorded, expected, rtol=1e-4, atol=1e-5)
    softmax_layers = [i for i, kind in enumerate(model.config.layer_kinds) if kind != 'D']
    assert sorted(records) == softmax_layers
    for weights, _ in records.values():
        assert weights.shape == (3, 2, 12, 12) and torch.all(weights.triu(1) == 0)  # causal
    report = probe(model, idx)
    assert [s is None for s in report['sink_share']] == [kind == 'D' for kind in model.config.layer_kinds]


def test_massive_activations_find_a_planted_value():
    model = tiny()
    idx = tokens() % 7  # token 7 only where planted
    plain = summarize(probe(model, idx))
    model.transformer.wte.weight.data[7, 5] = 1000.0  # token 7's embedding, channel 5: in the stream from the start
    idx[1, 4] = 7
    report = probe(model, idx)
    for layer in report['massive']:
        assert layer['max'] == pytest.approx(1000.0, rel=0.01)
        assert (layer['position'], layer['channel']) == (4, 5) and layer['ratio'] > 1000
    assert summarize(report)['massive_ratio'] > 100 * plain['massive_ratio']
    assert math.isclose(summarize(report)['massive_max'], max(m['max'] for m in report['massive']))


def test_massive_activations_read_every_copy_of_a_wider_stream():
    """Hyper-connections carry (B, T, n, C) between blocks: the probe reads the copies side by side (the crash an
    ablation of hc_mult met after its first mHC run)."""
    model = tiny(hc_mult=4, pos='rope', norm='rms')
    model.transformer.wte.weight.data[7, 5] = 1000.0
    idx = tokens() % 7
    idx[1, 4] = 7
    for layer in probe(model, idx)['massive']:
        assert layer['max'] == pytest.approx(1000.0, rel=0.05)
        assert layer['position'] == 4 and layer['channel'] % 16 == 5 and layer['ratio'] > 100


def test_gradient_norms_are_the_losses_gradients_at_each_depth_and_leave_the_model_as_it_was():
    """The last block's stream gradient against autograd's through the head alone (no hook); the parameters'
    against a plain backward of the same loss; the model's own .grad and training mode are kept."""
    model = tiny(norm='rms', pos='rope').train()
    idx = tokens(T=12)
    marker = torch.full_like(model.lm_head.weight, 7.0)
    model.lm_head.weight.grad = marker.clone()
    norms = gradient_norms(model, idx)
    assert model.training and torch.equal(model.lm_head.weight.grad, marker)
    assert all(p.grad is None for p in model.parameters() if p is not model.lm_head.weight)
    model.eval()
    x = model.embed(idx[:, :-1])[0]
    for block in model.transformer.h:
        x = block(x, model.embed(idx[:, :-1])[1]['rope'], True)
    last = x.detach().requires_grad_()
    logits = model.lm_head(model.transformer.ln_f(last))
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    expected = torch.autograd.grad(loss, last)[0]
    assert norms['stream'][-1] == pytest.approx(expected.pow(2).mean().sqrt().item(), rel=1e-5)
    model.zero_grad(set_to_none=True)
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    for block, norm in zip(model.transformer.h, norms['params']):
        assert norm == pytest.approx(math.sqrt(sum(p.grad.pow(2).sum().item() for p in block.parameters())), rel=1e-5)
    summary = summarize({**probe(model, idx), 'gradients': norms})
    assert summary['grad_first_over_last'] == pytest.approx(norms['stream'][0] / norms['stream'][-1])
    assert summary['grad_max_over_min'] >= max(summary['grad_first_over_last'], 1 / summary['grad_first_over_last'])


def test_gradient_norms_read_every_copy_of_a_wider_stream():
    model = tiny(hc_mult=4, pos='rope', norm='rms')
    norms = gradient_norms(model, tokens())
    assert len(norms['stream']) == 2 and all(v > 0 for v in norms['stream'] + norms['params'])


def test_too_few_tokens_is_refused_by_name():
    with pytest.raises(ValueError, match="more than skip=4 tokens"):
        probe(tiny(), tokens(T=4))


@pytest.mark.parametrize("kind, flag", [("L", "sliding_window"), ("C", "attention_chunk_size")])
def test_equal_attention_follows_each_layers_window_or_chunk(kind, flag):
    """Equal scores in a layer whose window (or chunk) is 16, at 64 tokens: queries past it do not see position 0,
    so equal attention gives it 0.022 on average there, not the whole row's 0.044; the global layer beside it
    keeps 0.044, and the summary's baseline is the mean over the same layers' heads (issue 44.5)."""
    model = tiny(block_size=64, pos="rope", layers=kind + "G", **{flag: 16})
    zero_queries(model)
    report = probe(model, tokens(T=64), skip=4)
    windowed = sum(1 / (t + 1) for t in range(4, 16)) / 60
    whole = sum(1 / (t + 1) for t in range(4, 64)) / 60
    assert round(windowed, 3) == 0.022 and round(whole, 3) == 0.044
    assert report['equal_share'] == pytest.approx([windowed, whole])
    for shares, equal in zip(report['sink_share'], report['equal_share']):
        assert shares == pytest.approx([equal] * 2, rel=1e-5)  # equal scores give exactly the baseline
    assert summarize(report)['equal_share'] == pytest.approx((windowed + whole) / 2)
    assert summarize(report)['sink_share'] == pytest.approx(summarize(report)['equal_share'], rel=1e-5)
