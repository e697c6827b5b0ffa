"""
The decoding engine: what generate needs beyond model.py's forward. The cache (KVCache) keeps what each
layer's token mixer declares (cache_entries per past token, a ring for a sliding window; cache_states, a
recurrent state whatever the length); a prefill runs GPT's forward with it (a long prompt in pieces), and
each later token one decoding step (decode_step), which compile_decoding compiles; sample_next picks the tokens.

GPT.generate, generate_stream, compile_decoding and kv_cache_bytes are these functions, called as methods.
"""

import contextlib
import math
import types
from functools import partial

import torch

from model import causal_mask, window_mask

PREFILL_CHUNK = 4096  # a longer prompt is prefilled in pieces of this many tokens (prefill)


class KVCache:
    """What each layer's token mixer keeps of past tokens, preallocated for `length` positions: its
    cache_entries as (B, heads, slots, dim) tensors, and its cache_states. A local layer whose window is shorter
    than that keeps only the last `window` positions, in a ring: slot = position % window; a global layer keeps
    every position; a recurrent state (Gated DeltaNet's) stands for all of them."""

    def __init__(self, model, batch_size, length, dtype, device):
        self.length = length
        self.layers = [LayerCache(self, {name: torch.zeros(batch_size, *shape, dtype=dt, device=device)
                                         for name, (shape, dt) in self.layer_stores(block.attn, length, dtype)},
                                  self.layer_slots(block.attn, length))
                       for block in model.transformer.h]
        self.stores = [layer.stores for layer in self.layers]  # what decode_step reads and writes
        # what the model's features keep whatever the length (a last token, its embedding): Feature.cache_states
        self.features = {name: torch.zeros(batch_size, *shape, dtype=dt or dtype, device=device)
                         for name, (shape, dt) in feature_states(model)}
        self.pos = 0  # positions seen
        # the next single token's position as a tensor: a compiled step would specialise on an int (one graph per
        # position)
        self.position = torch.zeros(1, dtype=torch.long, device=device)

    @staticmethod
    def slots_for(window, length):
        return min(length, window or length)

    @staticmethod
    def layer_slots(mixer, length):
        """Positions a layer keeps: its window, or all; none for a mixer that keeps no entries per token."""
        return KVCache.slots_for(mixer.window, length) if mixer.cache_entries() else 0

    @staticmethod
    def layer_stores(mixer, length, dtype):
        """A layer's stores as [(name, (shape without the batch, dtype))]: its mixer's entries per position kept,
        then its states."""
        slots = KVCache.layer_slots(mixer, length)
        return [(name, ((heads, slots, dim), dtype)) for name, (heads, dim) in mixer.cache_entries().items()] + \
            [(name, (shape, own or dtype)) for name, (shape, own) in mixer.cache_states().items()] + \
            [(name, ((-(-length // every), *shape), own or dtype))
             for name, (every, shape, own) in mixer.cache_blocks().items()]

    @staticmethod
    def bytes_for(model, batch_size, length, dtype):
        """Bytes a cache of these dimensions takes, without allocating it."""
        states = [store for block in model.transformer.h for store in KVCache.layer_stores(block.attn, length, dtype)]
        states += [(name, (shape, own or dtype)) for name, (shape, own) in feature_states(model)]
        return batch_size * sum(math.prod(shape) * torch.empty((), dtype=dtype_).element_size()
                                for _, (shape, dtype_) in states)

    def key_positions(self, T, slots, device):
        """Positions of the keys update() returns for T new tokens in a layer keeping `slots`, in its order."""
        if slots == self.length:
            return torch.arange(self.pos + T, device=device)
        if T == 1:  # the ring itself: slot s holds the latest position p with p % slots == s
            filled = torch.arange(min(self.pos + 1, slots), device=device)
            return self.pos - (self.pos - filled) % slots
        past = min(self.pos, slots - 1)  # what the first new query can still see
        return torch.arange(self.pos - past, self.pos + T, device=device)

    @property
    def start(self):
        """The position of the next token: what GPT.hidden_states continues from."""
        return self.pos

    def mask(self, layer, mixer, T, device):
        """Where T new queries may attend the keys a layer with this mixer's window (or chunk) gets from the cache
        (update); None when plain causal attention (SDPA's is_causal, or a single query: the cache returns only
        keys it sees, except the earlier chunks' still in a chunked layer's ring)."""
        window, chunked = mixer.window, mixer.chunked
        if T == 1 and not chunked:
            return None
        keys = self.key_positions(T, self.slots_for(window, self.length), device)
        if self.pos == 0 and keys.numel() == T:  # the keys are the queries
            return causal_mask(T, window, device, chunked)
        return window_mask(torch.arange(self.pos, self.pos + T, device=device), keys, window, chunked)

    def __getitem__(self, layer):
        """One layer's part, what its mixer writes to and reads from."""
        return self.layers[layer]

    def update(self, layer, **new):
        """Store the new tokens' entries (B, heads, T, dim) in a layer's stores; return, in the order given,
        every entry the new tokens attend to (all so far, or in a ring the ones key_positions names)."""
        T = next(iter(new.values())).size(2)
        if self.pos + T > self.length:
            raise ValueError(f"KV cache of length {self.length} cannot hold {self.pos + T} positions")
        slots, out = layer.slots, []
        for name, value in new.items():
            store = layer.stores[name]
            if slots == self.length:
                store[:, :, self.pos:self.pos + T] = value
                out.append(store[:, :, :self.pos + T])
            elif T == 1:
                store.index_copy_(2, self.position % slots, value)  # a ring of this layer's size
                out.append(store[:, :, :min(self.pos + 1, slots)])
            else:  # the past the window still needs, in order, then the new tokens
                past = torch.arange(self.pos - min(self.pos, slots - 1), self.pos, device=value.device)
                out.append(torch.cat((store[:, :, past % slots], value), dim=2))
                kept = torch.arange(self.pos, self.pos + T, device=value.device)[-slots:]
                store[:, :, kept % slots] = value[:, :, -slots:]
        return out

    def advance(self, T):
        self.pos += T
        self.position.fill_(self.pos)

    def reset(self):
        """Forget every position (the next call is a prefill): the stores back to zeros, in place, so a state
        starts from zeros again and a replayed graph keeps its addresses."""
        self.pos = 0
        self.position.zero_()
        for stores in self.stores + [self.features]:
            for store in stores.values():
                store.zero_()


class LayerCache:
    """A layer's part of a KVCache: its stores and how many positions they keep; the same class for every
    layer's code, so a compiled block is one graph."""

    def __init__(self, cache, stores, slots):
        self.cache, self.stores, self.slots = cache, stores, slots

    def update(self, **new):
        return self.cache.update(self, **new)

    @property
    def fresh(self):
        """Nothing stored yet (the stores hold zeros): a Gated DeltaNet then takes training's path."""
        return self.cache.pos == 0

    @property
    def start(self):
        """The position of the first new token (an int)."""
        return self.cache.pos


def feature_states(model):
    """[(name, (shape without the batch, dtype or None))] the model's features keep in a cache."""
    states = [state for feature in model.features for state in feature.cache_states().items()]
    names = [name for name, _ in states]
    assert len(names) == len(set(names)), f"features' cache states share a name: {names}"
    return states


class StepCache:
    """A layer's stores as one decoding step (decode_step) sees them: the new token is written at slot
    pos % slots, which is its position in a global layer and its ring slot in a local one, and every slot is
    returned, the ones not yet written masked by the step. Nothing depends on the position but tensors, so the
    step has the same shapes and code at every position."""
    fresh = False  # a step follows a prefill

    def __init__(self, stores, pos):
        self.stores, self.pos = stores, pos

    @property
    def start(self):
        """The position of the new token (a (1,) tensor)."""
        return self.pos

    def update(self, **new):
        out = []
        for name, value in new.items():
            store = self.stores[name]
            store.index_copy_(2, self.pos % store.size(2), value.to(store.dtype))
            out.append(store)
        return out


class DecodingStep:
    """A KVCache's stores as GPT.hidden_states sees them in one decoding step: a StepCache per layer, the position a
    (1,) tensor, and a mask per layer over its slots (slot s holds a position <= pos once written; a ring holds the
    last `window` positions). The caller advances the cache."""

    def __init__(self, stores, pos, features):
        self.stores, self.start, self.features = stores, pos, features

    def __getitem__(self, layer):
        return StepCache(self.stores[layer], self.start)

    def mask(self, layer, mixer, T, device):
        entries = mixer.cache_entries()
        if not entries:  # nothing cached per position (a recurrent mixer): no mask
            return None  # (a layer sharing another's keys takes its source's: GPT shares masks by kind)
        slots = torch.arange(self.stores[layer][next(iter(entries))].size(2), device=device)
        # a chunked layer's ring starts with each chunk: its slots 0..pos % chunk hold the current one
        return slots[None, :] <= (self.start % mixer.window if mixer.chunked else self.start)

    def advance(self, T):
        pass


def decode_step(model, idx, pos, stores, features):
    """One decoding step: the logits (B, vocab), in fp32, after the tokens idx (B, 1) at position pos (a (1,)
    tensor), whose entries go into stores (a KVCache's, filled by a prefill) in place. Every shape is the
    cache's and every position a tensor, so the step is one static graph whatever the position: what
    compile_decoding compiles. The caller advances the cache (the step reads no Python int that changes). features:
    the cache's stores of the model's features."""
    return model.logits(model.hidden_states(idx, DecodingStep(stores, pos, features)))[:, -1].float()


def compile_decoding(model, backend='inductor', mode=None, keep_cache=None):
    """Prepare generate's fast path: decode_step compiled once (the prefill stays eager), used by every later
    generate with a cache. On a CPU the cache's slots are a dynamic size, so no length compiles anew, and the
    weights are frozen into the step (call again after changing them: it compiles anew); on CUDA mode None is
    'reduce-overhead': the step replayed as a CUDA graph. A graph replays fixed addresses, so there (keep_cache
    None, or True) generate keeps one cache of block_size positions per batch size and reuses it. Returns the
    model."""
    cuda = model.lm_head.weight.is_cuda
    if mode is None and cuda and backend == 'inductor':
        mode = 'reduce-overhead'
    # dynamo keeps its graphs with the code object it compiled, and a frozen graph (below) the weights it saw:
    # each call compiles a copy of decode_step's code of its own, so a second call after the weights change
    # compiles anew instead of finding the old graph
    step = types.FunctionType(decode_step.__code__.replace(), decode_step.__globals__, 'decode_step')
    # On a CPU (inductor, mode None) the step is built for decoding's thin matmuls (batch-many rows): the weights
    # folded into it and prepacked (inductor's freezing), each matmul MKL's or inductor's own C++ micro-kernel,
    # whichever ran faster when timed at compile time (max_autotune with the CPP backend), and the kernels called
    # from C++, not Python (cpp_wrapper). fp32, 2 threads here: a Llama step 5.2 -> 2.2 ms at batch 1 and
    # 10.5 -> 4.9 ms at batch 8, for a compile of 20-35 s instead of ~10 (docs/results.md). Freezing is read
    # outside the options inductor applies (torch.compile's options={'freezing': True} did not reach it in torch
    # 2.13), so it is set around each call, as inductor compiles at a call.
    freezing = mode is None and backend == 'inductor'  # on CUDA mode None became 'reduce-overhead' above
    options = {'max_autotune': True, 'max_autotune_gemm_backends': 'CPP,ATEN', 'cpp_wrapper': True,
               'max_autotune_report_choices_stats': False} if freezing else None
    # MoE's CPU path reads its experts' token counts on the host: a graph break, so not fullgraph. dynamic=False:
    # each batch size a static graph of its own (dynamo's default would make the batch symbolic at the second
    # size, a general graph, 15% slower a GPT-2 step at batch 8 here, for every size after it); the cache's
    # slots stay dynamic, as generate marks them
    compiled = torch.compile(step, backend=backend, mode=mode, fullgraph=not syncs_host(model), dynamic=False,
                             options=options)
    # the autotuner writes its timing tables to stderr at each matmul shape not in its disk cache, sample.py's too
    if freezing:
        from torch._inductor import select_algorithm
        select_algorithm.PRINT_AUTOTUNE = False

    def compiled_step(*args):
        if not freezing:
            return compiled(model, *args)
        # set and restored by hand: config.patch's context manager cost 4x as much, on every step
        config = torch._inductor.config
        before, config.freezing = config.freezing, True
        try:
            return compiled(model, *args)
        finally:
            config.freezing = before
    model._compiled_step = compiled_step
    model._kept_caches = {} if (keep_cache if keep_cache is not None else mode == 'reduce-overhead') else None
    return model


def syncs_host(model):
    """Whether a module reads a tensor's values on the host in a forward (an MoE's token counts on a CPU): a graph
    break, so no full graph."""
    return any(getattr(module, 'syncs_host', False) for module in model.modules())


def cache_dtype(model):
    device_type = model.lm_head.weight.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return model.lm_head.weight.dtype


def _cache_length(model, seq_len):
    return min(seq_len, model.config.block_size)


def cache_bytes(model, batch_size, seq_len, dtype=torch.float32):
    """Bytes of the cache generate allocates for batch_size sequences of seq_len tokens."""
    return KVCache.bytes_for(model, batch_size, _cache_length(model, seq_len), dtype)


def decoding_cache(model, batch_size, seq_len, device):
    """generate's cache: a new one for seq_len positions (its slots marked dynamic for a compiled step), or
    with compile_decoding's kept caches the one of this batch size, dtype and device, emptied."""
    dtype, kept = cache_dtype(model), getattr(model, '_kept_caches', None)
    if kept is None:
        cache = KVCache(model, batch_size, _cache_length(model, seq_len), dtype, device)
        if getattr(model, '_compiled_step', None) is None:  # eager: nothing to mark (and no dynamo to import)
            return cache
        for block, layer in zip(model.transformer.h, cache.layers):  # a compiled step serves every length:
            for name in block.attn.cache_entries():  # the slots of the entries per position are a dynamic size
                torch._dynamo.maybe_mark_dynamic(layer.stores[name], 2)
            for name in block.attn.cache_blocks():  # and the entries per block of positions
                torch._dynamo.maybe_mark_dynamic(layer.stores[name], 1)
        return cache
    key = (batch_size, dtype, str(device))
    if key not in kept:
        kept[key] = KVCache(model, batch_size, model.config.block_size, dtype, device)
        for stores in kept[key].stores + [kept[key].features]:  # written in place at the same addresses by every replay
            for store in stores.values():
                torch._dynamo.mark_static_address(store)
    kept[key].reset()
    return kept[key]


@torch.no_grad()
def generate_stream(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                    vocab_limit=None):
    """Yield (B, 1) new tokens one step at a time; vocab_limit: sample only ids below it (a vocabulary
    padded past the tokenizer's, e.g. 50304 for GPT-2's 50257, has ids that decode to nothing).

    The context is a window of at most block_size tokens. When a new token would overflow it,
    the oldest half is dropped (as llama.cpp does) and, with the cache, the cache is rebuilt from
    the newest half in one prefill. Without the cache the same window is recomputed every step, so
    both paths see the same tokens at the same positions.
    """
    if max_new_tokens <= 0:
        return
    block_size = model.config.block_size
    keep = max(1, block_size // 2)
    window = idx if idx.size(1) <= block_size else idx[:, -keep:]
    cache = decoding_cache(model, idx.size(0), idx.size(1) + max_new_tokens, idx.device) if use_cache else None
    # the steps after the prefill (decode_step, compiled by compile_decoding); positions that follow the
    # length reached (RoPE scaled dynamically) change every angle with it, so they keep the general path
    compiled = getattr(model, '_compiled_step', None)
    step = compiled or partial(decode_step, model)
    # an eager step under inference_mode: no autograd bookkeeping per operator (a version counter bumped, a view's
    # base kept), up to a fifth of an eager step on a CPU; its logits are not kept past sampling, and the cache it
    # writes in place stays a normal tensor. A compiled step runs in the mode its graph was traced in
    step_mode = contextlib.nullcontext if compiled else torch.inference_mode
    static = not model.config.positions_follow_length
    nxt = None  # the last token sampled: a step's input (a prefill always comes first)
    for _ in range(max_new_tokens):
        if cache is not None and cache.pos > 0 and static:
            with step_mode():  # nxt: the last token, a fresh (B, 1) tensor
                logits = step(nxt, cache.position, cache.stores, cache.features)
            cache.advance(1)
        else:  # no cache, a prefill, or a step of the general path
            h = prefill(model, window, cache, static) if cache is not None and cache.pos == 0 else \
                model.hidden_states(window if cache is None else window[:, -1:], cache)
            logits = model.logits(h[:, -1, :])  # only the last position is sampled from
        logits = logits[:, :vocab_limit]
        nxt = sample_next(logits.float(), temperature, top_k, top_p)
        yield nxt
        window = torch.cat((window, nxt), dim=1)
        if window.size(1) > block_size:
            window = window[:, -keep:]
            if cache is not None:
                cache.reset()


def prefill(model, window, cache, static=True):
    """The prompt into a fresh cache -> its hidden states (the last are sampled from). A prompt longer than
    PREFILL_CHUNK goes in pieces of it, each continuing the cache (as every layer kind can: tiny_models'
    check_cache_logits), so attention's masks and scores stay a piece by the cache, not the prompt by itself: a
    32k prompt's (32k, 32k) masks would not fit in memory. Positions that follow the length reached (static False)
    take the whole prompt at once, at its own length."""
    piece = PREFILL_CHUNK if static else window.size(1)
    for start in range(0, window.size(1), piece):
        h = model.hidden_states(window[:, start:start + piece], cache)
    return h


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, vocab_limit=None):
    """Continue idx (B, T) by max_new_tokens; temperature 0 is greedy."""
    new = list(generate_stream(model, idx, max_new_tokens, temperature, top_k, top_p, use_cache, vocab_limit))
    return torch.cat([idx] + new, dim=1)


def sample_next(logits, temperature=1.0, top_k=None, top_p=None):
    """Pick the next token of each row of logits (B, vocab)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # in float64, shifted so the largest is 0: a tiny temperature sends the others to -inf, never one to +inf
    # (and does not round to 0 as in float32)
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token once the ones before it already cover top_p; the likeliest always stays (a top_p
        # below float precision would drop it too)
        drop = probs.cumsum(dim=-1) - probs >= top_p
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float('-inf'))
        logits = torch.full_like(logits, float('-inf')).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1)
