"""The miniseries: a grid's members trained at several depths, depth the one knob (nanochat's miniseries), and each
member judged by its compute multiplier against the target member: the factor of compute the target needs to reach
that member's loss, on three axes (training FLOPs, steps, seconds) and at each size, with how it moves with scale.

Sizing, at each depth d of --miniseries: n_embd = aspect x d, heads head_dim wide (nanochat: aspect 64, head_dim
128; its depth-20 model is 1280 wide), and tokens = tokens_per_param x the target's non-embedding parameters at that
depth (active ones for MoE; nanochat's target-param-data-ratio, Chinchilla's ~20), the same tokens for every member
at that depth: members compare at equal data and differ in FLOPs as their blocks do. The learning-rate schedule
(warmup, decay) and the evaluations keep the recipe's fractions of each run's length.

The fit, per axis: L(x) = E + A_m x^-alpha_m for each member m, E shared by every member (the loss no amount of
compute removes is the data's and the tokenizer's, not a block's: Chinchilla's E; with 3-5 sizes a member's own E
would soak up its noise and decide its multiplier). The multiplier of member m at its compute x is x_T(L_m) / x,
x_T the target's fitted curve inverted; its trend is the slope of ln(multiplier) against ln(x) over the depths
(> 0: the gain grows with scale). Intervals: 90%, a bootstrap that redraws each (member, depth)'s seeds.
"""

import math
import random
import statistics

from ablation.groups import int_list
from ablation.runs import scaling_params
from common.errors import die

AXES = {'flops': 'training FLOPs', 'steps': 'steps', 'seconds': 'training seconds'}
SIZES = ('n_layer', 'n_embd', 'n_head')
SCHEDULE = ('max_iters', 'lr_decay_iters', 'warmup_iters', 'eval_interval')
BOOTSTRAP, LEVEL, BOOTSTRAP_SEED = 300, 0.90, 20240601
EXTRAPOLATION = 2.0  # a multiplier that reads the target's curve past this times its largest measured x says so


# ----------------------------------------------------------------------------- the plan: members at each depth

def depths_of(settings):
    """The depths of --miniseries, checked before any run: at least 3 different ones (a curve of 3 parameters)."""
    depths = sorted(set(int_list(settings['miniseries'], 'miniseries')))
    if len(depths) < 3:
        die(f"miniseries needs at least 3 different depths for its fit (E + A x^-alpha has 3 parameters), got "
            f"{settings['miniseries']!r}; e.g. --miniseries=1,2,3,4")
    for name in ('aspect', 'tokens_per_param'):
        if not (isinstance(settings[name], (int, float)) and math.isfinite(settings[name]) and settings[name] > 0):
            die(f"{name} must be a positive number, got {settings[name]!r}")
    if settings['head_dim'] < 0:
        die(f"head_dim must be positive (0: the recipe's n_embd / n_head), got {settings['head_dim']}")
    return depths


def sizes_at(base, depth, settings):
    """n_layer, n_embd = aspect x depth and n_head = n_embd / head_dim; a width the heads do not divide is one line."""
    head = settings['head_dim'] or base['n_embd'] // base['n_head']
    width = round(settings['aspect'] * depth)
    if width < head or width % head:
        die(f"miniseries: at depth {depth}, n_embd = aspect x depth = {width} is not a multiple of head_dim {head}; "
            f"give an aspect that is a multiple of head_dim, or a head_dim that divides aspect x depth")
    return {'n_layer': depth, 'n_embd': width, 'n_head': width // head}


def schedule_at(base, iters):
    """max_iters for this run's tokens, the decay to min_lr over the whole run; the warmup and the evaluations at
    the recipe's fractions of its length."""
    warmup = min(1.0, base['warmup_iters'] / max(1, base['max_iters']))
    evaluations = max(1, round(base['max_iters'] / max(1, base['eval_interval'])))
    return {'max_iters': iters, 'lr_decay_iters': iters, 'warmup_iters': round(warmup * iters),
            'eval_interval': max(1, math.ceil(iters / evaluations))}


def plan(base, settings, build_grid, target_model):
    """{variant: (member, depth, flags)}, depth by depth: the grid's members rebuilt on the recipe sized to each
    depth (a member sized to its group's reference, MLA's cache or a widened MLP, is sized at that depth), each
    with its depth's sizes and schedule. build_grid(base, settings) -> {member: flags}; target_model(recipe) -> a
    GPT of that recipe, whose non-embedding parameters set the depth's tokens."""
    in_train_args = [a[2:].partition('=')[0] for a in settings['train_args'].split() if a.startswith('--')]
    clash = sorted(set(in_train_args) & set(SIZES + SCHEDULE))
    if clash:
        die(f"train_args set {', '.join(clash)}, which the miniseries sets for each depth (sizes from aspect and "
            f"head_dim, the schedule from tokens_per_param); leave them to it")
    row_tokens = base['batch_size'] * base['block_size'] * base.get('gradient_accumulation_steps', 1)
    out = {}
    for depth in depths_of(settings):
        sizes = sizes_at(base, depth, settings)
        sized = {**base, **sizes}
        members = build_grid(sized, settings, where=f" at miniseries depth {depth} (n_layer {depth}, n_embd "
                                                  f"{sizes['n_embd']}, n_head {sizes['n_head']})")
        own = [name for name, flags in members.items() if set(flags) & set(SIZES + SCHEDULE)]
        if own:
            die(f"the miniseries sizes every member itself, but {', '.join(map(repr, own))} set their own sizes or "
                f"schedule ({', '.join(sorted(set(members[own[0]]) & set(SIZES + SCHEDULE)))}): leave that group out")
        target = target_of(members, settings)
        tokens = settings['tokens_per_param'] * scaling_params(target_model({**sized, **members[target]}))
        schedule = schedule_at(base, max(1, math.ceil(tokens / row_tokens)))
        for name, flags in members.items():
            out[f'{name}_depth={depth}'] = (name, depth, {**sizes, **flags, **schedule})
    return out


def target_of(members, settings):
    """The member every other is measured against: --target, else the grid's reference (vanilla, or the first)."""
    if settings['target']:
        if settings['target'] not in members:
            die(f"target {settings['target']!r} is not a member of the grid; its members are {', '.join(members)}")
        return settings['target']
    return 'vanilla' if 'vanilla' in members else next(iter(members))


# ----------------------------------------------------------------------------- the runs' records

def series_runs(runs, plan_):
    """results.json's `runs` fields for the miniseries: each finished run of the plan's figures (member, depth,
    seed, its non-embedding parameters, FLOPs, tokens, steps, training seconds, val loss and bits per byte), added
    to its record; the list of them."""
    out = []
    for run in runs:
        if run['variant'] not in plan_ or run.get('flops_per_token') is None:
            continue
        member, depth, _ = plan_[run['variant']]
        run.update({'member': member, 'depth': depth, 'params': run['scaling_params'],
                    'flops': run['flops_per_token'] * run['tokens'], 'seconds': run['train_seconds'],
                    'val_loss': run['final_val_loss']})
        out.append({k: run.get(k) for k in ('member', 'depth', 'seed', 'params', 'flops', 'tokens', 'steps',
                                            'seconds', 'val_loss', 'val_bpb')})
    return out


def cells(records, axis):
    """{member: {depth: [(x, loss) per seed]}}."""
    out = {}
    for r in records:
        if r[axis] and r['val_loss'] is not None and math.isfinite(r['val_loss']):
            out.setdefault(r['member'], {}).setdefault(r['depth'], []).append((r[axis], r['val_loss']))
    return out


# ----------------------------------------------------------------------------- the fit

def fit_curves(points):
    """{'E', 'x0', 'members': {m: (ln A, alpha)}} of L = E + A (x/x0)^-alpha, E shared, by least squares over every
    run (scipy's curve_fit); None where it does not converge. points: {member: [(x, loss), ...]}."""
    import numpy as np
    from scipy.optimize import curve_fit
    names = list(points)
    xs = np.array([x for m in names for x, _ in points[m]], dtype=float)
    ys = np.array([y for m in names for _, y in points[m]], dtype=float)
    which = np.array([i for i, m in enumerate(names) for _ in points[m]])
    x0 = float(np.exp(np.mean(np.log(xs))))
    lx = np.log(xs / x0)

    def model(_, e, *coefs):
        a, alpha = np.array(coefs[0::2])[which], np.array(coefs[1::2])[which]
        return e + np.exp(a - alpha * lx)

    e0 = 0.5 * float(ys.min())
    guess = [e0]
    for i in range(len(names)):  # a line through ln(L - E0) against ln x: each member's start
        sel = which == i
        slope, icept = np.polyfit(lx[sel], np.log(ys[sel] - e0), 1) if len(set(lx[sel])) > 1 else (0.0, 0.0)
        guess += [icept, min(4.0, max(0.01, -slope))]
    lower = [0.0] + [-50.0, 0.0] * len(names)
    upper = [float(ys.min())] + [50.0, 5.0] * len(names)
    try:
        params, _ = curve_fit(model, lx, ys, p0=np.clip(guess, lower, upper), bounds=(lower, upper), maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    return {'E': float(params[0]), 'x0': x0,
            'members': {m: (float(params[1 + 2 * i]), float(params[2 + 2 * i])) for i, m in enumerate(names)}}


def predict(fit, member, x):
    a, alpha = fit['members'][member]
    return fit['E'] + math.exp(a - alpha * math.log(x / fit['x0']))


def inverse(fit, member, loss):
    """The x at which a member's fitted curve reaches loss; inf below its floor E (it never does)."""
    a, alpha = fit['members'][member]
    if loss <= fit['E'] or alpha <= 0:
        return math.inf
    return fit['x0'] * math.exp((a - math.log(loss - fit['E'])) / alpha)


def multipliers(fit, by_cell, target):
    """{member: {'depths': {d: multiplier}, 'largest': at the largest measured x, 'slope': d ln m / d ln x}}. At a
    depth: the x the target needs for the member's mean loss, read on the target's curve through its own mean at
    that depth (the fit's floor and exponent, the measurement's level: where the target's fit is poor, a depth at
    which both members measure alike still reads 1), over the member's mean x; at the largest x of the series, by
    both fitted curves."""
    largest = max(x for m in by_cell.values() for seeds in m.values() for x, _ in seeds)
    mean_of = {m: {d: (statistics.mean(s[0] for s in seeds), statistics.mean(s[1] for s in seeds))
                   for d, seeds in depths.items()} for m, depths in by_cell.items()}
    out = {}
    for member, depths in mean_of.items():
        if member == target:
            continue
        per_depth = {d: (needed(fit, target, mean_of[target].get(d), loss) / x, x) for d, (x, loss) in depths.items()}
        finite = [(math.log(x), math.log(m)) for m, x in per_depth.values() if 0 < m < math.inf]
        out[member] = {'depths': {d: m for d, (m, _) in per_depth.items()},
                       'largest': inverse(fit, target, predict(fit, member, largest)) / largest,
                       'slope': least_squares_slope(finite) if len(finite) >= 2 else None}
    return out


def needed(fit, target, anchor, loss):
    """The target's x for a loss, on its fitted curve moved through anchor (its mean (x, loss) at a depth); the
    fitted curve itself without one. inf at or below the floor E."""
    if anchor is None:
        return inverse(fit, target, loss)
    x, at = anchor
    alpha = fit['members'][target][1]
    if loss <= fit['E'] or at <= fit['E'] or alpha <= 0:
        return math.inf
    return x * ((loss - fit['E']) / (at - fit['E'])) ** (-1 / alpha)


def least_squares_slope(pairs):
    mx, my = statistics.mean(p[0] for p in pairs), statistics.mean(p[1] for p in pairs)
    sxx = sum((p[0] - mx) ** 2 for p in pairs)
    return sum((p[0] - mx) * (p[1] - my) for p in pairs) / sxx if sxx else None


def fit_quality(fit, by_cell):
    """(rms of the cell means' residuals, the seeds' pooled standard deviation or None with one seed a cell)."""
    residuals, variances = [], []
    for member, depths in by_cell.items():
        for seeds in depths.values():
            x, y = statistics.mean(s[0] for s in seeds), statistics.mean(s[1] for s in seeds)
            residuals.append(y - predict(fit, member, x))
            if len(seeds) > 1:
                variances.append(statistics.variance([s[1] for s in seeds]))
    rms = math.sqrt(statistics.mean(r * r for r in residuals))
    return rms, math.sqrt(statistics.mean(variances)) if variances else None


def interval(values):
    """The central LEVEL interval of the bootstrap's values (None with fewer than 10 finite ones)."""
    values = sorted(v for v in values if v is not None and math.isfinite(v))
    if len(values) < 10:
        return None, None
    k = (1 - LEVEL) / 2 * (len(values) - 1)
    return values[math.floor(k)], values[math.ceil(len(values) - 1 - k)]


def bootstrap(by_cell, target, rounds=BOOTSTRAP):
    """Each round redraws every (member, depth)'s seeds with replacement, fits again and measures again; the list
    of what multipliers() gave (the rounds whose fit failed are left out)."""
    rng, out = random.Random(BOOTSTRAP_SEED), []
    for _ in range(rounds):
        drawn = {m: {d: [rng.choice(seeds) for _ in seeds] for d, seeds in depths.items()}
                 for m, depths in by_cell.items()}
        fit = fit_curves({m: [p for seeds in depths.values() for p in seeds] for m, depths in drawn.items()})
        if fit is not None:
            out.append(multipliers(fit, drawn, target))
    return out


def judge_axis(records, axis, target):
    """One axis's fit and each member's multipliers with their intervals: results.json's figures for it."""
    by_cell = cells(records, axis)
    if target not in by_cell or len(by_cell[target]) < 3:
        return None
    fit = fit_curves({m: [p for seeds in depths.values() for p in seeds] for m, depths in by_cell.items()})
    if fit is None:
        return {'fit': None}
    measured, rounds = multipliers(fit, by_cell, target), bootstrap(by_cell, target)
    target_xs = [x for seeds in by_cell[target].values() for x, _ in seeds]
    rms, spread = fit_quality(fit, by_cell)
    out = {'fit': {'E': fit['E'], 'x0': fit['x0'], 'members': {m: {'ln_A': a, 'alpha': alpha}
                                                               for m, (a, alpha) in fit['members'].items()},
                   'rms_residual': rms, 'seed_std': spread, 'poor': spread is not None and rms > spread,
                   'bootstrap_rounds': len(rounds)},
           'members': {}}
    reach = EXTRAPOLATION * max(target_xs)
    for member, m in measured.items():
        lo, hi = interval([r[member]['largest'] for r in rounds])
        slope_lo, slope_hi = interval([r[member]['slope'] for r in rounds])
        depths = {}
        for depth, value in m['depths'].items():
            d_lo, d_hi = interval([r[member]['depths'][depth] for r in rounds])
            x = statistics.mean(s[0] for s in by_cell[member][depth])
            depths[depth] = {'value': value, 'lo': d_lo, 'hi': d_hi, 'extrapolated': value * x > reach}
        largest = max(x for d in by_cell.values() for seeds in d.values() for x, _ in seeds)
        out['members'][member] = {'value': m['largest'], 'lo': lo, 'hi': hi, 'slope': m['slope'],
                                  'slope_lo': slope_lo, 'slope_hi': slope_hi, 'depths': depths,
                                  'extrapolated': m['largest'] * largest > reach}
    return out


def judge(records, target):
    """{axis: judge_axis(...)} for the three axes."""
    return {axis: judge_axis(records, axis, target) for axis in AXES}


# ----------------------------------------------------------------------------- the report's part

def finite_or_none(value):
    """JSON holds no infinity: a multiplier beyond the target's floor (it never reaches that loss) is None."""
    return value if value is None or math.isfinite(value) else None


def json_ready(judged):
    """judge()'s figures with every infinity as None (the report says what None means)."""
    if isinstance(judged, dict):
        return {k: json_ready(v) for k, v in judged.items()}
    return finite_or_none(judged) if isinstance(judged, float) else judged


def fmt_multiplier(figures):
    """'1.52x [1.31, 1.80]': the value with its interval; a dagger where the target's curve is read past 2x its
    largest measured x; 'never' where the target's fitted floor is above the member's loss."""
    value = figures['value']
    if value is None or not math.isfinite(value):
        return 'never (below the target\'s floor E)'
    text = f"{value:.2f}x"
    if figures['lo'] is not None:
        text += f" [{figures['lo']:.2f}, {figures['hi']:.2f}]"
    return text + (' †' if figures['extrapolated'] else '')


def fmt_slope(figures):
    if figures['slope'] is None:
        return 'n/a'
    text = f"{figures['slope']:+.3f}"
    return text + (f" [{figures['slope_lo']:+.3f}, {figures['slope_hi']:+.3f}]" if figures['slope_lo'] is not None
                   else '')


def report_lines(records, judged, depths, target, settings):
    """results.md's miniseries section: the runs by depth, each axis's fit, the multipliers."""
    head = settings['head_dim'] or None
    lines = ['', f"## Miniseries: depths {', '.join(map(str, depths))}", '',
             f"n_embd = {settings['aspect']:g} x depth, heads {head or 'the recipe'}'s width"
             f"{'' if head else ' (n_embd / n_head)'}; tokens = {settings['tokens_per_param']:g} x {target}'s "
             f"non-embedding parameters at each depth, the same for every member. Means over seeds:", '',
             '| depth | member | seeds | non-embedding params | tokens | steps | training FLOPs | training s | '
             'val loss | val bpb |', '|' + ' --- |' * 10]
    by = {}
    for r in records:
        by.setdefault((r['depth'], r['member']), []).append(r)
    for (depth, member), rs in sorted(by.items(), key=lambda kv: kv[0][0]):
        mean = lambda key: statistics.mean(r[key] for r in rs) if all(r[key] is not None for r in rs) else None
        bpb = mean('val_bpb')
        loss = [r['val_loss'] for r in rs]
        lines.append(f"| {depth} | {member} | {len(rs)} | {rs[0]['params']:,} | {rs[0]['tokens']:,} | "
                     f"{rs[0]['steps']:,} | {mean('flops'):.3g} | {mean('seconds'):.1f} | {statistics.mean(loss):.4f}"
                     f"{f' ± {statistics.stdev(loss):.4f}' if len(loss) > 1 else ''} | "
                     f"{'n/a' if bpb is None else f'{bpb:.4f}'} |")
    for axis, figures in judged.items():
        lines += axis_lines(axis, figures, depths, target)
    lines += ['', f"Multiplier: the {AXES['flops']} (steps, seconds) {target} needs, on its fitted curve, to reach a "
                  f"member's loss, over what the member used: above 1 the member is worth that factor of the "
                  f"target's compute. Per depth: the member's mean loss read on the target's curve moved through "
                  f"the target's own mean at that depth; 'at the largest': both fitted curves at the largest x "
                  f"measured. Trend: the slope of ln(multiplier) against ln(x) over "
                  f"the depths (above 0: the gain grows with scale). [lo, hi]: {LEVEL:.0%} intervals, a bootstrap "
                  f"of {BOOTSTRAP} rounds redrawing each depth's seeds; none with one seed. †: read past "
                  f"{EXTRAPOLATION:g}x the target's largest measured x (an extrapolation). E is shared by the "
                  f"members: the loss no compute removes belongs to the data, not the block."]
    return lines


def axis_lines(axis, figures, depths, target):
    if figures is None:
        return ['', f"{AXES[axis]}: no fit ({target} needs finished runs at 3 depths at least)."]
    if figures['fit'] is None:
        return ['', f"{AXES[axis]}: the fit did not converge; no multipliers."]
    fit = figures['fit']
    quality = (f"rms residual of the depths' means {fit['rms_residual']:.4f}"
               + (f" against the seeds' spread {fit['seed_std']:.4f}" if fit['seed_std'] is not None else
                  " (one seed: no spread to hold it against)")
               + (": **a poor fit** (residuals beyond the seeds' noise); read its multipliers with care"
                  if fit['poor'] else ''))
    alphas = ', '.join(f"{m} {v['alpha']:.3f}" for m, v in fit['members'].items())
    lines = ['', f"### {AXES[axis]}", '', f"L = E + A x^-alpha: E {fit['E']:.4f} (shared); alpha: {alphas}; "
             f"{quality}.", '', f"| member | multiplier at the largest | " + ' | '.join(f'depth {d}' for d in depths)
             + ' | trend (slope in ln x) |', '|' + ' --- |' * (3 + len(depths))]
    for member, m in figures['members'].items():
        cells = [fmt_multiplier(m['depths'][d]) if d in m['depths'] else 'n/a' for d in depths]
        lines.append(f"| {member} | {fmt_multiplier(m)} | " + ' | '.join(cells) + f" | {fmt_slope(m)} |")
    return lines


def plot_series(records, judged, target, loss_path, multiplier_path, title):
    """Loss against training FLOPs on log-log axes with the fitted curves; the FLOPs multiplier at each depth."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np
    from ablation.report import save_figure
    flops = judged.get('flops')
    fig, ax = plt.subplots(figsize=(8, 5))
    members = list(dict.fromkeys(r['member'] for r in records))
    for i, member in enumerate(members):
        color = f'C{i % 10}'
        pts = [(r['flops'], r['val_loss']) for r in records if r['member'] == member]
        ax.scatter(*zip(*pts), s=12, color=color, label=member)
        if flops and flops['fit'] and member in flops['fit']['members']:
            fit = {**flops['fit'], 'members': {m: (v['ln_A'], v['alpha']) for m, v in flops['fit']['members'].items()}}
            xs = np.geomspace(min(p[0] for p in pts), max(p[0] for p in pts), 50)
            ax.plot(xs, [predict(fit, member, x) for x in xs], color=color, linewidth=1)
    ax.set(xscale='log', yscale='log', xlabel='training FLOPs', ylabel='final val loss', title=title)
    plain_numbers(ax.yaxis)
    ax.grid(alpha=0.3, which='both')
    ax.legend(fontsize='small')
    save_figure(fig, loss_path)
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (member, m) in enumerate(((flops or {}).get('members') or {}).items()):
        xs = {r['depth']: [] for r in records if r['member'] == member}
        for r in records:
            if r['member'] == member:
                xs[r['depth']].append(r['flops'])
        rows = [(statistics.mean(xs[d]), v) for d, v in sorted(m['depths'].items())
                if v['value'] is not None and math.isfinite(v['value'])]
        if not rows:
            continue
        x, values = [r[0] for r in rows], [r[1]['value'] for r in rows]
        lo = [v - (r[1]['lo'] if r[1]['lo'] is not None else v) for v, r in zip(values, rows)]
        hi = [(r[1]['hi'] if r[1]['hi'] is not None else v) - v for v, r in zip(values, rows)]
        ax.errorbar(x, values, yerr=[lo, hi], marker='o', capsize=3, color=f'C{(i + 1) % 10}', label=member)
    ax.axhline(1.0, color='grey', linestyle='--', linewidth=1, label=target)
    ax.set(xscale='log', yscale='log', xlabel='training FLOPs', ylabel=f'FLOPs multiplier against {target}',
           title=title)
    plain_numbers(ax.yaxis)
    ax.grid(alpha=0.3, which='both')
    ax.legend(fontsize='small')
    save_figure(fig, multiplier_path)


def plain_numbers(axis):
    """Losses and multipliers span less than a decade: 1.6, not 1.6 x 10^0, on a log axis."""
    from matplotlib.ticker import FormatStrFormatter
    axis.set_major_formatter(FormatStrFormatter('%.3g'))
    axis.set_minor_formatter(FormatStrFormatter('%.3g'))
