"""Tests for chapters/layer_kinds.py, layers of several kinds: local ('L') windows, NoPE ('N'), layers of one part
('-', mlp_with_mixer), and a new kind added as a chapter file (docs/chapters.md's example)."""
import ast
import os
import sys
import types
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

import chapters
import model as M
from tiny_models import (BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, build, check_autocast_backward, check_cache_logits,
                         check_causal, config_id, reference_greedy, tiny_config, train_steps)

pytestmark = pytest.mark.usefixtures('single_thread')


@torch.no_grad()
def test_a_window_of_w_sees_w_keys_itself_included():
    """One layer, so nothing reaches further through the layers below: key i-W+1 changes query i, key i-W not."""
    W, T = 4, 12
    model = build(n_layer=1, sliding_window=W, pos='rope')
    idx = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(50))
    base = model(idx)[0][0, -1]
    for back, seen in ((W - 1, True), (W, False), (W + 3, False)):
        changed = idx.clone()
        changed[0, T - 1 - back] = (changed[0, T - 1 - back] + 1) % VOCAB
        moved = (model(changed)[0][0, -1] - base).abs().max().item()
        assert (moved > 1e-6) == seen, (back, moved)


@torch.no_grad()
def test_each_layer_kind_sees_what_its_letter_says():
    """One layer of each kind: a local layer sees its window, a global one everything; a NoPE layer is blind to
    order (permuting earlier tokens changes nothing), a rotating one is not."""
    T, W = 12, 4
    idx = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(54))
    far = idx.clone()
    far[0, 2] = (far[0, 2] + 1) % VOCAB  # T-1-2 = 9 positions back: outside the window
    swapped = idx.clone()
    swapped[0, [3, 5]] = idx[0, [5, 3]]
    for kind, sees_far, sees_order in (('L', False, True), ('G', True, True), ('N', True, False)):
        model = build(n_layer=1, pos='rope', layers=kind, sliding_window=W if kind == 'L' else None)
        base = model(idx)[0][0, -1]
        assert ((model(far)[0][0, -1] - base).abs().max() > 1e-6) == sees_far, kind
        if kind != 'L':
            assert ((model(swapped)[0][0, -1] - base).abs().max() > 1e-6) == sees_order, kind


def test_local_layers_rotate_with_their_own_unscaled_base():
    """Gemma 3: local layers at rope_local_theta without the scaling, global layers at rope_theta with it."""
    model = build(n_layer=2, pos='rope', layers='LG', sliding_window=4, rope_theta=1e4, rope_local_theta=10.0,
                  rope_scaling='linear', rope_factor=2.0)
    cos_local, sin_local = model.rope_local(torch.zeros(1, 6, N_EMBD), 0)[1]
    cos_global, _ = model.transformer.wpe(torch.zeros(1, 6, N_EMBD), 0)[1]
    hs = N_EMBD // N_HEAD
    positions = torch.arange(6, dtype=torch.float32)[:, None]
    local_angles = positions * 10.0 ** (-torch.arange(0, hs, 2).float() / hs)
    assert_close(cos_local, torch.cat((local_angles, local_angles), -1).cos(), atol=1e-6)
    assert_close(sin_local, torch.cat((local_angles, local_angles), -1).sin(), atol=1e-6)
    global_angles = positions / 2.0 * 1e4 ** (-torch.arange(0, hs, 2).float() / hs)  # linear: positions / factor
    assert_close(cos_global, torch.cat((global_angles, global_angles), -1).cos(), atol=1e-6)


def test_layers_of_one_part_hold_only_their_part_train_and_decode():
    """Nemotron-H's layers ('S-N-', mlp_with_mixer=False): a mixer layer has its norm and mixer and no MLP, a
    '-' layer its norm and MLP and no mixer weights; each adds its one part to the residual stream. The model
    trains and decodes through the cache as without it, past block_size."""
    flags = dict(n_layer=4, layers='S-N-', mlp_with_mixer=False, pos='rope', norm='rms', mlp='relu2', bias=False,
                 ssm_state_dim=4, ssm_chunk_size=5)
    model = build(**flags)
    parts = [{name.split('.')[0] for name, _ in block.named_parameters()} for block in model.transformer.h]
    assert parts == [{'ln_1', 'attn'}, {'ln_2', 'mlp'}, {'ln_1', 'attn'}, {'ln_2', 'mlp'}]
    x = torch.randn(2, 5, N_EMBD, generator=torch.Generator().manual_seed(77))
    mlp_layer, attention_layer = model.transformer.h[1], model.transformer.h[2]
    with torch.no_grad():
        assert_close(mlp_layer(x), x + mlp_layer.mlp(mlp_layer.ln_2(x)), atol=1e-6)
        assert_close(attention_layer(x, None, True), x + attention_layer.attn(attention_layer.ln_1(x), None, True),
                     atol=1e-6)
    losses = train_steps(model, seed=78)
    assert losses[-1] < losses[0] - 0.5
    model.eval()
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(79))
    cached = model.generate(prompt, 3 * BLOCK, temperature=0.0)
    assert torch.equal(cached, reference_greedy(model, prompt, 3 * BLOCK))
    # the '-' layers cache nothing and count no mixer FLOPs
    no_ssm = {k: v for k, v in flags.items() if not k.startswith('ssm_')}
    assert model.kv_cache_bytes(2, BLOCK) == build(**{**flags, 'layers': 'S---'}).kv_cache_bytes(2, BLOCK) \
        + build(**{**no_ssm, 'layers': '-N--'}).kv_cache_bytes(2, BLOCK)
    assert model.flops_per_token() - sum(6 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)) \
        == model.transformer.h[0].attn.token_flops(BLOCK) + model.transformer.h[2].attn.token_flops(BLOCK)


@pytest.mark.parametrize('overrides, message', [
    (dict(layers='S-', norm_position='post'), "layers of one part (layers='S-', mlp_with_mixer=True) need "
                                              "norm_position='pre', got 'post'"),
    (dict(mlp_with_mixer=False, norm_position='sandwich'), "need norm_position='pre', got 'sandwich'"),
    (dict(mlp_with_mixer='no'), "mlp_with_mixer must be True or False, got 'no'"),
    (dict(layers='SG', ssm_dt_min=-0.1), 'ssm_dt_min must be a number >= 0, got -0.1'),
    (dict(ssm_dt_min=0.001), "ssm_dt_min apply to Mamba-2 ('S') layers"),
])
def test_bad_one_part_settings_are_one_line_naming_them(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('overrides,field', [
    (dict(sliding_window=0), 'sliding_window'),
    (dict(sliding_window=2.5), 'sliding_window'),
    (dict(layers='LG'), 'sliding_window'),  # local layers without a window
    (dict(layers='GN', pos='rope', sliding_window=4), 'sliding_window'),  # a window and no local layer
    (dict(layers='GN'), 'pos'),  # NoPE layers in a model without RoPE
    (dict(pos='rope', rope_local_theta=100.0), 'rope_local_theta'),  # no local layers
    (dict(pos='rope', layers='LG', sliding_window=4, rope_local_theta=0.0), 'rope_local_theta'),
], ids=config_id)
def test_invalid_configs_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


def docs_layer_kind():
    """The code block of docs/chapters.md's section "A new layer kind" (a complete chapter file), as written there;
    the test skips while that page, section or block is not written (a block of comments alone: a placeholder)."""
    path = os.path.join(os.path.dirname(__file__), '..', 'docs', 'chapters.md')
    if not os.path.exists(path):
        pytest.skip('docs/chapters.md is not written yet (its "## A new layer kind" holds the chapter run here)')
    lines = open(path).read().split('\n')
    starts = [i for i, line in enumerate(lines) if line.strip() == '## A new layer kind']
    if not starts:
        pytest.skip('docs/chapters.md has no section "## A new layer kind" (the chapter run here)')
    section = lines[starts[0] + 1:]
    section = '\n'.join(section[:next((i for i, line in enumerate(section) if line.startswith('## ')), len(section))])
    if '```python\n' not in section:
        pytest.skip('docs/chapters.md\'s "## A new layer kind" has no ```python block (the chapter run here)')
    code = section.split('```python\n', 1)[1].split('```', 1)[0]
    if not ast.parse(code).body:
        pytest.skip('docs/chapters.md\'s "## A new layer kind" holds a placeholder, not yet the chapter run here')
    return code


def test_the_docs_layer_kind_trains_decodes_counts_and_is_refused_by_export(monkeypatch):
    """docs/chapters.md's example chapter (executed as a module, the registry a copy; its Config joins the full
    config): a model with the new kind below global attention trains, decodes through the cache as without it (past
    block_size, where the cache restarts), counts its state and FLOPs, and export refuses it in one line naming it."""
    code = docs_layer_kind()
    monkeypatch.setattr(M, 'LAYER_KINDS', dict(M.LAYER_KINDS))
    before = set(M.LAYER_KINDS)  # the kinds of every chapter
    chapter = types.ModuleType('docs_layer_kind')
    monkeypatch.setitem(sys.modules, chapter.__name__, chapter)
    exec(compile(code, 'docs/chapters.md', 'exec'), vars(chapter))
    assert set(M.LAYER_KINDS) - before == {'M'} and isinstance(M.LAYER_KINDS['M'], M.LayerKind)
    config_class = chapters.GPTConfig
    if hasattr(chapter, 'Config'):
        config_class = dataclass(type('Config', (chapter.Config, chapters.GPTConfig), {}))
    model = build(config_class=config_class, layers='MG', pos='rope', n_kv_head=2, norm='rms', mlp='swiglu')
    mean = model.transformer.h[0].attn
    assert type(mean) is chapter.RunningMean and type(model.transformer.h[1].attn) is M.ATTENTIONS['mha']

    losses = train_steps(model, seed=3)
    assert losses[-1] < losses[0] - 0.5
    assert mean.c_attn.weight.grad.abs().sum() > 0  # the mean is on the gradient's path
    model.eval()

    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    cached = model.generate(prompt, 2 * BLOCK, temperature=0.0)
    assert torch.equal(cached, model.generate(prompt, 2 * BLOCK, temperature=0.0, use_cache=False))
    assert torch.equal(cached, reference_greedy(model, prompt, 2 * BLOCK))

    attention_only = build(layers='GG', pos='rope', n_kv_head=2, norm='rms', mlp='swiglu')
    state = 2 * (N_EMBD + 1) * 4  # two sequences' sum and count, fp32
    assert model.kv_cache_bytes(2, 10) == attention_only.kv_cache_bytes(2, 10) // 2 + state
    linears = sum(6 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert model.flops_per_token() == linears + model.transformer.h[1].attn.token_flops(BLOCK) + 6 * N_EMBD

    pytest.importorskip('transformers')
    from export import to_hf
    with pytest.raises(ValueError) as refused:
        to_hf(model)
    assert "layers='MG'" in str(refused.value) and '\n' not in str(refused.value)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('letter', [k for k in M.LAYER_KINDS if k != 'G'])
def test_every_layer_kind_trains_under_half_precision_autocast(letter, dtype):
    """Each kind of every chapter (its written-out backwards included: the delta rule's, SSD's, the convolution's, the
    sinks') beside a global layer, a step under autocast: a finite loss, finite gradients."""
    kind = M.LAYER_KINDS[letter]
    flags = dict(pos='rope', layers=letter + 'G')
    flags.update(kind.needs(vars(tiny_config(pos='rope')), 5) if kind.needs else {})
    check_autocast_backward(build(**flags), dtype)
