"""ablate.py end to end on a tiny self-made character dataset: report, resume, failures, bad settings."""

import importlib
import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def ablate_here(workdir, out, *args, monkeypatch, capsys):
    """ablate.py in this process, for what it decides before it starts a run: (exit code, stderr)."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', f'--run_dir={workdir}', f'--train_config={workdir / "tiny.py"}',
                                      f'--out_dir={out}', *args])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(REPO / 'ablate.py'), run_name='__main__')
    return e.value.code, capsys.readouterr().err


@pytest.fixture(scope='module')
def ablated(tmp_path_factory):
    """One 2-variant x 2-seed ablation, two runs at once, shared by the tests that read its report."""
    workdir = make_workdir(tmp_path_factory.mktemp('ablate'))
    out = workdir / 'out'
    result = ablate(workdir, out, '--grid=custom', f'--custom={TWO_VARIANTS}', '--seeds=2', '--parallel=2',
                    '--extrapolation=plain,yarn,window')
    assert result.returncode == 0, result.stdout + result.stderr
    return workdir, out, result


def tables(md):
    """Each Markdown table of the report: a list of rows of cells, the header first."""
    out, current = [], None
    for line in md.splitlines() + ['']:
        if line.startswith('|'):
            if current is None:
                current = []
                out.append(current)
            if not set(line) <= set('|-: '):
                current.append([c.strip() for c in line.strip().strip('|').split('|')])
        else:
            current = None
    return out


def curve_end(curve, goal):
    """The first iteration of a curve at or below goal: for the reference itself, at the latest its last."""
    return next(c[0] for c in curve if c[1] <= goal)


def table_rows(md):
    """The main table: {variant: cells}."""
    return {cells[0]: cells for cells in tables(md)[0][1:]}


def test_report_has_a_row_per_variant_with_extrapolation(ablated):
    _, out, result = ablated
    assert '[4/4] rope seed 1338' in result.stdout and 'ETA' in result.stdout
    # two at a time: the second run started before the first finished
    assert result.stdout.index('[2/4] vanilla seed 1338 started') < result.stdout.index('done in')
    md = (out / 'results.md').read_text(encoding='utf-8')
    assert 'Base recipe' in md and '1337, 1338' in md and 'python ablate.py' in md
    main, length, _ = tables(md)  # the probes' table last
    assert main[0][:5] == ['variant', 'flags', 'parameters', 'active', 'final val loss']
    rows = table_rows(md)
    assert list(rows) == ['vanilla', 'rope']
    for cells in rows.values():
        assert len(cells) == 13
        assert '±' in cells[4] and '±' in cells[5]
        assert int(cells[2].replace(',', '')) == int(cells[3].replace(',', '')) > 0  # dense: all active
        float(cells[4].split('±')[0]), float(cells[8]), float(cells[10].replace(',', ''))
        assert cells[11] == 'n/a' and cells[12] == '-'  # no experts; nothing diverged
    assert rows['vanilla'][6] == '+0.0000'
    # the first evaluation at or below vanilla's final loss: each variant's own mean curve against it
    results = json.loads((out / 'results.json').read_text())
    goal = results['variants']['vanilla']['final_val_loss']
    assert main[0][7] == 'reaches vanilla at iter'
    for name, cells in rows.items():
        curve = results['variants'][name]['curve']
        first = next((str(c[0]) for c in curve if c[1] <= goal), 'not reached')
        assert cells[7] == first, (name, curve, goal)
    assert rows['vanilla'][7] == str(curve_end(results['variants']['vanilla']['curve'], goal))
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


def report_here(workdir, out, *args, monkeypatch, capsys, run_dir=None):
    """ablate.py --report_only=True in this process on the fixture's runs: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', f'--run_dir={run_dir or workdir}',
                                      f'--train_config={workdir / "tiny.py"}',
                                      f'--out_dir={out}', '--extrapolation_iters=2', '--grid=custom',
                                      f'--custom={TWO_VARIANTS}', '--seeds=2', '--report_only=True', *args])
    code = 0
    try:
        runpy.run_path(str(REPO / 'ablate.py'), run_name='__main__')
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


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
    result = ablate(workdir, out, '--grid=custom', "--custom={'bad': {'n_kv_head': 3}, 'ok': {}}", '--seeds=1')
    assert result.returncode != 0
    assert 'FAILED' in result.stdout and 'bad' in result.stdout and 'n_kv_head' in result.stdout
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
    assert variants['modern+postnorm'] == {**variants['modern'], 'norm_position': 'post'}
    assert variants['kv=1']['n_kv_head'] == 1
    # mlp=gelu is vanilla, mlp=swiglu is vanilla+swiglu, kv=2 is modern: each runs once
    assert 'mlp=gelu' not in variants and 'mlp=swiglu' not in variants and 'kv=2' not in variants
    assert {'mlp=relu', 'mlp=geglu', 'vanilla+postnorm', 'modern-rms', 'modern-gqa'} <= set(variants)
    assert 'runs once, as vanilla' in capsys.readouterr().out
    assert all(os.sep not in name and ' ' not in name for name in variants)


def test_groups_are_built_from_the_swap_tables(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--grid=moe,attention,stability,long_context',
                                      '--learning_rates=1e-3,1e-2'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    variants = ablate_module.build_grid(ablate_module.base_recipe(str(REPO)))  # the CPU recipe: 4 heads of 32
    sys.modules.pop('ablate', None)
    modern = variants['modern']
    assert variants['moe'] == {**modern, 'mlp': 'moe', 'n_expert': 8, 'n_expert_active': 2, 'moe_aux_loss_coef': 0.01}
    assert variants['dense-as-total']['ffn_hidden'] == 8 * 192  # 8 experts of half the 384-wide SwiGLU
    assert variants['moe-sigmoid']['router'] == 'sigmoid' and 'moe_aux_loss_coef' not in variants['moe-sigmoid']
    # MLA's cache: latent + rotated key = GQA's 2 K/V heads x 2 x 32 = 128, MQA's 64
    mla = variants['mla-gqa-cache']
    assert mla['attn'] == 'mla' and mla['kv_lora_rank'] + mla['qk_rope_head_dim'] == 128
    assert variants['mla-mqa-cache']['kv_lora_rank'] + variants['mla-mqa-cache']['qk_rope_head_dim'] == 64
    assert variants['modern+qk_norm_lr=0.01'] == {**modern, 'qk_norm': True, 'learning_rate': 0.01, 'min_lr': 0.001}
    assert 'vanilla' in variants and 'mha' in variants and 'mqa' in variants


def test_the_recipe_groups_vary_one_thing_on_the_modern_block(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--grid=schedule,optimizer,recipe_mlp,zero_init',
                                      '--adamw_lrs=1e-3,3e-3', '--muon_lrs=0.02'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    base = ablate_module.base_recipe(str(REPO))  # the CPU recipe: learning_rate 1e-3
    variants = ablate_module.build_grid(base)
    sys.modules.pop('ablate', None)
    modern = variants['modern']  # adamw lr=1e-3 and modern mlp=swiglu are the recipe's modern: run once
    assert 'adamw_lr=0.001' not in variants and 'modern_mlp=swiglu' not in variants
    assert variants['adamw_lr=0.003'] == {**modern, 'learning_rate': 0.003, 'min_lr': 0.003 / 10}
    assert variants['muon_lr=0.02'] == {**modern, 'optimizer': 'muon', 'muon_lr': 0.02}
    assert variants['modern+wsd'] == {**modern, 'lr_schedule': 'wsd'}
    assert variants['modern_mlp=relu2'] == {**modern, 'mlp': 'relu2', 'ffn_hidden': 576}  # SwiGLU's 384 x 1.5
    assert variants['modern_untied+zero_init'] == {**modern, 'tie_embeddings': False, 'zero_init': True}
    from model import GPT, GPTConfig
    mlp_params = lambda flags: sum(p.numel() for p in GPT(GPTConfig(**{**ablate_module.model_args(base), **flags}))
                                   .transformer.h[0].mlp.parameters())
    assert mlp_params(variants['modern_mlp=gelu']) == mlp_params(variants['modern_mlp=relu2']) == mlp_params(modern)


def test_the_per_layer_groups_vary_one_thing_on_the_modern_block(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--grid=local_global,sinks,gate,nope,norm_position'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    base = ablate_module.base_recipe(str(REPO))  # the CPU recipe: 4 layers, block_size 64
    variants = ablate_module.build_grid(base)
    sys.modules.pop('ablate', None)
    modern, window = variants['modern'], {'sliding_window': 16}  # a quarter of block_size
    assert variants['layers=LLLG'] == {**modern, 'layers': 'LLLG', **window}
    assert variants['layers=L'] == {**modern, 'layers': 'L', **window}
    assert variants['layers=LG+sinks'] == {**modern, 'layers': 'LG', **window, 'attn_sinks': True}
    assert variants['modern+gate'] == {**modern, 'attn_gate': True}
    assert variants['layers=GGGN'] == {**modern, 'layers': 'GGGN'}
    assert variants['rope_fraction=0.25'] == {**modern, 'rope_fraction': 0.25}
    assert variants['modern+sandwich'] == {**modern, 'norm_position': 'sandwich'}
    assert variants['modern+after'] == {**modern, 'norm_position': 'after'}
    from model import GPTConfig
    for flags in variants.values():  # every variant is a model the recipe can build
        GPTConfig(**{**ablate_module.model_args(base), **flags})


def test_the_hybrid_group_varies_the_layer_kinds_at_about_equal_parameters(monkeypatch):
    """Each constant-memory kind 3:1 with global attention and alone: Gated DeltaNet differs from modern only in
    its layers and widths, Kimi Delta Attention, Mamba-2 and the short convolution in their layers and MLP width,
    and the parameters of all stay within 1% of modern's."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--grid=hybrid'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    base = ablate_module.base_recipe(str(REPO))
    variants = ablate_module.build_grid(base)
    sys.modules.pop('ablate', None)
    assert list(variants) == ['modern', 'layers=DDDG', 'layers=D', 'layers=KKKG', 'layers=K', 'layers=SSSG',
                              'layers=S', 'layers=VVVG', 'layers=V']
    modern = variants['modern']
    for kind in 'KSV':
        for pattern in (kind * 3 + 'G', kind):
            flags = variants[f'layers={pattern}']
            assert flags == {**modern, 'layers': pattern, 'ffn_hidden': flags['ffn_hidden']}
    linear = {k: v for k, v in variants['layers=D'].items() if k.startswith('linear_')}
    assert variants['layers=DDDG'] == {**modern, 'layers': 'DDDG', **linear}
    assert variants['layers=D'] == {**modern, 'layers': 'D', **linear}
    from model import GPT, GPTConfig
    sizes = [GPT(GPTConfig(**{**ablate_module.model_args(base), 'vocab_size': 65, **flags})).get_num_params()
             for flags in variants.values()]
    assert max(sizes) < 1.01 * sizes[0] and min(sizes) > 0.99 * sizes[0], sizes


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
    deadline = time.time() + 120
    while not log.exists():
        assert time.time() < deadline
        time.sleep(0.2)
    child = int((out / 'runs' / 'slow' / 'seed1337' / '.lock').read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30
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


def test_claims_are_whole_and_stale_ones_are_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['ablate.py'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    sys.modules.pop('ablate', None)
    run = str(tmp_path / 'seed1337')
    assert ablate_module.claim(run) is None  # ours now
    owner = json.loads((tmp_path / 'seed1337.claim').read_text())
    assert owner['pid'] == os.getpid()
    assert ablate_module.claim(run) == f"{owner['host']}:{os.getpid()}"  # held by a live process
    (tmp_path / 'seed1337.claim').write_text(json.dumps({'host': owner['host'], 'pid': 2 ** 22 + 12345}))
    assert ablate_module.claim(run) is None  # its owner on this host is dead
    (tmp_path / 'seed1337.claim').write_text(json.dumps({'host': 'elsewhere', 'pid': 1}))
    assert ablate_module.claim(run) == 'elsewhere:1'  # another node, refreshing it
    os.utime(tmp_path / 'seed1337.claim', (0, 0))
    assert ablate_module.claim(run) is None  # another node that stopped refreshing it
    assert sorted(p.name for p in tmp_path.iterdir()) == ['seed1337.claim']  # nothing else left beside it


def import_ablate(monkeypatch, *argv):
    """ablate.py as a module, its settings from argv."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', *argv])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    module = importlib.import_module('ablate')
    sys.modules.pop('ablate', None)
    return module


@pytest.mark.parametrize('returncode', [0, 1])
def test_a_run_whose_folder_went_away_fails_alone(tmp_path, monkeypatch, returncode):
    """Its folder deleted while train.py ran: that run is one FAILED line, not a traceback that stops the grid
    (main releases its claim and goes on)."""
    from types import SimpleNamespace
    ablate_module = import_ablate(monkeypatch)
    path = tmp_path / 'runs' / 'gone' / 'seed1337'
    path.mkdir(parents=True)
    log = open(path / 'train.log', 'w')
    (path / 'train.log').unlink()
    path.rmdir()
    why = ablate_module.finish(('gone', {}, 1337, str(path)), SimpleNamespace(returncode=returncode), log, 1.0,
                               str(tmp_path))
    assert 'went away' in why and str(path) in why and log.closed


def test_a_run_finished_between_the_look_and_the_claim_is_not_retrained(tmp_path, monkeypatch):
    ablate_module = import_ablate(monkeypatch)
    path = tmp_path / 'runs' / 'v' / 'seed1337'
    path.mkdir(parents=True)
    real_claim = ablate_module.claim

    def claim_after_another_finished(run):
        (path / 'done.json').write_text('{}')  # another process, just before our claim
        return real_claim(run)
    monkeypatch.setattr(ablate_module, 'claim', claim_after_another_finished)
    assert ablate_module.take(str(path)) == 'finished'
    assert (path / 'done.json').exists() and not (tmp_path / 'runs' / 'v' / 'seed1337.claim').exists()
    monkeypatch.setattr(ablate_module, 'claim', real_claim)
    (path / 'done.json').unlink()
    assert ablate_module.take(str(path)) is None  # free: ours to train


def test_one_seed_shows_no_spread(monkeypatch):
    ablate_module = import_ablate(monkeypatch)
    assert ablate_module.mean_std([2.3786]) == '2.3786 (1 seed)'
    assert ablate_module.mean_std([1.0, 2.0]) == '1.5000 ± 0.7071'


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
    monkeypatch.setattr(ablate_module, 'claim', held_by_another_that_finishes_it)
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


def test_the_chunked_group_sets_chunks_against_windows_of_the_same_size(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--grid=chunked'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    base = ablate_module.base_recipe(str(REPO))  # the CPU recipe: block_size 64
    variants = ablate_module.build_grid(base)
    sys.modules.pop('ablate', None)
    modern = variants['modern']
    assert list(variants) == ['modern', 'layers=GGGN', 'layers=CCCN+attention_chunk_size=16',
                              'layers=LLLN+sliding_window=16', 'layers=CCCN+attention_chunk_size=32',
                              'layers=LLLN+sliding_window=32']
    assert variants['layers=CCCN+attention_chunk_size=16'] == {**modern, 'layers': 'CCCN', 'attention_chunk_size': 16}
    assert variants['layers=LLLN+sliding_window=32'] == {**modern, 'layers': 'LLLN', 'sliding_window': 32}
    from model import GPT, GPTConfig
    sizes = {GPT(GPTConfig(**{**ablate_module.model_args(base), 'vocab_size': 65, **flags})).get_num_params()
             for flags in variants.values()}
    assert len(sizes) == 1  # chunks and windows change no weight


def ablate_grid(monkeypatch, *argv):
    """ablate.py's module as these arguments configure it, its base recipe and its grid."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', *argv])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    try:
        module = importlib.import_module('ablate')
        base = module.base_recipe(str(REPO))
        return module, base, module.build_grid(base)
    finally:
        sys.modules.pop('ablate', None)


def test_the_sparse_and_mtp_groups_vary_only_their_flags(monkeypatch):
    """sparse: modern, and DSA at k of a quarter and an eighth of block_size, with and without the KL loss; mtp:
    modern and depths 1 and 2; every variant a model the recipe builds."""
    ablate_module, base, variants = ablate_grid(monkeypatch, '--grid=sparse,mtp')
    modern, quarter, eighth = variants['modern'], base['block_size'] // 4, base['block_size'] // 8
    assert list(variants) == ['modern', f'dsa_topk={quarter}', f'dsa_topk={quarter}_no_kl', f'dsa_topk={eighth}',
                              f'dsa_topk={eighth}_no_kl', 'mtp_depth=1', 'mtp_depth=2']
    sparse = variants[f'dsa_topk={eighth}']
    assert sparse == {**modern, 'index_topk': eighth, 'index_loss_coef': 1.0, 'index_head_dim': sparse['index_head_dim']}
    assert variants[f'dsa_topk={eighth}_no_kl'] == {**sparse, 'index_loss_coef': 0.0}
    assert variants['mtp_depth=2'] == {**modern, 'mtp_depth': 2}
    from model import GPTConfig
    for flags in variants.values():
        GPTConfig(**{**ablate_module.model_args(base), **flags})


def test_the_kv_sharing_group_shares_a_quarter_and_a_half_of_the_layers_and_sets_k_eq_v(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--grid=kv_sharing'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    base = ablate_module.base_recipe(str(REPO))  # the CPU recipe: 4 layers
    variants = ablate_module.build_grid(base)
    sys.modules.pop('ablate', None)
    modern = variants['modern']
    assert list(variants) == ['modern', 'kv_shared_layers=1', 'kv_shared_layers=2', 'modern+attn_k_eq_v']
    assert variants['kv_shared_layers=2'] == {**modern, 'kv_shared_layers': 2}
    from model import GPT, GPTConfig
    cache = [GPT(GPTConfig(**{**ablate_module.model_args(base), 'vocab_size': 65, **flags})).kv_cache_bytes(1, 64)
             for flags in variants.values()]
    assert cache == [cache[0], cache[0] * 3 // 4, cache[0] // 2, cache[0]]  # K = V keeps both in the cache


def test_the_per_layer_embeddings_group_matches_the_dense_block_in_parameters_and_in_flops(monkeypatch):
    """Gemma 4's per-layer embeddings against the modern block widened (ffn_hidden) to the same total parameters
    and to the same FLOPs per token: each control nearer its target than one MLP unit more or less would be."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--grid=per_layer_embeddings'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    base = ablate_module.base_recipe(str(REPO))  # the CPU recipe: 4 layers, 128 wide
    variants = ablate_module.build_grid(base)
    sys.modules.pop('ablate', None)
    names = list(variants)
    assert names[:2] == ['modern', 'per_layer_embd=32'] and len(names) == 4
    assert variants['per_layer_embd=32'] == {**variants['modern'], 'per_layer_embd': 32}
    from model import GPT, GPTConfig
    args = {**ablate_module.model_args(base), 'vocab_size': ablate_module.base_vocab(base)}
    build = lambda flags: GPT(GPTConfig(**{**args, **flags}))
    ple = build(variants['per_layer_embd=32'])
    for name, measure in ((names[2], lambda m: m.get_num_params()), (names[3], lambda m: m.flops_per_token())):
        flags = variants[name]
        assert name.endswith(f"_ffn={flags['ffn_hidden']}") and 'per_layer_embd' not in flags
        gaps = [abs(measure(build({**flags, 'ffn_hidden': flags['ffn_hidden'] + d})) - measure(ple)) for d in (-1, 0, 1)]
        assert gaps[1] <= min(gaps[0], gaps[2])
    assert build(variants[names[2]]).get_num_params() > build(variants['modern']).get_num_params()


# ----------------------------------------------------------------------------- evidence: tasks, statistics, probes
def fabricated_run(workdir, out, name, flags, seed, val_loss, accuracy, lengths=None):
    """A finished run written by hand: an old done.json (so the report summarizes it again from its log.jsonl)
    and a log of two evaluations, the last with the given val loss and task accuracy."""
    path = out / 'runs' / name / f'seed{seed}'
    path.mkdir(parents=True)
    args = [str(workdir / 'tiny.py')] + [f'--{k}={v!r}' for k, v in flags.items()] + [f'--seed={seed}',
                                                                                      '--wandb_log=False']
    (path / 'done.json').write_text(json.dumps({'variant': name, 'flags': flags, 'seed': seed, 'args': args,
                                                'duration_s': 1.0, 'version': 3}))
    records = [{'iter': 0, 'val_loss': 3.0, 'elapsed_s': 0.0, 'ms_per_iter': None, 'tokens': 0, 'accuracy': 0.1},
               {'iter': 4, 'val_loss': val_loss, 'elapsed_s': 1.0, 'ms_per_iter': 10.0, 'tokens': 64,
                'accuracy': accuracy, **({'lengths': lengths} if lengths else {})}]
    (path / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))


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


def test_the_evidence_groups(tmp_path, monkeypatch, capsys):
    """recall: 5 architectures x widths x lengths, each length its own dataset (a missing one is one line naming
    its prepare command); length_generalization on data/copy; sinks with the gate and learned sinks."""
    workdir = make_workdir(tmp_path)
    code, err = ablate_here(workdir, tmp_path / 'out', '--grid=recall', monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and 'python data/recall/prepare.py --seq_len 32 --num_pairs 4' in lines[0]
    for length in (32, 64):
        (workdir / 'data' / f'recall_{length}').mkdir(parents=True)
        (workdir / 'data' / f'recall_{length}' / 'meta.json').write_text(json.dumps({'example_length': length}))
    (workdir / 'data' / 'copy').mkdir()
    (workdir / 'data' / 'copy' / 'meta.json').write_text(json.dumps({'splits': {
        'train': {'example_length': 33}, 'val': {'example_length': 33}, 'val_4x': {'example_length': 129}}}))
    monkeypatch.setattr(sys, 'argv', ['ablate.py', f'--run_dir={workdir}', '--grid=recall,length_generalization,sinks',
                                      '--recall_widths=32,64', '--recall_lengths=32,64'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    sys.modules.pop('ablate', None)
    base = ablate_module.base_recipe(str(REPO))
    variants = ablate_module.build_grid(base)
    recall = [n for n in variants if n.endswith(('L=32', 'L=64'))]
    assert len(recall) == 5 * 2 * 2
    wide = variants['global_d=64_L=32']
    assert {k: wide[k] for k in ('dataset', 'block_size', 'n_embd', 'n_head', 'pos')} == {
        'dataset': 'recall_32', 'block_size': 31, 'n_embd': 64, 'n_head': 2, 'pos': 'rope'}
    assert variants['L_d=32_L=64'] == {**variants['global_d=32_L=64'], 'layers': 'L', 'sliding_window': 16}
    assert variants['DDDG_d=64_L=64']['layers'] == 'DDDG' and variants['mla_d=64_L=64']['attn'] == 'mla'
    assert variants['learned']['pos'] == 'learned' and variants['learned']['block_size'] == 128
    assert variants['rope']['block_size'] == 32 and variants['nope']['layers'] == 'N'
    assert all(variants[n]['dataset'] == 'copy' for n in ('learned', 'rope', 'nope', 'layers=GGGN'))
    assert variants['modern+gate+sinks'] == {**variants['modern'], 'attn_gate': True, 'attn_sinks': True}
    from model import GPTConfig
    for flags in variants.values():  # every variant is a model the recipe can build
        GPTConfig(**{**ablate_module.model_args(base), **{k: v for k, v in flags.items() if k != 'dataset'}})


def test_the_recall_group_takes_any_layer_pattern_at_about_equal_parameters(tmp_path, monkeypatch, capsys):
    """recall_archs: Kimi Delta Attention, Mamba-2, the short convolution (issue 31's recall question) beside global
    attention, each width's models within 1% of its global one; a pattern of unknown letters is one line."""
    workdir = make_workdir(tmp_path)
    (workdir / 'data' / 'recall_32').mkdir(parents=True)
    (workdir / 'data' / 'recall_32' / 'meta.json').write_text(json.dumps({'example_length': 32, 'vocab_size': 64}))
    code, err = ablate_here(workdir, tmp_path / 'out', '--grid=recall', '--recall_lengths=32', '--recall_archs=global,XG',
                            monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "recall_archs must be" in err and "'global,XG'" in err
    monkeypatch.setattr(sys, 'argv', ['ablate.py', f'--run_dir={workdir}', '--grid=recall', '--recall_widths=32,64',
                                      '--recall_lengths=32', '--recall_archs=global,KKKG,S,VVVG'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    sys.modules.pop('ablate', None)
    base = ablate_module.base_recipe(str(REPO))
    variants = ablate_module.build_grid(base)
    assert list(variants) == [f'{a}_d={w}_L=32' for w in (32, 64) for a in ('global', 'KKKG', 'S', 'VVVG')]
    from model import GPT, GPTConfig
    for width in (32, 64):
        sizes = [GPT(GPTConfig(**{**ablate_module.model_args(base), 'vocab_size': 64,
                                  **{k: v for k, v in variants[f'{a}_d={width}_L=32'].items() if k != 'dataset'}}))
                 .get_num_params() for a in ('global', 'KKKG', 'S', 'VVVG')]
        assert max(sizes) < 1.01 * sizes[0] and min(sizes) > 0.99 * sizes[0], sizes
    assert variants['S_d=64_L=32']['layers'] == 'S' and variants['S_d=64_L=32']['n_embd'] == 64


def test_the_recall_group_takes_pair_counts_each_its_own_dataset(tmp_path, monkeypatch, capsys):
    """recall_pairs: the same length at several pair counts (the state's load), L / 8 keeping its old names and
    data/recall_<L>, any other count data/recall_<L>_p<P>; a missing dataset or a count that does not fit is one
    line."""
    workdir = make_workdir(tmp_path)
    (workdir / 'data' / 'recall_32').mkdir(parents=True)
    (workdir / 'data' / 'recall_32' / 'meta.json').write_text(json.dumps(
        {'example_length': 32, 'settings': {'num_pairs': 4}}))
    args = ('--grid=recall', '--recall_lengths=32', '--recall_widths=64', '--recall_archs=global,D')
    code, err = ablate_here(workdir, tmp_path / 'out', *args, '--recall_pairs=4,8', monkeypatch=monkeypatch,
                            capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].endswith(
        'python data/recall/prepare.py --seq_len 32 --num_pairs 8 --vocab_size 64 --out_dir data/recall_32_p8')
    code, err = ablate_here(workdir, tmp_path / 'out', *args, '--recall_pairs=9', monkeypatch=monkeypatch,
                            capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and '9 pairs' in lines[0] and '1 to 8 pairs' in lines[0]
    (workdir / 'data' / 'recall_32_p8').mkdir()
    (workdir / 'data' / 'recall_32_p8' / 'meta.json').write_text(json.dumps(
        {'example_length': 32, 'settings': {'num_pairs': 2}}))  # not the count its name says
    code, err = ablate_here(workdir, tmp_path / 'out', *args, '--recall_pairs=8', monkeypatch=monkeypatch,
                            capsys=capsys)
    assert code == 2 and 'data/recall_32_p8 (examples of 32 tokens, 8 pairs)' in err
    (workdir / 'data' / 'recall_32_p8' / 'meta.json').write_text(json.dumps(
        {'example_length': 32, 'settings': {'num_pairs': 8}}))
    monkeypatch.setattr(sys, 'argv', ['ablate.py', f'--run_dir={workdir}', *args, '--recall_pairs=4,8'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    sys.modules.pop('ablate', None)
    variants = ablate_module.build_grid(ablate_module.base_recipe(str(REPO)))
    assert list(variants) == ['global_d=64_L=32', 'D_d=64_L=32', 'global_d=64_L=32_P=8', 'D_d=64_L=32_P=8']
    assert variants['D_d=64_L=32_P=8'] == {**variants['D_d=64_L=32'], 'dataset': 'recall_32_p8'}
    assert ablate_module.recall_points(variants) == {
        'global_d=64_L=32': ('global', (32, 4), 64), 'D_d=64_L=32': ('D', (32, 4), 64),
        'global_d=64_L=32_P=8': ('global', (32, 8), 64), 'D_d=64_L=32_P=8': ('D', (32, 8), 64)}


def test_a_rope_run_on_copy_is_scaled_to_each_evaluation_length(tmp_path, monkeypatch, capsys):
    """task_lengths: each scaling of a RoPE checkpoint at data/copy's val, val_2x, val_4x; at 1x a scaling is plain
    RoPE, so it scores train.py's own val evaluation (the same first examples); cached in lengths.json."""
    import common.errors
    from common.files import release_out_dirs
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'argv', ['prepare.py', '--length', '4', '--num_train', '64', '--num_val', '16',
                                      '--out_dir', str(tmp_path / 'data' / 'copy')])
    runpy.run_path(str(REPO / 'data' / 'copy' / 'prepare.py'), run_name='__main__')
    monkeypatch.setattr(sys, 'argv', ['train.py', '--dataset=copy', '--device=cpu', '--compile=False', '--n_layer=1',
                                      '--n_head=2', '--n_embd=16', '--block_size=8', '--batch_size=4', '--eval_iters=2',
                                      '--gradient_accumulation_steps=1', '--max_iters=4', '--eval_interval=4',
                                      '--pos=rope', '--out_dir=run'])
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    try:
        runpy.run_path(str(REPO / 'train.py'), run_name='__main__')
    finally:
        release_out_dirs()
    logged = json.loads((tmp_path / 'run' / 'log.jsonl').read_text().splitlines()[-1])
    monkeypatch.setattr(sys, 'argv', ['ablate.py', '--extrapolation_iters=2'])
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop('ablate', None)
    ablate_module = importlib.import_module('ablate')
    sys.modules.pop('ablate', None)
    figures = ablate_module.task_lengths(str(tmp_path / 'run'), str(tmp_path), ['plain', 'linear', 'yarn'])
    capsys.readouterr()
    assert set(figures) == {'linear', 'yarn'} and set(figures['linear']) == {'val', 'val_2x', 'val_4x'}
    assert figures['linear']['val']['accuracy'] == pytest.approx(logged['accuracy'])
    assert figures['linear']['val']['loss'] == pytest.approx(logged['val_loss'], rel=1e-5)
    assert all(0 <= f['accuracy'] <= 1 for f in figures['yarn'].values())
    # the windowed length table (text) would score windows across examples: for a task it is left empty, and says so
    # without a model (cached as None, loaded once)
    monkeypatch.setattr(ablate_module, 'length_loss', lambda *a: pytest.fail('no windows of a task are scored'))
    windows, why = ablate_module.extrapolation_losses(str(tmp_path / 'run'), str(tmp_path), ['plain', 'yarn'])
    assert why == '' and all(v is None for losses in windows.values() for v in losses.values())
    assert ablate_module.lengths_missing(str(tmp_path / 'run'), ['plain', 'yarn']) == []
    monkeypatch.setattr(ablate_module, 'load_checkpoint', lambda *a: pytest.fail('cached: nothing to load'))
    assert ablate_module.task_lengths(str(tmp_path / 'run'), str(tmp_path), ['linear', 'yarn']) == figures
