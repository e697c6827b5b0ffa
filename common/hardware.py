"""The machine a script runs on: device and dtype choice, autocast and fp16's grad scaler, one all-reduce for
many tensors, and the peak FLOP/s that MFU divides by."""

import time
from contextlib import nullcontext

import torch

from common.errors import die

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


# ----------------------------------------------------------------------------- device and dtype

def pick_device(device='auto'):
    """'auto' picks cuda, then mps, then cpu; an explicit choice must exist on this machine."""
    if device == 'auto':
        if torch.cuda.is_available():
            return 'cuda'
        if getattr(torch.backends, 'mps', None) is not None and torch.backends.mps.is_available():
            return 'mps'
        return 'cpu'
    kind = device.split(':')[0]
    if kind not in ('cpu', 'cuda', 'mps'):
        die(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    if kind == 'cuda' and not torch.cuda.is_available():
        die(f"device={device!r} but CUDA is not available here (use --device=auto or --device=cpu)")
    if kind == 'mps' and not (getattr(torch.backends, 'mps', None) and torch.backends.mps.is_available()):
        die(f"device={device!r} but MPS is not available here (use --device=auto or --device=cpu)")
    return device


def pick_dtype(device, dtype='auto'):
    """'auto': bf16 where the GPU supports it, else fp16 (with a GradScaler) on CUDA, fp32 elsewhere."""
    if dtype == 'auto':
        if device.startswith('cuda'):
            return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
        return 'float32'
    if dtype not in DTYPES:
        die(f"dtype must be 'auto', {', '.join(map(repr, DTYPES))}; got {dtype!r}")
    return dtype


def autocast(device, dtype):
    """Mixed precision for forward passes; fp32 needs none."""
    if dtype == 'float32':
        return nullcontext()
    return torch.autocast(device_type=device.split(':')[0], dtype=DTYPES[dtype])


def grad_scaler(device_type, dtype, sharded=False):
    """fp16's loss scaler (a no-op otherwise). Under FSDP each rank holds only its shard of the gradients, so
    the sharded scaler all-reduces the overflow check: every rank skips the same steps and keeps one scale."""
    if sharded and dtype == 'float16':
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        return ShardedGradScaler(device_type)
    return torch.amp.GradScaler(device_type, enabled=dtype == 'float16')


def all_reduce_sum(tensors):
    """Sums these tensors (of one dtype) over the processes in place, with one all-reduce for all of them."""
    import torch.distributed as dist
    flat = torch.cat([t.flatten() for t in tensors])
    dist.all_reduce(flat)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


# ----------------------------------------------------------------------------- peak FLOP/s

# dense tensor-core peaks from the vendors' datasheets, by a substring of the device name: (bf16/fp16, tf32).
# fp32 runs with allow_tf32 (as train.py and bench.py set) use the TF32 peak; None: no such datasheet figure.
# The first match wins, so a variant's name ('H200 NVL') comes before its family's ('H200').
GPU_PEAK_FLOPS = [('H200 NVL', 835.5e12, 417.5e12), ('H200', 989e12, 494.7e12), ('H100 PCIe', 756e12, 378e12),
                  ('H100', 989e12, 494.7e12), ('A100', 312e12, 156e12), ('L40S', 362e12, 183e12),
                  ('A10G', 70e12, None), ('L4', 121e12, 60e12), ('4090', 165e12, None), ('3090', 71e12, None),
                  ('V100', 125e12, None), ('T4', 65e12, None), ('A6000', 155e12, None)]


def measure_matmul_flops(device, dtype=torch.float32, n=1024, seconds=0.3):
    """FLOP/s of a square matmul on this device, the best of repeated runs: the CPU's practical peak."""
    # own generator: measuring must not move the global RNG a resumed run restores
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        t0 = time.perf_counter()
        (a @ b).sum().item()
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def datasheet_peak(name, dtype):
    """The datasheet's dense FLOP/s for a GPU of this name in this dtype (fp32: TF32), or None."""
    for key, half, tf32 in GPU_PEAK_FLOPS:
        if key in name:
            return tf32 if dtype == 'float32' else half
    return None


def peak_flops(device, dtype='float32', seconds=0.3):
    """(FLOP/s, where it came from) for the dtype that runs: a known GPU's datasheet peak, else a matmul
    measured for seconds (CPU, MPS, other GPUs, or a datasheet without that dtype)."""
    if device.startswith('cuda'):
        name = torch.cuda.get_device_name(torch.device(device))
        flops = datasheet_peak(name, dtype)
        if flops:
            return flops, f"datasheet of {name}, {'tf32' if dtype == 'float32' else dtype}"
    return measure_matmul_flops(device, DTYPES.get(dtype, torch.float32), seconds=seconds), f"measured {dtype} matmul"
