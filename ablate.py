"""
Train a grid of block variants on the same data, batches and seeds; report losses, speed, size and length
extrapolation side by side (out_dir: results.md, results.json, val_loss_vs_iter.png, val_loss_vs_time.png).

    python ablate.py config/ablate_shakespeare_char.py
    python ablate.py config/ablate_shakespeare_char.py --grid=default,kv --n_kv_heads=1,2,4 --seeds=3
    python ablate.py config/ablate_shakespeare_char.py --grid=moe --seeds=3 --parallel=2
    python ablate.py --grid=custom --custom="{'vanilla': {}, 'tiny_rope': {'pos': 'rope', 'rope_theta': 500.0}}"
    python ablate.py --compare=out-shakespeare-vanilla-cpu,out-shakespeare-modern-cpu --out_dir=out-compare

Each variant x seed (1337, 1338, ...) is a run `python train.py <train_config> <settings> <train_args> --seed=<seed>
--out_dir=<out_dir>/runs/<variant>/seed<seed>` in run_dir ('': this repo), logged to train.log there; a variant's
settings are train.py settings, model flags or others (learning_rate in the stability group). A finished run holds
done.json and is skipped next time (one made with other arguments is kept, and the new one trains beside it);
the report is rewritten from every finished run made with this invocation's train_config and train_args (runs
made with others are left out, and named). train_config must be the vanilla
GPT-2 block; the swaps come from model.SWAPS.
grid: groups, comma-separated (the list below: every group of ablation/groups.py's GROUPS). Other learning rates:
--train_args='--learning_rate=...'.
extrapolation: the methods of the length table: the val loss of each RoPE run's ckpt.pt (on val.bin or the val
shards) at 1x, 2x, 4x and 8x its block_size, with plain RoPE, linear, dynamic NTK, YaRN (each stretched to the
length) or a sliding window of block_size; learned positions give 1x only.
parallel: runs at once; devices: a device per slot (cuda:0,cuda:1,...); threads: each run's intra-op threads, by
default the usable cores (train.py's own default) shared out among the parallel runs (torch's default, every core for
each run, would make runs and other work wait on each other).
miniseries: depths (at least 3): every member of the grid trained at each depth, n_embd = aspect x depth with heads
head_dim wide, for tokens_per_param x the target's non-embedding parameters (the same for every member at a depth,
the schedule at the recipe's fractions of each run's length); the report adds each member's compute multiplier
against the target (--target, else the reference) on FLOPs, steps and seconds, with 90% intervals and its trend
with scale (miniseries_loss_vs_flops.png, miniseries_multiplier_vs_flops.png; docs/miniseries.md).
Several ablate.py (one per node) can share an out_dir: each run is claimed, so no two train the same one.
compare: runs trained outside a grid (train.py's out_dirs, two or more), reported as a grid's variants are: the
table, and val loss against iterations, training FLOPs and seconds (val_loss_vs_flops.png too); no run trains.
"""

import ast
import io
import os
import shutil
import signal
import sys
import textwrap
import tokenize
from collections import deque

from configurator import configure, settings_of


def grid_groups():
    """'Grid groups:' and each group of ablation/groups.py's GROUPS with the comment above its entry, read from the
    source: --help answers before torch loads, and lists every group there is."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ablation', 'groups.py')
    with open(path, encoding='utf-8') as f:
        source = f.read()
    comments = {t.start[0]: t.string.lstrip('# ') for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT and t.line.lstrip().startswith('#')}  # lines of comment alone
    table = next(node.value for node in ast.parse(source).body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], 'id', None) == 'GROUPS')
    groups = []
    for key in table.keys:
        above, line = [], key.lineno - 1
        while line in comments:
            above.insert(0, comments[line])
            line -= 1
        groups.append(f"{key.value} ({' '.join(above)})" if above else key.value)
    return textwrap.fill('Grid groups: ' + ', '.join(groups) + '.', width=116, break_on_hyphens=False)

out_dir = 'out-ablate'
train_config = 'config/shakespeare_vanilla_cpu.py'  # the base recipe of every run
seeds = 1
grid = 'default'
n_kv_heads = ''  # for the kv group, e.g. '1,2,4'
learning_rates = '1e-3,3e-3,1e-2,3e-2'  # for the stability group
adamw_lrs = '3e-4,1e-3,3e-3'  # for the optimizer group: AdamW's peak rates
muon_lrs = '0.005,0.01,0.02,0.04'  # for the optimizer group: Muon's (AdamW keeps the recipe's for the rest)
target = ''  # a variant whose mean final val loss is the target the "iters to" and "seconds to it" columns time each variant to; '' the reference
members = ''  # only these variants of the grid's groups, e.g. 'modern+muon,+bigram' ('' every one)
custom = ''  # e.g. "{'tiny_rope': {'pos': 'rope', 'rope_theta': 500.0}}"
train_args = ''  # passed to every train.py run, e.g. '--max_iters=20 --eval_interval=10'
recall_widths = '32,64,128'  # the recall group's n_embd (n_head = n_embd // 32: heads 32 wide)
recall_lengths = '32,64,128'  # the recall group's seq_len L: the dataset data/recall_<L> (num_pairs L / 8)
recall_pairs = ''  # the recall group's pair counts at every L, e.g. '4,8' ('' is L / 8); others read data/recall_<L>_p<P>
recall_archs = 'global,DDDG,D,L,mla'  # the recall group's architectures: global, mla, dsa, blocks (an indexer reading L/4 keys: tokens, or 4 blocks), or a layers pattern (KKKG, S, ...)
recall_depths = ''  # the recall group's n_layer, e.g. '2,4' ('' the recipe's); a longer pattern keeps each kind once ('DDDG' at 2 is 'DG')
recall_lrs = ''  # the recall group's learning rates, e.g. '3e-4,1e-3,3e-3' ('' the recipe's): the table gives the best rate's accuracy
extrapolation = 'plain'  # methods of the length table: plain, linear, dynamic, yarn, window; '' for none
extrapolation_iters = 20  # batches per length and method
parallel = 1  # runs at once
threads = 0  # each run's intra-op threads (its OMP_NUM_THREADS); 0: ablate's own (the usable cores on a CPU, or OMP_NUM_THREADS) shared out among the parallel runs, at least 1 each
devices = ''  # e.g. 'cuda:0,cuda:1': the device of each parallel slot; '' keeps the recipe's
miniseries = ''  # depths, e.g. '1,2,3,4': every member of the grid at each depth, judged by compute multipliers (docs/miniseries.md)
aspect = 64  # the miniseries' n_embd = aspect x depth (nanochat's aspect ratio)
head_dim = 0  # the miniseries' head width (n_head = n_embd / head_dim); 0: the recipe's n_embd / n_head
tokens_per_param = 20.0  # the miniseries' tokens at each depth: this x the target's non-embedding (active) parameters
report_only = False  # write the report from the runs finished so far, training none (e.g. after an interrupt)
compare = ''  # train.py out_dirs, e.g. 'out-a,out-b': their table and val loss plots into out_dir; no grid
python = ''  # '' is this interpreter
run_dir = ''
settings = configure(settings_of(globals()), sys.argv[1:], prog='ablate.py',
                     doc=f"{__doc__.rstrip()}\n{grid_groups()}\n")
globals().update(settings)
METHODS = ('plain', 'linear', 'dynamic', 'yarn', 'window')


def check(ok, message):
    if not ok:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


# settings that are wrong whatever the machine: said before torch loads
check(seeds >= 1 and extrapolation_iters >= 1 and parallel >= 1, f"seeds, extrapolation_iters and parallel must be at "
      f"least 1, got {seeds}, {extrapolation_iters} and {parallel}")
check(threads >= 0, f"threads must be >= 0 (0: the usable cores shared out among the runs), got {threads}")
check(not python or shutil.which(python), f"python '{python}' is not an executable (give a path or a command on PATH, "
      f"or '' for this one)")
check(not os.path.exists(out_dir) or os.path.isdir(out_dir), f"out_dir '{out_dir}' is a file, not a directory")
unknown_methods = [m.strip() for m in extrapolation.split(',') if m.strip() and m.strip() not in METHODS]
check(not unknown_methods, f"unknown extrapolation method(s) {', '.join(map(repr, unknown_methods))}; methods are "
      f"{', '.join(METHODS)}")

# the heavy imports only now (torch comes with them): --help and a mistyped setting answer before torch loads
from ablation.files import REPO  # noqa: E402
from ablation.grid import base_recipe, build_grid, run_path  # noqa: E402
from ablation.estimate import grid_estimate  # noqa: E402
from ablation.jobs import Runner, run_threads  # noqa: E402
from ablation.miniseries import plan  # noqa: E402
from ablation.report import check_report_files, write_report  # noqa: E402
from common.errors import Interrupted, die  # noqa: E402


def main():
    cwd, out = os.path.abspath(run_dir or REPO), os.path.abspath(out_dir)
    if compare:
        from ablation.compare import write_comparison
        return write_comparison(compare, out, cwd, settings)
    if not os.path.isfile(os.path.join(cwd, train_config)):
        die(f"train_config '{train_config}' not found in run_dir '{cwd}'")
    base = base_recipe(cwd, settings)
    series = plan(base, settings, build_grid, target_model) if miniseries.strip() else None
    variants = {name: flags for name, (_, _, flags) in series.items()} if series else build_grid(base, settings)
    if os.path.isdir(out):  # said before the runs, not after hours of training
        check_report_files(out)
    jobs = deque((name, flags, 1337 + s, run_path(out, name, flags, 1337 + s, settings))
                 for name, flags in variants.items() for s in range(seeds))
    estimates = {} if report_only else grid_estimate(
        [j for j in jobs if not os.path.exists(os.path.join(j[3], 'done.json'))], base, settings,
        run_threads(threads, parallel)[0])
    failed, busy = ([], []) if report_only else Runner(jobs, cwd, settings, estimates).run()
    reported = write_report(out, list(variants), failed, cwd, base['n_layer'], settings, series)
    busy = [name for name, path in busy if os.path.abspath(path) not in reported]  # unless finished meanwhile
    if busy:
        print(f"{len(busy)} run(s) were being trained elsewhere and are not in the report yet: {', '.join(busy)}")
    if failed:
        die(f"{len(failed)} run(s) failed: {', '.join(failed)} (their train.log is in {out}/runs/<variant>/seed<seed>)",
            code=1)


def target_model(recipe):
    """The model a recipe builds (the miniseries counts its target's parameters on it)."""
    from ablation.groups import base_vocab, model_args
    from chapters import GPT, GPTConfig
    return GPT(GPTConfig(**model_args(recipe), vocab_size=base_vocab(recipe, settings)))


def interrupted(signum, frame):
    """Ctrl-C or `kill`: stop the runs (the runner's cleanup) and say so in one line, exit 128 + the signal. Only
    the first signal stops: a second would land in that cleanup."""
    for other in (signal.SIGINT, signal.SIGTERM):
        signal.signal(other, signal.SIG_IGN)
    raise Interrupted(signum)


if __name__ == '__main__':
    handlers = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        main()
    except KeyboardInterrupt as e:
        die(f"interrupted ({e if isinstance(e, Interrupted) else 'SIGINT'}): finished runs are kept; the same command "
            f"resumes", code=getattr(e, 'code', 130))
    finally:  # run in a process that goes on (a test's): its own handlers back
        for s, handler in handlers.items():
            signal.signal(s, handler)
