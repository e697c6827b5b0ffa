"""ablate.py end to end on a tiny self-made character dataset: report, resume, failures, bad settings."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_char_dataset

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = """\
dataset = 'tiny'
device = 'cpu'
compile = False
n_layer = 1
n_head = 2
n_embd = 16
block_size = 16
batch_size = 4
gradient_accumulation_steps = 1
max_iters = 4
eval_interval = 2
eval_iters = 2
log_interval = 1
"""
TWO_VARIANTS = "{'vanilla': {}, 'rope': {'pos': 'rope'}}"


def make_workdir(path):
    """data/tiny (a repetitive text) and a tiny train config: what train.py reads from its working directory."""
    make_char_dataset(path)  # val: 900 tokens, room for 4x block_size in the extrapolation eval
    (path / 'tiny.py').write_text(TINY_CONFIG)
    return path


def ablate(workdir, out, *args):
    cmd = [sys.executable, str(REPO / 'ablate.py'), f'--run_dir={workdir}', f'--train_config={workdir / "tiny.py"}',
           f'--out_dir={out}', '--extrapolation_iters=2', *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope='module')
def ablated(tmp_path_factory):
    """One 2-variant x 2-seed ablation shared by the tests that read its report."""
    workdir = make_workdir(tmp_path_factory.mktemp('ablate'))
    out = workdir / 'out'
    result = ablate(workdir, out, '--grid=custom', f'--custom={TWO_VARIANTS}', '--seeds=2')
    assert result.returncode == 0, result.stdout + result.stderr
    return workdir, out, result


def table_rows(md):
    rows = [line for line in md.splitlines() if line.startswith('| ') and not line.startswith(('| variant', '| ---'))]
    return {cells[0]: cells for cells in ([c.strip() for c in row.strip('|').split('|')] for row in rows)}


def test_report_has_a_row_per_variant_with_extrapolation(ablated):
    _, out, result = ablated
    assert '[4/4] rope seed 1338' in result.stdout and 'ETA' in result.stdout
    md = (out / 'results.md').read_text(encoding='utf-8')
    assert 'Base recipe' in md and '1337, 1338' in md and 'python ablate.py' in md
    rows = table_rows(md)
    assert list(rows) == ['vanilla', 'rope']
    for cells in rows.values():
        assert len(cells) == 12
        assert '±' in cells[3] and '±' in cells[4]
        assert int(cells[2].replace(',', '')) > 0  # parameters
        float(cells[3].split('±')[0]), float(cells[6]), float(cells[8].replace(',', ''))
    assert rows['vanilla'][5] == '+0.0000'
    assert rows['vanilla'][9] != 'n/a' and rows['vanilla'][10:] == ['n/a', 'n/a']  # learned: 1x only
    assert all(float(v) > 0 for v in rows['rope'][9:])  # rope: 1x, 2x, 4x
    results = json.loads((out / 'results.json').read_text())
    assert set(results['variants']) == {'vanilla', 'rope'} and len(results['runs']) == 4
    rope = results['variants']['rope']
    assert rope['seeds'] == [1337, 1338] and rope['flags'] == {'pos': 'rope'}
    assert [c[0] for c in rope['curve']] == [0, 2, 4]
    done = json.loads((out / 'runs' / 'vanilla' / 'seed1338' / 'done.json').read_text())
    assert done['seed'] == 1338 and done['extrapolation']['2x'] is None and done['kv_bytes_per_token'] == 128
    assert done['final_val_loss'] == done['curve'][-1][1] and done['ms_per_iter'] > 0
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


def test_failed_run_is_reported_and_the_others_finish(tmp_path):
    workdir = make_workdir(tmp_path)
    out = tmp_path / 'out'
    (out / 'runs' / 'ok' / 'seed1337').mkdir(parents=True)  # an unfinished run: cleared and run again
    (out / 'runs' / 'ok' / 'seed1337' / 'stale').write_text('x')
    result = ablate(workdir, out, '--grid=custom', "--custom={'bad': {'n_kv_head': 3}, 'ok': {}}", '--seeds=1')
    assert result.returncode != 0
    assert 'FAILED' in result.stdout and 'bad' in result.stdout and 'n_kv_head' in result.stdout
    assert str(out / 'runs' / 'bad' / 'seed1337' / 'train.log') in result.stdout
    assert 'bad seed 1337' in result.stderr and 'Traceback' not in result.stderr
    assert (out / 'runs' / 'ok' / 'seed1337' / 'done.json').exists()
    assert not (out / 'runs' / 'ok' / 'seed1337' / 'stale').exists()
    assert not (out / 'runs' / 'bad' / 'seed1337' / 'done.json').exists()
    rows = table_rows((out / 'results.md').read_text(encoding='utf-8'))
    assert list(rows) == ['ok'] and rows['ok'][5] == 'n/a'  # no vanilla in the grid: no delta


@pytest.mark.parametrize('args, fragment', [
    (['--grid=custom', "--custom={'a': {'pos': 'rope'"], 'not a Python literal'),
    (['--grid=custom', "--custom={'a': {'posn': 'rope'}}"], "unknown flag(s) 'posn'"),
    (['--grid=default,nope'], "unknown grid group 'nope'"),
    (['--grid=kv'], 'n_kv_heads'),
], ids=['literal', 'flag', 'group', 'kv'])
def test_bad_settings_are_one_line_errors(tmp_path, args, fragment):
    result = ablate(make_workdir(tmp_path), tmp_path / 'out', *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error:') and fragment in lines[0], result.stderr
    assert not (tmp_path / 'out').exists()


def test_grid_runs_each_flag_set_once(monkeypatch, capsys):
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--grid=default,leave_one_out,norm_position,mlp,kv',
                                      '--n_kv_heads=1,2', "--custom={'x y': {}}"])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    base = ablate_module.base_recipe(str(REPO))  # the CPU recipe: 4 heads
    variants = ablate_module.build_grid(base)
    sys.modules.pop('ablate', None)
    assert list(variants)[:6] == ['vanilla', 'vanilla+rms', 'vanilla+swiglu', 'vanilla+gqa', 'vanilla+rope', 'modern']
    assert variants['modern'] == {'norm': 'rms', 'mlp': 'swiglu', 'n_kv_head': 2, 'pos': 'rope'}
    assert variants['modern-rope'] == {**variants['modern'], 'pos': 'learned'}
    assert variants['modern+postnorm'] == {**variants['modern'], 'prenorm': False}
    assert variants['kv=1']['n_kv_head'] == 1
    # mlp=gelu is vanilla, mlp=swiglu is vanilla+swiglu, kv=2 is modern: each runs once
    assert 'mlp=gelu' not in variants and 'mlp=swiglu' not in variants and 'kv=2' not in variants
    assert {'mlp=relu', 'mlp=geglu', 'vanilla+postnorm', 'modern-rms', 'modern-gqa'} <= set(variants)
    assert 'runs once, as vanilla' in capsys.readouterr().out
    assert all(os.sep not in name and ' ' not in name for name in variants)
