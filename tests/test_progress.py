"""common/progress.py: a line on a terminal with the work done, its rate and the time left, rewritten in place and
cleared at the end; nothing where stderr is no terminal (a log, a pipe, a test)."""
import io

from common.progress import Progress, fmt_duration, progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_the_time_left_and_the_line_is_cleared(monkeypatch):
    import common.progress
    clock = iter(range(0, 100, 2))  # each look at the clock 2 s after the last
    monkeypatch.setattr(common.progress.time, 'monotonic', lambda: float(next(clock)))
    stream = Terminal()
    line = Progress('generating', 10, ' tokens', stream=stream)
    line.update(4)
    line.close()
    shown = stream.getvalue().split('\r')
    assert shown[1].rstrip() == 'generating 0/10 tokens'
    assert shown[2].startswith('generating 4/10 tokens, ') and 'about' in shown[2] and shown[2].endswith(' s left')
    assert shown[3].strip() == '' and shown[-1] == ''  # cleared: what follows prints where the line was


def test_no_terminal_no_line():
    stream = io.StringIO()
    line = Progress('decoding', 5, stream=stream)
    line.update(3)
    line.close()
    assert stream.getvalue() == ''
    assert list(progress(iter(range(3)), 3, 'steps')) == [0, 1, 2]


def test_durations_read_in_seconds_then_minutes():
    assert fmt_duration(42) == '42 s' and fmt_duration(600) == '10 min'
