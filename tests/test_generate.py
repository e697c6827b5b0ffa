"""Tests for generate.py, the decoding engine: greedy and sampled generation against references, the cache
(its bytes, windows, rings, recurrent states), the decoding step and compiled decoding (tiny random models)."""
import pytest
import torch

import generate as G
from chapters import mtp
from tiny_models import BLOCK, N_EMBD, N_HEAD, VOCAB, assert_steps_equal_full_forwards, build, reference_greedy

pytestmark = pytest.mark.usefixtures('single_thread')

# ----------------------------------------------------------------------------- 9: generation


@pytest.mark.parametrize('overrides', [dict(), dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2)],
                         ids=['vanilla', 'llama'])
def test_greedy_generation_matches_reference_and_batches(overrides):
    model = build(**overrides)
    torch.manual_seed(17)
    prompt = torch.randint(0, VOCAB, (3, 5))
    for new in (8, 40):
        expected = reference_greedy(model, prompt, new)
        for use_cache in (True, False):
            got = model.generate(prompt, new, temperature=0.0, use_cache=use_cache)
            assert torch.equal(got, expected), f"use_cache={use_cache}, {new} new tokens"
        # every row of the batch is what it would be alone
        got = model.generate(prompt, new, temperature=0.0)
        for b in range(3):
            assert torch.equal(model.generate(prompt[b:b + 1], new, temperature=0.0), got[b:b + 1])
    # a prompt longer than block_size
    long_prompt = torch.randint(0, VOCAB, (3, BLOCK + 4))
    expected = reference_greedy(model, long_prompt, 20)
    assert torch.equal(model.generate(long_prompt, 20, temperature=0.0, use_cache=True), expected)
    assert torch.equal(model.generate(long_prompt, 20, temperature=0.0, use_cache=False), expected)


MODERN = dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2)


def forward_lengths(model, monkeypatch):
    """The list that will hold the length of each forward model.hidden_states takes."""
    lengths, forward = [], model.hidden_states
    monkeypatch.setattr(model, 'hidden_states', lambda idx, cache=None: lengths.append(idx.size(1)) or forward(idx, cache))
    return lengths


@pytest.mark.parametrize('overrides', [MODERN, dict(MODERN, layers='LG', sliding_window=5),
                                       dict(MODERN, n_kv_head=None, attn='shared_kv', attn_sinks=True, layers='LH',
                                            sliding_window=5, hca_rate=3)],
                         ids=['modern', 'window', 'v4-compressed'])
def test_a_long_prompt_is_prefilled_in_pieces_to_the_same_tokens(monkeypatch, overrides):
    """A prompt longer than PREFILL_CHUNK goes into the cache in pieces of it (global, windowed and compressed
    layers), and greedy decoding gives the full forwards' tokens."""
    model = build(**overrides)
    prompt = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(5))
    expected = reference_greedy(model, prompt, 4)
    monkeypatch.setattr(G, 'PREFILL_CHUNK', 3)
    lengths = forward_lengths(model, monkeypatch)
    assert torch.equal(model.generate(prompt, 4, temperature=0.0), expected)
    assert lengths[:4] == [3, 3, 3, 2]


def test_positions_that_follow_the_length_prefill_the_prompt_whole(monkeypatch):
    """Dynamic RoPE computes a prompt's angles at its whole length: pieces would see shorter ones."""
    model = build(pos='rope', rope_scaling='dynamic', rope_factor=4.0, rope_original_length=8)
    monkeypatch.setattr(G, 'PREFILL_CHUNK', 3)
    lengths = forward_lengths(model, monkeypatch)
    model.generate(torch.zeros(1, 11, dtype=torch.long), 2, temperature=0.0)
    assert lengths[0] == 11


@pytest.mark.parametrize('overrides', [dict(), dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2),
                                       dict(sliding_window=4, layers='LN', pos='rope')], ids=['vanilla', 'llama', 'local'])
def test_engine_greedy_tokens_are_the_lessons_plain_loop(overrides):
    """model.py's generate_plain (nanoGPT's loop, what model.py alone samples with) and the engine, with and without
    its cache, give the same greedy tokens while the context fits block_size (past it the two drop old tokens
    differently: the engine half the window, the plain loop one token)."""
    model = build(**overrides)
    prompt = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(3))
    plain = model.generate_plain(prompt, BLOCK - 5, temperature=0.0)
    assert plain.shape == (3, BLOCK)
    for use_cache in (True, False):
        assert torch.equal(model.generate(prompt, BLOCK - 5, temperature=0.0, use_cache=use_cache), plain), use_cache


def test_generate_stream_yields_tokens_one_step_at_a_time():
    model = build()
    torch.manual_seed(18)
    prompt = torch.randint(0, VOCAB, (2, 4))
    steps = list(model.generate_stream(prompt, 6, temperature=0.0))
    assert len(steps) == 6 and all(s.shape == (2, 1) for s in steps)
    assert torch.equal(torch.cat([prompt] + steps, dim=1), model.generate(prompt, 6, temperature=0.0))
    assert list(model.generate_stream(prompt, 0)) == []
    assert torch.equal(model.generate(prompt, 0), prompt)


@pytest.mark.parametrize('overrides', [MODERN, dict(MODERN, layers='DG', n_expert=4, n_expert_active=2)],
                         ids=['llama', 'deltanet-moe'])
def test_tokens_and_weights_after_eager_decoding_can_train(monkeypatch, overrides):
    """Eager decoding steps run under inference_mode, whose tensors autograd cannot save: the tokens that come out
    and the model's own tensors after it are normal ones, so a training step on the samples (distillation, RL)
    backpropagates; and the steps did run in it (else this checks nothing)."""
    modes = []
    step = G.decode_step
    monkeypatch.setattr(G, 'decode_step', lambda *a: modes.append(torch.is_inference_mode_enabled()) or step(*a))
    model = build(**overrides)
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(19))
    out = model.generate(prompt, 6, temperature=1.0)
    streamed = list(model.generate_stream(prompt, 3, temperature=0.0))
    assert modes and all(modes)
    assert not out.is_inference() and not any(t.is_inference() for t in streamed)
    assert not any(t.is_inference() for t in [*model.parameters(), *model.buffers()])
    model.train()
    model(out[:, :-1], out[:, 1:])[1].backward()
    assert all(p.grad is not None for p in model.transformer.h.parameters() if p.requires_grad)


@pytest.mark.parametrize('overrides', [dict(), dict(norm='rms', mlp='geglu', pos='rope', n_kv_head=1)],
                         ids=['vanilla', 'rope-mqa'])
def test_top_k_1_and_tiny_top_p_are_greedy(overrides):
    model = build(**overrides)
    torch.manual_seed(19)
    prompt = torch.randint(0, VOCAB, (3, 5))
    greedy = model.generate(prompt, 30, temperature=0.0, use_cache=False)
    for use_cache in (True, False):
        torch.manual_seed(20)
        assert torch.equal(model.generate(prompt, 30, temperature=1.0, top_k=1, use_cache=use_cache), greedy)
        torch.manual_seed(21)
        assert torch.equal(model.generate(prompt, 30, temperature=1.0, top_p=1e-6, use_cache=use_cache), greedy)


@pytest.mark.parametrize('overrides', [dict(), dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2)],
                         ids=['vanilla', 'llama'])
def test_sampling_same_seed_same_tokens_with_and_without_cache(overrides):
    model = build(**overrides)
    torch.manual_seed(22)
    prompt = torch.randint(0, VOCAB, (3, 5))
    runs = {}
    for use_cache in (True, False):
        torch.manual_seed(123)
        runs[use_cache] = model.generate(prompt, 40, temperature=1.0, use_cache=use_cache)
    assert torch.equal(runs[True], runs[False])
    assert runs[True].min() >= 0 and runs[True].max() < VOCAB
    torch.manual_seed(124)
    other = model.generate(prompt, 40, temperature=1.0)
    assert not torch.equal(other, runs[True]), "sampling ignores the seed"
    greedy = model.generate(prompt, 40, temperature=0.0)
    assert not torch.equal(runs[True], greedy), "temperature 1.0 behaves greedily"


def test_sample_next_filters():
    torch.manual_seed(23)
    logits = torch.randn(4, VOCAB) * 3
    assert torch.equal(G.sample_next(logits, temperature=0.0), logits.argmax(dim=-1, keepdim=True))
    top5 = logits.topk(5, dim=-1).indices
    probs = logits.softmax(dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # the smallest prefix of the sorted tokens whose mass reaches 0.5
    n_nucleus = (sorted_probs.cumsum(dim=-1) < 0.5).sum(dim=-1) + 1
    seen_k = torch.zeros(4, VOCAB, dtype=torch.bool)
    for _ in range(300):
        tok = G.sample_next(logits, temperature=1.0, top_k=5)
        assert tok.shape == (4, 1)
        assert (top5 == tok).any(dim=-1).all(), "top_k sampled outside the top k"
        seen_k.scatter_(1, tok, True)
        tok = G.sample_next(logits, temperature=0.7, top_p=0.5)
        for b in range(4):
            assert tok[b, 0] in order[b, :n_nucleus[b]], "top_p sampled outside the nucleus"
    assert seen_k.sum(dim=-1).min() >= 2  # it samples, it does not just take the argmax


# ----------------------------------------------------------------------------- 10: KV-cache size

def cache_nbytes(cache):
    return sum(t.nbytes for layer in cache.layers for t in layer.stores.values())


class RecordingCache(G.KVCache):
    made = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        RecordingCache.made.append(self)


@pytest.mark.parametrize('n_kv', [None, 1])
def test_kv_cache_bytes_matches_the_cache_generate_builds(n_kv, monkeypatch):
    model = build(n_kv_head=n_kv, pos='rope')
    monkeypatch.setattr(G, 'KVCache', RecordingCache)
    RecordingCache.made = []
    torch.manual_seed(24)
    prompt = torch.randint(0, VOCAB, (3, 5))
    for new in (7, 40):
        RecordingCache.made.clear()
        model.generate(prompt, new, temperature=0.0, use_cache=True)
        assert len(RecordingCache.made) == 1
        cache = RecordingCache.made[0]
        total = 5 + new
        assert cache.length == min(total, BLOCK)
        assert model.kv_cache_bytes(3, total) == cache_nbytes(cache)
        kv = n_kv or N_HEAD
        assert cache_nbytes(cache) == 2 * 2 * 3 * kv * min(total, BLOCK) * (N_EMBD // N_HEAD) * 4
    direct = G.KVCache(model, 2, 9, torch.float32, torch.device('cpu'))
    assert model.kv_cache_bytes(2, 9) == cache_nbytes(direct)


def test_kv_cache_bytes_gqa_and_dtype_ratios():
    cfg = dict(n_head=8, n_embd=64)
    mha = build(**cfg)
    gqa = build(n_kv_head=2, **cfg)
    for seq_len in (10, BLOCK, 100):
        assert gqa.kv_cache_bytes(4, seq_len) * 4 == mha.kv_cache_bytes(4, seq_len)
        assert mha.kv_cache_bytes(4, seq_len, torch.bfloat16) * 2 == mha.kv_cache_bytes(4, seq_len, torch.float32)
    assert mha.kv_cache_bytes(4, 100) == mha.kv_cache_bytes(4, BLOCK)  # capped at block_size
    bf16 = G.KVCache(mha, 4, 10, torch.bfloat16, torch.device('cpu'))
    assert mha.kv_cache_bytes(4, 10, torch.bfloat16) == cache_nbytes(bf16)


def test_forward_rejects_overfilling_a_cache():
    model = build(pos='rope')
    cache = G.KVCache(model, 1, 6, torch.float32, torch.device('cpu'))
    with torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match='cache'):
            model(torch.zeros(1, 2, dtype=torch.long), cache=cache)


@pytest.mark.parametrize('window, layers', [(None, None), (5, None), (5, 'LG')])
def test_compiled_decoding_makes_one_graph_per_kind_of_call_not_per_ring_slot(window, layers):
    """Each block compiled with dynamic shapes (as sample.py did before compile_decoding; dynamo's own 'eager'
    backend, which keeps the guards and skips code generation): the same tokens as eager, past a context shift,
    and a few graphs (prefill, decoding steps, a windowed prefill), never one per position or ring slot; with
    local and global layers (four, with sinks) a few per kind of layer, not per layer."""
    import torch._dynamo
    model = build(n_layer=1, pos='rope', sliding_window=window) if layers is None else \
        build(n_layer=4, pos='rope', sliding_window=window, layers=layers, attn_sinks=True)
    idx = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(53))
    eager = model.generate(idx, 3 * BLOCK, temperature=0)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        for block in model.transformer.h:
            block.compile(dynamic=True, backend='eager')
        assert torch.equal(model.generate(idx, 3 * BLOCK, temperature=0), eager)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] <= (4 if layers is None else 8)
        assert not torch._dynamo.utils.counters['graph_break']
    finally:
        torch._dynamo.reset()


# every kind of cache a decoding step writes: K/V heads shared, MLA's latents, a window's ring next to a global
# layer (with their own RoPE base and sinks), a Gated DeltaNet's states, learned positions
STEP_KINDS = {'gqa': dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2), 'mqa': dict(pos='rope', n_kv_head=1),
              'mla': dict(pos='rope', attn='mla', q_lora_rank=8),
              'local+global': dict(pos='rope', layers='LG', sliding_window=5, attn_sinks=True, rope_local_theta=100.0),
              'deltanet+global': dict(pos='rope', layers='DG', linear_key_dim=4, linear_value_dim=4),
              'learned': dict()}


@torch.no_grad()
@pytest.mark.parametrize('kind', STEP_KINDS)
def test_a_decoding_step_gives_the_logits_of_a_full_forward(kind):
    """decode_step (generate's step after the prefill) writes each token in place into the preallocated cache
    and attends over all its slots, the unwritten ones masked: at every position, past the ring's wrap, its
    logits are those of a full forward over the sequence."""
    model = build(**STEP_KINDS[kind])
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(60))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert_steps_equal_full_forwards(model, seq, cache, 3)  # the prefill


@pytest.mark.parametrize('kind', ['local+global+deltanet', 'mla, kept cache'])
def test_compiled_decoding_is_one_graph_for_every_step_and_length(kind):
    """compile_decoding (here with AOT autograd, which functionalizes the in-place cache writes, and no code
    generation: the sampling test compiles with inductor): the tokens of eager decoding at three lengths, past a
    context shift, from one graph, never recompiled for a step, a position or a cache length; also with the
    one cache of block_size positions that CUDA graphs keep and reuse."""
    model = build(n_layer=3, pos='rope', layers='LGD', sliding_window=5, n_kv_head=2, attn_sinks=True,
                  linear_key_dim=4, linear_value_dim=4) if kind != 'mla' else build(pos='rope', attn='mla')
    assert_compiled_decoding_is_one_graph(model, keep_cache=kind == 'mla, kept cache')


def assert_compiled_decoding_is_one_graph(model, keep_cache=None):
    """compile_decoding with AOT autograd gives eager's tokens at three lengths, past a context shift, from one
    graph without a break."""
    import torch._dynamo
    idx = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(61))
    eager = {n: model.generate(idx, n, temperature=0) for n in (6, 9, 3 * BLOCK)}  # caches of 9, 12 and 16
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.compile_decoding(backend='aot_eager', keep_cache=keep_cache)
        for n, expected in eager.items():
            assert torch.equal(model.generate(idx, n, temperature=0), expected)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
        assert not torch._dynamo.utils.counters['graph_break']
    finally:
        torch._dynamo.reset()


@torch.no_grad()
def test_compiled_decoding_of_a_moe_model_is_one_graph_per_batch_size():
    """Issue 68: the experts' loop read their token counts on the host (a graph break) and skipped the empty ones
    (`if n:`), so each new routing recompiled until dynamo's limit. A decoding step's few tokens now take every
    (token, expert) pair with nothing read on the host: eager's tokens, past a context shift, from one graph per
    batch size without a break, at a batch whose pairs are gathered (2 x 2 <= 4 experts) and one where every expert
    runs (3 x 2)."""
    import torch._dynamo
    model = build(mlp='moe', n_expert=4, n_expert_active=2, moe_hidden=16, pos='rope', n_kv_head=2)
    prompts = [torch.randint(0, VOCAB, (b, 3), generator=torch.Generator().manual_seed(62)) for b in (2, 3)]
    eager = [model.generate(idx, 2 * BLOCK, temperature=0) for idx in prompts]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.compile_decoding(backend='aot_eager')
        for idx, expected in zip(prompts, eager):
            assert torch.equal(model.generate(idx, 2 * BLOCK, temperature=0), expected)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 2
        assert not torch._dynamo.utils.counters['graph_break']
    finally:
        torch._dynamo.reset()


@torch.no_grad()
def test_compiled_decoding_specializes_each_batch_size():
    """Each batch size gets a graph of its own (a static batch: dynamo would otherwise generalize the batch at
    the second size, a slower graph for every size after it): three sizes, three graphs, and a size seen before
    compiles nothing."""
    import torch._dynamo
    model = build(pos='rope', n_kv_head=2)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.compile_decoding(backend='aot_eager')
        for batch in (1, 3, 2, 3):
            idx = torch.randint(0, VOCAB, (batch, 2), generator=torch.Generator().manual_seed(batch))
            model.generate(idx, 4, temperature=0)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 3
    finally:
        torch._dynamo.reset()


def test_compiling_again_compiles_anew():
    """Issue 34: on a CPU inductor freezes the weights into the step, and a second compile_decoding() after the
    weights changed found dynamo's graph of the first (kept with decode_step's code), so after the eager
    prefill's token the output followed the old weights. Each call now compiles a step of its own: a new graph
    (dynamo's 'eager' backend here, which keeps the guards and the cache but generates no code; with inductor's
    frozen weights: the test after this one)."""
    import torch._dynamo
    model = build(pos='rope', n_kv_head=2)
    idx = torch.randint(0, VOCAB, (1, 3), generator=torch.Generator().manual_seed(7))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.compile_decoding(backend='eager')
        for _ in range(2):  # the same step: one graph
            model.generate(idx, 4, temperature=0)
            assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
        model.compile_decoding(backend='eager').generate(idx, 4, temperature=0)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 2
    finally:
        torch._dynamo.reset()


def test_compiling_again_after_the_weights_change_decodes_with_the_new_weights():
    """The issue's case itself: inductor on a CPU (the weights frozen into the step), weights loaded in place,
    compile_decoding() again: eager decoding's tokens with the new weights."""
    import torch._dynamo
    model = build(n_layer=1, n_embd=16, n_head=2)
    idx = torch.randint(0, VOCAB, (1, 3), generator=torch.Generator().manual_seed(7))
    torch._dynamo.reset()
    try:
        before = model.compile_decoding().generate(idx, 6, temperature=0)
        with torch.no_grad():
            for p in model.parameters():  # in place: the same tensors, new values
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        expected = model.generate(idx, 6, temperature=0, use_cache=False)
        assert not torch.equal(expected, before)
        assert torch.equal(model.compile_decoding().generate(idx, 6, temperature=0), expected)
    finally:
        torch._dynamo.reset()


@torch.no_grad()
def test_dynamic_rope_is_exact_with_a_cache_within_its_original_length_only():
    """'dynamic' gives every position new angles as the sequence grows past rope_original_length: a full
    forward recomputes all of them, a KV cache keeps the earlier keys' (as transformers does)."""
    model = build(pos='rope', rope_scaling='dynamic', rope_factor=4.0, rope_original_length=8)
    seq = torch.randint(0, VOCAB, (1, BLOCK), generator=torch.Generator().manual_seed(51))
    cache = G.KVCache(model, 1, BLOCK, torch.float32, torch.device('cpu'))
    model(seq[:, :4], cache=cache)
    for i in range(4, BLOCK):
        step = model(seq[:, i:i + 1], cache=cache)[0][0, -1]
        full = model(seq[:, :i + 1])[0][0, -1]
        assert ((step - full).abs().max() < 1e-5) == (i < 8), i


# ----------------------------------------------------------------------------- windows and recurrent states in the cache

def test_a_window_caps_the_cache_and_the_attention_flops():
    wide, windowed = build(pos='rope'), build(pos='rope', sliding_window=5)
    for seq_len in (3, 5, BLOCK):
        assert windowed.kv_cache_bytes(2, seq_len) == wide.kv_cache_bytes(2, min(seq_len, 5))
        assert windowed.flops_per_token(seq_len) == wide.flops_per_token(min(seq_len, 5))
    cache = G.KVCache(windowed, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert cache_nbytes(cache) == windowed.kv_cache_bytes(2, BLOCK) and [layer.slots for layer in cache.layers] == [5, 5]


def test_local_layers_keep_a_ring_and_global_layers_every_position():
    """layers='LG': the local layer's cache and attention FLOPs stop at the window, the global layer's grow."""
    wide, mixed = build(pos='rope'), build(pos='rope', layers='LG', sliding_window=5)
    for seq_len in (3, 5, BLOCK):
        half = wide.kv_cache_bytes(2, seq_len) // 2  # one layer's
        assert mixed.kv_cache_bytes(2, seq_len) == wide.kv_cache_bytes(2, min(seq_len, 5)) // 2 + half
        assert mixed.flops_per_token(seq_len) == (wide.flops_per_token(min(seq_len, 5))
                                                  + wide.flops_per_token(seq_len)) // 2
    cache = G.KVCache(mixed, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert cache_nbytes(cache) == mixed.kv_cache_bytes(2, BLOCK)
    assert [layer.slots for layer in cache.layers] == [5, BLOCK]


def test_deltanet_layers_keep_a_cache_that_does_not_grow():
    """'DG': the DeltaNet layer's cache (conv inputs and state) is the same at any length, the global layer's
    grows; the bytes counted are the bytes a cache allocates."""
    mixed, wide = build(pos='rope', layers='DG'), build(pos='rope')
    kernel, width = mixed.config.linear_conv_kernel, 3 * N_EMBD  # q, k and v at n_embd each by default
    fixed = 2 * 4 * ((kernel - 1) * width + N_HEAD * (N_EMBD // N_HEAD) ** 2)  # batch 2, fp32
    for seq_len in (3, 9, BLOCK):
        assert mixed.kv_cache_bytes(2, seq_len) == wide.kv_cache_bytes(2, seq_len) // 2 + fixed
        cache = G.KVCache(mixed, 2, seq_len, torch.float32, torch.device('cpu'))
        assert cache_nbytes(cache) == mixed.kv_cache_bytes(2, seq_len)
    # the recurrent state stays fp32 under a bf16 cache; the conv inputs take the cache's dtype
    assert mixed.kv_cache_bytes(2, BLOCK, torch.bfloat16) == wide.kv_cache_bytes(2, BLOCK, torch.bfloat16) // 2 \
        + 2 * (2 * (kernel - 1) * width + 4 * N_HEAD * (N_EMBD // N_HEAD) ** 2)


# ----------------------------------------------------------------------------- Llama 4's layers

# chunks of 6 (the cache's ring restarts with each chunk) beside a window's ring of 4, and a layer without RoPE whose
# queries' temperature grows every 3 positions
LLAMA4_LAYERS = dict(n_layer=3, pos='rope', layers='CLN', attention_chunk_size=6, sliding_window=4,
                     nope_temperature=0.5, nope_temperature_floor=3, rope_qk_norm=True, n_kv_head=2)


@torch.no_grad()
def test_a_decoding_step_of_chunked_and_tempered_layers_gives_the_logits_of_a_full_forward():
    model = build(**LLAMA4_LAYERS)
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(63))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert_steps_equal_full_forwards(model, seq, cache, 3)
# ----------------------------------------------------------------------------- gated short convolution ('V')


@torch.no_grad()
def test_a_decoding_step_through_short_conv_layers_gives_a_full_forwards_logits():
    """decode_step over 'VG' with a kernel of 4: the conv inputs it keeps roll one token per step."""
    model = build(pos='rope', layers='VG', short_conv_kernel=4)
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(80))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    # a prefill shorter than the kernel: the zeros before it stay in the window
    assert_steps_equal_full_forwards(model, seq, cache, 2)


def test_short_conv_layers_keep_a_cache_that_does_not_grow():
    """'VG': the 'V' layer keeps its last kernel-1 gated inputs (n_embd channels each, in the cache's dtype) at
    any length, the global layer's keys and values grow; the bytes counted are the bytes a cache allocates."""
    mixed, wide = build(pos='rope', layers='VG', short_conv_kernel=5), build(pos='rope')
    for seq_len, dtype in ((3, torch.float32), (BLOCK, torch.float32), (BLOCK, torch.bfloat16)):
        size = torch.empty((), dtype=dtype).element_size()
        assert mixed.kv_cache_bytes(2, seq_len, dtype) == wide.kv_cache_bytes(2, seq_len, dtype) // 2 \
            + 2 * 4 * N_EMBD * size
        cache = G.KVCache(mixed, 2, seq_len, dtype, torch.device('cpu'))
        assert cache_nbytes(cache) == mixed.kv_cache_bytes(2, seq_len, dtype)


@torch.no_grad()
def test_a_decoding_step_through_mamba2_layers_gives_a_full_forwards_logits():
    """decode_step over 'SG' (2 groups of B/C): the recurrent form continues the chunked prefill's state."""
    model = build(pos='rope', layers='SG', ssm_state_dim=4, ssm_n_groups=2, ssm_chunk_size=3)
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(82))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert_steps_equal_full_forwards(model, seq, cache, 5)  # a prefill of two chunks, the second partial


@torch.no_grad()
@pytest.mark.parametrize('layers', ['SN', 'DN'])
def test_a_decoding_step_masks_attention_after_a_recurrent_layer_of_the_same_positions(layers):
    """A recurrent layer ('S', 'D') and attention without RoPE ('N') both take no rotary tables: the step still
    masks the attention's unwritten slots (the recurrent layer, first, has none to mask)."""
    model = build(pos='rope', layers=layers, ssm_state_dim=4) if layers == 'SN' else build(pos='rope', layers=layers)
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(83))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert_steps_equal_full_forwards(model, seq, cache, 3)


@torch.no_grad()
def test_a_decoding_step_of_kimi_delta_attention_and_mla_without_positions():
    """Kimi Linear's shape ('K' layers, MLA with pos='none'): decode_step, writing each token into the cache in
    place, gives at every position the logits of a full forward."""
    model = build(pos='none', layers='KG', attn='mla', linear_key_dim=4, linear_value_dim=4, linear_chunk_size=3)
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(62))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert_steps_equal_full_forwards(model, seq, cache, 3)


def test_compiled_decoding_of_chunked_and_tempered_layers_is_one_graph():
    import torch._dynamo
    model = build(**LLAMA4_LAYERS)
    idx = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(64))
    eager = {n: model.generate(idx, n, temperature=0) for n in (9, 3 * BLOCK)}
    assert torch.equal(eager[3 * BLOCK], reference_greedy(model, idx, 3 * BLOCK))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.compile_decoding(backend='aot_eager')
        for n, expected in eager.items():
            assert torch.equal(model.generate(idx, n, temperature=0), expected)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
        assert not torch._dynamo.utils.counters['graph_break']
    finally:
        torch._dynamo.reset()
# ----------------------------------------------------------------------------- self-speculative decoding (MTP)


def mtp_model(seed=0, steps=0, **flags):
    """A tiny MTP model, trained `steps` AdamW steps on a cycle of 7 tokens (so its drafts come true)."""
    torch.manual_seed(seed)
    model = build(seed, **{'pos': 'rope', 'mtp_depth': 2, **flags})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cycle = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:7]
    data = torch.stack([cycle.roll(-s).repeat(4)[:BLOCK + 1] for s in range(7)])
    for _ in range(steps):
        model(data[:, :-1], data[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model.eval(), cycle


@pytest.mark.parametrize('flags', [dict(), dict(n_kv_head=2), dict(attn='mla', q_lora_rank=8)], ids=['mha', 'gqa', 'mla'])
def test_speculative_greedy_is_plain_greedy_token_for_token(flags):
    """Untrained (drafts rejected) and trained on a cycle (drafts taken): plain greedy's tokens, past block_size
    (the context shifts), a batch, a one-token prompt (nothing to draft from yet) and a vocab_limit."""
    for steps in (0, 60):
        model, cycle = mtp_model(steps=steps, **flags)
        for prompt in (cycle[None, :5].repeat(2, 1), torch.randint(0, VOCAB, (2, 1), generator=torch.Generator())):
            out, stats = mtp.generate_speculative(model, prompt, 3 * BLOCK)
            assert torch.equal(out, model.generate(prompt, 3 * BLOCK, temperature=0))
            # each row: a round for its first token and one for each more, a token per accepted draft
            assert stats['row_rounds'] + stats['accepted'] == 2 * 3 * BLOCK and stats['accepted'] <= stats['drafted']
            assert stats['rounds'] <= stats['row_rounds']
        limited, _ = mtp.generate_speculative(model, prompt, 20, vocab_limit=VOCAB // 2)
        assert torch.equal(limited, model.generate(prompt, 20, temperature=0, vocab_limit=VOCAB // 2))
        if steps:  # a trained model's drafts come true: fewer rounds than tokens
            assert stats['accepted'] > stats['drafted'] / 2


def test_speculative_decoding_keeps_a_partly_right_draft(monkeypatch):
    """Drafts whose first token is right and second wrong: the first is kept, the cache takes the second back."""
    model, cycle = mtp_model()
    prompt = cycle[None, :5]
    expected = model.generate(prompt, 30, temperature=0)

    def half_right(model_, hidden, window, cached, n):
        right = right_drafts(model, window, cached, n)
        return torch.cat((right[:, :1], (right[:, 1:] + 1) % VOCAB), dim=1)
    monkeypatch.setattr(mtp, 'draft', half_right)
    out, stats = mtp.generate_speculative(model, prompt, 30)
    assert torch.equal(out, expected)
    assert 0 < stats['accepted'] < stats['drafted']  # each round with drafts keeps one; the second goes back
    assert stats['rounds'] + stats['accepted'] == 30


def right_drafts(model, window, cached, n):
    """The n tokens plain greedy decoding gives after each row's window (right-padded: its cached tokens and the
    pending one): the drafts a perfect drafter would make (b, n)."""
    return torch.cat([model.generate(window[r:r + 1, :int(cached[r]) + 1], n, temperature=0)[:, -n:]
                      for r in range(window.size(0))])


@pytest.mark.parametrize('flags', [dict(), dict(pos='learned'), dict(nope_temperature=0.1, layers='GN')],
                         ids=['rope', 'learned', 'per-position'])
def test_speculative_rows_go_at_their_own_pace(monkeypatch, flags):
    """A batch whose first row's drafts are always right and second's always wrong (issue 49.4): the first keeps
    every draft (3 tokens a round), the second one token a round, each at a position of its own in the cache and
    with a context shift of its own past block_size; the batch takes the second's rounds, not one token a round for
    both as when a batch kept only the drafts all its rows accepted; the tokens are plain greedy's. A model that
    makes tables of its own from the position (Llama 4's NoPE temperature) takes its rows one forward per
    position, to the same tokens."""
    model, cycle = mtp_model(steps=0, **flags)
    prompt = torch.stack((cycle[:5], cycle.flip(0)[:5]))
    N = 3 * BLOCK

    def first_right(model_, hidden, window, cached, n):
        right = right_drafts(model, window, cached, n)
        wrong = (right + 1) % VOCAB
        # the rows still decoding: both, then the second alone (the first, 3 tokens a round, ends first)
        return torch.cat((right[:1], wrong[1:])) if window.size(0) == 2 else wrong
    monkeypatch.setattr(mtp, 'draft', first_right)
    out, stats = mtp.generate_speculative(model, prompt, N)
    assert torch.equal(out, model.generate(prompt, N, temperature=0))
    first = N // 3 + (N % 3 > 0)  # its rounds: 3 tokens each but where a window or the end leaves room for fewer
    assert stats['rounds'] == N and stats['row_rounds'] >= N + first
    assert stats['accepted'] == N + N - stats['row_rounds']


@pytest.mark.parametrize('flags, fragment', [
    (dict(), 'this model has none (train with mtp_depth >= 1)'),
    (dict(mtp_depth=1, layers='LG', sliding_window=4), 'layer 0 cannot (a sliding window'),
    (dict(mtp_depth=1, layers='DG'), 'layer 0 cannot'),
])
def test_speculative_decoding_refuses_what_it_cannot_take_back(flags, fragment):
    model = build(pos='rope', **flags)
    with pytest.raises(ValueError) as e:
        mtp.generate_speculative(model, torch.zeros(1, 3, dtype=torch.long), 4)
    assert fragment in str(e.value) and '\n' not in str(e.value)


def test_speculative_decoding_refuses_a_mixer_keeping_entries_per_block(monkeypatch):
    """A mixer that keeps a compressed entry per block of positions (TokenMixer.cache_blocks) cannot have a rejected
    draft taken back out of it: refused in one line, as a window's ring is."""
    model = build(pos='rope', mtp_depth=1)
    monkeypatch.setattr(type(model.transformer.h[1].attn), 'cache_blocks', lambda self: {'c': (4, (2, 8), None)})
    assert 'layer 0 cannot' in mtp.speculation_problem(model) and 'per block' in mtp.speculation_problem(model)


# ----------------------------------------------------------------------------- Gemma 4's K/V sharing

@torch.no_grad()
def test_a_decoding_step_through_kv_sharing_layers_gives_a_full_forwards_logits():
    """'LG' with the last two layers sharing: each reads its source's ring or full store, and its mask, in the step."""
    from test_gemma4 import KV_SHARING
    model = build(**KV_SHARING)
    seq = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(93))
    cache = G.KVCache(model, 2, BLOCK, torch.float32, torch.device('cpu'))
    assert [layer.slots for layer in cache.layers] == [5, BLOCK, 0, 0]
    assert_steps_equal_full_forwards(model, seq, cache, 3)


def test_compiled_decoding_of_kv_sharing_layers_is_one_graph():
    import torch._dynamo
    from test_gemma4 import KV_SHARING
    model = build(**KV_SHARING)
    idx = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(94))
    eager = model.generate(idx, 3 * BLOCK, temperature=0)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.compile_decoding(backend='aot_eager')
        assert torch.equal(model.generate(idx, 3 * BLOCK, temperature=0), eager)
        assert torch._dynamo.utils.counters['stats']['unique_graphs'] == 1
        assert not torch._dynamo.utils.counters['graph_break']
    finally:
        torch._dynamo.reset()
