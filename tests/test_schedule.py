"""common/schedule.py, through train.py: warmup, then cosine or WSD to min_lr."""

import pytest

from common.schedule import Schedule
from test_train import log_records, run, workdir  # noqa: F401 (fixtures)

RECIPE = dict(learning_rate=1e-3, min_lr=1e-4, muon_lr=0.02, decay_lr=True, lr_schedule='cosine', warmup_iters=10,
              lr_decay_iters=110, lr_decay_fraction=0.2)


def test_cosine_warms_up_then_decays_to_the_floor_and_scales_both_optimizers():
    schedule = Schedule.of({**RECIPE, 'dropout': 0.0})  # what train.py's settings hold besides
    assert schedule.scale(0) == 1 / 11 and schedule.scale(9) == 10 / 11
    assert schedule.scale(10) == 1.0 and schedule.scale(60) == pytest.approx(0.55)  # half-way: half of 1 - floor
    assert schedule.scale(110) == schedule.scale(500) == pytest.approx(0.1)
    assert Schedule(**{**RECIPE, 'decay_lr': False}).scale(500) == 1.0

    class Optimizer:  # AdamW's group, and Muon's (which has ns_steps)
        param_groups = [{'lr': 0.0}, {'lr': 0.0, 'ns_steps': 5}]
    assert schedule.set_lr(Optimizer, 60) == pytest.approx(0.55e-3)
    assert [g['lr'] for g in Optimizer.param_groups] == pytest.approx([0.55e-3, 0.011])


def test_a_warmup_longer_than_the_run_says_the_peak_is_never_reached(workdir, run):
    short = run(workdir, '--max_iters=2', '--eval_interval=2', '--warmup_iters=9', '--out_dir=short')
    assert 'note: warmup_iters (9) outlasts max_iters (2): the learning rate never reaches its peak' in short.stdout
    assert '(the last step runs at 20% of it)' in short.stdout  # step 1 of 9 + 1
    whole = run(workdir, '--max_iters=2', '--eval_interval=2', '--warmup_iters=1', '--out_dir=whole')
    assert 'warmup_iters' not in whole.stdout


def test_wsd_holds_the_peak_then_decays_linearly(workdir, run):
    run(workdir, '--max_iters=10', '--eval_interval=1', '--lr_schedule=wsd', '--warmup_iters=2',
        '--lr_decay_iters=10', '--lr_decay_fraction=0.5', '--min_lr=3e-4', '--out_dir=out')
    lr = {r['iter']: r['lr'] for r in log_records(workdir / 'out')}
    expected = {0: 1e-3, 1: 2e-3, 2: 3e-3, 3: 3e-3, 4: 3e-3, 5: 3e-3,  # warmup, then the peak to half the run
                6: 3e-4 + 0.8 * 2.7e-3, 8: 3e-4 + 0.4 * 2.7e-3, 10: 3e-4}  # then linear to min_lr
    for it, value in expected.items():
        assert lr[it] == pytest.approx(value), (it, lr)
