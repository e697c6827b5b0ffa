"""Tests for chapters/moe.py, mixture of experts (mlp='moe'): routing against references (Mixtral, Qwen3-MoE,
DeepSeek-V2/V3, gpt-oss, Llama 4's input scaling), the fused grouped matmul, compiling, active parameters, the
balancing losses and bias, dense layers between."""
import pytest
import torch
import torch.nn.functional as F

from chapters import moe
from tiny_models import BLOCK, N_EMBD, VOCAB, assert_close, build, config_id, tiny_config

pytestmark = pytest.mark.usefixtures('single_thread')


def moe_model(**overrides):
    torch.manual_seed(60)
    cfg = tiny_config(**{'mlp': 'moe', 'n_expert': 4, 'n_expert_active': 2, 'moe_hidden': 24, 'norm': 'rms',
                         **overrides})
    layer = moe.MoE(cfg).eval()
    with torch.no_grad():  # big enough router weights that choices are clear-cut, and a bias that matters
        layer.router.weight.normal_(0, 0.5)
        if cfg.router == 'sigmoid':
            layer.expert_bias.copy_(torch.tensor([0.5, -0.5, 0.2, 0.0]))
    return layer


def expert_reference(layer, x, e):
    """Expert e of an MoE layer on x (N, d), written out: down(silu(gate x) * up x); with biases and a limit,
    gpt-oss's clamped form."""
    experts = layer.experts
    W1, W2 = experts.c_fc[e], experts.c_proj[e]
    b1, b2 = (experts.c_fc_bias[e], experts.c_proj_bias[e]) if experts.c_fc_bias is not None else (0, 0)
    h = W1.size(0) // 2
    bias = torch.is_tensor(b1)
    gate, up = x @ W1[:h].T + (b1[:h] if bias else 0), x @ W1[h:].T + (b1[h:] if bias else 0)
    if experts.limit is None:
        return (gate * torch.sigmoid(gate) * up) @ W2.T + b2
    gate, up = torch.minimum(gate, torch.tensor(experts.limit)), up.clamp(-experts.limit, experts.limit)
    return (gate * torch.sigmoid(1.702 * gate) * (up + 1)) @ W2.T + b2


def routing_reference(layer, x, router, norm_topk, groups, topk_group, scaling):
    """Token by token: the experts each router picks, and their weights (Mixtral / Qwen3-MoE / DeepSeek-V2 / V3)."""
    out = []
    for token in x:
        logits = layer.router.weight @ token + (layer.router.bias if layer.router.bias is not None else 0)
        if router == 'softmax':
            scores = logits.softmax(-1)
            choice = scores.clone()
        else:
            scores = logits.sigmoid()
            choice = scores + layer.expert_bias
        size = len(choice) // groups
        if groups > 1:
            group_scores = [sorted(choice[g * size:(g + 1) * size].tolist())[-(2 if router == 'sigmoid' else 1):]
                            for g in range(groups)]
            best = sorted(range(groups), key=lambda g: -sum(group_scores[g]))[:topk_group]
            choice = torch.tensor([c if i // size in best else -1e9 for i, c in enumerate(choice.tolist())])
        picked = sorted(range(len(choice)), key=lambda i: -choice[i].item())[:layer.k]
        weights = scores[picked]
        if norm_topk:
            weights = weights / weights.sum()
        out.append(sum(w * scaling * expert_reference(layer, token[None], e)[0] for w, e in zip(weights, picked)))
    return torch.stack(out)


@pytest.mark.parametrize('router,norm_topk,groups,topk_group,scaling,shared', [
    ('softmax', True, 1, 1, 1.0, 0),  # Mixtral
    ('softmax', False, 1, 1, 1.0, 0),  # Qwen3-MoE without renormalisation
    ('softmax', False, 2, 1, 1.5, 1),  # DeepSeek-V2: group-limited greedy, scaled, a shared expert
    ('sigmoid', True, 2, 1, 2.5, 1),  # DeepSeek-V3: biased choice, groups by their top two, scaled
    ('sigmoid', True, 1, 1, 1.0, 0),
])
def test_moe_routes_like_the_reference(router, norm_topk, groups, topk_group, scaling, shared):
    layer = moe_model(router=router, router_norm_topk=norm_topk, n_expert_group=groups, topk_group=topk_group,
                routed_scaling=scaling, n_shared_expert=shared)
    x = torch.randn(2, 7, N_EMBD, generator=torch.Generator().manual_seed(61))
    with torch.no_grad():
        expected = routing_reference(layer, x.view(-1, N_EMBD), router, norm_topk, groups, topk_group, scaling)
        if shared:
            expected = expected + layer.shared(x.view(-1, N_EMBD))
        assert_close(layer(x), expected.view(2, 7, N_EMBD), atol=1e-5)


def test_gpt_oss_experts_have_biases_and_a_clamped_swiglu():
    layer = moe_model(moe_bias=True, swiglu_limit=0.5)
    with torch.no_grad():
        for p in (layer.router.bias, layer.experts.c_fc_bias, layer.experts.c_proj_bias):
            p.normal_(0, 0.5)
        layer.experts.c_fc.mul_(50)  # gates and ups well past the limit, so the clamp acts
    x = torch.randn(2, 7, N_EMBD, generator=torch.Generator().manual_seed(62))
    with torch.no_grad():
        expected = routing_reference(layer, x.view(-1, N_EMBD), 'softmax', True, 1, 1, 1.0)
        assert_close(layer(x), expected.view(2, 7, N_EMBD), atol=1e-4)


def test_moe_fused_grouped_matmul_equals_the_loop(monkeypatch):
    """The fused path (CUDA) and the loop (elsewhere) compute the same outputs and gradients; torch runs its
    grouped matmul on the CPU too, so both are checked here. The fused path computes in bf16 (8 bits of
    mantissa), so they agree to 2% of each tensor's scale; a token sent to the wrong expert is off by ~100%."""
    layer = moe_model()
    x = torch.randn(3, 5, N_EMBD, generator=torch.Generator().manual_seed(62))
    results = []
    for fused in (False, True):
        monkeypatch.setattr(moe, '_fused_grouped_mm', lambda *_: fused)
        layer.zero_grad()
        y = layer(x)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results.append((y.detach(), layer.experts.c_fc.grad.clone(), layer.experts.c_proj.grad.clone()))
    for loop, fused in zip(*results):
        assert_close(fused, loop, atol=0.02 * loop.abs().max().item())


@pytest.mark.parametrize('tokens', [1, 2, 5])  # 1 x 2 and 2 x 2 pairs of 4 experts gathered; 5 x 2: every expert
@pytest.mark.parametrize('flags', [{}, {'moe_bias': True, 'swiglu_limit': 0.5}, {'n_expert_active': 1,
                                                                               'moe_scale_input': True},
                                   {'moe_activation': 'gelu'}], ids=['plain', 'gpt-oss', 'llama4', 'gelu'])
def test_a_decoding_steps_pairs_equal_the_loop_over_experts(tokens, flags):
    """Experts.pairs (a compiled decoding step's few tokens: nothing read on the host) computes what the loop over
    experts (training, a prefill, eager decoding) does, whichever of its two ways the token count picks."""
    layer = moe_model(**flags)
    with torch.no_grad():
        for p in (layer.experts.c_fc_bias, layer.experts.c_proj_bias):
            if p is not None:
                p.normal_(0, 0.5)
    x = torch.randn(tokens, N_EMBD, generator=torch.Generator().manual_seed(63))
    experts = torch.randn(tokens, 4, generator=torch.Generator().manual_seed(64)).topk(layer.k).indices
    weights = torch.rand(tokens, layer.k, generator=torch.Generator().manual_seed(65))
    with torch.no_grad():
        assert_close(layer.experts.pairs(x, experts, weights), layer.experts(x, experts, weights), atol=1e-6)


@pytest.mark.parametrize('flags', [{}, {'moe_bias': True, 'swiglu_limit': 0.5}], ids=['plain', 'gpt-oss'])
def test_the_loop_over_experts_has_the_gradients_of_each_pair_written_out(flags):
    """The loop over experts (each expert's tokens split off, its weights unbound, the outputs joined) against
    Experts.pairs, each (token, expert) pair computed on its own: the same gradients for the tokens, the routing
    weights and every expert's weights and biases, an expert no token picked (the last) getting zeros."""
    layer = moe_model(**flags)
    with torch.no_grad():
        for p in (layer.experts.c_fc_bias, layer.experts.c_proj_bias):
            if p is not None:
                p.normal_(0, 0.5)
    gen = torch.Generator().manual_seed(66)
    x = torch.randn(6, N_EMBD, generator=gen)
    experts = torch.randn(6, 3, generator=gen).topk(layer.k).indices  # of the first 3 of 4 experts
    weights = torch.rand(6, layer.k, generator=gen)
    grads = []
    for form in (layer.experts, layer.experts.pairs):
        inputs = [x.clone().requires_grad_(), weights.clone().requires_grad_()]
        layer.zero_grad()
        y = form(inputs[0], experts, inputs[1])
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        grads.append([t.grad for t in inputs] + [p.grad.clone() for p in layer.experts.parameters()])
    for loop, pairs in zip(*grads):
        assert_close(loop, pairs, atol=1e-6)
    assert layer.experts.c_fc.grad[3].abs().max() == 0 < layer.experts.c_fc.grad[:3].abs().max()


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('flags', [{}, {'moe_bias': True, 'swiglu_limit': 0.5}, {'moe_scale_input': True}],
                         ids=['plain', 'gpt-oss', 'llama4'])
def test_an_moe_layer_trains_under_half_precision_autocast(flags, dtype):
    """Under autocast (on a CPU, as train.py's --dtype=bfloat16 or float16 there) the experts' matmuls give half
    precision for fp32 tokens: the layer adds them up in that dtype, as a Linear's output, with finite gradients for every weight,
    close to the same layer in fp32 (the decoding step's pairs too)."""
    layer = moe_model(**flags).train()
    x = torch.randn(2, 5, N_EMBD, generator=torch.Generator().manual_seed(67))
    want = layer(x)
    with torch.autocast('cpu', dtype=dtype):
        y = layer(x)
        *_, experts, weights = layer.route(x.view(-1, N_EMBD))
        with torch.no_grad():
            pairs = layer.experts.pairs(x.view(-1, N_EMBD), experts, weights)
    assert y.dtype == dtype
    for got in (y, pairs.view_as(y)):
        torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)
    y.float().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize('widths, fits', [((32, 24), True), ((64, 344), True), ((64, 341), False),
                                           ((36, 24), False), ((8, 8), True)])
def test_grouped_matmul_only_at_widths_it_can_read(widths, fits):
    """The rule _fused_grouped_mm applies on CUDA (rows of 16 bytes: 8 bf16 values) is the one torch's grouped
    matmul enforces; its CPU version checks the same, so it is checked against torch here."""
    assert moe.grouped_mm_fits(widths) is fits
    d, h = widths
    x, w = torch.randn(6, d, dtype=torch.bfloat16), torch.randn(3, h, d, dtype=torch.bfloat16)
    offs = torch.tensor([2, 4, 6], dtype=torch.int32)
    try:
        F.grouped_mm(x, w.transpose(1, 2), offs=offs)  # reads rows of width d
        F.grouped_mm(torch.randn(6, h, dtype=torch.bfloat16), w, offs=offs)  # and of width h
        accepted = True
    except RuntimeError:
        accepted = False
    assert accepted is fits


def test_moe_model_compiles_as_one_graph(monkeypatch):
    """The experts are counted without a data-dependent size (no bincount): the grouped-matmul path, which CUDA
    takes, compiles as train.py compiles it (no fullgraph) into one graph with eager's outputs. (The loop over
    experts reads each expert's token count on the host: a graph break per layer.)"""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter
    monkeypatch.setattr(moe, '_fused_grouped_mm', lambda *_: True)
    model = build(mlp='moe', n_expert=4, moe_hidden=24, norm='rms', pos='rope', moe_aux_loss_coef=0.01)
    model.train()
    idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(67))
    eager = model(idx, idx)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)(idx, idx)
    torch._dynamo.reset()
    assert counter.frame_count == 1
    assert_close(compiled[0], eager[0], atol=1e-5)
    assert_close(compiled[1], eager[1], atol=1e-5)


def test_active_parameters_are_what_one_token_touches():
    model = build(mlp='moe', n_expert=4, n_expert_active=2, first_dense_layers=1)
    model.train()
    model(torch.tensor([[5]]), torch.tensor([[7]]))[1].backward()
    untouched = 0
    for m in moe.moe_layers(model):
        per_expert = m.experts.c_fc[0].numel() + m.experts.c_proj[0].numel()
        idle = [e for e in range(4) if m.experts.c_fc.grad[e].abs().sum() == 0]
        assert len(idle) == 2  # one token: the other 4 - 2 experts get nothing
        untouched += len(idle) * per_expert
    assert model.get_num_params(active=True) == model.get_num_params() - untouched
    assert len(moe.moe_layers(model)) == 1  # the first layer is dense


def test_balancing_losses_join_the_training_loss_only():
    model = build(mlp='moe', n_expert=4, moe_aux_loss_coef=0.01, moe_z_loss_coef=0.001)
    idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(63))
    plain = build(mlp='moe', n_expert=4)  # same seed: same weights
    model.train(), plain.train()
    moe.report_and_reset(model), moe.report_and_reset(plain)
    loss, base = model(idx, idx)[1], plain(idx, idx)[1]
    report = moe.report_and_reset(model)
    assert loss.item() == pytest.approx(base.item() + 0.01 * report['aux_loss'] + 0.001 * report['z_loss'], rel=1e-5)
    model.eval()
    assert model(idx, idx)[1].item() == pytest.approx(base.item(), rel=1e-5)  # evaluation: the plain loss


def test_aux_loss_is_one_when_even_and_grows_when_collapsed():
    layer = moe_model()
    g = torch.Generator().manual_seed(64)
    u = torch.randn(N_EMBD, generator=g)
    u /= u.norm()
    x = torch.randn(64, N_EMBD, generator=g) + 3 * u  # every token leans one way
    with torch.no_grad():
        layer.router.weight.zero_()  # every expert equally likely: ties spread by topk
        layer(x)
        even = layer.losses[0].item()
        layer.losses.zero_(), layer.load.zero_()
        layer.router.weight[0], layer.router.weight[1] = 10 * u, 8 * u  # experts 0 and 1 take every token
        layer(x)
        collapsed = layer.losses[0].item()
    assert even == pytest.approx(1.0, abs=1e-6)
    assert layer.load[2:].sum() == 0 and collapsed > 1.8


def test_sigmoid_router_bias_evens_the_load():
    """DeepSeek-V3's balancing without an auxiliary loss: a router that sends most tokens to one expert is
    evened out by the bias alone (the router's weights stay as they are)."""
    layer = moe_model(router='sigmoid', n_expert_active=1, moe_bias_update_rate=0.02)
    g = torch.Generator().manual_seed(65)
    u = torch.randn(N_EMBD, generator=g)
    x = torch.randn(256, N_EMBD, generator=g) + 2 * u / u.norm()
    with torch.no_grad():
        layer.expert_bias.zero_()
        layer.router.weight[0] += 2 * u / u.norm()  # expert 0 favoured

        def imbalance():
            layer.load.zero_()
            layer(x)
            return (layer.load.max() / layer.load.mean()).item()
        before = imbalance()
        for _ in range(100):
            layer(x)
            layer.balance(0.02)
        after = imbalance()
    assert before > 2.0 and after < 1.3, (before, after)
    assert layer.expert_bias[0] == layer.expert_bias.min() < 0


def test_update_expert_bias_moves_every_sigmoid_layer_and_restarts_the_counts():
    model = build(mlp='moe', router='sigmoid', n_expert=4, moe_bias_update_rate=0.1)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(66)))
    loads = [m.load.clone() for m in moe.moe_layers(model)]
    moe.update_expert_bias(model)
    for m, load in zip(moe.moe_layers(model), loads):
        assert torch.equal(m.expert_bias, 0.1 * torch.sign(load.mean() - load)) and m.load.sum() == 0


@pytest.mark.parametrize('flags, balances', [
    (dict(mlp='moe', router='sigmoid', moe_bias_update_rate=0.1), True),
    (dict(mlp='moe', router='sigmoid', moe_bias_update_rate=0.0), False),  # a frozen bias
    (dict(mlp='moe', router='softmax'), False),  # never reads the load
    (dict(mlp='swiglu'), False),
])
def test_only_balancing_sigmoid_routers_need_the_load_summed_across_ranks(flags, balances):
    assert moe.reads_expert_load(build(n_expert=4, **flags)) is balances


def test_moe_every_kth_layer_with_dense_layers_between():
    cfg = tiny_config(mlp='moe', n_layer=6, moe_every=3)
    assert [cfg.mlp_of(i) for i in range(6)] == ['swiglu', 'swiglu', 'moe'] * 2
    assert [tiny_config(mlp='moe', n_layer=4, moe_every=2, first_dense_layers=2).mlp_of(i) for i in range(4)] == \
        ['swiglu', 'swiglu', 'swiglu', 'moe']


@torch.no_grad()
def test_moe_scale_input_weights_each_experts_input():
    """Llama 4: each chosen expert computes expert(sigmoid score * x), not score * expert(x); plus the shared one."""
    layer = moe_model(router='sigmoid', router_norm_topk=False, n_expert_active=1, n_shared_expert=1, moe_scale_input=True,
                moe_bias_update_rate=0.0)
    layer.expert_bias.zero_()
    x = torch.randn(9, N_EMBD, generator=torch.Generator().manual_seed(62))
    scores = (x @ layer.router.weight.T).sigmoid()
    best = scores.argmax(-1)
    expected = torch.stack([expert_reference(layer, scores[n, best[n]] * x[n:n + 1], best[n].item())[0]
                            for n in range(9)]) + layer.shared(x)
    assert_close(layer(x), expected, atol=1e-5)


@pytest.mark.parametrize('overrides,field', [
    (dict(mlp='moe', n_expert=0), 'n_expert'),
    (dict(mlp='moe', n_expert=4, n_expert_active=5), 'n_expert_active'),
    (dict(mlp='moe', n_expert=6, n_expert_group=4), 'n_expert_group'),
    (dict(mlp='moe', n_expert=8, n_expert_group=4, topk_group=1, n_expert_active=3), 'n_expert_active'),
    (dict(mlp='moe', router='top2'), 'router'),
    (dict(mlp='moe', routed_scaling=0), 'routed_scaling'),
    (dict(mlp='moe', moe_aux_loss_coef=-1.0), 'moe_aux_loss_coef'),
    (dict(mlp='moe', first_dense_layers=-1), 'first_dense_layers'),
    (dict(swiglu_limit=7.0), 'swiglu_limit'),  # experts only
    (dict(mlp='moe', moe_bias='yes'), 'moe_bias'),
    (dict(mlp='moe', shared_expert_gate=True), 'n_shared_expert'),
], ids=config_id)
def test_invalid_configs_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)
