"""The grid's time before its first run ends: each run's FLOPs (its training steps and its evaluations) over the
FLOP/s of a few training steps of the grid's first variant timed here, on the threads and device a run gets. As
runs finish, the ETA scales the runs left by how long the finished ones took against their estimates."""

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
    """Seconds left: the estimates of the runs left, scaled by how long the finished ones took against theirs."""
    known = sum(estimates.get(p, 0.0) for p in finished)
    scale = sum(took) / known if known > 0 else 1.0
    return scale * sum(estimates.get(p, 0.0) for p in left) / parallel
