"""Probes of the mechanism, on given tokens: where attention goes (the first-position sink) and how large the
residual stream gets (massive activations).

    from probes import probe
    report = probe(model, idx)   # idx: (B, T) token ids, T > skip

- sink_share[layer][head]: the mean share of attention a query gives to position 0, over the queries at
  positions skip.. (StreamingLLM's "attention sink"; Qwen's gated attention removes it). None for layers without
  softmax attention (Gated DeltaNet).
- equal_share[layer]: what equal scores would give position 0 over the same queries, the baseline a sink is read
  against: query t sees t + 1 keys, so 1/(t+1), while position 0 is in its window (a sliding window's or a chunk's
  first w positions: t < w) and 0 past it; a share well above it is a sink. None where sink_share is.
- learned_sink_share[layer][head]: with attn_sinks, the share given to the learned sink (to no key at all).
- massive[layer]: the largest |value| in the residual stream after the block, where it is (position,
  channel), the median |value| and their ratio (Sun et al. 2024: a few values thousands of times the median).

    from probes import gradient_norms
    norms = gradient_norms(model, idx)   # how the training gradient travels down the depth

- stream[layer]: the RMS of the loss's gradient with respect to the residual stream after the block (every
  copy of a hyper-connected stream), for next-token prediction of idx's own tokens; params[layer]: the norm of
  the block's parameters' gradients. mHC (Xie et al. 2025) claims to keep these bounded across depth.
"""
import contextlib
import math

import torch

import chapters.attention
import model as model_module

# the attention functions the mixers call (through their modules), swapped for the explicit one while recording:
# every softmax attention goes through model.attend, or with sinks through attend_with_sinks
ATTENTION_FUNCTIONS = ((model_module, 'attend'), (chapters.attention, 'attend_with_sinks'))


def attention_weights(q, k, mask, scale=None, sinks=None):
    """softmax(q k^T * scale + mask) over (B, H, T, dim) queries and (B, Hk, S, dim) keys, as model.attend
    means it: (weights (B, H, T, S), the share each query gives to the learned sink (B, H, T), or None)."""
    T, S = q.size(2), k.size(2)
    if k.size(1) != q.size(1):  # GQA: consecutive query heads share a key head
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    if mask is None:
        mask = T > 1
    if isinstance(mask, bool):  # True: causal, query i being the (S - T + i)-th key; False: every key
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T) if mask else None
    if mask is not None:
        scores = scores.masked_fill(~mask, float('-inf'))
    if sinks is None:
        return scores.softmax(dim=-1), None
    sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    weights = torch.cat((scores, sink), dim=-1).softmax(dim=-1)  # the sink joins every denominator
    return weights[..., :-1], weights[..., -1]


@contextlib.contextmanager
def recording_attention(model):
    """For the duration: every attention function (ATTENTION_FUNCTIONS) computes its weights explicitly
    (attention_weights) and records them under the layer whose block is running: yields {layer: (weights, learned
    sink share or None)}."""
    records, layer = {}, [None]
    originals = [getattr(module, name) for module, name in ATTENTION_FUNCTIONS]

    def explicit_attend(q, k, v, mask, dropout_p=0.0, scale=None, sinks=None):
        weights, sink = attention_weights(q, k, mask, scale, sinks)
        records[layer[0]] = (weights, sink)
        if v.size(1) != q.size(1):
            v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
        return (weights @ v.float()).to(v.dtype)

    def entering(i):
        return lambda module, args: layer.__setitem__(0, i)

    hooks = [block.register_forward_pre_hook(entering(i)) for i, block in enumerate(model.transformer.h)]
    for module, name in ATTENTION_FUNCTIONS:
        setattr(module, name, explicit_attend)
    try:
        yield records
    finally:
        for (module, name), original in zip(ATTENTION_FUNCTIONS, originals):
            setattr(module, name, original)
        for hook in hooks:
            hook.remove()


@contextlib.contextmanager
def recording_residual(model):
    """For the duration: each block's output (the residual stream after it) by layer: yields {layer: tensor}."""
    streams = {}

    def leaving(i):
        return lambda module, args, output: streams.__setitem__(i, output.detach())

    hooks = [block.register_forward_hook(leaving(i)) for i, block in enumerate(model.transformer.h)]
    try:
        yield streams
    finally:
        for hook in hooks:
            hook.remove()


def massive_activation(x):
    """The largest |value| of a (B, T, C) residual stream, where it is, the median |value| and the ratio; a stream
    of copies (B, T, n, C) (hyper-connections) is read as (B, T, n*C), its channel counted across the copies."""
    a = x.float().abs().flatten(2)
    top = int(a.argmax())
    _, T, C = a.shape
    median = a.median().item()
    largest = a.flatten()[top].item()
    return {'max': largest, 'position': top // C % T, 'channel': top % C, 'median': median,
            'ratio': largest / median if median > 0 else float('inf')}


@torch.no_grad()
def probe(model, idx, skip=4):
    """The attention sinks and massive activations of `model` (a GPT, not compiled) on tokens idx (B, T):
    see the module's docstring. skip: the first queries left out of the sink share (they have few keys to
    choose from, so a share of 1/(t+1) there says nothing)."""
    if idx.size(1) <= skip:
        raise ValueError(f"probe needs more than skip={skip} tokens per row; got {idx.size(1)}")
    was_training = model.training
    model.eval()
    try:
        with recording_attention(model) as records, recording_residual(model) as streams:
            model(idx)
    finally:
        model.train(was_training)
    n_layer = len(model.transformer.h)
    report = {'sink_share': [None] * n_layer, 'learned_sink_share': [None] * n_layer, 'equal_share': [None] * n_layer}
    for layer, (weights, sink) in records.items():
        report['sink_share'][layer] = weights[:, :, skip:, 0].mean(dim=(0, 2)).tolist()
        report['equal_share'][layer] = equal_share(idx.size(1), skip, model.transformer.h[layer].attn.window)
        if sink is not None:
            report['learned_sink_share'][layer] = sink[:, :, skip:].mean(dim=(0, 2)).tolist()
    report['massive'] = [massive_activation(streams[layer]) for layer in range(n_layer)]
    return report


def gradient_norms(model, idx):
    """The loss's gradient at each depth on tokens idx (B, T), see the module's docstring: one forward and backward
    in eval mode (no dropout), predicting idx[:, 1:] from idx[:, :-1]; the model's own .grad are restored."""
    blocks, outputs = model.transformer.h, {}

    def keep(i):
        def hook(module, args, output):
            output.retain_grad()
            outputs[i] = output
        return hook
    was_training, saved = model.training, {p: p.grad for p in model.parameters()}
    hooks = [block.register_forward_hook(keep(i)) for i, block in enumerate(blocks)]
    model.eval()
    try:
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            model(idx[:, :-1], idx[:, 1:])[1].backward()
        stream = [outputs[i].grad.float().pow(2).mean().sqrt().item() for i in range(len(blocks))]
        params = [math.sqrt(sum(p.grad.float().pow(2).sum().item() for p in block.parameters() if p.grad is not None))
                  for block in blocks]
    finally:
        for hook in hooks:
            hook.remove()
        for p, grad in saved.items():
            p.grad = grad
        model.train(was_training)
    return {'stream': stream, 'params': params}


def equal_share(T, skip, window=None):
    """The mean share equal scores give position 0 over the queries skip..T-1: query t sees t + 1 keys while
    position 0 is in its window (t < window: a sliding window's, or the first chunk of a chunked layer), none past
    it; window None: the whole past."""
    return sum(1 / (t + 1) for t in range(skip, min(T, window or T))) / (T - skip)


def summarize(report):
    """One row of figures from a probe's report: the sink share (mean and largest over the softmax layers'
    heads), what equal attention would give over the same heads (each layer's window followed), and the largest
    massive-activation ratio and value over layers."""
    shares = [s for layer in report['sink_share'] if layer is not None for s in layer]
    equal = [e for e, layer in zip(report.get('equal_share') or [], report['sink_share']) if layer is not None
             for _ in layer]
    stream = (report.get('gradients') or {}).get('stream')
    return {'sink_share': sum(shares) / len(shares) if shares else None,
            'sink_share_max': max(shares) if shares else None,
            'equal_share': sum(equal) / len(equal) if equal and None not in equal else None,
            'massive_ratio': max(m['ratio'] for m in report['massive']),
            'massive_max': max(m['max'] for m in report['massive']),
            # the first block's stream gradient over the last's: > 1, it grows on its way down
            'grad_first_over_last': stream[0] / stream[-1] if stream and stream[-1] > 0 else None,
            'grad_max_over_min': max(stream) / min(stream) if stream and min(stream) > 0 else None}
