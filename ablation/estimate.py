"""The grid's time before its first run ends: each run's FLOPs (its training steps and its evaluations) over the
FLOP/s of a few training steps of the grid's first variant timed here, on the threads and device a run gets. As
runs finish, the ETA takes each run left as a fixed cost plus its estimate scaled, both read off the finished runs."""

import time

import torch

from ablation.groups import base_vocab, model_args
from chapters import GPT, GPTConfig
from common.hardware import pick_device
from common.progress import fmt_duration


def model_of(recipe, settings):
    return GPT(GPTConfig(**model_args(recipe), vocab_size=base_vocab(recipe, settings)))


def run_flops(recipe, flops_per_token):
    """A run's FLOPs: max_iters steps of its tokens, and its evaluations (train and val, eval_iters batches each,
    a forward a third of a step's FLOPs). A run that stops early (stop_accuracy) takes less."""
    row = recipe['batch_size'] * recipe['block_size']
    evaluations = recipe['max_iters'] // recipe['eval_interval'] + 1
    tokens = recipe['max_iters'] * recipe['gradient_accumulation_steps'] * row \
        + evaluations * 2 * recipe['eval_iters'] * row / 3
    return tokens * flops_per_token


def step_flops_per_s(model, recipe, device, threads, steps=3):
    """FLOP/s of eager fp32 training steps (forward, backward, AdamW) of one micro batch, the first (warm-up) left
    out, on `threads` intra-op threads."""
    model = model.to(device).train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(model.config.vocab_size, (recipe['batch_size'], recipe['block_size']), device=device)
    before, times = torch.get_num_threads(), []
    torch.set_num_threads(threads)
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            _, loss = model(x, x)
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            loss.item()  # waits for the device
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return model.flops_per_token() * x.numel() / (sum(times[1:]) / len(times[1:]))


def grid_estimate(jobs, base, settings, threads):
    """{path: estimated seconds} of the jobs ((name, flags, seed, path) each), said in one line with the total."""
    if not jobs:
        return {}
    recipes = {name: {**base, **flags} for name, flags, _, _ in jobs}
    per_token = {name: model_of(recipe, settings).flops_per_token() for name, recipe in recipes.items()}
    first = jobs[0][0]
    slot = next((d.strip() for d in settings['devices'].split(',') if d.strip()), None)
    device = slot or pick_device(base.get('device', 'auto'))
    rate = step_flops_per_s(model_of(recipes[first], settings), recipes[first], device, threads)
    seconds = {path: run_flops(recipes[name], per_token[name]) / rate for name, _, _, path in jobs}
    print(f"grid: {len(jobs)} run(s) to train, about {fmt_duration(sum(seconds.values()) / settings['parallel'])} "
          f"in all ({settings['parallel']} at once; each run's FLOPs at the {rate / 1e9:.2g} GFLOP/s of {first}'s "
          f"steps timed here, eager fp32; the ETA below follows the runs as they finish)", flush=True)
    return seconds


def eta(estimates, finished, took, left, parallel):
    """Seconds left: each run left as the finished ones went, a fixed cost per run (starting Python and torch, the
    data, the checkpoint) plus its estimate scaled (tiny runs are nearly all fixed cost: scaling their FLOPs alone
    by it put a 90-minute grid at 500)."""
    overhead, scale = overhead_and_scale([estimates.get(p, 0.0) for p in finished], took)
    return sum(overhead + scale * estimates.get(p, 0.0) for p in left) / parallel


def overhead_and_scale(estimated, took):
    """took = overhead + scale x estimated: a least-squares line where the finished runs differ in size; where they
    do not, the timed rate is trusted and what it does not explain is the fixed cost (or, when the runs were quicker
    than estimated, the rate scaled)."""
    n = len(estimated)
    if not n:  # only failures so far: the estimates as they are
        return 0.0, 1.0
    mean_e, mean_t = sum(estimated) / n, sum(took) / n
    spread = sum((e - mean_e) ** 2 for e in estimated)
    if spread > n * (0.25 * mean_e) ** 2:
        scale = sum((e - mean_e) * (t - mean_t) for e, t in zip(estimated, took)) / spread
        if scale > 0 and mean_t >= scale * mean_e:
            return mean_t - scale * mean_e, scale
    if mean_t >= mean_e:
        return mean_t - mean_e, 1.0
    return 0.0, mean_t / mean_e if mean_e > 0 else 1.0
