"""Checkpoints trained before the chapters left model.py (commit 5eda1e1; tests/data/before_chapters/make.py made
them) load with today's code: the same logits and greedy tokens as the code that trained them, and training
resumes from them. One holds local, Gated DeltaNet, KDA, Mamba-2 and short-convolution layers, a sigmoid MoE with
a shared expert, QK-norm, gates, sinks, MTP, Gemma 4's per-layer embeddings and layer scalars; the other MLA with
DSA and IndexCache, nanochat's weightless norms, YaRN and zero-init."""
import json
import runpy
import shutil
import sys
from pathlib import Path

import pytest
import torch

import common.errors
from common.checkpoints import load_checkpoint, model_from_checkpoint
from common.files import release_out_dirs
from conftest import make_char_dataset

HERE = Path(__file__).resolve().parent / 'data' / 'before_chapters'
EXPECTED = json.loads((HERE / 'expected.json').read_text())

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('name', sorted(EXPECTED))
@torch.no_grad()
def test_a_checkpoint_from_before_the_move_computes_what_it_did(name):
    model = model_from_checkpoint(load_checkpoint(str(HERE / f'{name}.pt')), name)
    model.eval()
    expected = EXPECTED[name]
    idx = torch.arange(20).remainder(model.config.vocab_size).view(1, 20)
    logits = model(idx)[0]
    torch.testing.assert_close(logits[0, :3, :5], torch.tensor(expected['logits_first']), rtol=0, atol=1e-5)
    torch.testing.assert_close(logits[0, -1, :8], torch.tensor(expected['logits_last']), rtol=0, atol=1e-5)
    assert logits.double().sum().item() == pytest.approx(expected['logits_sum'], abs=1e-3)
    assert model.generate(idx[:, :5], 8, temperature=0)[0].tolist() == expected['greedy']


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_training_resumes_from_a_checkpoint_from_before_the_move(name, tmp_path, monkeypatch, capsys):
    make_char_dataset(tmp_path)  # the text it was trained on
    out = tmp_path / 'out'
    out.mkdir()
    shutil.copy(HERE / f'{name}.pt', out / 'ckpt.pt')
    shutil.copy(HERE / f'{name}.log.jsonl', out / 'log.jsonl')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'argv', ['train.py', '--init_from=resume', '--out_dir=out', '--dataset=tiny',
                                      '--device=cpu', '--compile=False', '--max_iters=5', '--eval_interval=5',
                                      '--eval_iters=1', '--batch_size=2', '--wandb_log=False'])
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)  # pytest keeps its own Ctrl-C
    try:  # train.py in this process (a subprocess would add only a torch import)
        runpy.run_path(str(Path(__file__).resolve().parents[1] / 'train.py'), run_name='__main__')
    finally:
        release_out_dirs()
    assert 'resum' in capsys.readouterr().out.lower()
    records = [json.loads(line) for line in (out / 'log.jsonl').read_text().splitlines()]
    assert records[-1]['iter'] == 5 and records[-1]['val_loss'] < 4.0
    assert load_checkpoint(str(out / 'ckpt.pt'))['iter_num'] == 5
