"""common/resume.py, through train.py: an out_dir that is one run's, a resume that goes on exactly (after an
interrupt too), and a checkpoint that cannot be resumed said in one line."""

import json
import signal

import pytest
import torch

import common.checkpoints
import common.errors
from common.checkpoints import load_checkpoint
from conftest import make_char_dataset
from test_train import (MODERN, iter_losses, log_records, one_line_error, one_process_group, run,  # noqa: F401
                        train_here, workdir)


@pytest.mark.parametrize('recipe', [[], ['--optimizer=muon', '--lr_schedule=wsd', '--mlp=moe', '--n_expert=4'],
                                    ['--optimizer=muon', '--n_layer=4', '--layers=S-VN', '--mlp_with_mixer=False',
                                     '--ssm_state_dim=4']],
                         ids=['adamw', 'muon-wsd-moe', 'muon-mamba2-shortconv-one-part'])
def test_resume_is_exact(workdir, run, recipe):
    """2N iterations straight equal N, resume, N more: losses identical, dropout included; with Muon both
    optimizers' states (the experts' momenta one per expert) come back."""
    common_args = ['--dropout=0.1', '--eval_interval=6', *MODERN, *recipe]
    straight = run(workdir, *common_args, '--max_iters=12', '--out_dir=a')
    run(workdir, *common_args, '--max_iters=6', '--out_dir=b')
    resumed = run(workdir, *common_args, '--max_iters=12', '--out_dir=b', '--init_from=resume')
    a, b = iter_losses(straight.stdout), iter_losses(resumed.stdout)
    assert sorted(b) == list(range(7, 13))
    assert {k: a[k] for k in b} == b
    timing = ('elapsed_s', 'ms_per_iter')
    strip = lambda records: [{k: v for k, v in r.items() if k not in timing} for r in records]
    # the resumed run logs each evaluation once, with full-precision losses equal to the straight run's
    assert strip(log_records(workdir / 'a')) == strip(log_records(workdir / 'b'))
    assert log_records(workdir / 'b')[-1]['elapsed_s'] > log_records(workdir / 'b')[1]['elapsed_s']
    final_a = load_checkpoint(str(workdir / 'a' / 'ckpt.pt'))['model']
    final_b = load_checkpoint(str(workdir / 'b' / 'ckpt.pt'))['model']
    for k in final_a:
        assert torch.equal(final_a[k], final_b[k]), k


def test_resume_takes_this_runs_dropout(workdir, run):
    run(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', '--dropout=0.0')
    result = run(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', '--dropout=0.2',
                   '--n_layer=3', '--init_from=resume')
    assert "checkpoint's model flags, not this run's: n_layer" in result.stdout
    ckpt = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    assert ckpt['model_args']['dropout'] == 0.2 and ckpt['model_args']['n_layer'] == 2


def test_resume_needs_a_training_checkpoint_of_this_model(workdir, monkeypatch, capsys):
    assert train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=a', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    assert train_here(workdir, *MODERN, '--max_iters=2', '--eval_interval=2', '--out_dir=b',
                      monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    a, b = (load_checkpoint(str(workdir / d / 'ckpt.pt')) for d in 'ab')
    del a['optimizer']
    common.checkpoints.save_checkpoint(a, str(workdir / 'a' / 'ckpt.pt'))
    code, _, err = train_here(workdir, '--out_dir=a', '--init_from=resume', '--max_iters=4',
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, 'no training state')
    b['optimizer']['param_groups'][0]['params'] = b['optimizer']['param_groups'][0]['params'][:-1]  # another model's
    common.checkpoints.save_checkpoint(b, str(workdir / 'b' / 'ckpt.pt'))
    code, _, err = train_here(workdir, '--out_dir=b', '--init_from=resume', '--max_iters=4',
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, 'optimizer state for another model')


def test_a_scratch_run_over_a_trained_out_dir_is_refused(workdir, monkeypatch, capsys):
    assert train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    before = (workdir / 'out' / 'ckpt.pt').read_bytes()
    code, _, err = train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out',
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "out_dir 'out' already holds a run", '--init_from=resume', 'another out_dir')
    assert (workdir / 'out' / 'ckpt.pt').read_bytes() == before
    code, _, err = train_here(workdir, '--eval_only=True', '--out_dir=out', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "already holds a run")  # a fresh model's loss would enter the trained run's log


def test_an_evaluation_keeps_the_records_past_the_checkpoint(workdir, monkeypatch, capsys):
    """With always_save_checkpoint=False the checkpoint may be older than the last records: evaluating it
    (eval_only) must not take them for a crash's leftovers."""
    assert train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    with open(workdir / 'out' / 'log.jsonl', 'a') as f:
        f.write(json.dumps({'iter': 6, 'train_loss': 2.0, 'val_loss': 2.5}) + '\n')
    assert train_here(workdir, '--out_dir=out', '--init_from=resume', '--eval_only=True', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    records = log_records(workdir / 'out')
    assert [r['iter'] for r in records] == [0, 2, 4, 6, 4] and records[-1]['eval_only']


def test_the_log_reads_as_one_run_after_a_crash(workdir, monkeypatch, capsys):
    """Records a crash left past the checkpoint (or a torn last line) are dropped; the resumed run logs them."""
    assert train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    with open(workdir / 'out' / 'log.jsonl', 'a') as f:  # as if it had crashed after logging, before saving
        f.write(json.dumps({'iter': 6, 'train_loss': 9.0, 'val_loss': 9.0}) + '\n{"iter": 8, "train_lo')
    (workdir / 'out' / '.ckpt.pt.tmp4242').write_bytes(b'half a checkpoint')  # and mid-write
    assert train_here(workdir, '--max_iters=8', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                      monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    records = log_records(workdir / 'out')
    assert [r['iter'] for r in records] == [0, 2, 4, 6, 8] and records[3]['val_loss'] != 9.0
    assert not (workdir / 'out' / '.ckpt.pt.tmp4242').exists()


def test_a_run_that_saved_nothing_says_so_and_does_not_block_the_next(workdir, run):
    result = run(workdir, '--max_iters=0', '--out_dir=out')
    assert 'no checkpoint was saved' in result.stdout and not (workdir / 'out' / 'ckpt.pt').exists()
    first_log = (workdir / 'out' / 'log.jsonl').read_text()
    # a scratch run: the old log moves aside, never lost
    result = run(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out')
    assert 'moved it to log.1.jsonl' in result.stdout
    assert (workdir / 'out' / 'log.1.jsonl').read_text() == first_log
    assert [r['iter'] for r in log_records(workdir / 'out')] == [0, 2]


def test_resume_refuses_another_block_size_for_learned_positions(workdir, monkeypatch, capsys):
    assert train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    code, _, err = train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                              '--block_size=8', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, 'block_size 8', "checkpoint's 16", 'learned positions')


def test_a_broken_log_on_resume(workdir, monkeypatch, capsys):
    assert train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    with open(workdir / 'out' / 'log.jsonl', 'a') as f:
        f.write('{"iter": "x", "val_loss": 1}\n')
    assert train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                      monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    assert [r['iter'] for r in log_records(workdir / 'out')] == [0, 2, 4]
    (workdir / 'out' / 'log.jsonl').unlink()
    (workdir / 'out' / 'log.jsonl').mkdir()
    code, _, err = train_here(workdir, '--max_iters=6', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "'out/log.jsonl' is not a file")


def test_resume_onto_another_dataset(workdir, monkeypatch, capsys):
    from conftest import TINY_TEXT
    make_char_dataset(workdir, 'same', text=TINY_TEXT[::-1])  # the same characters, other text
    make_char_dataset(workdir, 'other', text=TINY_TEXT.upper())
    assert train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    code, out, _ = train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                              '--dataset=same', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and "note: resuming on dataset 'same'; the checkpoint trained on 'tiny'" in out
    code, _, err = train_here(workdir, '--max_iters=6', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                              '--dataset=other', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "dataset 'other' has another vocabulary than 'same'", '--dataset=same')


def test_resume_on_a_task_dataset_prepared_again_is_refused_unless_told(tmp_path, monkeypatch, capsys):
    """The checkpoint records the dataset's meta.json (its settings, each file's sha256): prepared again with other
    settings, its val set is another, so a resume is one line naming what changed (it went on once, comparing new
    val losses with the old set's best), unless --resume_on_new_data=True: the best starts over and the old best.pt
    moves aside. eval_only evaluates on the new data, saying so."""
    import runpy
    import sys
    from test_batches import TASKS, make_task
    from test_train import REPO
    make_task(tmp_path, 'recall', monkeypatch, capsys)
    task = ['--dataset=recall', '--block_size=15', '--eval_interval=2', '--out_dir=out']
    assert train_here(tmp_path, *task, '--max_iters=2', monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    best_before = (tmp_path / 'out' / 'best.pt').read_bytes()
    again = [a if a != '2' else '3' for a in TASKS['recall']]  # 3 pairs, not 2: other examples
    monkeypatch.setattr(sys, 'argv', ['prepare.py', *again, '--num_train', '64', '--num_val', '16',
                                      '--out_dir', str(tmp_path / 'data' / 'recall')])
    runpy.run_path(str(REPO / 'data' / 'recall' / 'prepare.py'), run_name='__main__')
    capsys.readouterr()
    code, _, err = train_here(tmp_path, *task, '--max_iters=4', '--init_from=resume', monkeypatch=monkeypatch,
                              capsys=capsys)
    one_line_error(code, err, "dataset 'recall' was prepared again since 'out/ckpt.pt' trained on it (num_pairs 2 -> 3",
                   'train.bin', '--resume_on_new_data=True', 'a new out_dir')
    assert load_checkpoint(str(tmp_path / 'out' / 'ckpt.pt'))['iter_num'] == 2  # nothing trained, nothing lost
    code, out, _ = train_here(tmp_path, *task, '--init_from=resume', '--eval_only=True', monkeypatch=monkeypatch,
                              capsys=capsys)
    assert code == 0 and 'evaluating on the new data' in out
    code, out, _ = train_here(tmp_path, *task, '--max_iters=4', '--init_from=resume', '--resume_on_new_data=True',
                              monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and "resuming on the new data, the best val loss starting over; the old data's best.pt moved " \
                         "to out/best.1.pt" in out
    assert (tmp_path / 'out' / 'best.1.pt').read_bytes() == best_before
    best = load_checkpoint(str(tmp_path / 'out' / 'best.pt'))
    assert best['iter_num'] == 4 and best['meta']['settings']['num_pairs'] == 3  # the new data's best
    code, _, _ = train_here(tmp_path, *task, '--max_iters=6', '--init_from=resume', monkeypatch=monkeypatch,
                            capsys=capsys)
    assert code == 0  # the checkpoint now records the new data


def test_eval_only_at_another_length_logs_the_trained_tokens(workdir, run):
    run(workdir, '--max_iters=4', '--eval_interval=4', '--out_dir=out')
    run(workdir, '--out_dir=out', '--init_from=resume', '--eval_only=True', '--block_size=8')
    records = log_records(workdir / 'out')
    assert records[-1]['eval_only'] and records[-1]['block_size'] == 8
    assert records[-1]['tokens'] == records[-2]['tokens'] == 4 * 4 * 16


def test_an_interrupt_saves_the_state_and_resume_goes_on_exactly(workdir, monkeypatch, capsys):
    """Ctrl-C mid-run (delivered between two steps) saves that iteration's state whole; a resume from it ends
    bitwise where a straight run does, its log the straight run's (dropout on: the RNG is saved too)."""
    args = ['--dropout=0.1', '--eval_interval=4', '--max_iters=10', *MODERN]
    assert train_here(workdir, *args, '--out_dir=a', monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    real_clip, calls = torch.nn.utils.clip_grad_norm_, []

    def ctrl_c_in_step_7(*a, **k):
        calls.append(1)
        if len(calls) == 7:
            common.errors._on_signal(signal.SIGINT, None)  # as the handler does when Ctrl-C comes mid-step
        return real_clip(*a, **k)
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_', ctrl_c_in_step_7)
    code, _, err = train_here(workdir, *args, '--out_dir=b', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, 'interrupted at iter 7, its state saved', "'b/ckpt.pt' (iter 7, not evaluated)",
                   "the best is 'b/best.pt' (iter 4,")
    assert code == 130
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_', real_clip)
    assert load_checkpoint(str(workdir / 'b' / 'ckpt.pt'))['iter_num'] == 7
    assert train_here(workdir, *args, '--out_dir=b', '--init_from=resume', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    final_a = load_checkpoint(str(workdir / 'a' / 'ckpt.pt'))
    final_b = load_checkpoint(str(workdir / 'b' / 'ckpt.pt'))
    assert final_a['iter_num'] == final_b['iter_num'] == 10
    for k in final_a['model']:
        assert torch.equal(final_a['model'][k], final_b['model'][k]), k
    strip = lambda records: [{k: v for k, v in r.items() if k not in ('elapsed_s', 'ms_per_iter')} for r in records]
    assert strip(log_records(workdir / 'a')) == strip(log_records(workdir / 'b'))


def test_muon_under_fsdp_and_a_resume_with_another_optimizer_are_one_line(workdir, run, monkeypatch, capsys):
    monkeypatch.setenv('RANK', '0')  # as torchrun sets it: the check comes before any process group
    code, _, err = train_here(workdir, '--fsdp=True', '--optimizer=muon', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "optimizer='muon' cannot run with fsdp=True", 'use DDP')
    monkeypatch.delenv('RANK')
    run(workdir, '--max_iters=2', '--eval_interval=2', '--optimizer=muon', '--out_dir=out')
    code, _, err = train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "was trained with optimizer='muon'", '--optimizer=muon')


def test_a_muon_checkpoint_resumed_under_fsdp_names_the_optimizer(workdir, run, monkeypatch, capsys,
                                                                  one_process_group):
    for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'):  # a single process trains the checkpoint
        monkeypatch.delenv(k)
    run(workdir, '--max_iters=2', '--eval_interval=2', '--optimizer=muon', '--out_dir=out')
    monkeypatch.setenv('RANK', '0')
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.setenv('WORLD_SIZE', '1')
    code, _, err = train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                              '--fsdp=True', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "was trained with optimizer='muon', which cannot run with fsdp=True",
                   'under DDP (fsdp=False) with --optimizer=muon')


def test_resume_is_exact_for_gemma4s_parts(workdir, run):
    """Gemma 4's state under Muon: the per-layer table and projection (AdamW), each layer's gated projection (Muon),
    the router's and experts' scales, the layer scalars (saved buffers); K/V sharing and K = V change only shapes."""
    test_resume_is_exact(workdir, run, ['--optimizer=muon', '--n_layer=4', '--layers=LG', '--sliding_window=8',
                                        '--rope_local_theta=100.0', '--kv_shared_layers=2', '--attn_k_eq_v=True',
                                        '--v_norm=True', '--layer_scalar=True', '--per_layer_embd=4', '--mlp=moe',
                                        '--n_expert=4', '--moe_dense_mlp=True', '--moe_activation=gelu',
                                        '--global_head_dim=32', '--rope_proportion=0.25'])
