"""The threads torch computes with on a CPU. A run alone takes the cores this process may use
(os.sched_getaffinity: a container's or taskset's share, not the whole machine's), at most torch's own default
(one per physical core), less those other work keeps busy now (a tenth of a second of /proc/stat on those cores):
oversubscription is a problem of several processes. Where several are started together, OMP_NUM_THREADS
(torchrun's, ablate.py's share for each of its parallel runs, the user's) or --threads names the count, and a
script keeps it (docs/training.md, "Threads on a CPU")."""

import os
import time

import torch

PROC_STAT = '/proc/stat'


def usable_cores():
    """The cores this process may run on: its affinity where the OS says it, else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


def core_ticks(cores):
    """(busy, total) clock ticks since boot summed over the numbered cores, from /proc/stat's cpuN lines (Linux);
    None where there is no such file. Idle and iowait are the idle ticks."""
    try:
        with open(PROC_STAT) as f:
            lines = [line.split() for line in f if line.startswith('cpu') and line[3:4].isdigit()]
    except OSError:
        return None
    busy = total = 0
    for name, *ticks in lines:
        if int(name[3:]) in cores:
            ticks = [int(t) for t in ticks[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def busy_cores(window=0.1):
    """How many of this process's cores other work keeps busy now, rounded, from two looks at /proc/stat window
    seconds apart while this process sleeps (0 where the OS does not say). Not the load average: it lags by a
    minute, so a run started right after another (a benchmark's rounds, the tests) counted the one just ended."""
    cores = os.sched_getaffinity(0) if hasattr(os, 'sched_getaffinity') else set(range(os.cpu_count() or 1))
    before = core_ticks(cores)
    if before is None:
        return 0
    time.sleep(window)
    after = core_ticks(cores)
    if after is None or after[1] <= before[1]:
        return 0
    return int((after[0] - before[0]) / (after[1] - before[1]) * len(cores) + 0.5)


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
