"""ablation/jobs.py: claims (whole, a stale one taken over by one process), a run finished by another process
meanwhile, a run whose folder went away."""

import json
import os

import pytest

import ablation.jobs
import common.threads
from conftest import import_ablate


def test_claims_are_whole_and_stale_ones_are_taken_over(tmp_path, monkeypatch):
    run = str(tmp_path / 'seed1337')
    assert ablation.jobs.claim(run) is None  # ours now
    owner = json.loads((tmp_path / 'seed1337.claim').read_text())
    assert owner['pid'] == os.getpid()
    assert ablation.jobs.claim(run) == f"{owner['host']}:{os.getpid()}"  # held by a live process
    (tmp_path / 'seed1337.claim').write_text(json.dumps({'host': owner['host'], 'pid': 2 ** 22 + 12345}))
    assert ablation.jobs.claim(run) is None  # its owner on this host is dead
    (tmp_path / 'seed1337.claim').write_text(json.dumps({'host': 'elsewhere', 'pid': 1}))
    assert ablation.jobs.claim(run) == 'elsewhere:1'  # another node, refreshing it
    os.utime(tmp_path / 'seed1337.claim', (0, 0))
    assert ablation.jobs.claim(run) is None  # another node that stopped refreshing it
    assert sorted(p.name for p in tmp_path.iterdir()) == ['seed1337.claim']  # nothing else left beside it


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
    why = ablation.jobs.finish(('gone', {}, 1337, str(path)), SimpleNamespace(returncode=returncode), log, 1.0,
                               str(tmp_path), ablate_module.settings)
    assert 'went away' in why and str(path) in why and log.closed


def test_a_run_whose_summary_fails_fails_alone_with_its_files_kept(tmp_path, monkeypatch):
    """train.py finished but its summary raised (a checkpoint made by newer code than the running ablate.py read,
    as happened when a chapter gained a flag mid-grid): one FAILED line naming the error, the run's files kept."""
    from types import SimpleNamespace
    ablate_module = import_ablate(monkeypatch)
    path = tmp_path / 'runs' / 'v' / 'seed1337'
    path.mkdir(parents=True)
    (path / 'log.jsonl').write_text('{}\n')
    log = open(path / 'train.log', 'w')

    def unreadable(*args):
        raise TypeError("GPTConfig.__init__() got an unexpected keyword argument 'new_flag'")
    monkeypatch.setattr(ablation.jobs, 'summarize_run', unreadable)
    why = ablation.jobs.finish(('v', {}, 1337, str(path)), SimpleNamespace(returncode=0), log, 1.0, str(tmp_path),
                               ablate_module.settings)
    assert why.startswith('(exit 0): its summary failed: TypeError') and 'new_flag' in why and log.closed
    assert sorted(p.name for p in path.iterdir()) == ['log.jsonl', 'train.log']
    # the checkpoint loader's way: one error line, then an exit
    from common.errors import die
    monkeypatch.setattr(ablation.jobs, 'summarize_run', lambda *args: die("checkpoint 'ckpt.pt': unreadable"))
    why = ablation.jobs.finish(('v', {}, 1337, str(path)), SimpleNamespace(returncode=0), open(path / 'x.log', 'w'),
                               1.0, str(tmp_path), ablate_module.settings)
    assert why == '(exit 0): its summary failed: the error line above'


def test_a_run_finished_between_the_look_and_the_claim_is_not_retrained(tmp_path, monkeypatch):
    path = tmp_path / 'runs' / 'v' / 'seed1337'
    path.mkdir(parents=True)
    real_claim = ablation.jobs.claim

    def claim_after_another_finished(run):
        (path / 'done.json').write_text('{}')  # another process, just before our claim
        return real_claim(run)
    monkeypatch.setattr(ablation.jobs, 'claim', claim_after_another_finished)
    assert ablation.jobs.take(str(path)) == 'finished'
    assert (path / 'done.json').exists() and not (tmp_path / 'runs' / 'v' / 'seed1337.claim').exists()
    monkeypatch.setattr(ablation.jobs, 'claim', real_claim)
    (path / 'done.json').unlink()
    assert ablation.jobs.take(str(path)) is None  # free: ours to train


@pytest.mark.parametrize('args, env, expected', [([], None, 4), (['--parallel=2'], None, 2), (['--parallel=3'], None, 1),
                                                 ([], '3', 3), (['--threads=3', '--parallel=2'], None, 3)],
                         ids=['alone', 'parallel', 'more-runs-than-threads', 'OMP_NUM_THREADS', 'given'])
def test_each_run_gets_its_threads_said_once(tmp_path, monkeypatch, capsys, args, env, expected):
    """Each run's OMP_NUM_THREADS, which train.py's threads=0 takes (issue 49.1): --threads, or ablate.py's own count
    (common.threads: the usable cores on a CPU, or OMP_NUM_THREADS where set) shared out among the parallel runs,
    at least 1 each; one line says it. Here 4 cores: 4 threads for a run alone, 2 each for two at once."""
    from collections import deque
    import torch
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(4)))
    monkeypatch.setattr(common.threads, 'busy_cores', lambda: 0)  # a quiet machine
    state = {'threads': int(env or 4)}  # torch's default here: a thread a core, or what OMP_NUM_THREADS names
    monkeypatch.setattr(torch, 'get_num_threads', lambda: state['threads'])
    monkeypatch.setattr(torch, 'set_num_threads', lambda n: state.update(threads=n))
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    if env:
        monkeypatch.setenv('OMP_NUM_THREADS', env)
    ablate_module = import_ablate(monkeypatch, *args)
    started = []

    class Started:
        def __init__(self, cmd, env, **kwargs):
            started.append(env['OMP_NUM_THREADS'])
            self.returncode = 0

        def poll(self):
            return 0
    monkeypatch.setattr(ablation.jobs.subprocess, 'Popen', Started)
    monkeypatch.setattr(ablation.jobs, 'finish', lambda *a: '')
    jobs = deque((f'v{i}', {}, 1337, str(tmp_path / 'runs' / f'v{i}' / 'seed1337')) for i in range(2))
    ablation.jobs.Runner(jobs, str(tmp_path), ablate_module.settings).run()
    assert started == [str(expected)] * 2
    out = capsys.readouterr().out
    assert out.count('each run: ') == 1 and f'each run: {expected} thread' in out


def test_a_run_keeps_the_load_average_it_ran_under():
    """The report says when timings were contended: each run's mean load average while it ran, and its cores."""
    from ablation.jobs import load_figures
    cores = len(os.sched_getaffinity(0))
    assert load_figures([3.0, 5.0]) == {'load_avg': 4.0, 'cores': cores}
    assert set(load_figures([])) == {'load_avg', 'cores'}  # none sampled (a short run): one taken at its end
