"""ablation/miniseries.py: the plan (sizes, tokens, schedule at each depth), the fit, the multipliers with their
intervals and trend, and ablate.py's miniseries end to end on a tiny self-made dataset."""

import json
import math
import sys

import pytest

from ablation import miniseries
from conftest import ABLATE_PY, ablate_grid, ablate_here, make_workdir

CHAR = 'config/ablate_miniseries_char_cpu.py'


# ----------------------------------------------------------------------------- synthetic series

def curve(e, ln_a, alpha):
    return lambda x: e + math.exp(ln_a - alpha * math.log(x))


def records(members, depths=(1, 2, 3, 4), seeds=(0.0,), steps_of=None):
    """Run records in results.json's shape: each member a loss curve of FLOPs, its runs at depth d using 10^(d+6)
    FLOPs (times its own factor), a seed adding its offset to the loss."""
    out = []
    for member, (loss_of, factor) in members.items():
        for depth in depths:
            flops = factor * 10.0 ** (depth + 6)
            for k, offset in enumerate(seeds):
                out.append({'member': member, 'depth': depth, 'seed': 1337 + k, 'params': 0, 'flops': flops,
                            'tokens': 0, 'steps': 100 * depth, 'seconds': flops / 1e9,
                            'val_loss': loss_of(flops) + offset, 'val_bpb': None})
    return out


def test_the_fit_recovers_a_shared_floor_and_each_members_exponent():
    target, other = curve(1.0, 3.0, 0.2), curve(1.0, 2.5, 0.25)
    judged = miniseries.judge_axis(records({'t': (target, 1.0), 'o': (other, 1.0)}), 'flops', 't')
    fit = judged['fit']
    assert fit['E'] == pytest.approx(1.0, abs=1e-3)
    assert fit['members']['t']['alpha'] == pytest.approx(0.2, abs=1e-3)
    assert fit['members']['o']['alpha'] == pytest.approx(0.25, abs=1e-3)
    assert fit['rms_residual'] < 1e-5 and fit['seed_std'] is None and not fit['poor']


def test_a_member_that_is_the_target_shifted_in_compute_has_that_multiplier_at_every_depth():
    """A member whose loss at x is the target's at 3x: it is worth 3x the target's FLOPs everywhere, no trend;
    seeds' noise gives an interval around it."""
    target = curve(1.2, 2.0, 0.15)
    shifted = lambda x: target(3.0 * x)
    judged = miniseries.judge_axis(records({'t': (target, 1.0), 's': (shifted, 1.0)},
                                           seeds=(-0.002, 0.0, 0.002)), 'flops', 't')
    s = judged['members']['s']
    assert s['value'] == pytest.approx(3.0, rel=0.02)
    assert s['lo'] < 3.0 < s['hi'] and s['hi'] / s['lo'] < 1.5
    for depth in (1, 2, 3, 4):
        assert s['depths'][depth]['value'] == pytest.approx(3.0, rel=0.02)
    assert s['slope'] == pytest.approx(0.0, abs=0.01) and s['slope_lo'] <= 0.0 <= s['slope_hi']
    # at the top the target would need 3x its largest FLOPs: read past 2x, which is said
    assert s['extrapolated'] and s['depths'][4]['extrapolated'] and not s['depths'][3]['extrapolated']


def test_a_gain_that_grows_with_scale_has_a_positive_trend():
    target, steeper = curve(1.0, 2.0, 0.15), curve(1.0, 2.0, 0.2)  # the same at x = 1, better the larger x
    judged = miniseries.judge_axis(records({'t': (target, 1.0), 'g': (steeper, 1.0)},
                                           seeds=(-0.001, 0.0, 0.001)), 'flops', 't')
    g = judged['members']['g']
    assert g['slope'] > 0.1 and g['slope_lo'] > 0
    values = [g['depths'][d]['value'] for d in (1, 2, 3, 4)]
    assert values == sorted(values) and values[0] > 1


def test_a_member_past_the_targets_reach_is_marked_and_one_below_its_floor_is_none_in_json():
    target = curve(1.0, 1.0, 0.3)
    far = lambda x: target(50.0 * x)  # the target needs 50x: past 2x its largest measured FLOPs at the top depths
    below = lambda x: 0.9  # under the target's floor E = 1.0: it never gets there (fit with E below 0.9 though)
    judged = miniseries.judge_axis(records({'t': (target, 1.0), 'f': (far, 1.0)}), 'flops', 't')
    f = judged['members']['f']
    assert f['depths'][4]['extrapolated'] and not f['depths'][1]['extrapolated']
    assert '†' in miniseries.fmt_multiplier(f['depths'][4])
    fit = {'E': 1.0, 'x0': 1.0, 'members': {'t': (0.0, 0.3)}}
    assert miniseries.inverse(fit, 't', 0.95) == math.inf
    assert miniseries.json_ready({'value': math.inf, 'lo': 2.0}) == {'value': None, 'lo': 2.0}
    assert miniseries.fmt_multiplier({'value': math.inf, 'lo': None, 'hi': None, 'extrapolated': True}).startswith(
        'never')
    assert below(1) < 1.0


def test_a_poor_fit_is_said():
    """Losses that jump where a power law bends smoothly, seeds that agree closely: residuals beyond the spread."""
    target = lambda x: {1e7: 3.0, 1e8: 2.95, 1e9: 1.5, 1e10: 1.45}[x]
    judged = miniseries.judge_axis(records({'t': (target, 1.0), 'o': (target, 1.0)}, seeds=(-0.001, 0.001)),
                                   'flops', 't')
    assert judged['fit']['poor'] and judged['fit']['rms_residual'] > judged['fit']['seed_std']
    lines = miniseries.axis_lines('flops', judged, [1, 2, 3, 4], 't')
    assert any('a poor fit' in line for line in lines)


def test_each_axis_is_judged_on_its_own_figures():
    """Steps are the same for every member at a depth; seconds here are FLOPs / 1e9: the steps multiplier is the
    loss gap read on the target's steps curve, the seconds one equals the FLOPs one."""
    target = curve(1.0, 3.0, 0.2)
    better = lambda x: target(2.0 * x)
    judged = miniseries.judge(records({'t': (target, 1.0), 'b': (better, 1.0)}, seeds=(-0.001, 0.0, 0.001)), 't')
    assert set(judged) == {'flops', 'steps', 'seconds'}
    assert judged['seconds']['members']['b']['value'] == pytest.approx(judged['flops']['members']['b']['value'],
                                                                       rel=1e-3)
    assert judged['steps']['members']['b']['value'] > 1


def test_no_fit_without_three_depths_of_the_target():
    target = curve(1.0, 3.0, 0.2)
    assert miniseries.judge_axis(records({'t': (target, 1.0)}, depths=(1, 2)), 'flops', 't') is None


# ----------------------------------------------------------------------------- the plan

def test_the_plan_sizes_each_depth_and_gives_its_members_the_targets_tokens(monkeypatch):
    from ablation.grid import build_grid
    module, base, _ = ablate_grid(monkeypatch, CHAR)
    plan = miniseries.plan(base, module.settings, build_grid, module.target_model)
    from ablation.runs import scaling_params
    depths = sorted({d for _, d, _ in plan.values()})
    assert depths == [1, 2, 3, 4]
    tokens_per_iter = base['batch_size'] * base['block_size']
    for depth in depths:
        at = {member: flags for member, d, flags in plan.values() if d == depth}
        assert list(at) == ['vanilla', 'vanilla+rms', 'vanilla+swiglu', 'vanilla+gqa', 'vanilla+rope', 'modern']
        assert {(f['n_layer'], f['n_embd'], f['n_head']) for f in at.values()} == {(depth, 32 * depth, 2 * depth)}
        iters = {f['max_iters'] for f in at.values()}
        assert len(iters) == 1  # the same tokens for every member
        params = scaling_params(module.target_model({**base, **at['vanilla']}))
        assert iters.pop() == math.ceil(8.0 * params / tokens_per_iter)
        f = at['modern']
        assert f['lr_decay_iters'] == f['max_iters'] and f['warmup_iters'] == round(f['max_iters'] * 100 / 2000)
        assert f['n_kv_head'] == depth  # half the heads, sized at this depth (1 at depth 1: MQA)
    assert 'modern_depth=4' in plan


def test_scaling_params_leave_out_the_tables_and_count_active_experts(monkeypatch):
    from ablation.runs import scaling_params
    from chapters import GPT, GPTConfig
    dense = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=100))
    blocks = sum(p.numel() for p in dense.transformer.h.parameters()) + sum(
        p.numel() for p in dense.transformer.ln_f.parameters())
    assert scaling_params(dense) == blocks
    untied = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=100, tie_embeddings=False))
    assert scaling_params(untied) == blocks
    moe = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=100, norm='rms', mlp='moe',
                        n_expert=4, n_expert_active=1, pos='rope'))
    assert scaling_params(moe) < sum(p.numel() for p in moe.transformer.h.parameters())


@pytest.mark.parametrize('args, says', [
    (['--miniseries=1,2'], 'at least 3 different depths'),
    (['--miniseries=1,2,2'], 'at least 3 different depths'),
    (['--miniseries=0,1,2'], 'miniseries must be comma-separated positive integers'),
    (['--miniseries=1,2,3', '--aspect=0'], 'aspect must be a positive number'),
    (['--miniseries=1,2,3', '--tokens_per_param=-1'], 'tokens_per_param must be a positive number'),
    (['--miniseries=1,2,3', '--aspect=24', '--head_dim=16'], 'is not a multiple of head_dim 16'),
    (['--miniseries=1,2,3', '--aspect=16', '--head_dim=16', '--grid=hybrid'], 'at miniseries depth 1'),
    (['--miniseries=1,2,3', '--aspect=32', '--head_dim=16', '--grid=kv', '--n_kv_heads=4'], 'at miniseries depth 1'),
    (['--miniseries=1,2,3', '--aspect=16', '--head_dim=16', '--train_args=--max_iters=10'], 'train_args set max_iters'),
    (['--miniseries=1,2,3', '--aspect=16', '--head_dim=16', '--target=nope'], "target 'nope' is not a member"),
])
def test_bad_miniseries_settings_are_one_line_before_any_run(tmp_path, monkeypatch, capsys, args, says):
    workdir = make_workdir(tmp_path)
    code, err = ablate_here(workdir, tmp_path / 'out', *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and says in err and err.count('\n') == 1, err
    assert not (tmp_path / 'out' / 'runs').exists()


# ----------------------------------------------------------------------------- end to end

MINI_CONFIG = """\
exec(open('tiny.py').read())
warmup_iters = 0
max_iters = 10
eval_interval = 5
"""


@pytest.fixture(scope='module')
def series(tmp_path_factory):
    """Two members at depths 1-3, one seed each: six tiny runs, in this process's ablate.py."""
    workdir = make_workdir(tmp_path_factory.mktemp('miniseries'))
    (workdir / 'mini.py').write_text(MINI_CONFIG)
    out = workdir / 'out'
    argv = ['ablate.py', f'--run_dir={workdir}', f'--train_config={workdir / "mini.py"}', f'--out_dir={out}',
            '--miniseries=1,2,3', '--aspect=8', '--head_dim=8', '--tokens_per_param=0.5', '--extrapolation=',
            '--grid=custom', "--custom={'vanilla': {}, 'rope': {'pos': 'rope'}}", '--threads=1']
    run_ablate(argv)
    return workdir, out, argv


def run_ablate(argv):
    """ablate.py's main in this process (its runs are train.py processes all the same)."""
    import runpy
    saved = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(ABLATE_PY, run_name='__main__')
    finally:
        sys.argv = saved


def test_a_miniseries_reports_every_run_and_each_members_multipliers(series):
    workdir, out, _ = series
    results = json.loads((out / 'results.json').read_text())
    runs = {(r['member'], r['depth']): r for r in results['runs']}
    assert set(runs) == {(m, d) for m in ('vanilla', 'rope') for d in (1, 2, 3)}
    for (member, depth), r in runs.items():
        assert r['flops'] == r['flops_per_token'] * r['tokens'] > 0
        assert r['steps'] == r['tokens'] // (4 * 16) and r['seconds'] > 0 and r['val_loss'] > 0
        assert r['params'] > 0 and r['val_bpb'] == pytest.approx(r['val_loss'] / math.log(2), rel=1e-4)
    assert runs['vanilla', 3]['tokens'] == runs['rope', 3]['tokens'] > runs['vanilla', 2]['tokens']
    rope = results['multipliers']['rope']
    assert set(rope) == {'flops', 'steps', 'seconds'}
    assert set(rope['flops']) >= {'value', 'lo', 'hi', 'slope', 'slope_lo', 'slope_hi'}
    assert 'vanilla' not in results['multipliers'] and results['miniseries']['target'] == 'vanilla'
    md = (out / 'results.md').read_text()
    assert '## Miniseries: depths 1, 2, 3' in md and '### training FLOPs' in md and '| rope |' in md
    assert (out / 'miniseries_loss_vs_flops.png').stat().st_size > 0
    assert (out / 'miniseries_multiplier_vs_flops.png').stat().st_size > 0


def test_the_first_table_compares_each_run_with_the_target_at_its_depth(series):
    """A deeper model's loss against the shallowest vanilla says only that depth helps: each row's delta and its
    test are against the target at the row's own depth, and results.json keeps that reference."""
    _, out, _ = series
    results = json.loads((out / 'results.json').read_text())
    variants = results['variants']
    for d in (1, 2, 3):
        rope, vanilla = variants[f'rope_depth={d}'], variants[f'vanilla_depth={d}']
        assert rope['reference'] == vanilla['reference'] == f'vanilla_depth={d}'
    md = (out / 'results.md').read_text()
    assert '| Δ final vs vanilla at its depth |' in md and "against vanilla at its depth" in md
    row = next(line for line in md.splitlines() if line.startswith('| rope_depth=3 |')).split(' | ')
    header = next(line for line in md.splitlines() if line.startswith('| variant |')).split(' | ')
    delta = float(row[header.index('Δ final vs vanilla at its depth')].split()[0])
    assert delta == pytest.approx(variants['rope_depth=3']['final_val_loss'] - variants['vanilla_depth=3']['final_val_loss'],
                                  abs=1e-4)


def test_the_same_command_again_trains_nothing(series, capsys):
    _, out, argv = series
    run_ablate(argv)
    said = capsys.readouterr().out
    assert said.count('skipped (finished)') == 6 and 'started' not in said
