"""The threads torch computes with on a CPU. A run alone takes the cores this process may use
(os.sched_getaffinity: a container's or taskset's share, not the whole machine's), at most torch's own default
(one per physical core), less those other work keeps busy (the load average): oversubscription is a problem of
several processes. Where several are started together, OMP_NUM_THREADS (torchrun's, ablate.py's share for each
of its parallel runs, the user's) or --threads names the count, and a script keeps it (docs/training.md,
"Threads on a CPU")."""

import os

import torch


def usable_cores():
    """The cores this process may run on: its affinity where the OS says it, else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


def busy_cores():
    """The cores other work keeps busy: the 1-minute load average, rounded down (0 where the OS does not say)."""
    try:
        return int(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


def use_threads(threads, device):
    """Set torch's intra-op threads for a run on device -> how many and why, for the run's first line. threads: a
    count, or 0: torch's default on a GPU or where OMP_NUM_THREADS names one (torchrun, ablate.py's parallel runs,
    the user), else the cores this process may use that other work leaves idle (at least one)."""
    if threads > 0:
        torch.set_num_threads(threads)
        return f"{threads} thread{'s' if threads > 1 else ''} (--threads)"
    n = torch.get_num_threads()
    if not device.startswith('cpu'):
        return f"{n} CPU thread{'s' if n > 1 else ''} (torch's default)"
    if os.environ.get('OMP_NUM_THREADS'):
        return f"{n} thread{'s' if n > 1 else ''} (OMP_NUM_THREADS)"
    # a thread on a core other work holds stalls every operation's barrier (docs/training.md: 8x slower)
    cores, busy = usable_cores(), min(busy_cores(), usable_cores() - 1)
    n = max(1, min(n, cores - busy))
    torch.set_num_threads(n)
    plural = 's' if cores > 1 else ''
    return (f"{n} thread{'s' if n > 1 else ''} (of {cores} usable core{plural}"
            f"{f', {busy} busy with other work' if busy else ''}: --threads sets another count)")
