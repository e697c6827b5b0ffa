"""How many intra-op threads a run on a CPU takes (sample.py's `threads`, each of ablate.py's runs): the CPUs other
work leaves free, not every core. torch's default is every core, and on a machine busy with other work its threads
wait on each other at every operation (greedy decoding of the 4-layer character model at batch 10 here, a 2-core
CPU at load 3.5: 1,500-2,700 tokens/s on one thread, 160-290 on two)."""

import os


def usable_cpus():
    """The CPUs this process may run on (its affinity: a container's or taskset's limit), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def busy_cpus():
    """The CPUs other work keeps busy: the 1-minute load average (runnable processes), 0 where there is none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def pick_threads(threads, share=1):
    """The intra-op threads of a run on a CPU: `threads` as given (> 0), or for 0 the usable CPUs less the busy
    ones, shared out among `share` runs at once, at least 1 each."""
    if threads:
        return threads
    return max(1, (usable_cpus() - round(busy_cpus())) // share)


def threads_note(threads, chosen, share=1):
    """Where a run's thread count came from, in words (for a report line)."""
    if threads:
        return f"{chosen} thread{'s' if chosen > 1 else ''} (--threads)"
    return (f"{chosen} thread{'s' if chosen > 1 else ''} ({usable_cpus()} usable CPUs, load {busy_cpus():.1f}"
            + (f", {share} runs at once" if share > 1 else '') + "; --threads to choose)")
