"""ablate.py --compare: ordinary train.py runs (two recipes' out_dirs, no grid) through the report's machinery: the
table of the grid's report and their val loss against iterations, training FLOPs and seconds, into out_dir."""

import json
import os

from ablation.grid import ablate_command
from ablation.report import compare_variants, contention, goal_of, notes, plot, variant_table
from ablation.runs import summarize_run
from common.checkpoints import load_checkpoint, model_from_checkpoint
from common.errors import die
from common.files import output_refusal, write_output

PLOTS = (('iteration', 0, 'val_loss_vs_iter.png'), ('training FLOPs', 3, 'val_loss_vs_flops.png'),
         ('time (s)', 2, 'val_loss_vs_time.png'))


def run_dirs(compare):
    """The out_dirs named, each a finished train.py run (its log.jsonl and ckpt.pt), else one line."""
    dirs = [d.strip() for d in compare.split(',') if d.strip()]
    if len(dirs) < 2:
        die(f"compare needs two or more out_dirs of train.py runs, comma-separated, got {compare!r}")
    for d in dirs:
        missing = [f for f in ('log.jsonl', 'ckpt.pt') if not os.path.isfile(os.path.join(d, f))]
        if missing:
            die(f"compare: '{d}' is not a trained train.py out_dir (it has no {' and no '.join(missing)})")
    return dirs


def compared_run(path, cwd):
    """A run's figures as the report reads a grid's, named by its out_dir, with its model's arguments and the
    training FLOPs of a token (what train.py's flops_per_iter counts)."""
    checkpoint = load_checkpoint(os.path.join(path, 'ckpt.pt'))
    model = model_from_checkpoint(checkpoint, os.path.join(path, 'ckpt.pt'))
    with open(os.path.join(path, 'log.jsonl')) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    return {'variant': os.path.normpath(path), 'seed': (checkpoint.get('config') or {}).get('seed'),
            'model_args': checkpoint['model_args'], 'tokens_per_iter': last['tokens'] / max(last['iter'], 1),
            'flops_per_token': model.flops_per_token(), **summarize_run(path, cwd)}


def write_comparison(compare, out, cwd, settings):
    """results.md (the table: only the model flags in which the runs differ), results.json and the three plots."""
    dirs = run_dirs(compare)
    os.makedirs(out, exist_ok=True)
    for name in ('results.md', 'results.json') + tuple(p for *_, p in PLOTS):
        refusal = output_refusal(os.path.join(out, name))
        if refusal:
            die(f"cannot write the comparison's {name} in out_dir '{out}': {refusal}", code=1)
    runs = [compared_run(d, cwd) for d in dirs]
    keys = dict.fromkeys(k for r in runs for k in r['model_args'])
    differ = [k for k in keys if len({repr(r['model_args'].get(k)) for r in runs}) > 1]
    for run in runs:
        run['flags'] = {k: run['model_args'].get(k) for k in differ}
    names = [r['variant'] for r in runs]
    variants, reference = compare_variants(runs, names, [])
    for run in runs:  # each variant is one run: its curve gains the FLOPs trained by each evaluation
        for point in variants[run['variant']]['curve']:
            point.append(point[0] * run['tokens_per_iter'] * run['flops_per_token'])
    command = ablate_command()
    settings = {**settings, 'target': ''}  # the time to the reference's loss
    lines = [f"Runs compared: {', '.join(f'`{d}`' for d in dirs)}; command: `{command}`", '',
             *variant_table(variants, runs, reference, settings), *notes(variants, reference, 0)]
    if contention(runs):
        lines += ['', f"{contention(runs).capitalize()}."]
    write_output(os.path.join(out, 'results.json'), json.dumps({'command': command, 'variants': variants,
                                                                'runs': runs}, indent=1), 'results.json')
    write_output(os.path.join(out, 'results.md'), '\n'.join(lines) + '\n', 'results.md')
    goal_loss = goal_of(variants, reference, settings)[1]
    for xlabel, index, name in PLOTS:
        plot(variants, index, xlabel, os.path.join(out, name), f"val loss vs {xlabel}: {', '.join(names)}",
             goal_loss, contention(runs) if index == 2 else '')
    print(f"comparison: {os.path.join(out, 'results.md')} ({len(runs)} runs; plots of val loss against iterations, "
          f"FLOPs and seconds beside it)")
