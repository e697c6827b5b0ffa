"""One-line errors and interrupts: die, Ctrl-C and `kill` as Interrupted, critical() stretches an interrupt must
not cut, and what an exception is (out of memory, a failed collective, its first line)."""

import os
import signal
import sys
from contextlib import contextmanager

import torch


def die(message, code=2):
    """Report a user mistake as one line on stderr and exit: a traceback would only hide it."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or `kill` (SIGTERM): the scripts stop with one line, exit 128 + the signal."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


_critical, _pending, _stopping = 0, None, False


def _on_signal(signum, frame):
    global _pending, _stopping
    if _stopping:
        # already stopping: a second signal (Ctrl-C reaches ablate.py's runs, then ablate stops them with `kill`)
        # raised again would land in whatever cleanup runs then, a destructor or an atexit hook, as a traceback
        return
    if _critical:  # inside a write that must finish whole: stop right after it
        _pending = signum
    else:
        _stopping = True
        raise Interrupted(signum)


def catch_interrupts():
    """Ctrl-C and `kill` raise Interrupted, except inside critical(), which they end; one not caught by the
    script stops it with one line. Only the first signal raises: the process is stopping after it."""
    global _stopping
    _stopping = False
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    default_hook = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, Interrupted):
            return default_hook(kind, value, tb)
        print(f"error: interrupted ({value})", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(value.code)
    sys.excepthook = hook


def hold_interrupts():
    """Start a stretch an interrupt must not cut, as critical() for one that is not a single block (a training
    step): an interrupt waits until deliver_interrupts()."""
    global _critical
    _critical += 1


def deliver_interrupts(discard=False):
    """End hold_interrupts(): an interrupt that came meanwhile is raised now (discard: the stretch failed, and
    what ends the process is already under way)."""
    global _critical, _pending, _stopping
    _critical -= 1
    if not _critical and _pending is not None:
        signum, _pending, _stopping = _pending, None, True
        if not discard:
            raise Interrupted(signum)


@contextmanager
def critical():
    """A block that an interrupt must not cut in two (a checkpoint or log write): it is delivered after."""
    hold_interrupts()
    try:
        yield
    finally:
        deliver_interrupts()


def out_of_memory(error):
    """Whether an exception is the device or the host running out of memory."""
    if isinstance(error, (MemoryError, getattr(torch, 'OutOfMemoryError', MemoryError))):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ('out of memory' in text or "can't allocate memory" in text
                                                or 'not enough memory' in text)


def collective_error(error):
    """Whether an exception is a collective of torch.distributed failing (another process ended or hung)."""
    dist_error = getattr(torch.distributed, 'DistError', ())
    if dist_error and isinstance(error, dist_error):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ('gloo', 'NCCL', 'Connection closed by peer', 'Connection reset by peer'))


def first_line(error):
    """An exception's first line, the fields of a config validation error included (for a one-line message)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = ' '.join(lines[:3]) if lines and lines[0].endswith(':') else (lines[0] if lines else type(error).__name__)
    return text[:300]
