"""common/evaluation.py, through train.py: fixed evaluation batches shared out across ranks, a task's greedy accuracy
over its first examples and at longer lengths, MoE's load on the val batches."""

import re

import pytest
import torch

from common.checkpoints import load_checkpoint
from conftest import make_char_dataset
from test_batches import make_task, task_file
from test_train import MODERN, log_records, run, train_namespace, workdir  # noqa: F401 (fixtures)


def test_moe_training_logs_the_experts_load(workdir, run):
    run(workdir, *MODERN, '--mlp=moe', '--n_expert=4', '--moe_aux_loss_coef=0.01', '--moe_z_loss_coef=0.001',
        '--max_iters=6', '--eval_interval=3', '--out_dir=out')
    records = log_records(workdir / 'out')
    assert records[-1]['val_loss'] < records[0]['val_loss']
    for record in records:
        moe = record['moe']
        assert len(moe['load']) == len(moe['max_over_mean']) == 2  # per layer
        assert all(len(shares) == 4 and sum(shares) == pytest.approx(1, abs=1e-3) for shares in moe['load'])
        assert all(m >= 1 for m in moe['max_over_mean'])
        assert moe['aux_loss'] >= 1 - 1e-6 and moe['z_loss'] > 0


@pytest.mark.parametrize('fsdp, reads', [(False, [1]), (True, [1, 2])], ids=['ddp', 'fsdp'])
def test_a_rank_reads_only_its_own_eval_batches(workdir, monkeypatch, fsdp, reads):
    """Rank 1 of 2, 3 eval batches: it draws all three (the same ones as one process) and reads only batch 1;
    under FSDP also batch 2, the last, whose collective forward it joins. Each batch is one (B, T+1) block
    sent to the device once, inputs and targets its views."""
    from common.evaluation import EVAL_SEED, Evaluation
    ns = train_namespace(workdir, '--max_iters=0', '--eval_iters=3', '--out_dir=out', monkeypatch=monkeypatch)
    batches = ns['batches']
    x, y = batches.get('val', torch.Generator().manual_seed(0))
    assert x._base is y._base and x._base.shape == (4, 17) and x._base.is_contiguous()
    assert torch.equal(x[:, 1:], y[:, :-1])
    generator = torch.Generator().manual_seed(EVAL_SEED + 1)
    alone = [batches.get('val', generator) for _ in range(3)]  # what one process evaluates
    read, get_batch = [], batches.get

    def spy(split, generator, fetch=True):
        batch = get_batch(split, generator, fetch)
        if split == 'val' and fetch:
            read.append(batch)
        return batch
    monkeypatch.setattr(batches, 'get', spy)
    Evaluation(batches, 3, ns['ctx'], ns['eval_model'], ns['raw_model'], rank=1, world_size=2, fsdp=fsdp).estimate_loss()
    assert len(read) == len(reads)
    for (x, y), k in zip(read, reads):
        assert torch.equal(x, alone[k][0]) and torch.equal(y, alone[k][1])


def test_task_accuracy_is_greedy_over_the_scored_targets_of_the_first_examples(tmp_path, monkeypatch, capsys,
                                                                               single_thread):
    """Evaluations read the split's first eval_iters * batch_size examples in order; accuracy is the share of
    scored targets whose argmax is right, logged beside val loss."""
    data_dir = make_task(tmp_path, 'recall', monkeypatch, capsys)
    ns = train_namespace(tmp_path, '--dataset=recall', '--block_size=15', '--max_iters=0', '--out_dir=out',
                         monkeypatch=monkeypatch)
    record = log_records(tmp_path / 'out')[-1]
    tokens, mask = task_file(data_dir, 'val', 16)
    x, y = torch.from_numpy(tokens[:8, :-1]), torch.from_numpy(tokens[:8, 1:])  # eval_iters 2 x batch_size 4
    scored = torch.from_numpy(mask[:8, :-1] == 1)
    with torch.no_grad():
        logits, _ = ns['raw_model'](x)  # no targets: the logits of every position
    by_hand = (logits.argmax(-1)[scored] == y[scored]).float().mean().item()
    assert record['accuracy'] == pytest.approx(by_hand) and 'train_accuracy' in record and 'lengths' not in record

    class RightOnEvenIds(torch.nn.Module):  # predicts an even target, and the id before an odd one
        def forward(self, inputs, targets):
            guess = torch.where(targets % 2 == 0, targets, targets - 1).clamp(min=0)
            return torch.nn.functional.one_hot(guess, 16).float(), torch.tensor(1.0)
    monkeypatch.setattr(ns['evaluation'], 'model', RightOnEvenIds())
    accuracy = ns['evaluation'].estimate_loss()['accuracy']
    for split in ('train', 'val'):
        tokens, mask = task_file(data_dir, split, 16)
        targets = tokens[:8, 1:][mask[:8, :-1] == 1]  # the first eval_iters * batch_size examples
        assert accuracy[split] == pytest.approx((targets % 2 == 0).mean())
        assert accuracy[split] != pytest.approx((tokens[8:, 1:][mask[8:, :-1] == 1] % 2 == 0).mean())


def test_task_lengths_past_block_size_run_only_where_the_positions_go(tmp_path, run, monkeypatch, capsys,
                                                                      single_thread):
    """copy's val_2x (17 tokens) and val_4x (33) with block_size 16: RoPE evaluates both; learned positions
    val_2x only (inputs of 16), val_4x logged None, said once at start."""
    make_task(tmp_path, 'copy', monkeypatch, capsys)
    rope = run(tmp_path, '--dataset=copy', '--pos=rope', '--max_iters=2', '--eval_interval=2', '--out_dir=rope')
    lengths = log_records(tmp_path / 'rope')[-1]['lengths']
    assert set(lengths) == {'val_2x', 'val_4x'}
    assert all(v['loss'] > 0 and 0 <= v['accuracy'] <= 1 for v in lengths.values())
    assert re.search(r'accuracy [\d.]+ \(val_2x [\d.]+, val_4x [\d.]+\)', rope.stdout)
    learned = run(tmp_path, '--dataset=copy', '--max_iters=2', '--eval_interval=2', '--out_dir=learned')
    lengths = log_records(tmp_path / 'learned')[-1]['lengths']
    assert lengths['val_4x'] == {'loss': None, 'accuracy': None} and lengths['val_2x']['accuracy'] is not None
    assert learned.stdout.count('learned positions cannot go past block_size 16: val_4x (33 tokens)') == 1
    assert 'val_4x n/a' in learned.stdout


def test_stop_accuracy_ends_a_task_run_at_its_first_trained_evaluation_that_reaches_it(tmp_path, run, monkeypatch,
                                                                                     capsys, single_thread):
    """The run stops where its accuracy first reaches stop_accuracy, with the log and checkpoint of that
    evaluation; a text dataset refuses the setting."""
    make_task(tmp_path, 'recall', monkeypatch, capsys)
    task = ['--dataset=recall', '--block_size=15', '--max_iters=40', '--eval_interval=4', '--learning_rate=1e-2']
    run(tmp_path, *task, '--out_dir=full')
    full = [(r['iter'], r['accuracy']) for r in log_records(tmp_path / 'full')]
    best = max(accuracy for _, accuracy in full[1:-1])  # before the last evaluation: a stop there ends the run early
    first = next(k for k, (_, accuracy) in enumerate(full) if k > 0 and accuracy >= best)
    stop = full[first][0]
    assert best > 0 and stop < 40
    result = run(tmp_path, *task, f'--stop_accuracy={best!r}', '--out_dir=stopped')
    assert [(r['iter'], r['accuracy']) for r in log_records(tmp_path / 'stopped')] == full[:first + 1]
    assert f'reached stop_accuracy={best!r} at iter {stop}: the task is solved' in result.stdout
    assert torch.load(tmp_path / 'stopped' / 'ckpt.pt', weights_only=False)['iter_num'] == stop

    make_char_dataset(tmp_path)  # data/tiny, characters
    text = run(tmp_path, '--stop_accuracy=0.9', '--out_dir=text', check=False)
    assert text.returncode == 2 and text.stderr.count('\n') == 1
    assert "stop_accuracy=0.9 needs a task dataset" in text.stderr and "dataset 'tiny' is text" in text.stderr


def test_a_run_stopped_by_stop_accuracy_keeps_the_state_that_solved_it(tmp_path, run, monkeypatch, capsys,
                                                                       single_thread):
    """always_save_checkpoint=False saves when val loss improves; an evaluation that reaches stop_accuracy saves
    too, whatever its val loss (issue 65.1: ckpt.pt and best.pt held iter 20 of a run solved at 60, which a resume
    trained again). The closing line names what each checkpoint holds, and a resume of it trains nothing."""
    from common.evaluation import Evaluation
    make_task(tmp_path, 'recall', monkeypatch, capsys)
    real = Evaluation.estimate_loss

    def worse_loss_better_accuracy(self):  # val loss rises at every evaluation while accuracy climbs
        losses = real(self)
        worse_loss_better_accuracy.calls += 1
        losses['val'] = float(worse_loss_better_accuracy.calls)
        losses['accuracy']['val'] = 0.2 * worse_loss_better_accuracy.calls
        return losses
    worse_loss_better_accuracy.calls = 0
    monkeypatch.setattr(Evaluation, 'estimate_loss', worse_loss_better_accuracy)
    task = ['--dataset=recall', '--block_size=15', '--eval_interval=2', '--out_dir=out', '--stop_accuracy=0.7',
            '--always_save_checkpoint=False']
    result = run(tmp_path, *task, '--max_iters=20')  # evaluations at 0, 2, 4, 6: accuracy 0.2, 0.4, 0.6, 0.8
    ckpt = load_checkpoint(str(tmp_path / 'out' / 'ckpt.pt'))
    best = load_checkpoint(str(tmp_path / 'out' / 'best.pt'))
    assert ckpt['iter_num'] == 6 and ckpt['val_accuracy'] == pytest.approx(0.8) and best['iter_num'] == 2
    assert (f"val accuracy 0.8000 reached stop_accuracy=0.7 at iter 6: the task is solved, training ends here; the "
            f"last checkpoint is 'out/ckpt.pt' (iter 6, val loss 4.0000); the best is 'out/best.pt' (iter 2, val loss "
            f"2.0000)") in result.stdout
    again = run(tmp_path, *task, '--max_iters=20', '--init_from=resume')
    assert 'at iter 6: the task is solved, training ends here (the checkpoint had' in again.stdout
    assert worse_loss_better_accuracy.calls == 4 and load_checkpoint(str(tmp_path / 'out' / 'ckpt.pt'))['iter_num'] == 6
