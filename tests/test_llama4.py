"""Tests for chapters/llama4.py: chunked attention ('C'), the NoPE layers' temperature, Llama 4's block and its
settings."""
import math

import pytest
import torch

import model as M
from chapters import llama4
from tiny_models import (BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, build, check_backward, check_cache_logits,
                         check_causal, check_generate_cache, counted_training_flops, losses_fall, tiny_config,
                         train_a_few_steps)

pytestmark = pytest.mark.usefixtures('single_thread')


LLAMA4_BLOCK = dict(pos='rope', norm='rms', mlp='moe', n_kv_head=2, layers='CCCN', n_layer=4, attention_chunk_size=6,
                    nope_temperature=0.5, nope_temperature_floor=3, rope_qk_norm=True, moe_every=2,
                    moe_scale_input=True, router='sigmoid', router_norm_topk=False, n_shared_expert=1, n_expert=4,
                    n_expert_active=1, moe_hidden=16, moe_bias_update_rate=0.0)


@pytest.mark.parametrize('overrides', [
    LLAMA4_BLOCK,
    # chunks and a window of other sizes in one model (two rings), a chunk not dividing block_size
    dict(pos='rope', layers='CL', attention_chunk_size=6, sliding_window=4),
    dict(pos='learned', layers='CG', attention_chunk_size=5),  # chunks need no RoPE
], ids=['llama4', 'chunk-and-window', 'learned-positions'])
def test_chunked_layers_train_and_decode_past_block_size(overrides):
    model = build(**overrides)
    assert losses_fall(train_a_few_steps(model))
    if 'mlp' not in overrides:  # (in an MoE model an expert no token chose gets no gradient)
        check_backward(model)
    check_causal(model)
    check_cache_logits(model)  # a prefill, a chunk of 4, single tokens across chunk boundaries
    check_generate_cache(model)  # past block_size, through the context shift


@torch.no_grad()
def test_a_chunked_layer_sees_only_its_own_chunk():
    """One 'C' layer with chunks of 4: changing a token changes the logits of the later tokens of its chunk
    only."""
    model = build(pos='rope', layers='C', n_layer=1, attention_chunk_size=4)
    idx = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    base = model(idx)[0]
    for t in (0, 5, 11):
        changed = idx.clone()
        changed[0, t] = (changed[0, t] + 1) % VOCAB
        moved = (model(changed)[0] - base).abs().amax(-1)[0] > 1e-6
        assert moved.tolist() == [t <= p < (t // 4 + 1) * 4 for p in range(12)], t
    assert M.window_mask(torch.arange(6), torch.arange(6), 3, chunked=True).int().tolist() == [
        [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1, 1]]


def test_a_chunked_layers_cache_is_one_chunk_and_its_flops_at_most_one_chunk(monkeypatch):
    chunked, full = build(pos='rope', layers='CG', attention_chunk_size=4), build(pos='rope', layers='GG')
    per_position = 2 * N_HEAD * (N_EMBD // N_HEAD) * 4  # k and v, fp32, one layer
    assert chunked.kv_cache_bytes(1, BLOCK) == per_position * (4 + BLOCK)
    assert full.kv_cache_bytes(1, BLOCK) == per_position * 2 * BLOCK
    idx = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(40))
    assert chunked.flops_per_token(seq_len=4) * 2 * 4 == counted_training_flops(chunked, idx, monkeypatch)
    assert chunked.flops_per_token() < full.flops_per_token()


def test_nope_temperature_is_one_then_grows_with_the_log_of_the_position():
    cfg = tiny_config(pos='rope', layers='GN', nope_temperature=0.5, nope_temperature_floor=3)
    scales = llama4.nope_temperature_scales(cfg, 0, 12, 'cpu')
    expected = [1 + 0.5 * math.log(1 + (p + 1) // 3) for p in range(12)]
    assert_close(scales, torch.tensor(expected), atol=1e-6)
    assert_close(llama4.nope_temperature_scales(cfg, torch.tensor([7]), 1, 'cpu'), torch.tensor(expected[7:8]), atol=1e-6)


@torch.no_grad()
def test_nope_temperature_scales_the_queries_of_layers_without_rope_only():
    flags = dict(pos='rope', layers='GN', n_layer=2)
    plain, tuned = build(**flags), build(**flags, nope_temperature=0.5, nope_temperature_floor=3)
    tuned.load_state_dict(plain.state_dict())
    assert (tuned.transformer.h[0].attn.positions, tuned.transformer.h[1].attn.positions) == ('rope', 'temperature')
    idx = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(6))
    moved = (tuned(idx)[0] - plain(idx)[0]).abs().amax(-1)[0] > 1e-6
    assert moved.tolist() == [p >= 2 for p in range(10)]  # scale 1 until position F - 1 = 2


@pytest.mark.parametrize('overrides, message', [
    (dict(pos='rope', layers='CG'), "layers='CG' has chunked ('C') layers: set attention_chunk_size, their chunk"),
    (dict(pos='rope', attention_chunk_size=4), "attention_chunk_size=4 applies to chunked ('C') layers"),
    (dict(pos='rope', layers='CG', attention_chunk_size=0), 'attention_chunk_size must be None or a positive int'),
    (dict(pos='rope', nope_temperature=0.1), "nope_temperature=0.1 applies to layers without RoPE ('N')"),
    (dict(pos='rope', layers='GN', nope_temperature=-1.0), 'nope_temperature must be a positive number'),
    (dict(pos='rope', layers='GN', nope_temperature_floor=0), 'nope_temperature_floor must be a positive int'),
    (dict(rope_qk_norm=True), "rope_qk_norm=True normalizes queries and keys after RoPE: that needs pos='rope'"),
    (dict(pos='rope', attn='mla', rope_qk_norm=True), "to attn='mha' only"),
    (dict(moe_every=2), "moe_every=2 apply to mlp='moe' only"),
    (dict(moe_scale_input=True), "moe_scale_input=True apply to mlp='moe' only"),
    (dict(mlp='moe', moe_every=3), 'moe_every=3 is more than n_layer=2'),
    (dict(moe_scale_input=1), 'moe_scale_input must be True or False'),
], ids=lambda v: v if isinstance(v, str) else '-'.join(f'{k}={x}' for k, x in v.items()))
def test_llama4_settings_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**overrides)
    assert message in str(e.value) and '\n' not in str(e.value), str(e.value)


def test_export_refuses_llama4_parts_no_family_carries():
    pytest.importorskip('transformers')
    from export import to_hf
    with pytest.raises(ValueError) as refused:  # chunked layers beside sliding ones: no family has both
        to_hf(build(pos='rope', norm='rms', mlp='swiglu', bias=False, layers='CL', attention_chunk_size=6,
                    sliding_window=4))
    assert "layers='CL'" in str(refused.value) and '\n' not in str(refused.value)
