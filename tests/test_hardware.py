"""common/hardware.py: the peak FLOP/s MFU divides by, per dtype; fp16's grad scaler; one all-reduce."""

import pytest
import torch

import common.hardware
from common.hardware import all_reduce_sum, datasheet_peak, grad_scaler, peak_flops


@pytest.mark.parametrize('name, dtype, peak', [
    ('NVIDIA H100 80GB HBM3', 'bfloat16', 989e12),
    ('NVIDIA H100 80GB HBM3', 'float32', 494.7e12),  # an fp32 run (TF32 matmuls) against TF32's peak
    ('NVIDIA A100-SXM4-80GB', 'float16', 312e12),
    ('NVIDIA A100-SXM4-80GB', 'float32', 156e12),
])
def test_mfu_peak_is_the_running_dtypes(monkeypatch, name, dtype, peak):
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: name)
    flops, source = peak_flops('cuda', dtype)
    assert flops == peak and name in source


@pytest.mark.parametrize('name, dtype, peak', [
    ('NVIDIA H200 NVL', 'bfloat16', 835.5e12),  # the PCIe card at lower power: not the SXM's 989
    ('NVIDIA H200 NVL', 'float32', 417.5e12),
    ('NVIDIA H200', 'bfloat16', 989e12),
    ('NVIDIA H100 PCIe', 'float16', 756e12),
    ('Some Future GPU', 'bfloat16', None),
])
def test_datasheet_peak_takes_the_most_specific_name(name, dtype, peak):
    assert datasheet_peak(name, dtype) == peak


def test_a_gpu_without_that_dtypes_datasheet_figure_is_measured(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'Tesla T4')
    monkeypatch.setattr(common.hardware, 'measure_matmul_flops', lambda device, dtype, seconds=0.3: 7e12)
    assert peak_flops('cuda', 'float32') == (7e12, 'measured float32 matmul')


@pytest.mark.parametrize('dtype, sharded, kind', [
    ('float16', True, 'ShardedGradScaler'),  # FSDP: the overflow check covers every rank's shard
    ('float16', False, 'GradScaler'),
    ('bfloat16', True, 'GradScaler'),  # no scaling needed: a disabled plain scaler
])
def test_fp16_under_fsdp_takes_the_sharded_grad_scaler(dtype, sharded, kind):
    scaler = grad_scaler('cpu', dtype, sharded)
    assert type(scaler).__name__ == kind and scaler.is_enabled() is (dtype == 'float16')


def test_all_reduce_sum_is_one_collective_for_many_tensors(monkeypatch):
    calls = []

    def fake_all_reduce(tensor):  # as if a second process held the same values
        calls.append(tensor.shape)
        tensor.mul_(2)
    monkeypatch.setattr(torch.distributed, 'all_reduce', fake_all_reduce)
    loads = [torch.arange(4.0), torch.ones(2, 3), torch.zeros(3)]
    all_reduce_sum(loads)
    assert calls == [(4 + 6 + 3,)]
    assert torch.equal(loads[0], 2 * torch.arange(4.0)) and torch.equal(loads[1], torch.full((2, 3), 2.0))
