"""train.py end to end on a tiny self-made character dataset: as a subprocess like a user runs it where the
process itself matters (exit codes, signals, DDP), else in this process (no torch import to wait for)."""

import errno
import json
import math
import os
import re
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import common.checkpoints
import common.errors
import common.hardware
from common.checkpoints import CKPT_FORMAT, load_checkpoint
from common.errors import Interrupted, critical
from common.files import release_out_dirs
from conftest import CHOICE_TASK_YAML, make_char_dataset

REPO = Path(__file__).resolve().parents[1]
TINY = ['--dataset=tiny', '--device=cpu', '--compile=False', '--n_layer=2', '--n_head=2', '--n_embd=32',
        '--block_size=16', '--batch_size=4', '--gradient_accumulation_steps=1', '--eval_iters=2',
        '--log_interval=1', '--learning_rate=3e-3', '--warmup_iters=2', '--dropout=0.0']
MODERN = ['--norm=rms', '--mlp=swiglu', '--n_kv_head=1', '--pos=rope']
# runs compared with another process's to rounding use the thread count torchrun gives each of its processes
ONE_THREAD = {'OMP_NUM_THREADS': '1'}


@pytest.fixture
def workdir(tmp_path):
    make_char_dataset(tmp_path)
    return tmp_path


def train(cwd, *args, launcher=None, env=None, check=True):
    cmd = (launcher or [sys.executable]) + [str(REPO / 'train.py'), *TINY, *args]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300,
                            env={**os.environ, 'WANDB_MODE': 'offline', **(env or {})})
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def train_here(cwd, *args, monkeypatch, capsys):
    """train.py run in this process: (exit code, stdout, stderr); 0 when it ended normally."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, 'argv', ['train.py', *TINY, *args])
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)  # pytest keeps its own Ctrl-C
    monkeypatch.setenv('WANDB_MODE', 'offline')
    try:
        runpy.run_path(str(REPO / 'train.py'), run_name='__main__')
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        release_out_dirs()  # as the end of its process would
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def run(monkeypatch, capsys):
    """train(...) in this process: the same result, without a second of torch import per run."""
    def run_here(cwd, *args, check=True):
        code, out, err = train_here(cwd, *args, monkeypatch=monkeypatch, capsys=capsys)
        result = subprocess.CompletedProcess(['train.py', *args], code or 0, out, err)
        if check:
            assert result.returncode == 0, result.stderr[-3000:]
        return result
    return run_here


def one_line_error(code, err, *fragments):
    lines = err.strip().splitlines()
    assert code not in (0, None) and len(lines) == 1 and lines[0].startswith('error:'), (code, err)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def log_records(out_dir):
    return [json.loads(line) for line in (out_dir / 'log.jsonl').read_text().splitlines()]


def iter_losses(stdout):
    """{iteration: the loss its line prints} (the objective, where it has terms besides the next-token loss)."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'^iter (\d+)/\d+: (?:loss|objective) (\S+),', stdout,
                                                              re.M)}


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error:'), result.stderr
    assert 'Traceback' not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize('flags', [[], MODERN], ids=['vanilla', 'modern'])
def test_training_learns_saves_and_resumes(workdir, run, flags):
    run(workdir, *flags, '--max_iters=30', '--eval_interval=15', '--out_dir=out')
    records = log_records(workdir / 'out')
    assert [r['iter'] for r in records] == [0, 15, 30]
    assert records[-1]['val_loss'] < records[0]['val_loss'] - 0.5
    assert records[-1]['tokens'] == 30 * 4 * 16
    assert all(r['ms_per_iter'] > 0 for r in records[1:])
    ckpt = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    assert ckpt['iter_num'] == 30
    assert ckpt['best_val_loss'] == min(r['val_loss'] for r in records)
    assert not any(k.startswith('_orig_mod') for k in ckpt['model'])
    expected = dict(norm='rms', mlp='swiglu', n_kv_head=1, pos='rope') if flags else dict(norm='layernorm', pos='learned')
    for k, v in expected.items():
        assert ckpt['model_args'][k] == v and ckpt['config'][k] == v
    result = run(workdir, *flags, '--max_iters=35', '--eval_interval=15', '--out_dir=out', '--init_from=resume')
    assert 'iter 35/35' in result.stdout
    assert load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))['iter_num'] == 35


def test_bf16_autocast_on_cpu(workdir, run):
    run(workdir, *MODERN, '--dtype=bfloat16', '--max_iters=10', '--eval_interval=10', '--out_dir=out')
    records = log_records(workdir / 'out')
    assert records[-1]['val_loss'] < records[0]['val_loss']
    assert load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))['model']['lm_head.weight'].dtype == torch.float32


@pytest.mark.parametrize('optimizer', ['adamw', 'muon'])
def test_ddp_two_processes_match_one(workdir, optimizer):
    """gradient_accumulation_steps is global: 2 gloo processes x 1 micro step == 1 process x 2; with MoE the
    sigmoid routers' balancing biases follow the load of both processes; Muon steps on the averaged gradients."""
    args = ['--gradient_accumulation_steps=2', '--max_iters=4', '--eval_interval=4', '--eval_iters=3', *MODERN,
            '--mlp=moe', '--n_expert=4', '--router=sigmoid', '--moe_bias_update_rate=0.01', f'--optimizer={optimizer}']
    # one thread in every process: the thread count sets the order of a matmul's sums, and Muon's Newton-Schulz
    # steps amplify that rounding (2 threads against 1 moved val loss by 2.7e-4); alike, val loss matched to every digit
    single = train(workdir, *args, '--out_dir=single', env=ONE_THREAD)
    launcher = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    double = train(workdir, *args, '--out_dir=double', launcher=launcher, env=ONE_THREAD)
    a, b = iter_losses(single.stdout), iter_losses(double.stdout)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4], (single.stdout[-2000:], double.stdout[-2000:], double.stderr[-2000:])
    assert 'broadcast_buffers' not in double.stderr, double.stderr[-2000:]  # torch 2.13's FutureWarning
    for k in a:
        assert float(a[k]) == pytest.approx(float(b[k]), rel=1e-4), (k, single.stdout[-2000:], double.stdout[-2000:])
    ra, rb = log_records(workdir / 'single')[-1], log_records(workdir / 'double')[-1]
    assert ra['val_loss'] == pytest.approx(rb['val_loss'], rel=1e-4)
    assert ra['moe']['load'] == rb['moe']['load']  # the val batches of both ranks, summed
    biases = [load_checkpoint(str(workdir / d / 'ckpt.pt'))['model']['transformer.h.0.mlp.expert_bias']
              for d in ('single', 'double')]
    assert torch.equal(*biases)
    if optimizer == 'adamw':  # moved (with Muon's larger router steps 4 moves of +-rate happen to cancel)
        assert biases[0].abs().sum() > 0


def test_interrupted_checkpoint_write_keeps_previous(tmp_path, monkeypatch):
    path = str(tmp_path / 'ckpt.pt')
    common.checkpoints.save_checkpoint({'format': CKPT_FORMAT, 'iter_num': 1}, path)

    def crash_midway(obj, f):
        f.write(b'half a checkpoint')
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, 'save', crash_midway)
    with pytest.raises(KeyboardInterrupt):
        common.checkpoints.save_checkpoint({'format': CKPT_FORMAT, 'iter_num': 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)['iter_num'] == 1
    assert os.listdir(tmp_path) == ['ckpt.pt']  # no temporary file left behind


def test_diverging_run_stops_and_keeps_last_good_checkpoint(workdir, run):
    run(workdir, '--max_iters=4', '--eval_interval=4', '--out_dir=out')
    before = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    result = run(workdir, '--max_iters=40', '--eval_interval=4', '--out_dir=out', '--init_from=resume',
                   '--learning_rate=1e9', '--decay_lr=False', '--grad_clip=0', '--always_save_checkpoint=True',
                   check=False)
    assert_one_line_error(result, 'training diverged', 'ckpt.pt')
    assert result.returncode == 1
    after = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    for k, v in after['model'].items():
        assert torch.isfinite(v).all(), k
    # the checkpoint is the last evaluation that was still finite, the last one log.jsonl holds
    assert after['iter_num'] == log_records(workdir / 'out')[-1]['iter'] >= before['iter_num']
    assert math.isfinite(after['best_val_loss'])


def test_init_from_local_hf_gpt2(workdir, run):
    transformers = pytest.importorskip('transformers')
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32, vocab_size=40)
    transformers.GPT2LMHeadModel(config).save_pretrained(workdir / 'hf')
    run(workdir, f'--init_from={workdir / "hf"}', '--max_iters=2', '--eval_interval=2', '--out_dir=out')
    ckpt = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    assert ckpt['model_args']['block_size'] == 16  # cropped from 32 to the run's block_size
    assert ckpt['model_args']['vocab_size'] == 40 and ckpt['model_args']['bias'] is True


@pytest.mark.parametrize('args, fragments', [
    (['--dataset=nope'], ["data/nope/train.bin", "python data/nope/prepare.py"]),
    (['--n_kv_head=3', '--n_head=4', '--n_embd=32'], ['n_kv_head']),
    (['--norm=batchnorm'], ['norm', "'rms'"]),
    (['--lerning_rate=1'], ["did you mean 'learning_rate'"]),
    (['--init_from=resume', '--out_dir=missing'], ['missing/ckpt.pt']),
    (['--gradient_accumulation_steps=0'], ['gradient_accumulation_steps']),
    (['--beta1=1.5'], ['beta1', '[0, 1)']),
    (['--learning_rate=-1e-3'], ['learning_rate', '>= 0']),
    (['--learning_rate=1e999'], ['learning_rate must be >= 0 and finite, got inf']),  # 1e999 reads as inf
    (['--muon_lr=1e999'], ['muon_lr must be > 0 and finite, got inf']),
    (['--seed=-1'], ['seed']),
    (['--out_dir=' + 'x' * 300], ['cannot write to out_dir', 'too long']),
    (['--mlp=moe', '--n_expert=4', '--n_expert_active=5'], ['n_expert_active']),
    (['--attn=mla', '--n_kv_head=2'], ['n_kv_head', 'cannot apply']),
    (['--sliding_window=0'], ['sliding_window']),
    (['--rope_scaling=yarn'], ['rope_scaling', "pos='rope'"]),
    (['--block_size=2000'], ['val.bin', 'too few for block_size 2000']),
    (['--compile=maybe'], ["'compile' expects bool or None"]),
    (['--init_from=resum'], ["init_from 'resum'", "did you mean 'resume'"]),
    (['--eval_task=x', '--eval_task_include_path=nowhere'], ["eval_task_include_path 'nowhere'", 'not a directory']),
    (['--eval_task=x', '--eval_task_limit=-1'], ['eval_task_limit must be >= 0']),
    (['--optimizer=sgd'], ["optimizer must be 'adamw' or 'muon'", "'sgd'"]),
    (['--lr_schedule=linear'], ["lr_schedule must be 'cosine' or 'wsd'"]),
    (['--lr_decay_fraction=1.5'], ['lr_decay_fraction must be in [0, 1]', '1.5']),
    (['--muon_momentum=1.0'], ['muon_momentum must be in [0, 1)']),
    (['--muon_lr=0'], ['muon_lr must be > 0']),
    (['--min_lr=0.1'], ['min_lr (0.1) must not be above learning_rate']),
])
def test_user_mistakes_are_one_line(workdir, args, fragments, monkeypatch, capsys):
    code, _, err = train_here(workdir, '--max_iters=1', *args, monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, *fragments)


def test_out_dir_that_cannot_be_used_is_one_line(workdir, monkeypatch, capsys):
    (workdir / 'afile').write_text('x')
    code, _, err = train_here(workdir, '--out_dir=afile', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "out_dir 'afile' is a file")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, 'Read-only file system')
    monkeypatch.setattr(os, 'makedirs', read_only)
    code, _, err = train_here(workdir, '--out_dir=ro', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "cannot write to out_dir 'ro'", 'Read-only')


@pytest.mark.parametrize('error, fragment', [
    (OSError(errno.ENOSPC, 'No space left on device'), 'No space left'),
    # what torch.save itself raises on a full disk
    (RuntimeError('[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file data/3: '
                  'file write failed'), 'file write failed'),
], ids=['OSError', 'RuntimeError'])
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(workdir, monkeypatch, capsys, error, fragment):
    assert train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    before = (workdir / 'out' / 'ckpt.pt').read_bytes()

    def disk_full(obj, f):
        f.write(b'part of a checkpoint')
        raise error
    monkeypatch.setattr(torch, 'save', disk_full)
    code, _, err = train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, fragment, 'previous one is intact')
    assert (workdir / 'out' / 'ckpt.pt').read_bytes() == before
    assert sorted(p.name for p in (workdir / 'out').iterdir()) == ['.lock', 'best.pt', 'ckpt.pt', 'log.jsonl']


def test_out_of_memory_says_what_to_lower(workdir, monkeypatch, capsys):
    import model

    def too_big(self, *args, **kwargs):
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')
    monkeypatch.setattr(model.GPT, 'forward', too_big)
    code, _, err = train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out',
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, 'out of memory', 'batch_size (4)', 'block_size (16)', 'no checkpoint was saved')


def test_a_blown_up_run_keeps_its_better_checkpoint_and_says_so(workdir, monkeypatch, capsys):
    assert train_here(workdir, '--max_iters=20', '--eval_interval=20', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    good = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    code, out, err = train_here(workdir, '--max_iters=40', '--eval_interval=2', '--out_dir=out', '--init_from=resume',
                                '--learning_rate=30', '--decay_lr=False', '--grad_clip=0', '--warmup_iters=0',
                                monkeypatch=monkeypatch, capsys=capsys)
    assert 'not saving' in out, out[-2000:]
    after = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    assert after['val_loss'] <= 2 * good['best_val_loss']  # never a blown-up one
    # best.pt: the best model of the whole run, whatever ckpt.pt took since (always_save_checkpoint=True)
    best = load_checkpoint(str(workdir / 'out' / 'best.pt'))
    trained = [r for r in log_records(workdir / 'out') if r['iter'] > 0]
    assert best['val_loss'] == min(r['val_loss'] for r in trained) <= good['val_loss']
    assert best['iter_num'] == min(trained, key=lambda r: r['val_loss'])['iter']
    if code:  # it went on to NaN: the message names the checkpoint really kept
        one_line_error(code, err, 'training diverged', f"(iter {after['iter_num']}, val loss {after['val_loss']:.4f})")


def wait_for(predicate, timeout=120):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, 'timed out'
        time.sleep(0.2)


def test_one_process_per_out_dir_and_ctrl_c_stops_with_one_line(workdir, monkeypatch, capsys):
    """A second trainer on a busy out_dir is refused; Ctrl-C stops the first with one line and exit 130, its last
    checkpoint whole; a lock is never left held by a dead process (kill -9)."""
    cmd = [sys.executable, str(REPO / 'train.py'), *TINY, '--max_iters=100000', '--eval_interval=5',
           '--out_dir=out']
    first = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (workdir / 'out' / 'ckpt.pt').exists())
    code, _, err = train_here(workdir, '--out_dir=out', '--init_from=resume', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "out_dir 'out' is in use by another process", f'pid {first.pid}')
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130
    line = one_line_error(first.returncode, err, 'interrupted at iter', "the last checkpoint is 'out/ckpt.pt'")
    kept = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    assert f"(iter {kept['iter_num']}," in line
    killed = subprocess.Popen(cmd[:-1] + ['--out_dir=out2'], cwd=workdir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    wait_for(lambda: (workdir / 'out2' / 'ckpt.pt').exists())
    killed.kill()
    killed.wait()
    code, _, err = train_here(workdir, '--out_dir=out2', '--init_from=resume', '--max_iters=10',
                              '--eval_interval=5', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err


def test_an_interrupt_during_a_checkpoint_write_waits_for_it(tmp_path, monkeypatch):
    path = str(tmp_path / 'ckpt.pt')
    real_save = torch.save

    def interrupted_midway(obj, f):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the bytes are being written
        real_save(obj, f)
    monkeypatch.setattr(torch, 'save', interrupted_midway)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.excepthook
    common.errors.catch_interrupts()
    try:
        with pytest.raises(Interrupted) as e:
            common.checkpoints.save_checkpoint({'format': CKPT_FORMAT, 'iter_num': 3}, path)
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
        sys.excepthook = handlers[2]
    assert e.value.code == 130
    assert load_checkpoint(path)['iter_num'] == 3  # written whole before the interrupt took effect


def test_an_interrupt_during_a_save_names_the_checkpoint_just_written(workdir, monkeypatch, capsys):
    """Ctrl-C while iter 10's checkpoint is written: that write ends whole and the one line names iter 10."""
    real_save, saves = common.checkpoints.save_checkpoint, []

    def save_then_ctrl_c(checkpoint, path):
        with critical():
            real_save(checkpoint, path)
            saves.append(checkpoint['iter_num'])
            if len(saves) == 2:
                common.errors._on_signal(signal.SIGINT, None)  # as the handler does when the signal comes mid-write
    monkeypatch.setattr(common.checkpoints, 'save_checkpoint', save_then_ctrl_c)
    code, _, err = train_here(workdir, '--max_iters=100', '--eval_interval=5', '--out_dir=out',
                              monkeypatch=monkeypatch, capsys=capsys)
    line = one_line_error(code, err, 'interrupted at iter 10', "'out/ckpt.pt' (iter 10,")
    assert code == 130 and saves == [5, 10], line
    assert load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))['iter_num'] == 10


def test_eval_only_at_a_longer_context_with_rope_scaling(workdir, run):
    """A trained RoPE checkpoint evaluated at 4x its block_size with YaRN: the runtime flags are this run's,
    the result is appended to log.jsonl saying how it was made, and the checkpoint is untouched."""
    run(workdir, *MODERN, '--max_iters=4', '--eval_interval=4', '--out_dir=out')
    before = (workdir / 'out' / 'ckpt.pt').read_bytes()
    run(workdir, *MODERN, '--out_dir=out', '--init_from=resume', '--eval_only=True', '--block_size=64',
          '--rope_scaling=yarn', '--rope_factor=4')
    record = log_records(workdir / 'out')[-1]
    assert record['eval_only'] is True and record['iter'] == 4
    assert (record['block_size'], record['rope_scaling'], record['rope_factor']) == (64, 'yarn', 4.0)
    assert record['rope_original_length'] == 16  # stretched from the trained length
    assert math.isfinite(record['val_loss'])
    assert (workdir / 'out' / 'ckpt.pt').read_bytes() == before
    result = run(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=learned', check=False)
    assert result.returncode == 0, result.stderr
    result = run(workdir, '--out_dir=learned', '--init_from=resume', '--eval_only=True', '--block_size=64',
                   check=False)
    assert_one_line_error(result, 'block_size 64', 'learned positions')


def test_fsdp_matches_one_process_and_its_checkpoint_resumes_on_one(workdir):
    """FSDP over 2 gloo processes: the losses of one process, to 1e-4; its checkpoint (gathered, in our
    format) resumes on a single process as if that one had trained all along."""
    args = ['--gradient_accumulation_steps=2', '--eval_interval=4', '--eval_iters=3', *MODERN]
    single = train(workdir, *args, '--max_iters=8', '--out_dir=single', env=ONE_THREAD)
    launcher = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    sharded = train(workdir, *args, '--max_iters=4', '--fsdp=True', '--out_dir=fsdp', launcher=launcher, env=ONE_THREAD)
    assert 'sharded (FSDP)' in sharded.stdout
    resumed = train(workdir, *args, '--max_iters=8', '--out_dir=fsdp', '--init_from=resume', env=ONE_THREAD)
    a, b, c = iter_losses(single.stdout), iter_losses(sharded.stdout), iter_losses(resumed.stdout)
    assert sorted(b) == [1, 2, 3, 4] and sorted(c) == [5, 6, 7, 8], (sharded.stdout[-2000:], sharded.stderr[-2000:])
    for k, loss in {**b, **c}.items():
        assert float(loss) == pytest.approx(float(a[k]), rel=1e-4), (k, loss, a[k])
    va, vb = log_records(workdir / 'single'), log_records(workdir / 'fsdp')
    assert [r['iter'] for r in vb] == [0, 4, 8]
    assert vb[-1]['val_loss'] == pytest.approx(va[-1]['val_loss'], rel=1e-4)


def test_compiled_training_matches_eager(workdir, run):
    """torch.compile on the CPU (inductor): the same losses as eager, to float rounding."""
    for compile in (False, True):
        result = run(workdir, *MODERN, f'--compile={compile}', '--max_iters=4', '--eval_interval=4',
                     f'--out_dir=out{int(compile)}')
        assert f'compile {compile}' in result.stdout
    eager, compiled = log_records(workdir / 'out0'), log_records(workdir / 'out1')
    for a, b in zip(eager, compiled):
        assert b['val_loss'] == pytest.approx(a['val_loss'], rel=1e-4) and b['train_loss'] == pytest.approx(
            a['train_loss'], rel=1e-4)


def test_a_gpu_recipe_on_a_cpu_stops_at_once_unless_told_to_go_on(workdir):
    """config/shakespeare_modern.py on a CPU: one error line with the estimated time and the CPU recipe, exit 2,
    before the long first evaluation; with --cpu_anyway=True a note, and the evaluation shows its progress."""
    (workdir / 'config').mkdir()
    for name in ('shakespeare_vanilla.py', 'shakespeare_modern.py', 'shakespeare_modern_cpu.py'):
        (workdir / 'config' / name).write_text((REPO / 'config' / name).read_text())
    cmd = [sys.executable, str(REPO / 'train.py'), 'config/shakespeare_modern.py', '--dataset=tiny', '--device=cpu',
           '--out_dir=out']
    stopped = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=120)
    line = one_line_error(stopped.returncode, stopped.stderr, 'this run is sized for a GPU', '--cpu_anyway=True')
    assert ' h; the CPU recipe is config/shakespeare_modern_cpu.py' in line and not (workdir / 'out').exists()
    proc = subprocess.Popen(cmd + ['--cpu_anyway=True'], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith('note:'):
                break
        assert lines and lines[-1].startswith('note: this run is sized for a GPU'), ''.join(lines)
        assert 'training all the same (cpu_anyway)' in lines[-1]
        progress = ''
        while 'evaluating' not in progress:  # the progress line on stderr
            progress += proc.stderr.read(64)
            assert progress, 'no progress shown'
    finally:
        proc.kill()
        proc.wait()


def test_a_run_ends_with_one_summary_line(workdir, run):
    """The last line: final and best val loss (as log.jsonl has them), iterations, wall time, tokens/s."""
    out = run(workdir, '--max_iters=6', '--eval_interval=3', '--out_dir=out').stdout.strip().splitlines()
    val = [r['val_loss'] for r in log_records(workdir / 'out')]
    match = re.fullmatch(r'done: iter 6/6, final val loss (\S+), best (\S+) \(iter (\d)\), 6 iterations in \d+ s, '
                         r'([\d,]+) tok/s', out[-1])
    assert match, out[-1]
    final, best, best_iter, rate = match.groups()
    assert float(final) == pytest.approx(val[-1], abs=1e-4) and float(best) == pytest.approx(min(val[1:]), abs=1e-4)
    assert int(best_iter) == 3 * (1 + val[1:].index(min(val[1:]))) and int(rate.replace(',', '')) > 0


def train_namespace(cwd, *args, monkeypatch):
    """train.py run in this process to its end: its globals (settings, batches, evaluation, ...)."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, 'argv', ['train.py', *TINY, *args])
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    try:
        return runpy.run_path(str(REPO / 'train.py'), run_name='__main__')
    finally:
        release_out_dirs()


@pytest.mark.parametrize('flags, terms, figure', [
    (['--mtp_depth=1'], ["mtp_loss_coef (0.3) times the MTP modules' loss"], 'mtp_loss'),
    (['--mlp=moe', '--n_expert=4', '--moe_aux_loss_coef=0.01'],
     ["the MoE routers' balancing losses (moe_aux_loss_coef, moe_z_loss_coef)"], None),
    (['--index_topk=4'], ["index_loss_coef (1.0) times the indexers' KL loss"], 'index_loss'),
    (['--mlp=moe', '--n_expert=4'], [], None),  # no balancing loss: the next-token loss alone
    (['--mtp_shared=2'], ["the shared head's losses on the 2 tokens after the next, the k-th weighted "
                          "mtp_shared_decay (0.5) to the k, fading over training"], 'mtp_shared_loss'),
    (['--layers=LI', '--sliding_window=4', '--attn=shared_kv', '--n_kv_head=None', '--csa_rate=2', '--csa_topk=2',
      '--csa_index_dim=16'], ["csa_index_loss_coef (1.0) times the CSA indexers' KL loss"], 'csa_index_loss'),
    ([], [], None),
], ids=['mtp', 'moe-balancing', 'indexers', 'moe-bias-only', 'speedrun-mtp', 'deepseek-v4-csa', 'plain'])
def test_a_step_says_when_its_loss_is_the_whole_objective(workdir, run, flags, terms, figure):
    """With MTP (the modules' or the speedrun's shared head's), MoE balancing or an indexers' loss, what a step
    minimizes is more than the next-token loss an evaluation prints: the line says objective, a note at the
    start names the terms, each chapter's in its words (Feature.objective), and log.jsonl has the term's mean
    over the steps since the last evaluation (Feature.figures)."""
    result = run(workdir, *MODERN, *flags, '--max_iters=2', '--eval_interval=2', '--out_dir=out')
    label = 'objective' if terms else 'loss'
    assert re.search(rf'^iter 2/2: {label} \d\.\d{{4}}, lr', result.stdout, re.M), result.stdout
    notes = [line for line in result.stdout.splitlines() if 'objective' in line and line.startswith('note:')]
    if terms:
        assert notes == [f"note: a step prints its objective, what training minimizes: the next-token loss + "
                         f"{' + '.join(terms)}; evaluations print the next-token loss alone"]
    else:
        assert not notes and 'objective' not in result.stdout
    records = [json.loads(line) for line in (workdir / 'out' / 'log.jsonl').read_text().splitlines()]
    if figure:
        assert figure not in records[0] and records[-1][figure] > 0, records  # iter 0: no step yet


def test_a_new_features_term_is_labelled_and_logged_without_an_edit_here(workdir, run, monkeypatch):
    """A chapter's Feature says what its loss adds (objective) and what to log (figures); train.py names no
    chapter: a Feature it has never seen gets its note, its 'objective' lines and its figure in log.jsonl, and its
    after_step runs after every optimizer step."""
    import model

    class Penalty(model.Feature):
        steps = 0

        @staticmethod
        def applies(config):
            return True

        def loss(self, model, idx, h, targets):
            return 0.01 * h.pow(2).mean()

        def objective(self, model):
            return "0.01 times the hidden states' mean square"

        def figures(self, model):
            return {'penalty': Penalty.steps, 'nothing': None}

        def after_step(self, model, sum_across):
            Penalty.steps += 1

    monkeypatch.setattr(model, 'FEATURES', model.FEATURES + [Penalty])
    result = run(workdir, *MODERN, '--max_iters=3', '--eval_interval=2', '--out_dir=out')
    assert "the next-token loss + 0.01 times the hidden states' mean square; " in result.stdout
    assert re.search(r'^iter 3/3: objective \d\.\d{4}, lr', result.stdout, re.M), result.stdout
    records = [json.loads(line) for line in (workdir / 'out' / 'log.jsonl').read_text().splitlines()]
    assert [r['penalty'] for r in records] == [0, 2, 3] and not any('nothing' in r for r in records)


def test_no_cpu_recipe_prints_a_line_per_iteration(monkeypatch):
    """Every CPU recipe prints at most 100 progress lines a run (log_interval=1, nanoGPT's, printed 2,000)."""
    from configurator import configure, script_defaults
    monkeypatch.chdir(REPO)  # recipes build on each other with exec(open('config/...'))
    defaults = script_defaults(REPO / 'train.py')
    for path in sorted((REPO / 'config').glob('*_cpu.py')):
        if not path.name.startswith('ablate'):  # ablate.py's
            settings = configure(defaults, [f'config/{path.name}'])
            assert settings['max_iters'] // settings['log_interval'] <= 100, (path.name, settings['log_interval'])


def test_the_loss_is_read_every_log_interval_10_by_default(workdir, run, monkeypatch):
    monkeypatch.setitem(globals(), 'TINY', [a for a in TINY if not a.startswith('--log_interval')])
    result = run(workdir, '--max_iters=12', '--eval_interval=12', '--out_dir=out')
    assert sorted(iter_losses(result.stdout)) == [10, 12]  # and the last iteration


# ----------------------------------------------------------------------------- issue 17

def test_a_mistyped_model_flag_is_reported_before_the_out_dir_conflict(workdir, monkeypatch, capsys):
    assert train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                      capsys=capsys)[0] == 0
    code, _, err = train_here(workdir, '--norm=batch', '--out_dir=out', monkeypatch=monkeypatch, capsys=capsys)
    line = one_line_error(code, err, 'norm', "'rms'")
    assert 'already holds' not in line


def test_an_uncached_hub_name_offline_is_one_line_at_once(workdir, monkeypatch, capsys):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_HOME', str(workdir / 'hf_home'))  # an empty cache
    t0 = time.time()
    code, _, err = train_here(workdir, '--init_from=nobody/no-such-model', '--out_dir=out', monkeypatch=monkeypatch,
                              capsys=capsys)
    one_line_error(code, err, "'nobody/no-such-model'", 'not in the Hugging Face cache', 'HF_HUB_OFFLINE')
    assert time.time() - t0 < 5 and not (workdir / 'out').exists()


@pytest.mark.parametrize('args', [['--n_layer=0'], ['--block_size=2000'], ['--init_from=resume']],
                         ids=['n_layer', 'data-too-short', 'no-checkpoint'])
def test_a_failed_start_leaves_no_empty_out_dir(workdir, monkeypatch, capsys, args):
    code, _, err = train_here(workdir, '--out_dir=new', *args, monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err)
    assert not (workdir / 'new').exists()
    (workdir / 'mine').mkdir()  # an out_dir the user made stays
    code, _, err = train_here(workdir, '--out_dir=mine', *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code and (workdir / 'mine').is_dir()


def test_the_first_trained_evaluation_is_always_saved(workdir, run):
    """With a learning rate of 0 no evaluation beats iter 0's (untrained, never saved): one is saved anyway."""
    run(workdir, '--max_iters=4', '--eval_interval=2', '--learning_rate=0', '--min_lr=0',
        '--always_save_checkpoint=False', '--out_dir=out')
    ckpt = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    assert ckpt['iter_num'] >= 2 and (workdir / 'out' / 'best.pt').exists()


@pytest.fixture
def one_process_group(monkeypatch):
    """torchrun's environment for a single process: train.py starts a gloo group of one, destroyed after."""
    import socket

    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK='0', LOCAL_RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_ddp_keeps_each_ranks_buffers_without_a_deprecation_warning(workdir, monkeypatch, capsys, one_process_group,
                                                                   recwarn):
    """torch 2.13 deprecates broadcast_buffers=False for forward_sync_buffers=False: the run says nothing of it (the
    two-process test checks that MoE's load counters stay each rank's)."""
    code, out, err = train_here(workdir, *MODERN, '--mlp=moe', '--n_expert=4', '--router=sigmoid', '--max_iters=2',
                                '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert '1 process(es)' in out and not [w for w in recwarn if 'buffers' in str(w.message)], [str(w.message)
                                                                                                for w in recwarn]


def test_a_failed_collective_is_one_line_naming_the_last_checkpoint(workdir, monkeypatch, capsys, one_process_group):
    """A rank killed under DDP makes the others' collectives fail: one line, not gloo's traceback. Killing one
    of 2 real processes is slow; here one gloo process's all_reduce fails after the first checkpoint."""
    import torch.distributed as dist
    real_all_reduce, calls = dist.all_reduce, []

    def peer_gone(*args, **kwargs):
        calls.append(1)
        if len(calls) > 6:  # past iter 2's evaluation (2 per evaluation, 1 per step)
            raise dist.DistBackendError('[gloo/transport/tcp/pair.cc:534] Connection closed by peer')
        return real_all_reduce(*args, **kwargs)
    monkeypatch.setattr(dist, 'all_reduce', peer_gone)
    code, _, err = train_here(workdir, '--max_iters=6', '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                              capsys=capsys)
    one_line_error(code, err, 'another process stopped at iter', 'Connection closed by peer',
                   "the last checkpoint is 'out/ckpt.pt' (iter 2,")
    assert code == 1


CHAR_TASK = CHOICE_TASK_YAML.replace('{name}', 'tiny_char')


def make_char_task(workdir):
    """A harness task in HellaSwag's shape, in the dataset's characters -> train.py's settings that score it."""
    pytest.importorskip('lm_eval')
    tasks = workdir / 'tasks'
    tasks.mkdir()
    items = [{'ctx': 'the quick brown', 'endings': [' fox jumps.', ' dog lazy.', ' over the.'], 'label': 0},
             {'ctx': 'jumps over the', 'endings': [' quick dog.', ' lazy dog.', ' brown.'], 'label': 1},
             {'ctx': 'the lazy', 'endings': [' fox.', ' jumps.', ' dog.'], 'label': 2}]
    (tasks / 'items.jsonl').write_text(''.join(json.dumps(item) + '\n' for item in items))
    (tasks / 'tiny_char.yaml').write_text(CHAR_TASK.format(path=tasks / 'items.jsonl'))
    return ['--eval_task=tiny_char', f'--eval_task_include_path={tasks}', '--eval_task_limit=2']


def test_a_downstream_task_is_scored_beside_val_loss(workdir, run, single_thread):
    """eval_task: a harness task (here a local one in HellaSwag's shape, in the dataset's characters) scored at
    every evaluation, logged beside val loss."""
    task = make_char_task(workdir)
    result = run(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out', *task)
    assert re.search(r'step 2: tiny_char acc \d\.\d{4}, acc_norm \d\.\d{4}', result.stdout), result.stdout
    records = [json.loads(line) for line in (workdir / 'out' / 'log.jsonl').read_text().splitlines()]
    assert [r['iter'] for r in records] == [0, 2]
    for r in records:
        assert set(r['task']['tiny_char']) == {'acc', 'acc_norm'}
        assert r['task']['tiny_char']['acc'] in (0, 0.5, 1)  # two items scored


def scoring_that_fails_on_call(n, fail, monkeypatch):
    """eval.run_tasks as train.py imports it, calling fail() instead on its n-th call."""
    import eval
    real_run_tasks, calls = eval.run_tasks, []

    def run_tasks(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            fail()
        return real_run_tasks(*args, **kwargs)
    monkeypatch.setattr(eval, 'run_tasks', run_tasks)


def test_an_interrupt_while_the_task_scores_keeps_best_pt_and_best_val_loss_together(workdir, monkeypatch, capsys,
                                                                                     single_thread):
    """Ctrl-C while eval_task scores the evaluation of iter 4: the state saved still counts iter 2 as the best (as
    best.pt holds), so the resume, evaluating iter 4 again, makes it best.pt."""
    args = ['--max_iters=4', '--eval_interval=2', '--out_dir=out', *make_char_task(workdir)]
    scoring_that_fails_on_call(3, lambda: common.errors._on_signal(signal.SIGINT, None), monkeypatch)  # iters 0, 2, 4
    code, _, err = train_here(workdir, *args, monkeypatch=monkeypatch, capsys=capsys)
    # the harness's progress bars come before it on stderr
    assert code == 130 and 'interrupted at iter 4, its state saved' in err.strip().splitlines()[-1], err
    ckpt = load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))
    best = load_checkpoint(str(workdir / 'out' / 'best.pt'))
    assert ckpt['iter_num'] == 4 and best['iter_num'] == 2
    assert ckpt['best_val_loss'] == best['val_loss']
    monkeypatch.undo()
    assert train_here(workdir, *args, '--init_from=resume', monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    records = log_records(workdir / 'out')
    assert records[-1]['iter'] == 4 and records[-1]['val_loss'] < records[-2]['val_loss']  # it did improve
    best = load_checkpoint(str(workdir / 'out' / 'best.pt'))
    assert best['iter_num'] == 4 and best['best_val_loss'] == best['val_loss'] == records[-1]['val_loss']


def test_a_task_failing_at_a_later_evaluation_is_one_line_and_training_goes_on(workdir, monkeypatch, capsys,
                                                                              single_thread):
    def fail():
        raise RuntimeError('The size of tensor a (20) must match the size of tensor b (16)\nat dimension 1')
    scoring_that_fails_on_call(2, fail, monkeypatch)
    code, out, err = train_here(workdir, '--max_iters=4', '--eval_interval=2', '--out_dir=out',
                                *make_char_task(workdir), monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith('warning:')] == ["warning: eval_task 'tiny_char' failed at iter 2 (RuntimeError: The size of "
                                        "tensor a (20) must match the size of tensor b (16)); not scored this time, "
                                        "training goes on"]
    records = log_records(workdir / 'out')
    assert [r['iter'] for r in records] == [0, 2, 4] and [('task' in r) for r in records] == [True, False, True]
    assert load_checkpoint(str(workdir / 'out' / 'ckpt.pt'))['iter_num'] == 4
