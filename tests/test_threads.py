"""common/threads.py, and the threads setting of train.py and eval.py: on a CPU the cores this process may use by
default (a lone run has the machine), never more than torch's own default; what OMP_NUM_THREADS or --threads names
otherwise."""

import os

import pytest
import torch

import common.threads
from common.threads import busy_cores, use_threads
from test_train import one_line_error, train_here, workdir  # noqa: F401 (fixtures)


@pytest.fixture
def threads(monkeypatch):
    """torch's thread count put back after the test; OMP_NUM_THREADS unset, as in a plain shell."""
    before = torch.get_num_threads()
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    monkeypatch.setattr(common.threads, 'busy_cores', lambda: 0)  # a quiet machine unless a test says otherwise
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize('cores, default, expected', [(2, 2, 2), (1, 1, 1), (16, 8, 8), (2, 64, 2), (64, 16, 16)])
def test_a_cpu_takes_the_cores_it_may_use_at_most_torchs_default(threads, monkeypatch, cores, default, expected):
    """A lone run takes its affinity's cores (half of them made one run 1.35x slower than nanoGPT's train.py on a
    quiet 2-core machine), never more than torch's default (a container's 2 cores on a 64-core host: 2)."""
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(cores)), raising=False)
    torch.set_num_threads(default)
    said = use_threads(0, 'cpu')
    assert torch.get_num_threads() == expected
    assert said.startswith(f"{expected} thread") and f'of {cores} usable core' in said


@pytest.mark.parametrize('cores, busy, expected, said', [(2, 1, 1, ', 1 busy with other work'), (2, 7, 1, ', 1 busy'),
                                                        (8, 3, 5, ', 3 busy'), (4, 0, 4, ':')])
def test_cores_other_work_keeps_busy_are_left_to_it(threads, monkeypatch, cores, busy, expected, said):
    """On a machine other work keeps busy, a run takes the idle cores, at least one: on a 2-core machine at load 5
    to 8 the CPU recipe ran at 170-260 ms/iter on one thread and 1,760-2,230 on two (docs/training.md)."""
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(common.threads, 'busy_cores', lambda: busy)
    torch.set_num_threads(cores)
    text = use_threads(0, 'cpu')
    assert torch.get_num_threads() == expected and text.startswith(f"{expected} thread")
    assert f'of {cores} usable cores{said}' in text


def stat_lines(*cores):
    """/proc/stat's text for cores given as (busy, idle) ticks, with the all-cores line and one other line."""
    lines = [f"cpu  {sum(b for b, _ in cores)} 0 0 {sum(i for _, i in cores)} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {b // 2} 0 {b - b // 2} {i - i // 4} {i // 4} 0 0 0 0 0" for n, (b, i) in enumerate(cores)]
    return '\n'.join(lines + ['intr 12345 0 0', ''])


@pytest.mark.parametrize('first, then, affinity, expected', [
    (((100, 900), (100, 900)), ((110, 990), (190, 910)), {0, 1}, 1),  # core 1 busy 90% of the window
    (((100, 900), (100, 900)), ((104, 996), (104, 996)), {0, 1}, 0),  # quiet
    (((100, 900), (100, 900)), ((200, 900), (200, 900)), {0, 1}, 2),  # both busy (another run's two threads)
    (((100, 900), (100, 900)), ((110, 990), (200, 900)), {0}, 0),     # taskset to core 0: core 1 is not ours
    (((0, 0), (0, 0), (0, 0)), ((60, 40), (60, 40), (50, 50)), {0, 1, 2}, 2),  # 1.7 cores busy in all -> 2
])
def test_busy_cores_are_read_from_a_short_look_at_proc_stat(tmp_path, monkeypatch, first, then, affinity, expected):
    """Busy cores are those of this process's affinity that other work kept busy over a tenth of a second: a
    run started right after another is not charged with it, as the 1-minute load average did (it left our CPU
    recipe on one thread, 1.5x nanoGPT's time, in a benchmark's back-to-back rounds)."""
    stat = tmp_path / 'stat'
    stat.write_text(stat_lines(*first))
    monkeypatch.setattr(common.threads, 'PROC_STAT', str(stat))
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: affinity, raising=False)
    monkeypatch.setattr(common.threads.time, 'sleep', lambda s: stat.write_text(stat_lines(*then)))
    assert busy_cores() == expected
    monkeypatch.setattr(common.threads, 'PROC_STAT', str(tmp_path / 'absent'))  # not Linux: none said busy
    assert busy_cores() == 0


def test_a_gpu_omp_num_threads_and_a_count_given_are_kept(threads, monkeypatch):
    torch.set_num_threads(2)
    assert use_threads(0, 'cuda:0') == "2 CPU threads (torch's default)" and torch.get_num_threads() == 2
    monkeypatch.setenv('OMP_NUM_THREADS', '2')  # torchrun's, ablate.py's parallel runs', or the user's
    assert use_threads(0, 'cpu') == '2 threads (OMP_NUM_THREADS)' and torch.get_num_threads() == 2
    assert use_threads(1, 'cpu') == '1 thread (--threads)' and torch.get_num_threads() == 1


def test_train_takes_a_thread_count_and_says_it(workdir, threads, monkeypatch, capsys):
    code, out, err = train_here(workdir, '--threads=1', '--max_iters=2', '--eval_interval=2', '--out_dir=one',
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert torch.get_num_threads() == 1 and '1 thread (--threads)' in out.splitlines()[0]
    torch.set_num_threads(2)
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1}, raising=False)
    code, out, err = train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=default',
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert torch.get_num_threads() == 2 and '2 threads (of 2 usable cores' in out.splitlines()[0]
    code, _, err = train_here(workdir, '--threads=-1', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, 'threads must be >= 0', '-1')
