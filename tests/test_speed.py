"""common/speed.py, through train.py: ms/iter, MFU and the ETA of the progress line."""

import common.hardware
from test_train import train_here, workdir  # noqa: F401 (fixtures)


def test_mfu_over_100_percent_remeasures_the_peak_and_says_so(workdir, monkeypatch, capsys):
    peaks = iter([1e3] + [1e3] * 3)  # a peak far too low at start, and still when measured again
    monkeypatch.setattr(common.hardware, 'measure_matmul_flops', lambda device, dtype=None: next(peaks))
    code, out, _ = train_here(workdir, '--max_iters=8', '--eval_interval=8', '--out_dir=out',
                              monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith('iter ')]
    assert all('mfu --, eta --:--:--' in line for line in lines[:3]), lines  # warm-up steps: no figures yet
    assert 'over 100%: the peak is too low, set --peak_flops' in lines[-1] and 'eta 00:00:0' in lines[-1]
    assert next(peaks, None) is None  # measured again, up to 3 times
    peaks = iter([1e3, 1e15])  # the second measurement finds the real peak
    code, out, _ = train_here(workdir, '--max_iters=8', '--eval_interval=8', '--out_dir=out2',
                              monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and 'over 100%' not in out and 'mfu 0.' in out


def test_a_measured_peak_says_that_mfu_is_not_trustworthy_under_load(workdir, monkeypatch, capsys):
    """As bench.py: MFU against a matmul measured here reads high when another job slows the measurement."""
    code, out, err = train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=measured',
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert 'for MFU (measured float32 matmul)' in out
    assert ('MFU is against a matmul measured on this machine, not a datasheet: under load (another job on these '
            'cores) the peak reads low and MFU high, so MFU is not trustworthy then; give --peak_flops for a fixed '
            'one') in out
    code, out, err = train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=given', '--peak_flops=1e12',
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and 'not trustworthy' not in out, err
