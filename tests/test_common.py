"""common.py: the peak FLOP/s MFU divides by, per dtype; an out_dir's lock; log repair."""

import json
import os

import pytest
import torch

import common


@pytest.mark.parametrize('name, dtype, peak', [
    ('NVIDIA H100 80GB HBM3', 'bfloat16', 989e12),
    ('NVIDIA H100 80GB HBM3', 'float32', 494.7e12),  # an fp32 run (TF32 matmuls) against TF32's peak
    ('NVIDIA A100-SXM4-80GB', 'float16', 312e12),
    ('NVIDIA A100-SXM4-80GB', 'float32', 156e12),
])
def test_mfu_peak_is_the_running_dtypes(monkeypatch, name, dtype, peak):
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: name)
    flops, source = common.peak_flops('cuda', dtype)
    assert flops == peak and name in source


def test_a_gpu_without_that_dtypes_datasheet_figure_is_measured(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'Tesla T4')
    monkeypatch.setattr(common, 'measure_matmul_flops', lambda device, dtype: 7e12)
    assert common.peak_flops('cuda', 'float32') == (7e12, 'measured float32 matmul')


def test_repair_log_keeps_one_run(tmp_path):
    path = tmp_path / 'log.jsonl'
    records = [{'iter': 0}, {'iter': 2}, {'iter': 2, 'eval_only': True, 'block_size': 64}, {'iter': 2},
               {'iter': 4}, {'iter': 6}]
    path.write_text(''.join(json.dumps(r) + '\n' for r in records) + '{"iter": 8, "tr')
    common.repair_log(str(path), last_iter=4)
    assert [json.loads(line) for line in path.read_text().splitlines()] == records[:3] + [{'iter': 4}]


def test_an_out_dir_is_one_processs(tmp_path):
    common.claim_out_dir(str(tmp_path / 'out'))
    try:
        common.claim_out_dir(str(tmp_path / 'out'))  # the same process again: still its own
        assert (tmp_path / 'out' / '.lock').read_text() == str(os.getpid())
    finally:
        common.release_out_dirs()


def test_only_the_first_signal_interrupts():
    """Ctrl-C reaches ablate.py's runs, then ablate stops them with kill: that second signal, raised again while the
    run is stopping, would land in a destructor or an atexit hook ('Exception ignored in tqdm.__del__')."""
    import signal
    import sys
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.excepthook
    common.catch_interrupts()
    try:
        with pytest.raises(common.Interrupted) as e:
            os.kill(os.getpid(), signal.SIGINT)
        assert e.value.code == 130
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # stopping already: nothing raised
        except common.Interrupted:
            pytest.fail('a second signal interrupted the stopping run again')
        common.catch_interrupts()  # a new start arms it again
        with pytest.raises(common.Interrupted) as e:
            os.kill(os.getpid(), signal.SIGTERM)
        assert e.value.code == 143
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
        sys.excepthook = handlers[2]
