"""Tests for common/flops.py: torch's FlopCounterMode count of a training step, which bench.py sets beside our
formula, against each layer kind's token_flops (model.flops_per_token) on a tiny model."""
import pytest
import torch
import torch.nn.functional as F

from chapters import BEYOND_MODERN, GPT, GPTConfig
from common.flops import training_flops
from model import LAYER_KINDS, TokenMixer

pytestmark = pytest.mark.usefixtures('single_thread')

MODERN = dict(n_layer=2, n_head=2, n_embd=32, block_size=48, vocab_size=64, bias=False, norm='rms', mlp='swiglu',
              pos='rope', n_kv_head=1)
WINDOW = MODERN['block_size'] // 4  # a local or chunked kind's window, a compressed kind's rate
CASES = {**{f'layers={letter}': {'layers': letter * 2, **(kind.needs(MODERN, WINDOW) if kind.needs else {})}
            for letter, kind in LAYER_KINDS.items()}, **BEYOND_MODERN}


@pytest.mark.parametrize('case', CASES)
def test_our_flops_are_torchs_count_within_10_percent(case):
    """Where a layer computes what it is counted for; where a mask hides keys (a window, a chunk) torch counts every
    key, so there its count is at least ours."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**MODERN, **CASES[case]})).train()
    T = MODERN['block_size']
    idx = torch.randint(0, MODERN['vocab_size'], (2, T), generator=torch.Generator().manual_seed(1))
    ours, torchs = model.flops_per_token(T), training_flops(model, idx, idx) / (2 * T)
    if any(isinstance(m, TokenMixer) and m.window for m in model.modules()):
        assert torchs >= ours * 0.99, (ours, torchs)
    else:
        assert abs(torchs / ours - 1) <= 0.10, (ours, torchs)


def test_attention_on_the_cpu_is_counted():
    """torch counts its CUDA attention kernels and, without common.flops, 0 for the CPU one SDPA runs here: the
    count of a causal attention's forward and backward is its CUDA kernels' formula, 4 + 10 products of T x T x hs
    per head (scores and weighted values; their gradients and the recomputed scores)."""
    q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    assert counter.get_total_flops() == 2 * 8 * 8 * 4 * 2 * (2 + 5)
