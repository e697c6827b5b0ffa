"""
Train a grid of block variants on the same data, batches and seeds; report losses, speed, size and length
extrapolation side by side (out_dir: results.md, results.json, val_loss_vs_iter.png, val_loss_vs_time.png).

    python ablate.py config/ablate_shakespeare_char.py
    python ablate.py config/ablate_shakespeare_char.py --grid=default,kv --n_kv_heads=1,2,4 --seeds=3
    python ablate.py --grid=custom --custom="{'vanilla': {}, 'tiny_rope': {'pos': 'rope', 'rope_theta': 500.0}}"

Each variant x seed (1337, 1338, ...) is a run `python train.py <train_config> <flags> <train_args> --seed=<seed>
--out_dir=<out_dir>/runs/<variant>/seed<seed>` in run_dir ('': this repo), logged to train.log there. A finished
run holds done.json and is skipped next time; the report is rewritten from every finished run at each invocation.
train_config must be the vanilla GPT-2 block; variants override its model flags. grid groups: default (vanilla,
vanilla+rms/+swiglu/+gqa/+rope, modern), leave_one_out (modern, modern minus each swap), norm_position (vanilla
and modern, pre- and post-norm), mlp (relu, gelu, swiglu, geglu on vanilla), kv (modern with each n_kv_heads),
custom (the `custom` dict). A variant with the flags of an earlier one runs once, under the earlier name.
extrapolation: val loss at 1x, 2x, 4x the trained block_size (past 1x for rope only), extrapolation_iters batches.
"""

import ast
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import fields

from configurator import configure, script_defaults, settings_of

out_dir = 'out-ablate'
train_config = 'config/shakespeare_vanilla_cpu.py'  # the base recipe of every run
seeds = 1
grid = 'default'
n_kv_heads = ''  # for the kv group, e.g. '1,2,4'
custom = ''  # e.g. "{'tiny_rope': {'pos': 'rope', 'rope_theta': 500.0}}"
train_args = ''  # passed to every train.py run, e.g. '--max_iters=20 --eval_interval=10'
extrapolation = True
extrapolation_iters = 20
python = ''  # '' is this interpreter
run_dir = ''
settings = configure(settings_of(globals()), sys.argv[1:], prog='ablate.py', doc=__doc__)
globals().update(settings)

# the heavy imports only now: --help and a mistyped setting answer before torch loads
import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import die, load_checkpoint, model_from_checkpoint, pick_device  # noqa: E402
from model import SWAPS, GPTConfig, swap_flags  # noqa: E402

REPO = os.path.dirname(os.path.abspath(__file__))
TRAIN_PY = os.path.join(REPO, 'train.py')
MODEL_FLAGS = [f.name for f in fields(GPTConfig) if f.name != 'vocab_size']  # the dataset decides vocab_size
EXTRAPOLATION_SEED = 4242  # one set of batches per length, the same for every variant
MULTIPLES = (1, 2, 4)


# ----------------------------------------------------------------------------- the grid

def parse_custom(text):
    try:
        variants = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        die(f"custom is not a Python literal ({type(e).__name__}): {text!r}")
    if not isinstance(variants, dict) or not variants or not all(
            isinstance(k, str) and isinstance(v, dict) for k, v in variants.items()):
        die(f"custom must be a non-empty dict of name -> flag dict, e.g. \"{{'rope': {{'pos': 'rope'}}}}\"; "
            f"got {text!r}")
    for name, flags in variants.items():
        unknown = [k for k in flags if k not in MODEL_FLAGS]
        if unknown:
            die(f"custom variant {name!r}: unknown flag(s) {', '.join(map(repr, unknown))}; model flags are "
                f"{', '.join(MODEL_FLAGS)} (put training settings in train_args)")
    return variants


def kv_head_counts():
    if not re.fullmatch(r'\s*\d+(\s*,\s*\d+)*\s*', n_kv_heads):
        die(f"grid 'kv' needs n_kv_heads as comma-separated integers, e.g. --n_kv_heads=1,2,4; got {n_kv_heads!r}")
    return [int(v) for v in n_kv_heads.split(',')]


def base_recipe(cwd):
    """train.py's settings for train_config and train_args, read as train.py would in run_dir."""
    try:
        argv = [train_config] + shlex.split(train_args)
    except ValueError as e:
        die(f"train_args {train_args!r}: {e}")
    here = os.getcwd()
    os.chdir(cwd)  # recipes exec() the files they build on by relative path
    try:
        return configure(script_defaults(TRAIN_PY), argv, prog='train.py')
    finally:
        os.chdir(here)


def build_grid(base):
    """{name: flags} in grid order, swaps as model.SWAPS makes them for the base recipe; a flag set
    already present (e.g. mlp=gelu is vanilla) runs once."""
    swaps = {name: swap_flags([name], base) for name in SWAPS}
    modern = swap_flags('modern', base)
    variants, names_by_key = {}, {}
    for group in [g.strip() for g in grid.split(',') if g.strip()] or die("grid is empty"):
        if group == 'default':
            members = [('vanilla', {})] + [(f'vanilla+{s}', f) for s, f in swaps.items()] + [('modern', modern)]
        elif group == 'leave_one_out':
            members = [('modern', modern)] + [(f'modern-{s}', {**modern, **swap_flags([s], base, modern=False)})
                                              for s in swaps]
        elif group == 'norm_position':
            members = [('vanilla', {}), ('vanilla+postnorm', {'prenorm': False}),
                       ('modern', modern), ('modern+postnorm', {**modern, 'prenorm': False})]
        elif group == 'mlp':
            members = [(f'mlp={m}', {'mlp': m}) for m in ('relu', 'gelu', 'swiglu', 'geglu')]
        elif group == 'kv':
            members = [(f'kv={k}', {**modern, 'n_kv_head': k}) for k in kv_head_counts()]
        elif group == 'custom':
            members = list(parse_custom(custom).items())
        else:
            die(f"unknown grid group {group!r}; groups are default, leave_one_out, norm_position, mlp, kv, custom")
        for name, flags in members:
            name = re.sub(r'[^A-Za-z0-9._+=-]', '_', name).strip('.') or '_'  # a directory name
            # a flag at the base recipe's value changes nothing
            key = repr(sorted((k, v) for k, v in flags.items() if base.get(k, ...) != v))
            if key in names_by_key:
                if names_by_key[key] != name:
                    print(f"{name} has the flags of {names_by_key[key]}: it runs once, as {names_by_key[key]}")
                continue
            if name in variants:
                die(f"variant name {name!r} stands for two different flag sets")
            variants[name], names_by_key[key] = flags, name
    return variants


# ----------------------------------------------------------------------------- one run

def run_args(flags, seed):
    """train.py's arguments but out_dir: what makes two runs the same. seed last, so train_args cannot move it."""
    return ([train_config] + [f'--{k}={v!r}' for k, v in flags.items()]  # repr: read back as the same literal
            + shlex.split(train_args) + [f'--seed={seed}', '--wandb_log=False'])


@torch.no_grad()
def extrapolation_losses(model, config, cwd):
    """Mean val loss on fixed batches of 1x, 2x, 4x block_size tokens; None where positions cannot reach."""
    data = np.memmap(os.path.join(cwd, 'data', config['dataset'], 'val.bin'), dtype=np.uint16, mode='r')
    device = pick_device(config.get('device', 'auto'))
    model.to(device).eval()
    losses = {}
    for m in MULTIPLES:
        T = m * model.config.block_size
        if (m > 1 and model.config.pos != 'rope') or len(data) <= T:
            losses[f'{m}x'] = None  # learned positions stop at block_size
            continue
        generator, total = torch.Generator().manual_seed(EXTRAPOLATION_SEED + m), 0.0
        for _ in range(extrapolation_iters):
            ix = torch.randint(len(data) - T, (config['batch_size'],), generator=generator).tolist()
            xy = torch.stack([torch.from_numpy(data[i:i + T + 1].astype(np.int64)) for i in ix]).to(device)
            total += model(xy[:, :-1], xy[:, 1:].contiguous())[1].item()
        losses[f'{m}x'] = total / extrapolation_iters
    return losses


def checkpoint_figures(path, cwd):
    """Parameters, KV cache bytes per token and extrapolation losses of a run's checkpoint."""
    ckpt_path = os.path.join(path, 'ckpt.pt')
    if not os.path.exists(ckpt_path):  # e.g. val loss never improved with always_save_checkpoint=False
        print(f"(no checkpoint in {path}: no parameter, KV cache or extrapolation figures)", end=' ')
        return {'parameters': None, 'kv_bytes_per_token': None, 'extrapolation': None}
    checkpoint = load_checkpoint(ckpt_path)
    model = model_from_checkpoint(checkpoint, ckpt_path)
    block = model.config.block_size
    return {'parameters': model.get_num_params(),
            'kv_bytes_per_token': model.kv_cache_bytes(1, block, torch.float32) / block,
            'extrapolation': extrapolation_losses(model, checkpoint['config'], cwd) if extrapolation else None}


def summarize_run(path, name, flags, seed, duration, cwd):
    with open(os.path.join(path, 'log.jsonl')) as f:
        records = [json.loads(line) for line in f if line.strip()]
    last = records[-1]
    ms = [r['ms_per_iter'] for r in records[1:] if r['ms_per_iter'] is not None]  # the first eval has none
    ms_per_iter = statistics.mean(ms) if ms else None
    tokens_per_iter = last['tokens'] / last['iter'] if last['iter'] else None
    return {'variant': name, 'flags': flags, 'seed': seed, 'args': run_args(flags, seed), 'duration_s': duration,
            'final_val_loss': last['val_loss'], 'best_val_loss': min(r['val_loss'] for r in records),
            'curve': [[r['iter'], r['val_loss'], r['elapsed_s']] for r in records], 'ms_per_iter': ms_per_iter,
            'tokens_per_s': tokens_per_iter / ms_per_iter * 1000 if ms_per_iter and tokens_per_iter else None,
            **checkpoint_figures(path, cwd)}


def write_json(path, obj):
    with open(path + '.tmp', 'w') as f:
        json.dump(obj, f, indent=1)
    os.replace(path + '.tmp', path)  # a done.json is whole or absent


def train_one(name, flags, seed, path, cwd):
    """Run train.py for one variant and seed into a fresh path; '' when it finished, else why it failed."""
    shutil.rmtree(path, ignore_errors=True)  # a half-finished run restarts from scratch
    os.makedirs(path)
    t0, log_path = time.time(), os.path.join(path, 'train.log')
    with open(log_path, 'w') as log:
        rc = subprocess.run([python or sys.executable, TRAIN_PY, *run_args(flags, seed), f'--out_dir={path}'],
                            cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, 'PYTHONUNBUFFERED': '1'}).returncode
    if rc != 0 or not os.path.exists(os.path.join(path, 'log.jsonl')):
        with open(log_path, errors='replace') as f:
            lines = [line.strip() for line in f if line.strip()]
        why = ([line for line in lines if line.startswith('error:')] or lines or ['(no output)'])[-1][:300]
        return f"(exit {rc}): {why}; see {log_path}"
    write_json(os.path.join(path, 'done.json'), summarize_run(path, name, flags, seed, round(time.time() - t0, 1), cwd))
    return ''


# ----------------------------------------------------------------------------- the report

def fmt(value, spec='.4f'):
    return 'n/a' if value is None else format(value, spec)


def mean_std(values):
    return f"{statistics.mean(values):.4f} ± {f'{statistics.stdev(values):.4f}' if len(values) > 1 else '—'}"


def mean_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def aggregate(runs):
    """A variant's means over seeds; its curve over the iterations every seed logged."""
    iters = sorted(set.intersection(*({c[0] for c in r['curve']} for r in runs)))
    curves = [{c[0]: c for c in r['curve']} for r in runs]
    ext = [r['extrapolation'] or {} for r in runs]
    return {'flags': runs[0]['flags'], 'seeds': [r['seed'] for r in runs], 'parameters': runs[0]['parameters'],
            **{k: statistics.mean(r[k] for r in runs) for k in ('final_val_loss', 'best_val_loss')},
            **{k: mean_or_none(r[k] for r in runs) for k in ('ms_per_iter', 'tokens_per_s', 'kv_bytes_per_token')},
            'extrapolation': {f'{m}x': mean_or_none(e.get(f'{m}x') for e in ext) for m in MULTIPLES},
            'curve': [[i, statistics.mean(c[i][1] for c in curves), statistics.mean(c[i][2] for c in curves)]
                      for i in iters]}


def plot(variants, x_index, xlabel, path):
    import matplotlib
    matplotlib.use('Agg')  # files only: no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, agg in variants.items():
        ax.plot([c[x_index] for c in agg['curve']], [c[1] for c in agg['curve']], marker='.', label=name)
    ax.set(xlabel=xlabel, ylabel='val loss (mean over seeds)', title=f'val loss vs {xlabel}: {train_config}')
    ax.grid(alpha=0.3)
    # the loss at iteration 0 (ln vocab) would squash the differences that matter: start the axis below it
    later = [c[1] for agg in variants.values() for c in agg['curve'][1:]]
    if later:
        ax.set_ylim(min(later) - 0.05, max(later) + 0.05)
    ax.legend(fontsize='small')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def shell_quote(arg):
    return arg if re.fullmatch(r'[\w@%+=:,./-]+', arg) else '"' + re.sub(r'(["\\$`])', r'\\\1', arg) + '"'


def write_report(out, order, failed):
    runs = []
    for root, _, files in os.walk(os.path.join(out, 'runs')):
        if 'done.json' in files:
            with open(os.path.join(root, 'done.json')) as f:
                runs.append(json.load(f))
    # this grid's order first, then variants of earlier invocations
    runs.sort(key=lambda r: (order.index(r['variant']) if r['variant'] in order else len(order), r['variant'],
                             r['seed']))
    names = dict.fromkeys(r['variant'] for r in runs)
    variants = {n: aggregate([r for r in runs if r['variant'] == n]) for n in names}
    command = ' '.join(['python ablate.py'] + [shell_quote(a) for a in sys.argv[1:]])
    write_json(os.path.join(out, 'results.json'), {'command': command, 'settings': settings, 'variants': variants,
                                                   'runs': runs})
    base = variants['vanilla']['final_val_loss'] if 'vanilla' in variants else None
    lines = [f"Base recipe `{train_config}`{f' with `{train_args}`' if train_args else ''}, seeds "
             f"{', '.join(str(1337 + s) for s in range(seeds))}; command: `{command}`", '',
             '| variant | flags | parameters | final val loss | best val loss | Δ final vs vanilla | ms/iter '
             '| tokens/s | KV cache bytes/token | val loss 1× | val loss 2× | val loss 4× |', '|' + ' --- |' * 12]
    for name, agg in variants.items():
        seeds_runs = [r for r in runs if r['variant'] == name]
        flags = ', '.join(f'{k}={v}' for k, v in agg['flags'].items()).replace('|', '\\|') or '(base recipe)'
        cells = [name, flags, fmt(agg['parameters'], ','), mean_std([r['final_val_loss'] for r in seeds_runs]),
                 mean_std([r['best_val_loss'] for r in seeds_runs]),
                 'n/a' if base is None else f"{agg['final_val_loss'] - base:+.4f}", fmt(agg['ms_per_iter'], '.1f'),
                 fmt(agg['tokens_per_s'], ',.0f'), fmt(agg['kv_bytes_per_token'], ',.0f')]
        lines.append('| ' + ' | '.join(cells + [fmt(agg['extrapolation'][f'{m}x']) for m in MULTIPLES]) + ' |')
    if failed:
        lines += ['', f"Failed in the last invocation (see their train.log): {', '.join(failed)}"]
    with open(os.path.join(out, 'results.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines) + '\n')
    if variants:
        plot(variants, 0, 'iteration', os.path.join(out, 'val_loss_vs_iter.png'))
        plot(variants, 2, 'time (s)', os.path.join(out, 'val_loss_vs_time.png'))
    print(f"report: {os.path.join(out, 'results.md')} ({len(runs)} finished runs of {len(variants)} variants)")


# ----------------------------------------------------------------------------- main

def fmt_duration(seconds):
    return f'{seconds:.0f} s' if seconds < 90 else f'{seconds / 60:.0f} min'


def main():
    if seeds < 1 or extrapolation_iters < 1:
        die(f"seeds and extrapolation_iters must be at least 1, got {seeds} and {extrapolation_iters}")
    cwd = os.path.abspath(run_dir or REPO)
    if not os.path.isfile(os.path.join(cwd, train_config)):
        die(f"train_config '{train_config}' not found in run_dir '{cwd}'")
    variants, out = build_grid(base_recipe(cwd)), os.path.abspath(out_dir)
    jobs = [(name, flags, 1337 + s, os.path.join(out, 'runs', name, f'seed{1337 + s}'))
            for name, flags in variants.items() for s in range(seeds)]
    todo = sum(not os.path.exists(os.path.join(path, 'done.json')) for *_, path in jobs)
    durations, failed = [], []
    for i, (name, flags, seed, path) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {name} seed {seed} ...", end=' ', flush=True)
        if os.path.exists(os.path.join(path, 'done.json')):
            with open(os.path.join(path, 'done.json')) as f:
                same = json.load(f)['args'] == run_args(flags, seed)
            print('skipped (finished' + ('' if same else ' with other arguments: delete its directory to rerun') + ')')
            continue
        t0, todo = time.time(), todo - 1
        why = train_one(name, flags, seed, path, cwd)
        if why:
            failed.append(f'{name} seed {seed}')
        else:
            durations.append(time.time() - t0)  # failures are quick: they would shrink the ETA
        eta = f", ETA {fmt_duration(statistics.mean(durations) * todo)}" if todo and durations else ''
        print((f"FAILED {why}" if why else f"done in {fmt_duration(durations[-1])}") + eta, flush=True)
    write_report(out, list(variants), failed)
    if failed:
        die(f"{len(failed)} run(s) failed: {', '.join(failed)} (their train.log is in {out}/runs/<variant>/seed<seed>)",
            code=1)


if __name__ == '__main__':
    try:
        main()
    except KeyboardInterrupt:
        die("interrupted: finished runs are kept; the same command resumes", code=130)
