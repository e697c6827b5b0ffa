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


def test_a_checkpoint_from_before_norm_position_loads_with_its_placement(tmp_path):
    """Checkpoints saved with prenorm=False (before norm_position) build the same post-norm model."""
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11, norm_position='post'))
    checkpoint = common.new_checkpoint(model)
    checkpoint['model_args'] = {k: v for k, v in checkpoint['model_args'].items() if k != 'norm_position'}
    checkpoint['model_args']['prenorm'] = False
    torch.save(checkpoint, tmp_path / 'ckpt.pt')
    loaded = common.load_checkpoint(str(tmp_path / 'ckpt.pt'))
    back = common.model_from_checkpoint(loaded)
    assert back.config.norm_position == 'post' and 'prenorm' not in loaded['model_args']
    idx = torch.randint(0, 11, (1, 8))
    assert torch.equal(back(idx)[0], model(idx)[0])
