"""Tests for chapters/hyper_connections.py: one hyper-connection against the formula written out and against
transformers' DeepSeek-V4, HY-V4 and Qwen4-Exp (the gated residual) modules on the same weights, the doubly stochastic mix, a model's decoding through the
cache, compiled decoding, its FLOPs as torch counts them, its parameters, training, and the checks."""
import math

import pytest
import torch

import model as M
from chapters import GPT, GPTConfig, attention, hyper_connections as hc
from tiny_models import check_autocast_backward

VOCAB, BLOCK, N_EMBD = 32, 16, 16
FLAGS = dict(n_layer=2, n_head=2, n_embd=N_EMBD, block_size=BLOCK, vocab_size=VOCAB, norm='rms', mlp='swiglu',
             pos='rope', bias=False, hc_mult=4)

pytestmark = pytest.mark.usefixtures('single_thread')


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**FLAGS, **overrides})).eval()


def randomized(module, seed):
    """Every parameter away from its init (a near-zero projection would hide a wrong formula)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 1.0))
    return module


def connection_written_out(layer, x, branch):
    """mHC, one token at a time in float64: the weights from the flattened copies' unweighted RMS norm, Sinkhorn
    (columns first, then rows and columns), the collapse, the branch, the spread plus the mixed copies."""
    n, out = layer.n, torch.empty_like(x, dtype=torch.float64)
    fn, base, scale = (p.double() for p in (layer.fn, layer.base, layer.scale))
    for b in range(x.size(0)):
        for t in range(x.size(1)):
            copies = x[b, t].double()
            flat = copies.flatten()
            mixes = fn @ (flat / math.sqrt(flat.square().mean() + layer.norm_eps))
            pre = torch.sigmoid(mixes[:n] * scale[0] + base[:n]) + layer.eps
            post = layer.post_scale * torch.sigmoid(mixes[n:2 * n] * scale[1] + base[n:2 * n])
            comb = torch.softmax((mixes[2 * n:] * scale[2] + base[2 * n:]).view(n, n), dim=-1) + layer.eps
            comb = comb / (comb.sum(0, keepdim=True) + layer.eps)
            for _ in range(layer.iters - 1):
                comb = comb / (comb.sum(1, keepdim=True) + layer.eps)
                comb = comb / (comb.sum(0, keepdim=True) + layer.eps)
            y = branch((pre[:, None] * copies).sum(0))
            out[b, t] = post[:, None] * y[None, :] + comb.T @ copies
    return out


@torch.no_grad()
def test_a_hyper_connection_is_the_formula_written_out():
    layer = randomized(hc.HyperConnection(GPTConfig(**FLAGS), mixed=True).double(), 1)
    x = torch.randn(2, 3, 4, N_EMBD, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weight = torch.randn(N_EMBD, N_EMBD, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    branch = lambda u: torch.tanh(u @ weight)  # noqa: E731
    # the weights are computed in fp32 whatever the stream's type (as DeepSeek-V4 keeps them): fp32's rounding
    torch.testing.assert_close(layer.connect(x, branch), connection_written_out(layer, x, branch), rtol=0, atol=1e-5)
    _, _, comb = layer.weights(x)  # doubly stochastic: every row and column sums to one
    torch.testing.assert_close(comb.sum(-1), torch.ones(2, 3, 4), rtol=0, atol=1e-4)
    torch.testing.assert_close(comb.sum(-2), torch.ones(2, 3, 4), rtol=0, atol=1e-5)


@torch.no_grad()
def test_a_hyper_connection_and_the_head_are_deepseek_v4s_on_the_same_weights():
    transformers = pytest.importorskip('transformers')
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as V4
    theirs_config = transformers.DeepseekV4Config(hidden_size=N_EMBD, hc_mult=4, rms_norm_eps=1e-5)
    ours = randomized(hc.HyperConnection(GPTConfig(**FLAGS), mixed=True), 4)
    theirs = V4.DeepseekV4HyperConnection(theirs_config)
    theirs.load_state_dict({'fn': ours.fn, 'base': ours.base, 'scale': ours.scale})
    x = torch.randn(2, 5, 4, N_EMBD, generator=torch.Generator().manual_seed(5))
    post, comb, collapsed = theirs(x)
    pre, our_post, our_comb = ours.weights(x)
    torch.testing.assert_close(our_post, post, rtol=0, atol=1e-6)
    torch.testing.assert_close(our_comb, comb, rtol=0, atol=1e-6)
    torch.testing.assert_close((pre.unsqueeze(-1) * x).sum(2), collapsed, rtol=0, atol=1e-6)
    head = randomized(hc.HyperHead(GPTConfig(**FLAGS)), 6)
    their_head = V4.DeepseekV4HyperHead(theirs_config)
    their_head.load_state_dict({k: v for k, v in head.state_dict().items()})
    torch.testing.assert_close(head(x), their_head(x), rtol=0, atol=1e-6)


@torch.no_grad()
def test_an_independent_hyper_connection_and_the_head_are_hy_v4s_on_the_same_weights():
    """ihc with hc_post_eps (the epsilon on the spread weights too, here a large one so it shows) and HY-V4's
    hc_magnitude as hc_post_scale: transformers' HY-V4 connection and head, the same weights; without
    hc_post_eps the spread weights differ by the epsilon."""
    transformers = pytest.importorskip('transformers')
    from transformers.models.hy_v4 import modeling_hy_v4 as HY
    theirs_config = transformers.HYV4Config(hidden_size=N_EMBD, hc_mult=4, rms_norm_eps=1e-5, hc_eps=0.01,
                                            hc_magnitude=1.5)
    flags = {**FLAGS, 'hc_kind': 'ihc', 'hc_eps': 0.01, 'hc_post_scale': 1.5, 'hc_post_eps': True}
    ours = randomized(hc.HyperConnection(GPTConfig(**flags), mixed=False), 12)
    theirs = HY.HYV4HyperConnection(theirs_config)
    theirs.load_state_dict({'fn': ours.fn, 'base': ours.base, 'scale': ours.scale})
    x = torch.randn(2, 5, 4, N_EMBD, generator=torch.Generator().manual_seed(13))
    post, collapsed = theirs(x)
    pre, our_post, comb = ours.weights(x)
    assert comb is None
    torch.testing.assert_close(our_post, post, rtol=0, atol=1e-6)
    torch.testing.assert_close((pre.unsqueeze(-1) * x).sum(2), collapsed, rtol=0, atol=1e-6)
    plain = hc.HyperConnection(GPTConfig(**{**flags, 'hc_post_eps': False}), mixed=False)
    plain.load_state_dict(ours.state_dict())
    torch.testing.assert_close(plain.weights(x)[1] + 0.01, post, rtol=0, atol=1e-6)
    head = randomized(hc.HyperHead(GPTConfig(**flags)), 14)
    their_head = HY.HYV4HyperHead(theirs_config)
    their_head.load_state_dict(head.state_dict())
    torch.testing.assert_close(head(x), their_head(x), rtol=0, atol=1e-6)


@torch.no_grad()
def test_a_gated_residual_and_its_head_are_qwen4_exps_on_the_same_weights():
    """hc_kind='gated': the grouped norm, the low-rank collapse weights and the injection gates of transformers'
    Qwen4ExpTextGatedResidual (its norm gains are 1 + w), and its combine-less form as the last collapse."""
    transformers = pytest.importorskip('transformers')
    from transformers.models.qwen4_exp import modeling_qwen4_exp as Q4
    theirs_config = transformers.Qwen4ExpTextConfig(hidden_size=N_EMBD, hc_count=4, hc_lowrank=8, rms_norm_eps=1e-5,
                                                    num_experts=2, num_experts_per_tok=1)
    flags = {**FLAGS, 'hc_kind': 'gated', 'hc_rank': 8, 'norm_eps': 1e-5}
    for spreads, seed in ((True, 15), (False, 16)):
        ours = randomized(hc.GatedConnection(GPTConfig(**flags), spreads), seed)
        theirs = Q4.Qwen4ExpTextGatedResidual(theirs_config, use_combine=spreads)
        names = dict(hc_norm='norm', input_mix_weight_down='down', input_mix_weight_up='up',
                     block_inject_weight='inject')
        theirs.load_state_dict({f'{k}.weight': getattr(ours, v).weight - (1 if k == 'hc_norm' else 0)
                                for k, v in names.items() if spreads or k != 'block_inject_weight'})
        x = torch.randn(2, 5, 4, N_EMBD, generator=torch.Generator().manual_seed(seed))
        if not spreads:
            torch.testing.assert_close(ours(x), theirs(x.flatten(2)), rtol=0, atol=1e-6)
            continue
        branch = lambda u: torch.tanh(u * 3)  # noqa: E731
        collapsed, kept, gates = theirs(x.flatten(2))
        expected = kept + (branch(collapsed).unsqueeze(-2) * gates.unsqueeze(-1)).flatten(-2)
        torch.testing.assert_close(ours.connect(x, branch), expected.view_as(x), rtol=0, atol=1e-6)


@torch.no_grad()
def test_the_gated_residuals_switches_change_the_output():
    """The spread scale (Qwen4-Exp's 2), each copy's own norm gains and the bottleneck's weights all reach the
    logits; a gated model has no branch norms and no final norm (its collapses are the norms)."""
    model = randomized(build(hc_kind='gated', hc_rank=8), 17)
    assert all(isinstance(b.ln_1, torch.nn.Identity) and isinstance(b.ln_2, torch.nn.Identity)
               for b in model.transformer.h) and isinstance(model.transformer.ln_f, torch.nn.Identity)
    idx = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(18))
    expected = model(idx)[0]
    other = build(hc_kind='gated', hc_rank=8, hc_post_scale=1.0)
    other.load_state_dict(model.state_dict())
    assert (other(idx)[0] - expected).abs().max() > 1e-3
    norm = model.transformer.h[0].residual.attn_hc.norm.weight
    saved = norm.clone()
    norm.view(4, N_EMBD)[1:] = norm.view(4, N_EMBD)[0]  # every copy the first copy's gains
    assert (model(idx)[0] - expected).abs().max() > 1e-3
    norm.copy_(saved)
    model.transformer.hc_head.up.weight.zero_()  # the last collapse a plain mean of the normalized copies
    assert (model(idx)[0] - expected).abs().max() > 1e-3


@pytest.mark.parametrize('kind, final', [('mhc', 'learned'), ('mhc', 'mean'), ('ihc', 'learned'),
                                         ('gated', 'learned'), ('gated', 'mean')])
@torch.no_grad()
def test_a_model_of_copies_decodes_through_the_cache_as_without_it(kind, final):
    model = randomized(build(hc_kind=kind, hc_final=final), 7)
    for p in model.parameters():  # randomized weights at a scale the stream survives
        p.mul_(0.3)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(8))
    cached = model.generate(prompt, 2 * BLOCK, temperature=0)  # past block_size: the cache restarts
    assert torch.equal(cached, model.generate(prompt, 2 * BLOCK, temperature=0, use_cache=False))
    assert model.kv_cache_bytes(2, 10) == build(hc_mult=1).kv_cache_bytes(2, 10)  # nothing of it is cached


@torch.no_grad()
def test_compiled_decoding_of_copies_is_eager_decoding():
    model = randomized(build(), 9)
    for p in model.parameters():
        p.mul_(0.3)
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(10))
    eager = model.generate(prompt, 6, temperature=0)
    model.compile_decoding(backend='aot_eager')
    assert torch.equal(model.generate(prompt, 6, temperature=0), eager)


def explicit_attend(q, k, v, mask, dropout_p=0.0, scale=None, sinks=None):
    """Attention as matmuls torch's FLOP counter sees (SDPA's CPU kernel it does not)."""
    if k.size(1) != q.size(1):
        k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
    T, S = q.size(2), k.size(2)
    scores = (q @ k.transpose(-1, -2)) * (q.size(-1) ** -0.5 if scale is None else scale)
    if mask is True or mask is None and T > 1:
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    if isinstance(mask, torch.Tensor):
        scores = scores.masked_fill(~mask, float('-inf'))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize('kind, final', [('mhc', 'learned'), ('ihc', 'mean'), ('gated', 'learned')])
def test_flops_and_parameters_count_the_projections(kind, final, monkeypatch):
    from torch.utils.flop_counter import FlopCounterMode
    model = build(hc_kind=kind, hc_final=final, **({'hc_rank': 8} if kind == 'gated' else {})).train()
    monkeypatch.setattr(M, 'attend', explicit_attend)
    monkeypatch.setattr(attention, 'attend_with_sinks', explicit_attend)
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(11))
    with FlopCounterMode(display=False) as counter:
        model(idx, idx)[1].backward()
    assert model.flops_per_token(seq_len=12) * 2 * 12 == counter.get_total_flops()
    n, d, r = 4, N_EMBD, 8
    per_connection = ((2 + n) * n if kind == 'mhc' else 2 * n) * (n * d + 1) + (3 if kind == 'mhc' else 2)
    head = n * n * d + n + 1 if final == 'learned' else 0
    plain = build(hc_mult=1).get_num_params()
    if kind == 'gated':  # the grouped norm, down, up and the gates; the branches' and the final norm are gone
        per_connection, head = n * d + 2 * n * d * r + n * d * n + -d, n * d + 2 * n * d * r - d
    assert model.get_num_params() == plain + 2 * FLAGS['n_layer'] * per_connection + head


def test_a_model_of_copies_trains_and_every_part_learns():
    torch.manual_seed(0)
    model = build().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, VOCAB, (8, BLOCK + 1), generator=torch.Generator().manual_seed(12))
    losses = []
    for _ in range(12):
        _, loss = model(data[:, :-1], data[:, 1:])
        opt.zero_grad()
        loss.backward()
        losses.append(loss.item())
        if len(losses) == 1:
            connection = model.transformer.h[0].residual.attn_hc
            assert all(p.grad.abs().sum() > 0 for p in (connection.fn, connection.base, connection.scale))
            assert model.transformer.hc_head.hc_fn.grad.abs().sum() > 0
        opt.step()
    assert losses[-1] < losses[0] - 0.3


@pytest.mark.parametrize('overrides, fragment', [
    (dict(hc_mult=1, hc_kind='ihc'), "hc_kind apply to hyper-connections: set hc_mult >= 2"),
    (dict(hc_mult=1, hc_post_eps=True), "hc_post_eps apply to hyper-connections: set hc_mult >= 2"),
    (dict(hc_kind='other'), "hc_kind must be one of 'mhc', 'ihc', 'gated'"),
    (dict(hc_rank=8), "hc_rank=8 is the gated residual's bottleneck: set hc_kind='gated'"),
    (dict(hc_kind='gated', hc_eps=0.1), "hc_eps=0.1 apply to hc_kind 'mhc' and 'ihc', not to 'gated'"),
    (dict(hc_kind='gated', norm_position='sandwich'), "hc_kind='gated' normalizes each copy in its collapse"),
    (dict(hc_mult=1, hc_rank=8), "hc_rank apply to hyper-connections: set hc_mult >= 2"),
    (dict(norm_position='post'), "norm_position='post' normalizes the stream itself"),
    (dict(mtp_depth=1), 'not supported yet'),
    (dict(hc_mult=-1), 'hc_mult must be an int >= 0'),
])
def test_bad_hyper_connection_settings_are_one_line(overrides, fragment):
    with pytest.raises(ValueError) as e:
        GPTConfig(**{**FLAGS, **overrides})
    assert fragment in str(e.value) and '\n' not in str(e.value)


def test_a_model_with_copies_that_fits_no_family_names_the_families_that_carry_them():
    """A model with copies that is otherwise neither DeepSeek-V4's nor HY-V4's is refused, naming the nearer of
    the families that carry hc_mult and what else it needs."""
    pytest.importorskip('transformers')
    from export import hf_family
    with pytest.raises(ValueError) as e:
        hf_family(GPTConfig(**FLAGS))
    message = str(e.value)
    assert 'hc_mult=4 is carried by' in message and ('deepseek_v4' in message or 'hy_v4' in message)
    assert 'which also needs' in message


def test_the_mean_squares_backward_is_autograds():
    """MeanSquare (the collapse weights' norm: one dot product, its backward written out) against the square and
    the mean, value and gradient, in fp64."""
    x = torch.randn(2, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(9), requires_grad=True)
    torch.testing.assert_close(hc.MeanSquare.apply(x), x.square().mean(-1, keepdim=True), rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(hc.MeanSquare.apply, (x,))


def test_sinkhorns_own_backward_is_autograds_through_the_normalisations():
    """Sinkhorn (forward and hand-written backward) against the softmax and the normalisations written out and
    differentiated by autograd, in float64, for 1, 2 and 20 iterations; without a gradient (decoding's way: in
    place, divisions) the same matrices."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 4, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    grad = torch.randn(2, 3, 4, 4, dtype=torch.float64, generator=gen)
    for iters in (1, 2, 20):
        comb = torch.softmax(logits, dim=-1) + 1e-6
        expected = comb / (comb.sum(dim=-2, keepdim=True) + 1e-6)
        for _ in range(iters - 1):
            expected = expected / (expected.sum(dim=-1, keepdim=True) + 1e-6)
            expected = expected / (expected.sum(dim=-2, keepdim=True) + 1e-6)
        ours = hc.Sinkhorn.apply(logits, iters, 1e-6)
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-14)
        torch.testing.assert_close(hc.Sinkhorn.apply(logits.detach(), iters, 1e-6), expected, rtol=0, atol=1e-14)
        torch.testing.assert_close(torch.autograd.grad(ours, logits, grad)[0],
                                   torch.autograd.grad(expected, logits, grad)[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('kind', hc.HC_KINDS)
def test_hyper_connections_train_under_half_precision_autocast(kind, dtype):
    """The mixes in fp32 whatever autocast says: in fp16 the norm's scale overflowed in its backward (r^3 at the
    embeddings' small RMS), every gradient before it non-finite."""
    check_autocast_backward(build(hc_kind=kind, **({'hc_rank': 8} if kind == 'gated' else {})), dtype)
