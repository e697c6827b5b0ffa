"""A finished run's figures: its summary (losses, speed, size, a task's accuracy, the probes) from its log.jsonl and
ckpt.pt, and its losses and accuracies at other lengths (the length table), each cached beside the run."""

import json
import os
import statistics
import time

import numpy as np
import torch

from ablation.files import data_meta, read_json
from common.checkpoints import build_model, load_checkpoint, model_from_checkpoint
from common.data import example_split, masked_accuracy, read_examples
from common.files import write_json
from common.hardware import pick_device
from common.progress import fmt_duration
from probes import gradient_norms, probe, summarize as summarize_probe

EXTRAPOLATION_SEED = 4242  # one set of batches per length, the same for every variant
MULTIPLES = (1, 2, 4, 8)
SUMMARY_VERSION = 8  # done.json figures older than this are recomputed from the run's files
SOLVED = 0.9  # a task's accuracy taken as solved: past the plateaus of a phase change (recall's sit near 0.2-0.55)
PROBE_ROWS, PROBE_SKIP = 16, 4  # the probes' rows, and the first queries left out of the sink share
PROBE_FIGURES = ('sink_share', 'sink_share_max', 'equal_share', 'massive_ratio', 'grad_first_over_last',
                 'grad_max_over_min')


def summarize_run(path, cwd):
    """The figures of a finished run, from its log.jsonl and checkpoint."""
    with open(os.path.join(path, 'log.jsonl')) as f:
        records = [r for r in map(json.loads, filter(str.strip, f)) if not r.get('eval_only')]
    last = records[-1]
    ms = [r['ms_per_iter'] for r in records[1:] if r['ms_per_iter'] is not None]  # the first eval has none
    ms_per_iter = statistics.mean(ms) if ms else None
    tokens_per_iter = last['tokens'] / last['iter'] if last['iter'] else None
    diverged = os.path.join(path, 'diverged.json')
    figures = {'final_val_loss': last['val_loss'], 'best_val_loss': min(r['val_loss'] for r in records),
               'curve': [[r['iter'], r['val_loss'], r['elapsed_s']] for r in records], 'ms_per_iter': ms_per_iter,
               'tokens_per_s': tokens_per_iter / ms_per_iter * 1000 if ms_per_iter and tokens_per_iter else None,
               'load_max_over_mean': statistics.mean(last['moe']['max_over_mean']) if 'moe' in last else None,
               'diverged_at': read_json(diverged)['iter'] if os.path.exists(diverged) else None,
               'parameters': None, 'active_parameters': None, 'kv_bytes_per_token': None,
               'task': task_scores(last), 'accuracy': last.get('accuracy'), 'lengths': last.get('lengths'),
               'best_accuracy': max((r['accuracy'] for r in records if r.get('accuracy') is not None), default=None),
               'solved_at': next((r['iter'] for r in records if (r.get('accuracy') or 0) >= SOLVED), None),
               'probe': None, 'tokens': last['tokens'], 'steps': last['iter'], 'val_bpb': last.get('val_bpb'),
               'train_seconds': train_seconds(records), 'flops_per_token': None, 'scaling_params': None}
    ckpt_path = os.path.join(path, 'ckpt.pt')
    if os.path.exists(ckpt_path):  # not when val loss never improved with always_save_checkpoint=False
        checkpoint = load_checkpoint(ckpt_path)
        model = model_from_checkpoint(checkpoint, ckpt_path)
        block = model.config.block_size
        figures.update(parameters=model.get_num_params(), active_parameters=model.get_num_params(active=True),
                       kv_bytes_per_token=model.kv_cache_bytes(1, block, torch.float32) / block,
                       flops_per_token=model.flops_per_token(), scaling_params=scaling_params(model),
                       probe=probe_run(model, probe_tokens(cwd, checkpoint['config']['dataset'], block)))
    return figures


def train_seconds(records):
    """Seconds spent in training steps (evaluations and checkpoints left out): each record's ms/iter times the
    iterations since the one before."""
    return sum(r['ms_per_iter'] * (r['iter'] - before['iter']) / 1000 for before, r in zip(records, records[1:])
               if r['ms_per_iter'] is not None)


def scaling_params(model):
    """Kaplan's N: the parameters a token's compute goes through (a MoE's active share), without the tables it
    looks up (token and position embeddings, value and n-gram tables) and without an untied head, whose size is the
    vocabulary's, not the block's."""
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    head = model.lm_head.weight
    untied = 0 if any(head is t for t in tables) else head.numel()
    return model.get_num_params(active=True) - sum(t.numel() for t in tables) - untied


def probe_tokens(cwd, dataset, block_size):
    """The tokens the probes read, the same for every variant: a task's first PROBE_ROWS val examples (inputs),
    or PROBE_ROWS windows of block_size of the val text at offsets drawn from EXTRAPOLATION_SEED; None without
    the data."""
    data_dir = os.path.join(cwd, 'data', dataset)
    meta_path = os.path.join(data_dir, 'meta.json')
    meta = read_json(meta_path) if os.path.exists(meta_path) else {}
    if 'example_length' in meta:
        if not os.path.isfile(os.path.join(data_dir, 'val_mask.bin')):
            return None
        examples, length = example_split(data_dir, 'val', meta)  # its files of one preparation
        inputs, _ = read_examples(data_dir, 'val', range(min(PROBE_ROWS, examples)), length)
        return torch.from_numpy(inputs)
    files = [f for f in val_files(cwd, dataset) if os.path.isfile(f)]
    data = np.memmap(files[0], dtype=np.uint16, mode='r') if files else []
    if len(data) <= block_size:
        return None
    offsets = torch.randint(len(data) - block_size, (PROBE_ROWS,), generator=torch.Generator().manual_seed(
        EXTRAPOLATION_SEED)).tolist()
    return torch.from_numpy(np.stack([data[i:i + block_size] for i in offsets]).astype(np.int64))


def probe_run(model, tokens):
    """The probes' summary (sink share, what equal attention would give the same queries in each layer's window,
    massive activations, the gradient across depth) and the per-layer report; None without tokens."""
    if tokens is None or tokens.size(1) <= PROBE_SKIP:
        return None
    report = {**probe(model, tokens, skip=PROBE_SKIP), 'gradients': gradient_norms(model, tokens)}
    return {**summarize_probe(report), 'layers': report}


def task_scores(record):
    """The downstream task's headline metric a run logged at this evaluation (train.py's eval_task), as
    {'hellaswag acc_norm': 0.29}: acc_norm where the task has it, else acc, else its first metric."""
    out = {}
    for name, metrics in (record.get('task') or {}).items():
        metric = next((m for m in ('acc_norm', 'acc') if m in metrics), next(iter(metrics), None))
        if metric is not None:
            out[f'{name} {metric}'] = metrics[metric]
    return out


def method_args(method, trained, multiple):
    """The runtime flags that evaluate a model trained at `trained` tokens at multiple x that length."""
    length = multiple * trained
    return {'plain': {}, 'linear': {'rope_scaling': 'linear', 'rope_factor': float(multiple)},
            # factor 1: the base grows with the length itself, (L / trained)^(d / (d - 2))
            'dynamic': {'rope_scaling': 'dynamic', 'rope_factor': 1.0},
            'yarn': {'rope_scaling': 'yarn', 'rope_factor': float(multiple)},
            'window': {'sliding_window': trained}}[method] | {'block_size': length} | (
                {'rope_original_length': trained} if method in ('linear', 'dynamic', 'yarn') else {})  # a scaling's


def val_files(cwd, dataset):
    """The val split's token files: val.bin, or the shards meta.json lists (data/fineweb_edu/prepare.py)."""
    data_dir = os.path.join(cwd, 'data', dataset)
    meta_path = os.path.join(data_dir, 'meta.json')
    meta = read_json(meta_path) if os.path.exists(meta_path) else {}
    shards = meta.get('shards') if isinstance(meta, dict) else None
    names = [entry[0] for entry in shards.get('val', [])] if isinstance(shards, dict) else ['val.bin']
    return [os.path.join(data_dir, name) for name in names]


def is_task(cwd, dataset):
    """Whether data/<dataset> holds whole examples (a task: recall, copy), not running text."""
    return 'example_length' in data_meta(cwd, dataset)


def lengths_missing(path, methods, extrapolation_iters):
    """The (method, multiple) losses of a run not yet in its extrapolation.json."""
    cache_path = os.path.join(path, 'extrapolation.json')
    cache = read_json(cache_path) if os.path.exists(cache_path) else {}
    return [(m, k) for m in methods for k in MULTIPLES if f'{m}@{k}x@{extrapolation_iters}' not in cache]


@torch.no_grad()
def extrapolation_losses(path, cwd, methods, extrapolation_iters):
    """({method: {'1x': loss, ...}}, why): mean val loss of the run's checkpoint on fixed batches of each length,
    each method applied to the trained weights; None where it cannot run, and why when the val data is missing.
    Cached in the run's extrapolation.json."""
    cache_path = os.path.join(path, 'extrapolation.json')
    cache = read_json(cache_path) if os.path.exists(cache_path) else {}
    missing = lengths_missing(path, methods, extrapolation_iters)
    ckpt_path = os.path.join(path, 'ckpt.pt')
    why = ''
    if missing and os.path.exists(ckpt_path):
        checkpoint = load_checkpoint(ckpt_path)
        dataset = checkpoint['config']['dataset']
        files = val_files(cwd, dataset)
        absent = [f for f in files if not os.path.isfile(f)] or ([] if files else ['(meta.json lists no val shard)'])
        if is_task(cwd, dataset):  # windows across whole examples score nothing: the task's lengths table does
            cache.update({f'{method}@{multiple}x@{extrapolation_iters}': None for method, multiple in missing})
            write_json(cache_path, cache)
        elif absent:  # nothing cached: the losses are computed once the data is back
            why = f"no val data at {absent[0]}"
        else:
            shards = [np.memmap(f, dtype=np.uint16, mode='r') for f in files]
            for method, multiple in missing:
                cache[f'{method}@{multiple}x@{extrapolation_iters}'] = length_loss(checkpoint, ckpt_path, shards,
                                                                                   method, multiple,
                                                                                   extrapolation_iters)
            write_json(cache_path, cache)
    return {m: {f'{k}x': cache.get(f'{m}@{k}x@{extrapolation_iters}') for k in MULTIPLES} for m in methods}, why


def length_loss(checkpoint, ckpt_path, shards, method, multiple, extrapolation_iters):
    """The checkpoint's mean loss at multiple x its block_size with one method, or None where it cannot run."""
    trained, batch_size = checkpoint['model_args'], checkpoint['config']['batch_size']
    T = multiple * trained['block_size']
    rope = trained.get('pos') == 'rope'
    # each shard's windows one after another, one draw over them all (as train.py's get_batch); with one
    # val.bin, the draws it always had
    ends = np.cumsum([max(0, len(data) - T) for data in shards])
    if not ((multiple == 1 or rope) and (method == 'plain' or (rope and multiple > 1)) and ends[-1]):
        return None
    args = {**trained, **method_args(method, trained['block_size'], multiple)}
    if not rope:
        args = {k: v for k, v in args.items() if k not in ('rope_original_length',)}
    device = pick_device('auto')  # this machine's: the run's may have been another node's cuda:3
    model = build_model(args, checkpoint['model'], f"checkpoint '{ckpt_path}'").to(device).eval()
    generator, total = torch.Generator().manual_seed(EXTRAPOLATION_SEED + multiple), 0.0
    for _ in range(extrapolation_iters):
        rows = []
        for i in torch.randint(int(ends[-1]), (batch_size,), generator=generator).tolist():
            k = int(np.searchsorted(ends, i, side='right'))
            offset = i - (int(ends[k - 1]) if k else 0)
            rows.append(torch.from_numpy(shards[k][offset:offset + T + 1].astype(np.int64)))
        xy = torch.stack(rows).to(device)
        total += model(xy[:, :-1], xy[:, 1:].contiguous())[1].item()
    return total / extrapolation_iters


SCALINGS = ('linear', 'dynamic', 'yarn')


def task_lengths(path, cwd, methods, extrapolation_iters):
    """{scaling: {split: {'loss', 'accuracy'}} or None} of a RoPE run's ckpt.pt on a task dataset's evaluation
    splits (data/copy's val, val_2x, val_4x), each scaling of methods applied to the trained weights; train.py
    logged the plain ones. Cached in the run's lengths.json."""
    cache_path = os.path.join(path, 'lengths.json')
    cache = read_json(cache_path) if os.path.exists(cache_path) else {}
    keys = {m: f'{m}@{extrapolation_iters}' for m in methods if m in SCALINGS}
    found = task_checkpoint(path, cwd) if any(k not in cache for k in keys.values()) else None
    if found:
        checkpoint, data_dir, meta = found
        for method in [m for m, k in keys.items() if k not in cache]:
            cache[keys[method]] = {s: task_split_figures(checkpoint, os.path.join(path, 'ckpt.pt'), data_dir, meta,
                                                         method, s, extrapolation_iters) for s in meta['eval_splits']}
        write_json(cache_path, cache)
    return {m: cache.get(k) for m, k in keys.items()}


def task_checkpoint(path, cwd):
    """(checkpoint, data_dir, meta) of a RoPE run on a task dataset with its evaluation splits here, else None."""
    ckpt_path = os.path.join(path, 'ckpt.pt')
    if not os.path.exists(ckpt_path):
        return None
    checkpoint = load_checkpoint(ckpt_path)
    data_dir = os.path.join(cwd, 'data', checkpoint['config']['dataset'])
    meta_path = os.path.join(data_dir, 'meta.json')
    meta = read_json(meta_path) if os.path.exists(meta_path) else {}
    splits = meta.get('eval_splits') if 'example_length' in meta else None
    if checkpoint['model_args'].get('pos') != 'rope' or not splits or not all(
            os.path.isfile(os.path.join(data_dir, f'{s}_mask.bin')) for s in splits):
        return None
    return checkpoint, data_dir, meta


@torch.no_grad()
def task_split_figures(checkpoint, ckpt_path, data_dir, meta, method, split, extrapolation_iters):
    """{'loss', 'accuracy'} over the scored targets of the split's first extrapolation_iters batches of examples,
    the trained model scaled from its training examples' length to the split's."""
    trained = meta['splits']['train']['example_length'] - 1
    examples, length = example_split(data_dir, split, meta)  # its files of one preparation
    args = {**checkpoint['model_args'], **method_args(method, trained, (length - 1) / trained),
            'block_size': max(length - 1, checkpoint['model_args']['block_size'])}
    device = pick_device('auto')
    model = build_model(args, checkpoint['model'], f"checkpoint '{ckpt_path}'").to(device).eval()
    batch_size = checkpoint['config']['batch_size']
    n = min(examples, extrapolation_iters * batch_size)
    loss_sum, right, scored = 0.0, 0, 0
    for start in range(0, n, batch_size):
        rows = range(start, min(n, start + batch_size))
        x, y = (torch.from_numpy(a).to(device) for a in read_examples(data_dir, split, rows, length))
        logits, loss = model(x, y)
        hits, count = (int(v) for v in masked_accuracy(logits, y))
        loss_sum, right, scored = loss_sum + loss.item() * count, right + hits, scored + count
    return {'loss': loss_sum / scored, 'accuracy': right / scored}


def finished(path, cwd):
    """The run's done.json, its figures brought up to date."""
    done = read_json(os.path.join(path, 'done.json'))
    if done.get('version') != SUMMARY_VERSION:
        done.update(summarize_run(path, cwd), version=SUMMARY_VERSION)
        write_json(os.path.join(path, 'done.json'), done)
    return done


def measure_lengths(runs, roots, cwd, methods, extrapolation_iters):
    """Each run's length table (its cached losses, the missing ones computed now with progress and an ETA: minutes
    on a CPU); {run: why} for the runs whose val data is gone."""
    todo = [root for root in roots if os.path.exists(os.path.join(root, 'ckpt.pt')) and
            lengths_missing(root, methods, extrapolation_iters)]
    if todo:
        print(f"length table: measuring {len(todo)} run(s) at {', '.join(f'{k}x' for k in MULTIPLES)} block_size "
              f"({', '.join(methods)}; {extrapolation_iters} batches each)", flush=True)
    durations, no_data = [], {}
    for run, root in zip(runs, roots):
        t0 = time.time()
        run['extrapolation'], why = extrapolation_losses(root, cwd, methods, extrapolation_iters)
        run['scaled_lengths'] = task_lengths(root, cwd, methods, extrapolation_iters)
        if why:
            no_data[f"{run['variant']} seed {run['seed']}"] = why
        if root in todo:
            durations.append(time.time() - t0)
            left = len(todo) - len(durations)
            eta = f", ETA {fmt_duration(statistics.mean(durations) * left)}" if left else ''
            print(f"length table [{len(durations)}/{len(todo)}] {run['variant']} seed {run['seed']} done in "
                  f"{fmt_duration(durations[-1])}{eta}", flush=True)
    return no_data
