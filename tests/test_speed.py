"""common/speed.py, through train.py: ms/iter, MFU and the ETA of the progress line."""

import common.hardware
from common.speed import Speed
from test_train import train_here, workdir  # noqa: F401 (fixtures)


class Counted:
    """What Speed reads of a model: MFU as a fixed FLOP count over the time and the peak."""
    def estimate_mfu(self, batch, dt, peak):
        return 1e6 / dt / peak


def test_mfu_over_100_percent_remeasures_the_peak_and_says_so(monkeypatch):
    """Where a measured peak gives MFU (an MPS or an unknown GPU): over 100% measures it again, up to 3 times."""
    peaks = iter([1e3] * 3)  # a peak far too low at start, and still when measured again
    monkeypatch.setattr(common.hardware, 'measure_matmul_flops', lambda device, dtype=None: next(peaks))
    speed = Speed(Counted(), 1, 'mps', 'float32', 1e3, measured=True)
    assert speed.line(8) == 'mfu --, eta --:--:--'  # no step yet
    for _ in range(4):
        speed.update(0.5)
    assert 'over 100%: the peak is too low, set --peak_flops' in speed.line(8) and next(peaks, None) is None
    peaks = iter([1e15])  # the second measurement finds the real peak
    speed = Speed(Counted(), 1, 'mps', 'float32', 1e3, measured=True)
    speed.update(0.5)
    assert speed.line(8).startswith('mfu 0.00%') and speed.peak == 1e15


def test_a_cpu_without_a_known_peak_prints_no_mfu(workdir, monkeypatch, capsys):
    """A peak measured on a CPU reads low under load (MFU read 57%): the lines give no MFU, and say how to get one."""
    code, out, err = train_here(workdir, '--max_iters=6', '--eval_interval=6', '--out_dir=measured',
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    steps = [line for line in out.splitlines() if line.startswith('iter ')]
    assert 'no MFU on a CPU without a known peak: give --peak_flops (FLOP/s) for one' in out
    assert steps and not any('mfu' in line for line in steps) and 'eta 00:00:00' in steps[-1], steps
    code, out, err = train_here(workdir, '--max_iters=6', '--eval_interval=6', '--out_dir=given', '--peak_flops=1e12',
                                monkeypatch=monkeypatch, capsys=capsys)
    steps = [line for line in out.splitlines() if line.startswith('iter ')]
    assert code == 0 and 'no MFU' not in out and 'mfu 0.' in steps[-1], err
