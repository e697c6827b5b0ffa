"""common/checkpoints.py: a second name of a checkpoint; old flags; unsafe and corrupt files refused."""

import os

import numpy as np
import pytest
import torch

from common.checkpoints import (CKPT_FORMAT, keep_as, load_checkpoint, model_from_checkpoint, new_checkpoint,
                                save_checkpoint)


def test_a_second_name_of_a_checkpoint_is_whole_and_separate(tmp_path):
    save_checkpoint({'format': CKPT_FORMAT, 'iter_num': 1}, str(tmp_path / 'ckpt.pt'))
    keep_as(str(tmp_path / 'ckpt.pt'), str(tmp_path / 'best.pt'))
    save_checkpoint({'format': CKPT_FORMAT, 'iter_num': 2}, str(tmp_path / 'ckpt.pt'))
    assert load_checkpoint(str(tmp_path / 'best.pt'))['iter_num'] == 1  # replacing ckpt.pt leaves it
    assert load_checkpoint(str(tmp_path / 'ckpt.pt'))['iter_num'] == 2
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt.pt']


def test_a_checkpoint_from_before_norm_position_loads_with_its_placement(tmp_path):
    """Checkpoints saved with prenorm=False (before norm_position) build the same post-norm model."""
    from chapters import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11, norm_position='post'))
    checkpoint = new_checkpoint(model)
    checkpoint['model_args'] = {k: v for k, v in checkpoint['model_args'].items() if k != 'norm_position'}
    checkpoint['model_args']['prenorm'] = False
    torch.save(checkpoint, tmp_path / 'ckpt.pt')
    loaded = load_checkpoint(str(tmp_path / 'ckpt.pt'))
    back = model_from_checkpoint(loaded)
    assert back.config.norm_position == 'post' and 'prenorm' not in loaded['model_args']
    idx = torch.randint(0, 11, (1, 8))
    assert torch.equal(back(idx)[0], model(idx)[0])


class RunsCode:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


def test_an_unsafe_checkpoint_is_refused_saying_it_would_run_code(tmp_path, capsys):
    marker = tmp_path / 'code_ran'
    torch.save({'format': CKPT_FORMAT, 'model': RunsCode(str(marker))}, tmp_path / 'ckpt.pt')
    with pytest.raises(SystemExit) as e:
        load_checkpoint(str(tmp_path / 'ckpt.pt'))
    assert e.value.code == 2 and not marker.exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error:')
    # the warning whole: what loading would do and what not to do, never torch's advice to load it anyway
    for fragment in ('ckpt.pt', 'not loaded', 'arbitrary code', 'unless you trust'):
        assert fragment in lines[0], lines[0]
    assert 'weights_only set to False' not in lines[0] and lines[0].endswith(')')


def test_a_corrupt_checkpoint_is_called_corrupt_not_unsafe(tmp_path, capsys):
    (tmp_path / 'ckpt.pt').write_bytes(np.random.default_rng(0).bytes(4096))  # the safe unpickler's 'operand' error
    with pytest.raises(SystemExit):
        load_checkpoint(str(tmp_path / 'ckpt.pt'))
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and 'corrupt' in line and 'unless you trust' in line, line
