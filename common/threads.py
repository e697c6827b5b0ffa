"""The threads torch computes with on a CPU. Torch's default, one per core, oversubscribes a machine where other
work runs: each matmul's threads wait at a barrier for the one the scheduler set aside (on a 2-core machine with
one other busy process, the CPU recipe went from 300 to 2,400 ms/iter with 2 threads; docs/training.md). So a
script's threads=0 takes, on a CPU, half the cores (one on two), at most torch's own default, which is already
that on machines with two hardware threads per core; elsewhere torch's default."""

import os

import torch


def use_threads(threads, device):
    """Set torch's intra-op threads for a run on device -> how many and why, for the run's first line. threads: a
    count, or 0: torch's default on a GPU or where OMP_NUM_THREADS names one (torchrun, ablate.py's parallel runs,
    the user), else half the CPU's cores."""
    if threads > 0:
        torch.set_num_threads(threads)
        return f"{threads} thread{'s' if threads > 1 else ''} (--threads)"
    n = torch.get_num_threads()
    if not device.startswith('cpu'):
        return f"{n} CPU thread{'s' if n > 1 else ''} (torch's default)"
    if os.environ.get('OMP_NUM_THREADS'):
        return f"{n} thread{'s' if n > 1 else ''} (OMP_NUM_THREADS)"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    n = max(1, min(n, cores // 2))
    torch.set_num_threads(n)
    return f"{n} thread{'s' if n > 1 else ''} (half of {cores} cores: --threads sets another count)"
