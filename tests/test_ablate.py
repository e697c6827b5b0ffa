"""ablate.py end to end on a tiny self-made character dataset: report, resume, failures, bad settings."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ablation.jobs
from conftest import TWO_VARIANTS, ablate_here, import_ablate, make_workdir, report_here, table_rows, tables

REPO = Path(__file__).resolve().parents[1]
HANG_S = 1800  # a limit only a hang reaches, however busy the machine


def ablate(workdir, out, *args):
    cmd = [sys.executable, str(REPO / 'ablate.py'), f'--run_dir={workdir}', f'--train_config={workdir / "tiny.py"}',
           f'--out_dir={out}', '--extrapolation_iters=2', *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=HANG_S)


@pytest.fixture(scope='module')
def ablated(tmp_path_factory):
    """One 2-variant x 2-seed ablation, two runs at once, shared by the tests that read its report."""
    workdir = make_workdir(tmp_path_factory.mktemp('ablate'))
    out = workdir / 'out'
    result = ablate(workdir, out, '--grid=custom', f'--custom={TWO_VARIANTS}', '--seeds=2', '--parallel=2',
                    '--extrapolation=plain,yarn,window')
    assert result.returncode == 0, result.stdout + result.stderr
    return workdir, out, result


def test_report_has_a_row_per_variant_with_extrapolation(ablated):
    _, out, result = ablated
    assert '[4/4] rope seed 1338' in result.stdout and 'ETA' in result.stdout
    # the whole grid's estimate before the first run starts, from its FLOPs and a timed step
    assert re.search(r"^grid: 4 run\(s\) to train, about \d+ s in all \(2 at once; each run's FLOPs at the \S+ GFLOP/s "
                     r"of vanilla's steps timed here", result.stdout, re.M), result.stdout
    assert result.stdout.index('grid: 4 run(s)') < result.stdout.index('[1/4] vanilla seed 1337 started')
    # two at a time: the second run started before the first finished
    assert result.stdout.index('[2/4] vanilla seed 1338 started') < result.stdout.index('done in')
    md = (out / 'results.md').read_text(encoding='utf-8')
    assert 'Base recipe' in md and '1337, 1338' in md and 'python ablate.py' in md
    main, length, _ = tables(md)  # the probes' table last
    assert main[0][:5] == ['variant', 'flags', 'parameters', 'active', 'final val loss']
    rows = table_rows(md)
    assert list(rows) == ['vanilla', 'rope']
    for cells in rows.values():
        assert len(cells) == 12  # no experts, nothing diverged: no load or 'diverged at' column
        assert '±' in cells[4] and '±' in cells[5]
        assert int(cells[2].replace(',', '')) == int(cells[3].replace(',', '')) > 0  # dense: all active
        float(cells[4].split('±')[0]), float(cells[9]), float(cells[11].replace(',', ''))
    assert rows['vanilla'][6] == '+0.0000'
    # time to target: each seed's first evaluation at or below vanilla's mean final loss, in iterations and seconds,
    # mean over the seeds that reached it (the speedrun's yardstick)
    results = json.loads((out / 'results.json').read_text())
    goal = results['variants']['vanilla']['final_val_loss']
    assert main[0][7:9] == ["iters to vanilla's loss", 'seconds to it']
    for name, cells in rows.items():
        firsts = [next(((c[0], c[2]) for c in run['curve'] if c[1] <= goal), None) for run in results['runs']
                  if run['variant'] == name]
        reached = [f for f in firsts if f is not None]
        if not reached:
            assert cells[7] == cells[8] == 'not reached', (name, firsts)
            continue
        iters = [f[0] for f in reached]
        assert cells[7].startswith(f"{sum(iters) / len(iters):.0f}"), (name, cells[7], firsts)
        assert ('not reached' in cells[7]) == (len(reached) < len(firsts))
    assert rows['vanilla'][7].split(' ')[0] != 'not'  # the goal's own seeds reach their mean in one seed at least
    assert length[0] == ['variant', 'method', '1×', '2×', '4×', '8×']
    length = {(row[0], row[1]): row[2:] for row in length[1:]}
    assert set(length) == {('vanilla', 'plain'), ('rope', 'plain'), ('rope', 'yarn'), ('rope', 'window')}
    assert length['vanilla', 'plain'][0] != 'n/a' and length['vanilla', 'plain'][1:] == ['n/a'] * 3  # learned: 1x
    assert all(float(v) > 0 for v in length['rope', 'plain'])  # rope: 1x to 8x
    assert length['rope', 'yarn'][0] == 'n/a' and all(float(v) > 0 for v in length['rope', 'yarn'][1:])  # 1x: plain
    results = json.loads((out / 'results.json').read_text())
    assert set(results['variants']) == {'vanilla', 'rope'} and len(results['runs']) == 4
    rope = results['variants']['rope']
    assert rope['seeds'] == [1337, 1338] and rope['flags'] == {'pos': 'rope'}
    assert [c[0] for c in rope['curve']] == [0, 2, 4]
    done = json.loads((out / 'runs' / 'vanilla' / 'seed1338' / 'done.json').read_text())
    assert done['seed'] == 1338 and done['kv_bytes_per_token'] == 128
    assert done['command'] == results['command'] and done['command'].startswith('python ablate.py ')
    assert 'made by other commands' not in md  # every run is this command's
    assert done['final_val_loss'] == done['curve'][-1][1] and done['ms_per_iter'] > 0
    cached = json.loads((out / 'runs' / 'vanilla' / 'seed1338' / 'extrapolation.json').read_text())
    assert cached['plain@2x@2'] is None and cached['plain@1x@2'] > 0
    for name in ('val_loss_vs_iter.png', 'val_loss_vs_time.png'):
        data = (out / name).read_bytes()
        assert data.startswith(b'\x89PNG\r\n\x1a\n') and len(data) > 1000


def test_rerun_skips_finished_runs_and_rewrites_the_report(ablated):
    workdir, out, _ = ablated
    done = sorted(out.glob('runs/*/seed*/done.json')) + sorted(out.glob('runs/*/seed*/train.log'))
    mtimes = [p.stat().st_mtime_ns for p in done]
    (out / 'results.md').unlink()
    (out / 'val_loss_vs_iter.png').unlink()
    result = ablate(workdir, out, '--grid=custom', f'--custom={TWO_VARIANTS}', '--seeds=2')
    assert result.returncode == 0, result.stderr
    assert result.stdout.count('skipped (finished)') == 4
    assert [p.stat().st_mtime_ns for p in done] == mtimes  # train.py did not run again
    assert list(table_rows((out / 'results.md').read_text(encoding='utf-8'))) == ['vanilla', 'rope']
    assert (out / 'val_loss_vs_iter.png').exists()


def test_report_only_trains_nothing_and_reports_what_finished(ablated):
    """--report_only after an interrupt: the finished runs' report, a third seed not trained."""
    workdir, out, _ = ablated
    (out / 'results.md').unlink()
    result = ablate(workdir, out, '--grid=custom', f'--custom={TWO_VARIANTS}', '--seeds=3', '--report_only=True')
    assert result.returncode == 0, result.stderr
    assert 'started' not in result.stdout and not list(out.glob('runs/*/seed1339'))
    assert list(table_rows((out / 'results.md').read_text(encoding='utf-8'))) == ['vanilla', 'rope']


def test_the_report_is_written_aside_and_never_over_a_checkpoint(ablated, tmp_path, monkeypatch, capsys):
    """results.md, results.json and the plots are new files switched in (a reader of the old ones keeps them);
    one of them that is a checkpoint's second name is refused before any work, and nothing is written."""
    workdir, fixture_out, _ = ablated
    out = tmp_path / 'out'
    shutil.copytree(fixture_out, out)
    old = {name: open(out / name, 'rb') for name in ('results.md', 'results.json', 'val_loss_vs_iter.png')}
    old_bytes = {name: (out / name).read_bytes() for name in old}
    code, stdout, err = report_here(workdir, out, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and 'report:' in stdout, err
    assert all(f.read() == old_bytes[name] for name, f in old.items())  # the old files, whole
    for f in old.values():
        f.close()
    assert list(table_rows((out / 'results.md').read_text(encoding='utf-8'))) == ['vanilla', 'rope']
    assert not list(out.glob('.*tmp*'))
    ckpt = out / 'runs' / 'vanilla' / 'seed1337' / 'ckpt.pt'
    (out / 'val_loss_vs_time.png').unlink()
    os.link(ckpt, out / 'val_loss_vs_time.png')
    before = {p: p.read_bytes() for p in (ckpt, out / 'results.md', out / 'results.json')}
    code, _, err = report_here(workdir, out, monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and 'val_loss_vs_time.png' in lines[0] and 'checkpoint' in lines[0], err
    assert {p: p.read_bytes() for p in before} == before


def runs_to_measure(ablated, cwd):
    """A copy of the fixture's runs in cwd/out with no length table cached: the report computes it again."""
    shutil.copytree(ablated[1], cwd / 'out')
    for cached in (cwd / 'out').glob('runs/*/seed*/extrapolation.json'):
        cached.unlink()
    return cwd / 'out'


def test_a_sharded_dataset_gets_its_length_table(ablated, tmp_path, monkeypatch, capsys):
    """FineWeb-Edu's layout: meta.json lists the val shards and there is no val.bin. The length table reads the
    shards; with one gone, the report is still written and says which run is missing from the table and why."""
    workdir = ablated[0]
    data = tmp_path / 'data' / 'tiny'
    data.mkdir(parents=True)
    meta = json.loads((workdir / 'data' / 'tiny' / 'meta.json').read_text())
    val = np.fromfile(workdir / 'data' / 'tiny' / 'val.bin', dtype=np.uint16)
    shards = {'val': [val[:450], val[450:]], 'train': [np.fromfile(workdir / 'data' / 'tiny' / 'train.bin', np.uint16)]}
    meta['shards'] = {split: [] for split in shards}
    for split, parts in shards.items():
        for part in parts:
            name = f"tiny_{split}_{sum(map(len, meta['shards'].values())):06d}.bin"
            part.tofile(data / name)
            meta['shards'][split].append([name, len(part)])
    (data / 'meta.json').write_text(json.dumps(meta))
    out = runs_to_measure(ablated, tmp_path)
    code, _, err = report_here(workdir, out, monkeypatch=monkeypatch, capsys=capsys, run_dir=tmp_path)
    assert code == 0, err
    length = {(row[0], row[1]): row[2:] for row in tables((out / 'results.md').read_text(encoding='utf-8'))[1][1:]}
    assert all(float(v) > 0 for v in length['rope', 'plain'][:3])  # 4x = 64 tokens fit in a 450-token shard
    (data / 'tiny_val_000001.bin').unlink()
    for cached in out.glob('runs/*/seed*/extrapolation.json'):
        cached.unlink()
    code, _, err = report_here(workdir, out, monkeypatch=monkeypatch, capsys=capsys, run_dir=tmp_path)
    md = (out / 'results.md').read_text(encoding='utf-8')
    assert code == 0 and 'Not in the length table' in md and 'tiny_val_000001.bin' in md, err
    assert list(table_rows(md)) == ['vanilla', 'rope']


def test_the_length_table_shows_progress_with_an_eta(ablated, tmp_path, monkeypatch, capsys):
    out = runs_to_measure(ablated, tmp_path)
    code, stdout, err = report_here(ablated[0], out, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert 'length table: measuring 4 run(s) at 1x, 2x, 4x, 8x' in stdout
    assert 'length table [1/4] rope seed 1337 done in' in stdout and ', ETA ' in stdout
    assert 'length table [4/4]' in stdout and 'measuring' not in report_here(
        ablated[0], out, monkeypatch=monkeypatch, capsys=capsys)[1]  # cached: nothing to measure, nothing said


def test_the_report_says_what_its_figures_are(ablated, tmp_path, monkeypatch, capsys):
    """Timing from runs one after another, the 1x column against the final val loss, 'LLLG' as Gemma 3's
    stand-in, and a plot title that does not name the base recipe as if it were every variant."""
    shutil.copytree(ablated[1], tmp_path / 'out')
    for done in (tmp_path / 'out').glob('runs/rope/seed*/done.json'):  # as if the rope runs were the group's
        done.write_text(done.read_text().replace('"variant": "rope"', '"variant": "layers=LLLG"'))
    import matplotlib.axes
    titles, set_axes = [], matplotlib.axes.Axes.set
    monkeypatch.setattr(matplotlib.axes.Axes, 'set',
                        lambda ax, **kw: titles.append(kw.get('title')) or set_axes(ax, **kw))
    code, _, err = report_here(ablated[0], tmp_path / 'out', monkeypatch=monkeypatch, capsys=capsys)
    md = (tmp_path / 'out' / 'results.md').read_text(encoding='utf-8')
    assert code == 0 and list(table_rows(md)) == ['vanilla', 'layers=LLLG'], err
    assert 'runs trained one after another' in md and 'bench.py times variants side by side' in md
    assert '1× is not the final val loss above' in md and 'eval_iters batches' in md
    assert "not Gemma 3's 5:1 'LLLLLG', which tiled over this 1-layer model would be 'L': LLLG stands in" in md
    assert titles == [f"val loss vs {x}: grid custom, each variant's flags on tiny.py"
                      for x in ('iteration', 'time (s)')]


def test_failed_run_is_reported_and_the_others_finish(tmp_path):
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    (out / 'runs' / 'ok' / 'seed1337').mkdir(parents=True)  # an unfinished run: cleared and run again
    (out / 'runs' / 'ok' / 'seed1337' / 'stale').write_text('x')
    # a model that builds (a bad one is refused before any run) on data that is not there: train.py fails
    result = ablate(workdir, out, '--grid=custom', "--custom={'bad': {'dataset': 'missing'}, 'ok': {}}", '--seeds=1')
    assert result.returncode != 0
    assert 'FAILED' in result.stdout and 'bad' in result.stdout and 'data/missing/train.bin' in result.stdout
    assert str(out / 'runs' / 'bad' / 'seed1337' / 'train.log') in result.stdout
    assert 'bad seed 1337' in result.stderr and 'Traceback' not in result.stderr
    assert (out / 'runs' / 'ok' / 'seed1337' / 'done.json').exists()
    assert not (out / 'runs' / 'ok' / 'seed1337' / 'stale').exists()
    assert not (out / 'runs' / 'bad' / 'seed1337' / 'done.json').exists()
    rows = table_rows((out / 'results.md').read_text(encoding='utf-8'))
    assert list(rows) == ['ok'] and rows['ok'][6] == '+0.0000'  # no vanilla: the first variant is the reference


@pytest.mark.parametrize('args, fragment', [
    (['--grid=custom', "--custom={'a': {'pos': 'rope'"], 'not a Python literal'),
    (['--grid=custom', "--custom={'a': {'posn': 'rope'}}"], "unknown flag(s) 'posn'"),
    (['--grid=default,no_such_group'], "unknown grid group 'no_such_group'"),
    (['--grid=kv'], 'n_kv_heads'),
    (['--grid=stability', '--train_args=--learning_rate=1e-3'], 'train_args set learning_rate'),
], ids=['literal', 'flag', 'group', 'kv', 'train_args'])
def test_bad_settings_are_one_line_errors(tmp_path, args, fragment, monkeypatch, capsys):
    code, err = ablate_here(make_workdir(tmp_path), tmp_path / 'out', *args, monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith('error:') and fragment in lines[0], err
    assert not (tmp_path / 'out').exists()


def test_a_report_never_mixes_arguments(tmp_path):
    """Runs made with other train_args are left out of the report, and named (the new ones train beside
    them); a corrupt done.json is one error line."""
    workdir = make_workdir(tmp_path)
    out = workdir / 'out'
    one = "--custom={'rope': {'pos': 'rope'}}"
    assert ablate(workdir, out, '--grid=custom', one, '--extrapolation=').returncode == 0
    result = ablate(workdir, out, '--grid=custom', one, '--extrapolation=', '--train_args=--max_iters=2 --eval_interval=2')
    assert result.returncode == 0, result.stderr
    md = (out / 'results.md').read_text(encoding='utf-8')
    assert list(table_rows(md)) == ['rope'] and '--max_iters=2' in md
    assert 'Not in this report' in md and 'rope seed 1337' in md
    assert len(list(out.glob('runs/rope/seed1337*/done.json'))) == 2  # both kept
    (out / 'runs' / 'rope' / 'seed1337' / 'done.json').write_text('{"variant": ')
    result = ablate(workdir, out, '--grid=custom', one, '--extrapolation=')
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and 'done.json' in lines[0] and 'delete it' in lines[0]


@pytest.mark.parametrize('make, args, fragment', [
    (lambda d: None, ['--python=/nonexistent/python3'], "python '/nonexistent/python3'"),
    (lambda d: (d / 'out').write_text('x'), [], 'is a file'),
    (lambda d: None, ['--extrapolation=plain,ntk'], "'ntk'"),
    (lambda d: None, ['--parallel=0'], 'parallel'),
], ids=['python', 'out_dir-file', 'method', 'parallel'])
def test_more_bad_settings_are_one_line_errors(tmp_path, make, args, fragment, monkeypatch, capsys):
    workdir = make_workdir(tmp_path)
    make(workdir)
    code, err = ablate_here(workdir, workdir / 'out', '--grid=custom', f'--custom={TWO_VARIANTS}', *args,
                            monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment in lines[0], err


def test_killing_ablate_stops_its_run_and_a_claimed_run_is_left_alone(tmp_path):
    """kill -9 ablate.py: its train.py child dies too (no orphan keeps writing); a rerun trains the run anew.
    A run another live process has claimed is skipped, not trained twice."""
    import signal
    import time
    workdir = make_workdir(tmp_path)
    out = workdir / 'out'
    cmd = [sys.executable, str(REPO / 'ablate.py'), f'--run_dir={workdir}', f'--train_config={workdir / "tiny.py"}',
           f'--out_dir={out}', "--grid=custom", "--custom={'slow': {}}", '--train_args=--max_iters=100000']
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / 'runs' / 'slow' / 'seed1337' / 'log.jsonl'
    deadline = time.time() + HANG_S
    while not log.exists():
        assert time.time() < deadline
        time.sleep(0.2)
    child = int((out / 'runs' / 'slow' / 'seed1337' / '.lock').read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + HANG_S
    while True:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        assert time.time() < deadline, 'the train.py child outlived ablate.py'
        time.sleep(0.2)
    # a claim held by a live process (this test's) is respected
    (out / 'runs' / 'slow' / 'seed1337.claim').write_text(json.dumps({'host': os.uname().nodename, 'pid': os.getpid()}))
    result = ablate(workdir, out, '--grid=custom', "--custom={'slow': {}}")
    assert 'being trained by' in result.stdout and not (out / 'runs' / 'slow' / 'seed1337' / 'done.json').exists()
    (out / 'runs' / 'slow' / 'seed1337.claim').unlink()
    result = ablate(workdir, out, '--grid=custom', "--custom={'slow': {}}")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r['iter'] for r in records] == [0, 2, 4]  # one run's log, not two trainers' mixed


def test_a_run_another_process_finished_meanwhile_is_reported_not_listed_as_missing(ablated, monkeypatch, capsys):
    """Two ablate.py on one out_dir: a run the other one was training when this one looked, and finished before
    this one's report, is in the report, and not named as 'not in the report yet'."""
    import shutil
    workdir, out, _ = ablated
    out2 = workdir / 'out-shared'
    monkeypatch.chdir(workdir)
    ablate_module = import_ablate(monkeypatch, f'--run_dir={workdir}', f'--train_config={workdir / "tiny.py"}',
                                  f'--out_dir={out2}', '--grid=custom', "--custom={'vanilla': {}}",
                                  '--extrapolation=')

    def held_by_another_that_finishes_it(run):
        shutil.copytree(out / 'runs' / 'vanilla' / 'seed1337', run)  # the other process's finished run
        return 'elsewhere:1'
    monkeypatch.setattr(ablation.jobs, 'claim', held_by_another_that_finishes_it)
    ablate_module.main()
    stdout = capsys.readouterr().out
    assert 'being trained by elsewhere:1' in stdout and 'not in the report yet' not in stdout
    assert list(table_rows((out2 / 'results.md').read_text(encoding='utf-8'))) == ['vanilla']


def test_a_downstream_task_metric_is_a_column(ablated, monkeypatch, capsys):
    """Runs that logged train.py's eval_task show its headline metric (acc_norm) as a column, the mean over
    seeds; variants without it say n/a."""
    workdir, out, _ = ablated
    for seed, score in ((1337, 0.25), (1338, 0.75)):
        run = out / 'runs' / 'vanilla' / f'seed{seed}'
        log = run / 'log.jsonl'
        records = [json.loads(line) for line in log.read_text().splitlines()]
        records[-1]['task'] = {'tiny_swag': {'acc': 0.5, 'acc_norm': score}}
        log.write_text(''.join(json.dumps(r) + '\n' for r in records))
        done = json.loads((run / 'done.json').read_text())
        (run / 'done.json').write_text(json.dumps({**done, 'version': 0}))  # figures from the log again
    monkeypatch.chdir(workdir)
    import_ablate(monkeypatch, f'--run_dir={workdir}', f'--train_config={workdir / "tiny.py"}', f'--out_dir={out}',
                  '--grid=custom', f'--custom={TWO_VARIANTS}', '--seeds=2', '--extrapolation=').main()
    assert capsys.readouterr().out.count('skipped (finished)') == 4
    table = tables((out / 'results.md').read_text(encoding='utf-8'))[0]
    column = table[0].index('tiny_swag acc_norm')
    rows = {cells[0]: cells for cells in table[1:]}
    assert rows['vanilla'][column] == '0.5000' and rows['rope'][column] == 'n/a'


def test_the_probes_of_each_variant_are_reported_beside_equal_attention(ablated):
    """Every run's ckpt.pt probed on the same val windows: the table's 'equal' is the mean of 1/(t+1) over the
    queries past the first 4 of block_size 16, and each share a probability."""
    md = (ablated[1] / 'results.md').read_text(encoding='utf-8')
    probes = next(t for t in tables(md) if t[0][:2] == ['variant', 'sink share (mean)'])
    rows = {cells[0]: cells for cells in probes[1:]}
    assert set(rows) == {'vanilla', 'rope'}
    equal = sum(1 / (t + 1) for t in range(4, 16)) / 12
    for cells in rows.values():
        assert cells[3] == f'{equal:.3f}' and 0 < float(cells[1]) <= float(cells[2]) <= 1 and float(cells[4]) >= 1
    done = json.loads((ablated[1] / 'runs' / 'rope' / 'seed1337' / 'done.json').read_text())
    assert len(done['probe']['layers']['sink_share']) == 1  # the per-layer, per-head figures stay in done.json


@pytest.mark.parametrize('signame, code', [('SIGTERM', 143), ('SIGINT', 130)])
def test_kill_or_ctrl_c_stops_the_runs_with_one_line(tmp_path, signame, code):
    """`kill` (SIGTERM) says what Ctrl-C says, in one line, exit 128 + the signal (issues 44.15, 49.7); its train.py
    child stops with it."""
    import signal
    import time
    workdir = make_workdir(tmp_path)
    out = workdir / 'out'
    cmd = [sys.executable, str(REPO / 'ablate.py'), f'--run_dir={workdir}', f'--train_config={workdir / "tiny.py"}',
           f'--out_dir={out}', "--grid=custom", "--custom={'slow': {}}", '--train_args=--max_iters=100000']
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log = out / 'runs' / 'slow' / 'seed1337' / 'log.jsonl'
        while not log.exists():  # the run is training
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        child = int((out / 'runs' / 'slow' / 'seed1337' / '.lock').read_text())
        proc.send_signal(getattr(signal, signame))
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [f'error: interrupted ({signame}): finished runs are kept; the same command '
                                        f'resumes'], err
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_help_lists_every_group_of_the_registry_before_torch_loads():
    """--help's groups are read from ablation/groups.py's GROUPS, each with the comment above its entry: a group
    added there is in the help (10 of 31 were missing from a list written by hand); torch is not imported."""
    from ablation.groups import GROUPS
    probe = ("import runpy, sys; sys.argv = ['ablate.py', '--help']\n"
             "try:\n    runpy.run_path('ablate.py', run_name='__main__')\n"
             "except SystemExit:\n    pass\nprint('torch loaded' if 'torch' in sys.modules else 'no torch')")
    result = subprocess.run([sys.executable, '-c', probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith('no torch')
    listed = ' '.join(result.stdout[result.stdout.index('Grid groups: '):].split('\n\n')[0].split())
    for name in GROUPS:
        assert f" {name} (" in listed or listed.startswith(f"Grid groups: {name} ("), name  # named, and said what it is
    assert "recall (Zoology's associative recall" in listed and 'custom (a dict of name -> flags' in listed


def test_compare_reports_ordinary_runs_against_iterations_flops_and_seconds(tmp_path, monkeypatch, capsys):
    """Two train.py runs made outside a grid (vanilla and modern recipes): the table (their own val losses, the
    flag they differ in) and the three plots, from --compare; a directory that is no run is one line."""
    workdir = make_workdir(tmp_path)
    for out_dir, flags in (('out-vanilla', []), ('out-rope', ['--pos=rope'])):
        subprocess.run([sys.executable, str(REPO / 'train.py'), 'tiny.py', f'--out_dir={out_dir}', *flags],
                       cwd=workdir, check=True, capture_output=True, timeout=HANG_S)
    monkeypatch.chdir(workdir)
    import_ablate(monkeypatch, '--compare=out-vanilla,out-rope', '--out_dir=cmp', f'--run_dir={workdir}').main()
    md = (workdir / 'cmp' / 'results.md').read_text(encoding='utf-8')
    rows, header = table_rows(md), tables(md)[0][0]
    assert list(rows) == ['out-vanilla', 'out-rope'] and rows['out-rope'][1] == 'pos=rope'
    for name in rows:
        last = [json.loads(line) for line in (workdir / name / 'log.jsonl').read_text().splitlines()][-1]
        assert rows[name][header.index('final val loss')] == f"{last['val_loss']:.4f}"
    assert all((workdir / 'cmp' / p).stat().st_size > 0
               for p in ('val_loss_vs_iter.png', 'val_loss_vs_flops.png', 'val_loss_vs_time.png'))
    code, err = ablate_here(workdir, workdir / 'cmp', '--compare=out-vanilla,nowhere', monkeypatch=monkeypatch,
                            capsys=capsys)
    assert code == 2 and err.strip() == ("error: compare: 'nowhere' is not a trained train.py out_dir (it has no "
                                         "log.jsonl and no ckpt.pt)"), err


def test_the_eta_takes_each_run_left_as_a_fixed_cost_plus_its_estimate_scaled():
    """Runs of one size that took 10 s over their estimates leave 10 s a run of fixed cost; runs of several sizes
    fit the line (2 s a run plus twice the estimate); runs quicker than estimated scale the rate; a run's FLOPs grow
    with its steps."""
    from ablation.estimate import eta, run_flops
    estimates = {'a': 10.0, 'b': 10.0, 'c': 30.0, 'd': 50.0, 'e': 20.0}
    assert eta(estimates, ['a', 'b'], [20.0, 20.0], ['c', 'd'], 1) == pytest.approx(100.0)
    assert eta(estimates, ['a', 'e'], [22.0, 42.0], ['c', 'd'], 1) == pytest.approx(62.0 + 102.0)
    assert eta(estimates, ['a'], [5.0], ['c', 'd'], 2) == pytest.approx(20.0)
    assert eta(estimates, [], [], ['c', 'd'], 1) == pytest.approx(80.0)  # only failed runs so far
    recipe = dict(batch_size=4, block_size=16, gradient_accumulation_steps=1, eval_iters=2, eval_interval=10)
    assert run_flops({**recipe, 'max_iters': 100}, 1.0) > 1.9 * run_flops({**recipe, 'max_iters': 50}, 1.0)
