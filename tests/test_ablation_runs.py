"""ablation/runs.py: a RoPE run on a task dataset scaled to each evaluation length, cached; no windowed length
table for a task."""

import json
import runpy
import sys
from pathlib import Path

import pytest

import ablation.runs

REPO = Path(__file__).resolve().parents[1]


def test_a_rope_run_on_copy_is_scaled_to_each_evaluation_length(tmp_path, monkeypatch, capsys):
    """task_lengths: each scaling of a RoPE checkpoint at data/copy's val, val_2x, val_4x; at 1x a scaling is plain
    RoPE, so it scores train.py's own val evaluation (the same first examples); cached in lengths.json."""
    import common.errors
    from common.files import release_out_dirs
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'argv', ['prepare.py', '--length', '4', '--num_train', '64', '--num_val', '16',
                                      '--out_dir', str(tmp_path / 'data' / 'copy')])
    runpy.run_path(str(REPO / 'data' / 'copy' / 'prepare.py'), run_name='__main__')
    monkeypatch.setattr(sys, 'argv', ['train.py', '--dataset=copy', '--device=cpu', '--compile=False', '--n_layer=1',
                                      '--n_head=2', '--n_embd=16', '--block_size=8', '--batch_size=4', '--eval_iters=2',
                                      '--gradient_accumulation_steps=1', '--max_iters=4', '--eval_interval=4',
                                      '--pos=rope', '--out_dir=run'])
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    try:
        runpy.run_path(str(REPO / 'train.py'), run_name='__main__')
    finally:
        release_out_dirs()
    logged = json.loads((tmp_path / 'run' / 'log.jsonl').read_text().splitlines()[-1])
    extrapolation_iters = 2
    figures = ablation.runs.task_lengths(str(tmp_path / 'run'), str(tmp_path), ['plain', 'linear', 'yarn'],
                                         extrapolation_iters)
    capsys.readouterr()
    assert set(figures) == {'linear', 'yarn'} and set(figures['linear']) == {'val', 'val_2x', 'val_4x'}
    assert figures['linear']['val']['accuracy'] == pytest.approx(logged['accuracy'])
    assert figures['linear']['val']['loss'] == pytest.approx(logged['val_loss'], rel=1e-5)
    assert all(0 <= f['accuracy'] <= 1 for f in figures['yarn'].values())
    # the windowed length table (text) would score windows across examples: for a task it is left empty, and says so
    # without a model (cached as None, loaded once)
    monkeypatch.setattr(ablation.runs, 'length_loss', lambda *a: pytest.fail('no windows of a task are scored'))
    windows, why = ablation.runs.extrapolation_losses(str(tmp_path / 'run'), str(tmp_path), ['plain', 'yarn'],
                                                      extrapolation_iters)
    assert why == '' and all(v is None for losses in windows.values() for v in losses.values())
    assert ablation.runs.lengths_missing(str(tmp_path / 'run'), ['plain', 'yarn'], extrapolation_iters) == []
    monkeypatch.setattr(ablation.runs, 'load_checkpoint', lambda *a: pytest.fail('cached: nothing to load'))
    assert ablation.runs.task_lengths(str(tmp_path / 'run'), str(tmp_path), ['linear', 'yarn'],
                                      extrapolation_iters) == figures


def test_the_probes_and_length_figures_read_a_task_split_only_of_one_preparation(tmp_path, monkeypatch, capsys):
    """A val.bin of another preparation beside the masks (same sizes): the probes' tokens, as the task's lengths
    table, stop with train.py's one line naming the file (common.data.example_split), not read mixed examples."""
    import shutil
    from test_data import two_preparations
    mine, other = two_preparations(tmp_path / 'data', monkeypatch, capsys)
    assert ablation.runs.probe_tokens(str(tmp_path), 'seed1', 23).shape == (16, 23)
    shutil.copy(other / 'val.bin', mine / 'val.bin')
    with pytest.raises(SystemExit):
        ablation.runs.probe_tokens(str(tmp_path), 'seed1', 23)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"'{mine / 'val.bin'}'" in err[0] and 'different runs of prepare.py' in err[0]


def test_the_probes_equal_baseline_follows_a_windowed_models_layers():
    """A run's probe figures: 'equal' is what equal attention gives the same queries in each layer's window (all
    local layers with a window of 16 at 64 tokens: 0.022), not the whole row's 0.044 (issue 44.5)."""
    import torch
    from chapters import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=11, n_layer=2, n_head=2, n_embd=16, pos='rope', layers='L',
                          sliding_window=16)).eval()
    figures = ablation.runs.probe_run(model, torch.randint(0, 11, (2, 64), generator=torch.Generator().manual_seed(1)))
    assert figures['equal_share'] == pytest.approx(sum(1 / (t + 1) for t in range(4, 16)) / 60)
    assert figures['layers']['equal_share'] == [figures['equal_share']] * 2
