"""ablation/report.py: a seed's figure without a spread, Welch's p on each difference (≈ where noise could explain
it), the recall table by length and width against global attention, and its plot."""

import json

import pytest

from ablation.report import mean_std
from conftest import make_workdir, report_here, table_rows, tables


def test_one_seed_shows_no_spread():
    assert mean_std([2.3786]) == '2.3786 (1 seed)'
    assert mean_std([1.0, 2.0]) == '1.5000 ± 0.7071'


def fabricated_run(workdir, out, name, flags, seed, val_loss, accuracy, lengths=None, records=None, command=None,
                   **done):
    """A finished run written by hand: an old done.json (so the report summarizes it again from its log.jsonl)
    and a log of evaluations (by default two, the last with the given val loss and task accuracy)."""
    path = out / 'runs' / name / f'seed{seed}'
    path.mkdir(parents=True)
    args = [str(workdir / 'tiny.py')] + [f'--{k}={v!r}' for k, v in flags.items()] + [f'--seed={seed}',
                                                                                      '--wandb_log=False']
    (path / 'done.json').write_text(json.dumps({'variant': name, 'flags': flags, 'seed': seed, 'args': args,
                                                'duration_s': 1.0, 'version': 3,
                                                **({'command': command} if command else {}), **done}))
    records = records or [
        {'iter': 0, 'val_loss': 3.0, 'elapsed_s': 0.0, 'ms_per_iter': None, 'tokens': 0, 'accuracy': 0.1},
        {'iter': 4, 'val_loss': val_loss, 'elapsed_s': 1.0, 'ms_per_iter': 10.0, 'tokens': 64,
         'accuracy': accuracy, **({'lengths': lengths} if lengths else {})}]
    (path / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))


def test_time_to_target_is_per_seed_with_welchs_p_and_seeds_that_missed_it(tmp_path, monkeypatch, capsys):
    """The speedrun's yardstick: each seed's first evaluation at or below the target's mean final loss, in
    iterations and seconds, mean ± std over the seeds that reached it, p against the target's own seeds, and how
    many did not reach it."""
    from stats import welch
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    curves = {'vanilla': [[3.0, 2.5, 2.1, 2.0], [3.0, 2.4, 2.0, 1.9], [3.0, 2.6, 2.2, 2.1]],  # mean final 2.0
              'fast': [[3.0, 1.9, 1.8, 1.7], [3.0, 2.3, 2.0, 1.8], [3.0, 2.0, 1.9, 1.8]],
              'slow': [[3.0, 2.9, 2.5, 2.1], [3.0, 2.8, 2.4, 2.0], [3.0, 2.9, 2.6, 2.2]]}
    flags = {'vanilla': {}, 'fast': {'learning_rate': 2e-3}, 'slow': {'learning_rate': 1e-4}}
    seconds_per_eval = {'vanilla': 1.0, 'fast': 3.0, 'slow': 1.0}  # fast in iterations, slow in seconds
    for name, runs in curves.items():
        for k, curve in enumerate(runs):
            records = [{'iter': 10 * i, 'val_loss': v, 'elapsed_s': seconds_per_eval[name] * i, 'tokens': 64 * i,
                        'ms_per_iter': 10.0 if i else None} for i, v in enumerate(curve)]
            fabricated_run(workdir, out, name, flags[name], 1337 + k, curve[-1], None, records=records)
    code, _, err = report_here(workdir, out, f'--custom={flags}', '--seeds=3', '--extrapolation=',
                               monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    md = (out / 'results.md').read_text(encoding='utf-8')
    rows, header = table_rows(md), tables(md)[0][0]
    iters, seconds = header.index("iters to vanilla's loss"), header.index('seconds to it')
    assert header[seconds] == 'seconds to it'
    assert rows['vanilla'][iters] == '25 ± 7, 1 not reached'  # its seeds: 30, 20, and 2.1 > 2.0; no p on itself
    p = welch([10, 20, 10], [30, 20])['p']
    assert rows['fast'][iters] == f"13 ± 6 (p {p:.2g}{' ≈' if p >= 0.05 else ''})"
    p = welch([3.0, 6.0, 3.0], [3.0, 2.0])['p']
    assert rows['fast'][seconds] == f"4 ± 2 (p {p:.2g}{' ≈' if p >= 0.05 else ''})"
    assert rows['slow'][iters] == '30 (1 seed), 2 not reached'  # one seed at 2.0; its p needs two


def test_each_difference_gets_welchs_p_and_noise_is_marked(tmp_path, monkeypatch, capsys):
    """Three variants x 3 seeds: the Δ cells carry the p stats.welch gives on the per-seed figures, '≈' exactly
    where p >= 0.05; accuracy (read from each run's log.jsonl) is a column with its own p, and each evaluation
    length a column of the length table."""
    from stats import welch
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    losses = {'vanilla': [2.00, 2.02, 2.01], 'close': [2.01, 2.00, 2.03], 'apart': [1.80, 1.81, 1.79]}
    accuracies = {'vanilla': [0.30, 0.35, 0.32], 'close': [0.31, 0.36, 0.30], 'apart': [0.90, 0.95, 0.99]}
    flags = {'vanilla': {}, 'close': {'learning_rate': 1e-3}, 'apart': {'learning_rate': 2e-3}}
    for name in losses:
        for k, seed in enumerate((1337, 1338, 1339)):
            fabricated_run(workdir, out, name, flags[name], seed, losses[name][k], accuracies[name][k],
                           {'val_2x': {'loss': 2.5, 'accuracy': accuracies[name][k] / 2},
                            'val_4x': {'loss': None, 'accuracy': None}})
    code, _, err = report_here(workdir, out, f'--custom={flags}', '--seeds=3', '--extrapolation=',
                               monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    md = (out / 'results.md').read_text(encoding='utf-8')
    rows, header = table_rows(md), tables(md)[0][0]
    loss_col, acc_col = header.index('Δ final vs vanilla'), header.index('Δ accuracy vs vanilla')
    saved = json.loads((out / 'results.json').read_text())['variants']
    for name in ('close', 'apart'):
        for col, key, figures in ((loss_col, 'final_val_loss', losses), (acc_col, 'accuracy', accuracies)):
            p = welch(figures[name], figures['vanilla'])['p']
            assert saved[name]['welch'][key]['p'] == pytest.approx(p)
            assert f"(p {p:.2g}{' ≈' if p >= 0.05 else ''})" in rows[name][col]
    assert rows['close'][loss_col].endswith('≈)') and not rows['apart'][loss_col].endswith('≈)')
    assert rows['apart'][header.index('val accuracy')].startswith('0.9467 ±')
    assert "Welch's two-sided t-test over seeds against vanilla" in md
    lengths = {cells[0]: cells for cells in tables(md)[1][1:]}
    assert tables(md)[1][0] == ['variant', 'positions', 'val (1x)', 'val_2x', 'val_4x']
    p_val = welch(accuracies['apart'], accuracies['vanilla'])['p']
    p_2x = welch([a / 2 for a in accuracies['apart']], [a / 2 for a in accuracies['vanilla']])['p']
    assert lengths['apart'] == ['apart', 'plain', f'0.947 (1.800) p {p_val:.2g}', f'0.473 (2.500) p {p_2x:.2g}', 'n/a']
    assert lengths['vanilla'][2] == '0.323 (2.010)' and lengths['close'][3].endswith(' ≈')  # no test against itself


def test_the_recall_group_is_a_table_of_accuracy_by_length_and_width_tested_against_global(
        tmp_path, monkeypatch, capsys):
    """Zoology's figure as a table: one row per architecture, one column per (L, width), each cell the accuracy's
    mean ± std with Welch's p against global attention of the same shape; and the same as a plot."""
    from stats import welch
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    accuracies = {('global', 32, ''): [1.0, 0.98, 0.99], ('global', 64, ''): [1.0, 1.0, 0.99],
                  ('D', 32, ''): [0.40, 0.45, 0.35], ('D', 64, ''): [0.99, 0.97, 1.0],
                  ('global', 64, '_P=8'): [0.9, 0.8, 0.85], ('D', 64, '_P=8'): [0.2, 0.3, 0.25]}
    custom = {}
    for (arch, width, pairs), values in accuracies.items():
        name = f'{arch}_d={width}_L=32{pairs}'
        custom[name] = {'n_embd': width, **({'layers': 'D'} if arch == 'D' else {}),
                        **({'dropout': 0.01} if pairs else {})}  # another flag set than the same width's at 4 pairs
        for k, seed in enumerate((1337, 1338, 1339)):
            fabricated_run(workdir, out, name, custom[name], seed, 1.0, values[k])
    code, _, err = report_here(workdir, out, f'--custom={custom}', '--seeds=3', '--extrapolation=',
                               monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    md = (out / 'results.md').read_text(encoding='utf-8')
    recall = next(t for t in tables(md) if t[0][0] == 'architecture')
    assert recall[0] == ['architecture', 'L=32 d=32', 'L=32 d=64', 'L=32 P=8 d=64']  # P where not L / 8
    rows = {cells[0]: cells for cells in recall[1:]}
    assert list(rows) == ['global', 'D']
    assert rows['global'][1] == '0.990 ± 0.010'  # the reference: no test against itself
    for col, width, pairs in ((1, 32, ''), (2, 64, ''), (3, 64, '_P=8')):
        p = welch(accuracies[('D', width, pairs)], accuracies[('global', width, pairs)])['p']
        assert rows['D'][col].endswith(f"(p {p:.2g}{' ≈' if p >= 0.05 else ''})")
    assert rows['D'][1].startswith('0.400 ± 0.050 (p') and not rows['D'][1].endswith('≈)')
    assert rows['D'][2].endswith('≈)')  # 0.987 against 0.997: noise could explain it
    png = (out / 'accuracy_vs_width.png').read_bytes()
    assert png.startswith(b'\x89PNG') and len(png) > 10_000


def test_a_swept_recall_point_reports_its_best_rate_tested_against_globals_best_at_that_depth(
        tmp_path, monkeypatch, capsys):
    """Zoology's protocol: a row per architecture and depth, each cell the best rate's accuracy (by its mean over
    seeds) naming the rate, tested against global attention's best rate at the same depth."""
    from stats import welch
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    accuracies = {('global', 2, '0.001'): [0.4, 0.5, 0.3], ('global', 2, '0.003'): [1.0, 0.99, 1.0],
                  ('global', 4, '0.001'): [0.3, 0.35, 0.4], ('global', 4, '0.003'): [0.2, 0.25, 0.3],
                  ('DDDG', 2, '0.001'): [0.9, 0.95, 1.0], ('DDDG', 2, '0.003'): [0.8, 0.7, 0.9],
                  ('DDDG', 4, '0.001'): [1.0, 1.0, 1.0]}  # its other rate never ran
    custom = {}
    for (arch, depth, rate), values in accuracies.items():
        name = f'{arch}_d=64_L=32_n={depth}_lr={rate}'
        custom[name] = {'n_layer': depth, 'learning_rate': float(rate), **({'layers': 'DG'} if arch != 'global' else {})}
        for k, seed in enumerate((1337, 1338, 1339)):
            fabricated_run(workdir, out, name, custom[name], seed, 1.0, values[k])
    code, _, err = report_here(workdir, out, f'--custom={custom}', '--seeds=3', '--extrapolation=',
                               monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    md = (out / 'results.md').read_text(encoding='utf-8')
    assert 'the learning rate with the best mean accuracy' in md
    rows = {cells[0]: cells[1] for cells in next(t for t in tables(md) if t[0][0] == 'architecture')[1:]}
    assert list(rows) == ['global n=2', 'global n=4', 'DDDG n=2', 'DDDG n=4']
    assert rows['global n=2'] == '0.997 ± 0.006 @0.003' and rows['global n=4'] == '0.350 ± 0.050 @0.001'
    p = welch(accuracies[('DDDG', 2, '0.001')], accuracies[('global', 2, '0.003')])['p']
    assert rows['DDDG n=2'] == f"0.950 ± 0.050 @0.001 (p {p:.2g}{' ≈' if p >= 0.05 else ''})"
    p = welch(accuracies[('DDDG', 4, '0.001')], accuracies[('global', 4, '0.001')])['p']
    assert rows['DDDG n=4'] == f"1.000 ± 0.000 @0.001 (p {p:.2g}{' ≈' if p >= 0.05 else ''})"
    saved = json.loads((out / 'results.json').read_text())['variants']
    assert len(saved) == len(accuracies)  # every rate's figure is kept


def test_the_recall_table_says_when_each_seed_of_the_best_rate_crossed_the_phase_change(
        tmp_path, monkeypatch, capsys):
    """Zoology's "sooner": beside the accuracies, each seed's first evaluation at 0.9 accuracy or more ('never'
    where it stayed below), read from the best rate's runs, not the other rate's."""
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    curves = {('global', '0.001'): [[0.2, 0.5, 0.95, 1.0], [0.2, 0.3, 0.4, 0.41], [0.2, 0.9, 0.99, 1.0]],
              ('global', '0.003'): [[0.95, 0.4, 0.4, 0.4], [0.2, 0.4, 0.4, 0.4], [0.2, 0.4, 0.4, 0.4]],
              ('DG', '0.001'): [[0.95, 1.0, 1.0, 1.0], [0.5, 0.92, 1.0, 1.0], [0.3, 0.6, 0.91, 1.0]]}
    custom = {}
    for (arch, rate), runs in curves.items():
        name = f'{arch}_d=64_L=32_P=8_n=2_lr={rate}'
        custom[name] = {'n_layer': 2, 'learning_rate': float(rate), **({'layers': 'DG'} if arch == 'DG' else {})}
        for k, curve in enumerate(runs):
            records = [{'iter': 250 * (i + 1), 'val_loss': 1.0, 'elapsed_s': i + 1.0, 'tokens': 64 * (i + 1),
                        'ms_per_iter': 10.0, 'accuracy': a} for i, a in enumerate(curve)]
            fabricated_run(workdir, out, name, custom[name], 1337 + k, 1.0, None, records=records)
    code, _, err = report_here(workdir, out, f'--custom={custom}', '--seeds=3', '--extrapolation=',
                               monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    md = (out / 'results.md').read_text(encoding='utf-8')
    accuracy, solved = [t for t in tables(md) if t[0][0] == 'architecture']
    assert solved[0] == accuracy[0] == ['architecture', 'L=32 P=8 d=64']
    assert dict(accuracy[1:])['global n=2'].endswith('@0.001')  # 0.803 against 0.4 at 0.003
    assert dict(solved[1:]) == {'global n=2': '750, never, 500', 'DG n=2': '250, 500, 750'}
    assert 'first evaluation at 0.9 accuracy or more' in md


def test_a_length_table_without_rows_is_one_line_not_an_empty_table(tmp_path, monkeypatch, capsys):
    """The copy group's runs (a task: no windows of text to score at 2x..8x) asked for --extrapolation=plain: the
    report says there is nothing to show and where the lengths are, instead of an empty table (issue 44.15)."""
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    flags = {'vanilla': {}, 'rope': {'pos': 'rope'}}
    for name in flags:
        for seed in (1337, 1338):
            fabricated_run(workdir, out, name, flags[name], seed, 2.0, 0.5)
    code, _, err = report_here(workdir, out, '--extrapolation=plain', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    md = (out / 'results.md').read_text(encoding='utf-8')
    assert '| variant | method |' not in md
    assert 'Val loss at multiples of the trained block_size: none to show (runs on a task dataset' in md


def test_the_report_names_the_commands_of_runs_an_earlier_invocation_made(tmp_path, monkeypatch, capsys):
    """The header names this invocation's command; runs another command made (or one from before runs kept their
    command) are counted by command in a line of their own, so each figure's command can be found."""
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    earlier = 'python ablate.py --grid=custom "--custom={\'vanilla\': {}}" --seeds=2'
    for seed in (1337, 1338):
        fabricated_run(workdir, out, 'vanilla', {}, seed, 2.0, None, command=earlier)
        fabricated_run(workdir, out, 'rope', {'pos': 'rope'}, seed, 1.9, None)
    code, _, err = report_here(workdir, out, '--extrapolation=', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    md = (out / 'results.md').read_text(encoding='utf-8')
    this = json.loads((out / 'results.json').read_text())['command']
    assert f"command: `{this}`" in md
    assert f"Runs in this report made by other commands: 2 by `{earlier}`; 2 made before runs kept their " \
           f"command." in md
    for done in out.glob('runs/*/seed*/done.json'):  # as if this command had made them all
        done.write_text(json.dumps({**json.loads(done.read_text()), 'command': this}))
    code, _, err = report_here(workdir, out, '--extrapolation=', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert 'made by other commands' not in (out / 'results.md').read_text(encoding='utf-8')


def test_a_column_shows_only_where_it_has_something_and_one_seed_is_said_once(tmp_path, monkeypatch, capsys):
    """One seed each, nothing diverged, no MoE: no '(1 seed)' in every cell (a line says it once), no load or
    'diverged at' column; a diverged run brings its column back."""
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    for name, flags, loss in (('vanilla', {}, 2.0), ('rope', {'pos': 'rope'}, 1.9)):
        fabricated_run(workdir, out, name, flags, 1337, loss, None)
    code, _, err = report_here(workdir, out, '--extrapolation=', '--seeds=1', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    md = (out / 'results.md').read_text(encoding='utf-8')
    header, rows = tables(md)[0][0], table_rows(md)
    assert 'One seed each: no spread and no test' in md and '(1 seed' not in md
    assert 'load max/mean' not in header and 'diverged at' not in header and 'KV cache bytes/token' not in header
    assert rows['rope'][header.index('final val loss')] == '1.9000'
    assert rows['rope'][header.index('Δ final vs vanilla')] == '-0.1000'
    run = out / 'runs' / 'rope' / 'seed1337'
    (run / 'diverged.json').write_text(json.dumps({'iter': 4}))
    (run / 'done.json').write_text(json.dumps({**json.loads((run / 'done.json').read_text()), 'version': 3}))
    code, _, err = report_here(workdir, out, '--extrapolation=', '--seeds=1', monkeypatch=monkeypatch, capsys=capsys)
    md = (out / 'results.md').read_text(encoding='utf-8')
    header = tables(md)[0][0]
    assert code == 0 and table_rows(md)['rope'][header.index('diverged at')] == '4', err


def test_the_loss_plot_shows_every_point_and_tells_each_line_apart():
    """The first evaluation (ln vocab) stays on the chart, and lines that coincide differ in marker or dash."""
    from ablation.report import loss_figure
    curve = [[0, 4.2, 0.0], [100, 1.9, 10.0], [200, 1.6, 20.0]]
    variants = {f'v{i}': {'curve': curve} for i in range(12)}
    fig = loss_figure(variants, 0, 'iteration', 'title', goal_loss=1.6)
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert low < 1.6 and high > 4.2 and ax.get_yscale() == 'log'
    styles = [(line.get_marker(), line.get_linestyle()) for line in ax.get_lines() if line.get_label() in variants]
    assert len(styles) == 12 and len(set(styles)) == 12


def test_contended_timings_are_said_in_the_report_and_the_time_plot(tmp_path, monkeypatch, capsys):
    """Runs that ran with the load average above the cores: ms/iter compares poorly (vanilla's 268.5 against
    +gqa's 147.4 under load), and the report and the time plot say so."""
    import ablation.report
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    notes = []
    monkeypatch.setattr(ablation.report, 'plot', lambda *a, **k: notes.append(a[-1] if len(a) > 6 else ''))
    fabricated_run(workdir, out, 'vanilla', {}, 1337, 2.0, None, load_avg=5.2, cores=2)
    fabricated_run(workdir, out, 'rope', {'pos': 'rope'}, 1337, 1.9, None, load_avg=1.0, cores=2)
    code, _, err = report_here(workdir, out, '--extrapolation=', '--seeds=1', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    said = 'timings contended: load average above the cores in 1 of 2 runs (up to 5.2 on 2)'
    assert said.capitalize() in (out / 'results.md').read_text(encoding='utf-8')
    assert len(notes) == 2 and notes[0] == '' and notes[1].startswith(said), notes
    for done in out.glob('runs/*/seed*/done.json'):
        done.write_text(json.dumps({**json.loads(done.read_text()), 'load_avg': 1.5}))
    notes.clear()
    code, _, err = report_here(workdir, out, '--extrapolation=', '--seeds=1', monkeypatch=monkeypatch, capsys=capsys)
    md = (out / 'results.md').read_text(encoding='utf-8')
    assert code == 0 and 'Timings contended' not in md and notes == ['', '']
