"""The report: results.md's tables (a row per variant, the length table, a task's lengths, recall, the probes),
results.json and the plots, from every finished run; each file written aside and switched in, never over a
checkpoint."""

import json
import os
import re
import statistics
from collections import Counter

from ablation import miniseries
from ablation.files import read_json
from ablation.grid import ablate_command, made_here
from ablation.groups import default_pairs
from ablation.runs import MULTIPLES, PROBE_FIGURES, PROBE_ROWS, PROBE_SKIP, SCALINGS, SOLVED, finished, measure_lengths
from common.errors import die
from common.files import output_refusal, tmp_path, write_output
from stats import welch

REPORT_FILES = ('results.md', 'results.json', 'val_loss_vs_iter.png', 'val_loss_vs_time.png', 'accuracy_vs_width.png',
                'miniseries_loss_vs_flops.png', 'miniseries_multiplier_vs_flops.png')


def fmt(value, spec='.4f'):
    return 'n/a' if value is None else format(value, spec)


def mean_std(values, spec='.4f'):
    values = [v for v in values if v is not None]
    if not values:
        return 'n/a'
    if len(values) == 1:  # no spread to give
        return f"{values[0]:{spec}} (1 seed)"
    return f"{statistics.mean(values):{spec}} ± {statistics.stdev(values):{spec}}"


def mean_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def aggregate(runs, methods):
    """A variant's means over seeds; its curve over the iterations every seed logged."""
    iters = sorted(set.intersection(*({c[0] for c in r['curve']} for r in runs)))
    curves = [{c[0]: c for c in r['curve']} for r in runs]
    return {'flags': runs[0]['flags'], 'seeds': [r['seed'] for r in runs], 'parameters': runs[0]['parameters'],
            'active_parameters': runs[0]['active_parameters'],
            **{k: mean_or_none(r[k] for r in runs) for k in ('final_val_loss', 'best_val_loss', 'ms_per_iter',
                                                              'tokens_per_s', 'kv_bytes_per_token',
                                                              'load_max_over_mean')},
            **{k: mean_or_none(r.get(k) for r in runs) for k in ('accuracy', 'best_accuracy')},
            'lengths': mean_lengths([r.get('lengths') or {} for r in runs]),
            'probe': {k: mean_or_none((r.get('probe') or {}).get(k) for r in runs) for k in PROBE_FIGURES},
            'scaled_lengths': {m: mean_lengths([(r.get('scaled_lengths') or {}).get(m) or {} for r in runs])
                               for m in methods if m in SCALINGS},
            'diverged_at': [r['diverged_at'] for r in runs],
            'task': {k: mean_or_none((r.get('task') or {}).get(k) for r in runs)
                     for k in dict.fromkeys(k for r in runs for k in (r.get('task') or {}))},
            'extrapolation': {m: {x: mean_or_none((r.get('extrapolation') or {}).get(m, {}).get(x) for r in runs)
                                  for x in (f'{k}x' for k in MULTIPLES)} for m in methods},
            'curve': [[i, statistics.mean(c[i][1] for c in curves), statistics.mean(c[i][2] for c in curves)]
                      for i in iters]}


def mean_lengths(per_run):
    """{split: {'loss', 'accuracy'}} of several runs, each figure's mean over the runs that have it."""
    splits = dict.fromkeys(s for lengths in per_run for s in lengths)
    return {s: {k: mean_or_none((lengths.get(s) or {}).get(k) for lengths in per_run) for k in ('loss', 'accuracy')}
            for s in splits}


def seed_values(runs, name, key):
    return [r[key] for r in runs if r['variant'] == name and r.get(key) is not None]


def delta(agg, reference, key, n_seeds):
    """'+0.0123 (p 0.004)' against the reference's mean, '≈' marking a p >= 0.05; '(1 seed)': nothing to test."""
    if agg[key] is None or reference[key] is None:
        return 'n/a'
    text, test = f"{agg[key] - reference[key]:+.4f}", agg['welch'][key]
    if agg is reference:
        return text
    if test is None:
        return f"{text} ({n_seeds} seed{'s' if n_seeds > 1 else ''}: untested)"
    return f"{text} (p {test['p']:.2g}{' ≈' if test['p'] >= 0.05 else ''})"


def split_accuracies(runs, name, split):
    """Each seed's plain accuracy of a variant at an evaluation split ('val': train.py's val accuracy)."""
    return [a for a in ((r.get('accuracy') if split == 'val' else ((r.get('lengths') or {}).get(split) or {}).get(
        'accuracy')) for r in runs if r['variant'] == name) if a is not None]


def lengths_table(variants, runs, reference, extrapolation_iters):
    """A task's accuracy (loss) at each evaluation length (train.py's eval_splits, its last evaluation), each plain
    accuracy with Welch's p against the reference's at the same length."""
    splits = list(dict.fromkeys(s for agg in variants.values() for s in agg['lengths']))
    if not splits:
        return []
    lines = ['', "Accuracy (loss) at each evaluation length: plain, each run's last evaluation by train.py (p: Welch's "
                 f"test of its accuracy over seeds against {reference}'s at the same length; ≈: p >= 0.05); a RoPE "
                 f"scaling, its ckpt.pt stretched from the training length to the split's ({extrapolation_iters} "
                 "batches of the split's first examples); n/a: the positions cannot go there.", '',
             '| variant | positions | val (1x) | ' + ' | '.join(splits) + ' |', '|' + ' --- |' * (3 + len(splits))]

    def tested(name, split, figures):
        test = welch(split_accuracies(runs, name, split), split_accuracies(runs, reference, split)) \
            if name != reference else None
        return accuracy_cell(figures) + (f" p {test['p']:.2g}{' ≈' if test['p'] >= 0.05 else ''}" if test else '')

    for name, agg in variants.items():
        val = {'accuracy': agg['accuracy'], 'loss': agg['final_val_loss']}
        lines.append(f"| {name} | plain | {tested(name, 'val', val)} | "
                     + ' | '.join(tested(name, s, agg['lengths'].get(s)) for s in splits) + ' |')
        for method, figures in agg['scaled_lengths'].items():
            if figures:
                lines.append(f"| {name} | {method} | {accuracy_cell(figures.get('val'))} | "
                             + ' | '.join(accuracy_cell(figures.get(s)) for s in splits) + ' |')
    return lines


def recall_points(variants):
    """{name: (row, (L, pairs), width, rate)} of the recall group's variants
    ('<arch>_d=<width>_L=<L>[_P=<pairs>][_n=<layers>][_lr=<rate>]'; pairs L / 8 where the name has none, rate None
    where not swept); row is the architecture with its depth where depths are swept ('global n=2')."""
    points = {}
    for name in variants:
        match = re.fullmatch(r'(.+)_d=(\d+)_L=(\d+)(?:_P=(\d+))?(?:_n=(\d+))?(?:_lr=([\d.e+-]+))?', name)
        if match:
            length = int(match[3])
            row = match[1] + (f' n={match[5]}' if match[5] else '')
            points[name] = (row, (length, int(match[4] or default_pairs(length))), int(match[2]),
                            float(match[6]) if match[6] else None)
    return points


def recall_best(variants, runs):
    """{(row, task, width): (rate, accuracies of its seeds, variant)}: at each point the learning rate whose mean
    accuracy is highest (Zoology's protocol: the best of a sweep; the first of a tie), or the one rate run."""
    best = {}
    for name, (row, task, width, rate) in recall_points(variants).items():
        accuracies = seed_values(runs, name, 'accuracy')
        held = best.get((row, task, width))
        if accuracies and (held is None or statistics.mean(accuracies) > statistics.mean(held[1])):
            best[(row, task, width)] = (rate, accuracies, name)
    return best


def task_label(task):
    """'L=32' where the pair count is L's default (L / 8), else 'L=32 P=8'."""
    length, pairs = task
    return f'L={length}' + ('' if pairs == default_pairs(length) else f' P={pairs}')


def global_row(row):
    """The row an architecture's figures are tested against: global attention at the same depth."""
    _, _, depth = row.partition(' n=')
    return 'global' + (f' n={depth}' if depth else '')


def recall_table(variants, runs):
    """Zoology's figure as a table: each architecture's recall accuracy at every (L, pairs, width), tested against
    all global attention of the same shape, the architecture that solves it; the best rate's where rates are swept."""
    points = recall_points(variants)
    if not points:
        return []
    best = recall_best(variants, runs)
    swept = any(rate is not None for *_, rate in points.values())
    shapes = sorted({(task, width) for _, task, width, _ in points.values()})
    lines = ['', "Recall accuracy (val, the last evaluation; mean ± std over seeds) at each sequence length L (P: pairs "
                 "where not L / 8) and width d; p: Welch's test against global attention at the same L, P, d "
                 "(and depth n) (≈: p >= 0.05, noise could explain it). Chance is 1/num_pairs among the values of "
                 "an example." + (" At each point the learning rate with the best mean accuracy (@ its rate, as "
                                  "Zoology reports; every rate's figure is a variant of results.json)." if swept
                                  else ''), '',
             *shapes_header(shapes)]
    for row in dict.fromkeys(r for r, *_ in points.values()):
        cells = []
        for task, width in shapes:
            if (row, task, width) not in best:
                cells.append('-')
                continue
            rate, accuracies, _ = best[(row, task, width)]
            cell = f"{statistics.mean(accuracies):.3f}" + (
                f" ± {statistics.stdev(accuracies):.3f}" if len(accuracies) > 1 else ' (1 seed)') + \
                (f" @{rate:g}" if rate is not None else '')
            reference = best.get((global_row(row), task, width))
            test = welch(accuracies, reference[1]) if reference and row != global_row(row) else None
            cells.append(cell + (f" (p {test['p']:.2g}{' ≈' if test['p'] >= 0.05 else ''})" if test else ''))
        lines.append(f"| {row} | " + ' | '.join(cells) + ' |')
    return lines + solved_table(points, best, shapes, runs)


def solved_table(points, best, shapes, runs):
    """When each seed of a point crossed the phase change: the first evaluation at SOLVED accuracy or more, at the
    point's best rate (how much sooner one architecture learns the lookup than another)."""
    lines = ['', f"Iteration of the first evaluation at {SOLVED:g} accuracy or more, each seed in order (never: not in "
                 "its run), of the runs in the table above: where and how soon the phase change came.", '',
             *shapes_header(shapes)]
    for row in dict.fromkeys(r for r, *_ in points.values()):
        cells = [crossings(runs, best[(row, *shape)][2]) if (row, *shape) in best else '-' for shape in shapes]
        lines.append(f"| {row} | " + ' | '.join(cells) + ' |')
    return lines


def crossings(runs, name):
    """'750, never, 500': each seed's solved_at of a variant, in the runs' order."""
    return ', '.join('never' if r.get('solved_at') is None else str(r['solved_at'])
                     for r in runs if r['variant'] == name)


def shapes_header(shapes):
    """The recall tables' header lines: a column per (task, width)."""
    return ['| architecture | ' + ' | '.join(f'{task_label(task)} d={width}' for task, width in shapes) + ' |',
            '|' + ' --- |' * (1 + len(shapes))]


def plot_recall(variants, runs, path):
    """accuracy_vs_width.png: a panel per sequence length and pair count, a line per architecture (mean, ± std;
    the best rate's where rates are swept)."""
    best = recall_best(variants, runs)
    tasks = sorted({task for _, task, _ in best})
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        # past matplotlib's 10 colours the lines repeat one: a marker per decade tells them apart
        for i, row in enumerate(dict.fromkeys(r for r, _, _ in best)):
            at = sorted((w, v) for (r, t, w), (_, v, _) in best.items() if r == row and t == task)
            if at:
                ax.errorbar([w for w, _ in at], [statistics.mean(v) for _, v in at], marker='osD^v'[i // 10 % 5], capsize=3,
                            yerr=[statistics.stdev(v) if len(v) > 1 else 0 for _, v in at], label=row)
        title = f'L={task[0]}, {task[1]} pairs'
        ax.set(xscale='log', xlabel='width (n_embd)', ylabel='recall accuracy', title=title, ylim=(0, 1.05))
        ax.set_xticks(sorted({w for _, t, w in best if t == task}))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the widths run are labelled
        ax.grid(alpha=0.3)
        ax.legend(fontsize='small', loc='center left', bbox_to_anchor=(1, 0.5))
    save_figure(fig, path)


def accuracy_cell(figures):
    if not figures or figures.get('accuracy') is None:
        return 'n/a'
    return f"{figures['accuracy']:.3f} ({figures['loss']:.3f})"


def probes_table(variants):
    """The probes of each variant's ckpt.pt: the attention sink and massive activations."""
    probed = {n: agg['probe'] for n, agg in variants.items() if agg['probe']['sink_share'] is not None
              or agg['probe']['massive_ratio'] is not None}
    if not probed:
        return []
    lines = ['', f"Probes (probes.py) of each run's ckpt.pt on {PROBE_ROWS} fixed val rows: sink share, the attention "
                 f"a query gives the first position (mean over softmax layers and heads, and the largest head), over "
                 f"queries past the first {PROBE_SKIP}; equal attention would give it 1/(t+1) where the query sees "
                 f"position 0 and 0 where it does not (past a sliding window, or the first chunk of a chunked layer), "
                 f"whose mean over the same queries and layers is the 'equal' column: a share far above it is a sink. "
                 f"Massive ratio: the largest |activation| in the residual stream over its median, the largest over "
                 f"layers (n/a sink share: no softmax layer). Gradient across depth: the RMS of the loss's gradient "
                 f"with respect to the stream after each block (next-token loss on the same rows), the first block's "
                 f"over the last's (above 1: it grows on its way down) and the largest over the smallest.", '',
             '| variant | sink share (mean) | sink share (max) | equal | massive ratio | grad first/last | grad max/min |',
             '|' + ' --- |' * 7]
    ratios = ('massive_ratio', 'grad_first_over_last', 'grad_max_over_min')
    for name, figures in probed.items():
        lines.append('| ' + ' | '.join([name] + [fmt(figures[k], '.3f') for k in PROBE_FIGURES if k not in ratios]
                                       + [fmt(figures[k], '.1f' if k == 'massive_ratio' else '.2f') for k in ratios])
                     + ' |')
    return lines


def methods_asked(settings):
    return [m.strip() for m in settings['extrapolation'].split(',') if m.strip()]


def plot_title(xlabel, settings):
    """The variants are the grid's flags on the base recipe (a vanilla one, even when every variant is modern)."""
    return (f"val loss vs {xlabel}: grid {settings['grid']}, each variant's flags on "
            f"{os.path.basename(settings['train_config'])}")


def contention(runs):
    """A line saying the runs' timings were contended (the machine's load average above its cores while some
    ran: each waited for a core, so ms/iter and seconds compare poorly), or ''."""
    loaded = [r for r in runs if r.get('load_avg') is not None and r['load_avg'] > r['cores']]
    if not loaded:
        return ''
    worst = max(loaded, key=lambda r: r['load_avg'] / r['cores'])
    return (f"timings contended: load average above the cores in {len(loaded)} of {len(runs)} runs (up to "
            f"{worst['load_avg']:.1f} on {worst['cores']}): seconds and ms/iter compare poorly")


MARKERS, LINESTYLES = 'osD^v<>px*', ('-', '--', ':', '-.')


def loss_figure(variants, x_index, xlabel, title, goal_loss=None, note=''):
    """val loss against curve column x_index, every point on the chart (a log axis: the start's ln(vocab) and the
    end's small differences both readable), each line its own marker and, past 10, dash: none hides another."""
    import matplotlib
    matplotlib.use('Agg')  # files only: no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, agg) in enumerate(variants.items()):
        ax.plot([c[x_index] for c in agg['curve']], [c[1] for c in agg['curve']], label=name, alpha=0.8,
                marker=MARKERS[i % len(MARKERS)], markersize=4, linestyle=LINESTYLES[i // len(MARKERS) % 4])
    if goal_loss is not None:  # the target: where a curve first crosses it is its time to target
        ax.axhline(goal_loss, color='grey', linestyle='--', linewidth=1, label=f'target {goal_loss:.4f}')
    ax.set(xlabel=xlabel, ylabel='val loss (mean over seeds)', title=title, yscale='log')
    shown = [c[1] for agg in variants.values() for c in agg['curve'] if 0 < c[1] < 1e3]  # not a diverged run's
    if shown:
        ax.set_ylim(0.97 * min(shown), 1.03 * max(shown))
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(alpha=0.3, which='both')
    if note:
        ax.text(0.5, 0.98, note, transform=ax.transAxes, ha='center', va='top', fontsize='small', color='darkred',
                wrap=True)
    ax.legend(fontsize='small')
    return fig


def plot(variants, x_index, xlabel, path, title, goal_loss=None, note=''):
    save_figure(loss_figure(variants, x_index, xlabel, title, goal_loss, note), path)


def save_figure(fig, path):
    import matplotlib.pyplot as plt
    fig.tight_layout()
    tmp = tmp_path(path)  # written aside and switched in: a reader never sees half a picture
    try:
        fig.savefig(tmp, format='png', dpi=120)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.lexists(tmp):
            os.remove(tmp)


def check_report_files(out):
    """One line and exit if a report file may not be written in out (one is a checkpoint, a hard link, a
    directory): outputs never replace those."""
    for name in REPORT_FILES:
        refusal = output_refusal(os.path.join(out, name))
        if refusal:
            die(f"cannot write the report's {name} in out_dir '{out}': {refusal}", code=1)


def finished_runs(out, cwd, settings):
    """(runs, roots, other): the figures (done.json, read now: runs other processes finished are in) and the
    directories of the finished runs made with this invocation's train_config and train_args, and the names of
    those made with others."""
    runs, roots, other = [], [], []
    for root, _, files in sorted(os.walk(os.path.join(out, 'runs'))):
        if 'done.json' in files:
            done = read_json(os.path.join(root, 'done.json'))
            if not made_here(done, settings):
                other.append(f"{done['variant']} seed {done['seed']}")
                continue
            runs.append(finished(root, cwd))
            roots.append(root)
    return runs, roots, other


def compare_variants(runs, order, methods, references=None):
    """(variants, reference): each variant's means over its seeds, each difference to its reference over seeds
    tested against noise. runs is sorted as the variants: this grid's order first, then variants of earlier
    invocations. references: {variant: the variant it is compared with} where not the grid's one reference (a
    miniseries: the target at the same depth); each variant's is kept as its 'reference'."""
    runs.sort(key=lambda r: (order.index(r['variant']) if r['variant'] in order else len(order), r['variant'],
                             r['seed']))
    names = dict.fromkeys(r['variant'] for r in runs)
    variants = {n: aggregate([r for r in runs if r['variant'] == n], methods) for n in names}
    reference = 'vanilla' if 'vanilla' in variants else next(iter(variants), None)
    for name, agg in variants.items():
        ref = (references or {}).get(name, reference)
        agg['reference'] = ref = ref if ref in variants else reference
        agg['welch'] = {k: welch(*(seed_values(runs, n, k) for n in (name, ref))) if name != ref else None
                        for k in ('final_val_loss', 'accuracy')}
    return variants, reference


def goal_of(variants, reference, settings):
    """(the variant whose mean final val loss is the target loss: settings' target, else the reference; the loss)."""
    goal = settings['target'] if settings['target'] in variants else reference
    return goal, (variants[goal]['final_val_loss'] if goal else None)


def time_to_target(run, loss):
    """(the first evaluated iteration, its elapsed seconds) at which a run's val loss is at most `loss`, or None
    (the speedrun's yardstick: how soon, not how low)."""
    return next(((i, s) for i, v, s in run['curve'] if loss is not None and v <= loss), None)


def reach_cell(runs, reference_runs, loss, index):
    """Iterations (index 0) or seconds (1) to the target: mean ± std over the seeds that reached it, p against the
    reference's seeds (None: these are the reference's), and how many did not."""
    reached = [t[index] for t in (time_to_target(r, loss) for r in runs) if t is not None]
    if not reached:
        return 'not reached'
    ref = [t[index] for t in (time_to_target(r, loss) for r in reference_runs or []) if t is not None]
    test = welch(reached, ref) if reference_runs else None
    missed = len(runs) - len(reached)
    return mean_std(reached, '.0f') + (f" (p {test['p']:.2g}{' ≈' if test['p'] >= 0.05 else ''})" if test else '') + \
        (f", {missed} not reached" if missed else '')


def main_table(variants, runs, reference, command, settings):
    """The report's first lines: the base recipe and command, then a row per variant."""
    train_args = settings['train_args']
    return [f"Base recipe `{settings['train_config']}`{f' with `{train_args}`' if train_args else ''}, seeds "
            f"{', '.join(str(1337 + s) for s in range(settings['seeds']))}; command: `{command}`", '',
            *variant_table(variants, runs, reference, settings)]


def at_depth(variants):
    """'<member> at its depth' where the variants are compared with references of their own (a miniseries' target
    at each depth, named <member>_depth=<d>), else None."""
    refs = {agg['reference'] for agg in variants.values()}
    if len(refs) < 2:
        return None
    return f"{re.sub(r'_depth=[0-9]+$', '', sorted(refs)[0])} at its depth"


def variant_table(variants, runs, reference, settings):
    """A row per variant; a column only where some row has something in it (a grid without MoE has no load
    column, one where nothing diverged no 'diverged at'), and no '(1 seed)' in every cell where every variant
    ran one seed (the line above the table says so once)."""
    # how soon each seed's val loss is at the target's mean final loss, in iterations and in seconds; where the
    # variants have references of their own (a miniseries' depths), at their reference's
    goal = goal_of(variants, reference, settings)[0]
    own = any(agg['reference'] != reference for agg in variants.values())
    seeds_of = {name: [r for r in runs if r['variant'] == name] for name in variants}
    one_seed = all(len(rs) == 1 for rs in seeds_of.values())
    spread = (lambda values, spec='.4f': mean_std(values, spec).replace(' (1 seed)', '')) if one_seed else mean_std

    def delta_cell(agg, key, n):
        text = delta(agg, variants[agg['reference']], key, n)
        return text.partition(' (')[0] if one_seed else text

    def flags(agg):
        return ', '.join(f'{k}={v}' for k, v in agg['flags'].items()).replace('|', '\\|') or '(base recipe)'

    def reach(name, index):
        to = variants[name]['reference'] if own else goal
        cell = reach_cell(seeds_of[name], seeds_of[to] if name != to else None, variants[to]['final_val_loss'], index)
        return cell.replace(' (1 seed)', '') if one_seed else cell

    versus = at_depth(variants) or reference
    goal_said = versus if own else goal
    # (header, cell of a variant); the task metrics and a task dataset's accuracy where runs logged them
    columns = [('variant', lambda n, a: n), ('flags', lambda n, a: flags(a)),
               ('parameters', lambda n, a: fmt(a['parameters'], ',')),
               ('active', lambda n, a: fmt(a['active_parameters'], ',')),
               ('final val loss', lambda n, a: spread([r['final_val_loss'] for r in seeds_of[n]])),
               ('best val loss', lambda n, a: spread([r['best_val_loss'] for r in seeds_of[n]])),
               (f'Δ final vs {versus}', lambda n, a: delta_cell(a, 'final_val_loss', len(seeds_of[n]))),
               (f"iters to {goal_said}'s loss", lambda n, a: reach(n, 0)), ('seconds to it', lambda n, a: reach(n, 1)),
               ('ms/iter', lambda n, a: fmt(a['ms_per_iter'], '.1f')),
               ('tokens/s', lambda n, a: fmt(a['tokens_per_s'], ',.0f')),
               ('KV cache bytes/token', lambda n, a: fmt(a['kv_bytes_per_token'], ',.0f')),
               ('load max/mean', lambda n, a: fmt(a['load_max_over_mean'], '.2f')),
               ('diverged at', lambda n, a: ', '.join(str(d) for d in a['diverged_at'] if d is not None) or '-')]
    columns += [(t, lambda n, a, t=t: fmt(a['task'].get(t)))
                for t in dict.fromkeys(k for agg in variants.values() for k in agg['task'])]
    if any(agg['accuracy'] is not None for agg in variants.values()):
        columns += [('val accuracy', lambda n, a: spread([r['accuracy'] for r in seeds_of[n]])),
                    (f'Δ accuracy vs {versus}', lambda n, a: delta_cell(a, 'accuracy', len(seeds_of[n])))]
    cells = {name: [cell(name, agg) for _, cell in columns] for name, agg in variants.items()}
    empty = {'n/a', '-'}
    shown = [i for i, (header, _) in enumerate(columns) if i < 11 or any(c[i] not in empty for c in cells.values())]
    lines = ["One seed each: no spread and no test.", ''] if one_seed and variants else []
    lines += ['| ' + ' | '.join(columns[i][0] for i in shown) + ' |', '|' + ' --- |' * len(shown)]
    return lines + ['| ' + ' | '.join(c[i] for i in shown) + ' |' for c in cells.values()]


def other_commands(runs, command):
    """A line naming the commands of the runs an earlier invocation made (the header names this one only)."""
    counts = Counter(run.get('command') for run in runs if run.get('command') != command)
    if not counts:
        return []
    return ['', 'Runs in this report made by other commands: ' + '; '.join(
        f"{n} by `{key}`" if key else f"{n} made before runs kept their command" for key, n in counts.items()) + '.']


def notes(variants, reference, n_layer):
    """What the main table's figures are: the test, the timing, LLLG standing in for Gemma 3's ratio."""
    against = at_depth(variants) or reference
    lines = ['', f"p: Welch's two-sided t-test over seeds against {against} (stats.welch); ≈: p >= 0.05, a "
                 f"difference noise could explain; the per-seed figures are in results.json's runs."]
    lines += ['', "ms/iter and tokens/s come from runs trained one after another (or `parallel` at once) on this "
                  "machine: another job's load during one run slows it alone, so compare them across variants with "
                  "care; bench.py times variants side by side, its steps taken in turn."]
    if 'layers=LLLG' in variants:
        lines += ['', "layers=LLLG is 3 local layers to 1 global (OLMo 3's ratio), not Gemma 3's 5:1 'LLLLLG'" + (
            f", which tiled over this {n_layer}-layer model would be {('LLLLLG' * n_layer)[:n_layer]!r}: LLLG stands "
            f"in for it" if n_layer < 6 else "; add that with --grid=custom") + '.']
    return lines


def extrapolation_table(variants, no_data, extrapolation_iters):
    """Each variant's val loss at multiples of its trained block_size, a row per method; the runs left out. No rows
    (a task's runs, scored by the lengths table instead; no ckpt.pt): a line saying so, not an empty table."""
    rows = [f"| {name} | {method} | " + ' | '.join(fmt(v) for v in losses.values()) + ' |'
            for name, agg in variants.items() for method, losses in agg['extrapolation'].items()
            if any(v is not None for v in losses.values())]
    lines = ['', "Val loss at multiples of the trained block_size: none to show (runs on a task dataset are scored at "
                 "each evaluation length instead, below; a run without ckpt.pt has none)."] if not rows else [
             '', f"Val loss at multiples of the trained block_size (each run's ckpt.pt, {extrapolation_iters} "
                 f"batches per length; n/a: learned positions cannot go past 1x). 1× is not the final val loss "
                 f"above: it is the loss of ckpt.pt (the best val loss's checkpoint unless "
                 f"always_save_checkpoint=True) on {extrapolation_iters} batches of the length table's own seed, "
                 f"the same for every variant, where the val loss columns are train.py's eval_iters batches; "
                 f"the two differ by that sampling (and by which checkpoint).", '',
             '| variant | method | ' + ' | '.join(f'{k}×' for k in MULTIPLES) + ' |',
             '|' + ' --- |' * (2 + len(MULTIPLES))] + rows
    if no_data:
        lines += ['', f"Not in the length table (rerun once the data is back): "
                      f"{', '.join(f'{run} ({why})' for run, why in no_data.items())}"]
    return lines


def miniseries_figures(runs, series, settings):
    """The miniseries' part of the report: each of its runs' record (member, depth, params, flops, ...: added to
    results.json's runs too), the fits and multipliers, results.md's lines."""
    members = list(dict.fromkeys(member for member, _, _ in series.values()))
    target = miniseries.target_of(dict.fromkeys(members), settings)
    records = miniseries.series_runs(runs, series)
    figures = miniseries.judge(records, target) if records else {axis: None for axis in miniseries.AXES}
    depths = sorted({depth for _, depth, _ in series.values()})
    multipliers = {m: {axis: miniseries.json_ready({k: v for k, v in (f['members'].get(m) or {}).items()})
                       for axis, f in figures.items() if f and f.get('members')} for m in members if m != target}
    return {'records': records, 'figures': figures, 'target': target,
            'lines': miniseries.report_lines(records, figures, depths, target, settings),
            'json': {'miniseries': {'depths': depths, 'target': target, 'aspect': settings['aspect'],
                                    'head_dim': settings['head_dim'], 'tokens_per_param': settings['tokens_per_param'],
                                    'fits': {axis: miniseries.json_ready(f['fit']) if f else None
                                             for axis, f in figures.items()}},
                     'multipliers': multipliers}}


def series_references(series, settings):
    """{variant: the target's variant at its depth} for a miniseries' plan, else None (the grid's one reference):
    a deeper model's loss against the shallowest vanilla says only that depth helps."""
    if not series:
        return None
    target = miniseries.target_of(dict.fromkeys(member for member, _, _ in series.values()), settings)
    target_at = {depth: name for name, (member, depth, _) in series.items() if member == target}
    return {name: target_at.get(depth, name) for name, (_, depth, _) in series.items()}


def write_report(out, order, failed, cwd, n_layer, settings, series=None):
    """Write results.md, results.json and the plots from every finished run (its done.json, read now: runs other
    processes finished are in); the set of the runs' directories it holds. series: the miniseries' plan
    ({variant: (member, depth, flags)}), whose section and plots it adds."""
    check_report_files(out)  # before the minutes of the length table
    runs, roots, other = finished_runs(out, cwd, settings)
    methods, iters = methods_asked(settings), settings['extrapolation_iters']
    no_data = measure_lengths(runs, roots, cwd, methods, iters)
    reported = {os.path.abspath(root) for root in roots}
    variants, reference = compare_variants(runs, order, methods, series_references(series, settings))
    command = ablate_command()
    judged = miniseries_figures(runs, series, settings) if series else None
    write_output(os.path.join(out, 'results.json'), json.dumps({'command': command, 'settings': dict(settings),
                                                                'variants': variants, 'runs': runs,
                                                                **(judged['json'] if judged else {})}, indent=1),
                 'results.json')
    lines = main_table(variants, runs, reference, command, settings) + other_commands(runs, command) + \
        notes(variants, reference, n_layer) + (['', f"{contention(runs).capitalize()}."] if contention(runs) else []) + \
        (judged['lines'] if judged else [])
    if methods:
        lines += extrapolation_table(variants, no_data, iters)
    lines += lengths_table(variants, runs, reference, iters) + recall_table(variants, runs) + probes_table(variants)
    target = settings['target']
    if target and target not in variants:
        lines += ['', f"target {target!r} has no finished runs here: the columns to the target use {reference!r}"]
    if other:
        lines += ['', f"Not in this report, made with another train_config or train_args: {', '.join(other)}"]
    if failed:
        lines += ['', f"Failed in the last invocation (see their train.log): {', '.join(failed)}"]
    write_output(os.path.join(out, 'results.md'), '\n'.join(lines) + '\n', 'results.md')
    if variants:
        goal_loss = goal_of(variants, reference, settings)[1]
        plot(variants, 0, 'iteration', os.path.join(out, 'val_loss_vs_iter.png'), plot_title('iteration', settings),
             goal_loss)
        plot(variants, 2, 'time (s)', os.path.join(out, 'val_loss_vs_time.png'), plot_title('time (s)', settings),
             goal_loss, contention(runs))
    if judged and judged['records']:
        miniseries.plot_series(judged['records'], judged['figures'], judged['target'],
                               os.path.join(out, 'miniseries_loss_vs_flops.png'),
                               os.path.join(out, 'miniseries_multiplier_vs_flops.png'),
                               f"grid {settings['grid']} on {os.path.basename(settings['train_config'])}")
    if recall_best(variants, runs):
        plot_recall(variants, runs, os.path.join(out, 'accuracy_vs_width.png'))
    print(f"report: {os.path.join(out, 'results.md')} ({len(runs)} finished runs of {len(variants)} variants)")
    return reported
