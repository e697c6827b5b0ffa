"""common/threads.py, and the threads setting of train.py and eval.py: on a CPU the cores this process may use by
default (a lone run has the machine), never more than torch's own default; what OMP_NUM_THREADS or --threads names
otherwise."""

import os

import pytest
import torch

from common.threads import use_threads
from test_train import one_line_error, train_here, workdir  # noqa: F401 (fixtures)


@pytest.fixture
def threads(monkeypatch):
    """torch's thread count put back after the test; OMP_NUM_THREADS unset, as in a plain shell."""
    before = torch.get_num_threads()
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    monkeypatch.setattr(os, 'getloadavg', lambda: (0.3, 0.3, 0.3))  # a quiet machine unless a test says otherwise
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


@pytest.mark.parametrize('cores, load, expected, said', [(2, 1.9, 1, ', 1 busy with other work'), (2, 7.5, 1, ', 1 busy'),
                                                        (8, 3.2, 5, ', 3 busy'), (4, 0.99, 4, ':')])
def test_cores_other_work_keeps_busy_are_left_to_it(threads, monkeypatch, cores, load, expected, said):
    """On a machine other work keeps busy, a run takes the idle cores, at least one: on a 2-core machine at load 5
    to 8 the CPU recipe ran at 170-260 ms/iter on one thread and 1,760-2,230 on two (docs/training.md)."""
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, 'getloadavg', lambda: (load, load, load))
    torch.set_num_threads(cores)
    text = use_threads(0, 'cpu')
    assert torch.get_num_threads() == expected and text.startswith(f"{expected} thread")
    assert f'of {cores} usable cores{said}' in text


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
