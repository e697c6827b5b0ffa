"""A long measurement's or generation's progress on a terminal: one line on stderr ('decoding 120/500 tokens,
41.3/s, about 9 s left'), rewritten at most once a second and cleared at the end; nothing where stderr is not a
terminal (a log, a pipe, a test). Written by hand, not by a progress-bar library: one that sizes its bar to the
terminal prints nothing at all on a terminal that reports no width."""

import sys
import time
import warnings
from contextlib import contextmanager


def fmt_duration(seconds):
    return f'{seconds:.0f} s' if seconds < 90 else f'{seconds / 60:.0f} min'


class Progress:
    """update(done) as the work goes; close() at the end (the line cleared: what follows prints where it was)."""

    def __init__(self, what, total, unit='', stream=None, interval=1.0):
        self.stream = stream or sys.stderr
        self.what, self.total, self.unit, self.interval = what, total, unit, interval
        self.on = bool(getattr(self.stream, 'isatty', lambda: False)())
        self.t0 = self.shown = time.monotonic()
        self.width = 0
        self.show(0)

    def show(self, done):
        if not self.on:
            return
        line = f"{self.what} {done}/{self.total}{self.unit}"
        elapsed = time.monotonic() - self.t0
        if done and elapsed > 0:
            rate = done / elapsed
            line += f", {rate:.3g}/s, about {fmt_duration((self.total - done) / rate)} left"
        self.stream.write('\r' + line.ljust(self.width))
        self.stream.flush()
        self.width, self.shown = len(line), time.monotonic()

    def update(self, done):
        if self.on and time.monotonic() - self.shown >= self.interval:
            self.show(done)

    def close(self):
        if self.on and self.width:
            self.stream.write('\r' + ' ' * self.width + '\r')
            self.stream.flush()
            self.width = 0


def progress(iterable, total, what, unit=''):
    """The items of iterable, with a Progress line of `what` on a terminal, one item done as the next is asked for."""
    line = Progress(what, total, unit)
    try:
        for done, item in enumerate(iterable):
            line.update(done)
            yield item
    finally:
        line.close()


# warnings known to be noise, by a part of their message: torch 2.13's inductor reads a TypedStorage while it
# autotunes a compiled step's matmuls (compile_decoding on a CPU), once per shape
NOISE = ('TypedStorage is deprecated',)


@contextmanager
def warnings_after():
    """Warnings raised in the block held back, and shown after it (known noise dropped): a line the block's caller
    prints in two parts ('compiling ... compiled in 40 s', a progress line) stays whole."""
    with warnings.catch_warnings(record=True) as caught:
        yield
    for w in caught:
        if not any(noise in str(w.message) for noise in NOISE):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
