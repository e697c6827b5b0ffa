"""common.py: the peak FLOP/s MFU divides by, per dtype; an out_dir's lock; log repair."""

import json
import os

import numpy as np
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


@pytest.mark.parametrize('name, dtype, peak', [
    ('NVIDIA H200 NVL', 'bfloat16', 835.5e12),  # the PCIe card at lower power: not the SXM's 989
    ('NVIDIA H200 NVL', 'float32', 417.5e12),
    ('NVIDIA H200', 'bfloat16', 989e12),
    ('NVIDIA H100 PCIe', 'float16', 756e12),
    ('Some Future GPU', 'bfloat16', None),
])
def test_datasheet_peak_takes_the_most_specific_name(name, dtype, peak):
    assert common.datasheet_peak(name, dtype) == peak


def test_a_gpu_without_that_dtypes_datasheet_figure_is_measured(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'Tesla T4')
    monkeypatch.setattr(common, 'measure_matmul_flops', lambda device, dtype: 7e12)
    assert common.peak_flops('cuda', 'float32') == (7e12, 'measured float32 matmul')


@pytest.mark.parametrize('dtype, sharded, kind', [
    ('float16', True, 'ShardedGradScaler'),  # FSDP: the overflow check covers every rank's shard
    ('float16', False, 'GradScaler'),
    ('bfloat16', True, 'GradScaler'),  # no scaling needed: a disabled plain scaler
])
def test_fp16_under_fsdp_takes_the_sharded_grad_scaler(dtype, sharded, kind):
    scaler = common.grad_scaler('cpu', dtype, sharded)
    assert type(scaler).__name__ == kind and scaler.is_enabled() is (dtype == 'float16')


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


def test_all_reduce_sum_is_one_collective_for_many_tensors(monkeypatch):
    calls = []

    def fake_all_reduce(tensor):  # as if a second process held the same values
        calls.append(tensor.shape)
        tensor.mul_(2)
    monkeypatch.setattr(torch.distributed, 'all_reduce', fake_all_reduce)
    loads = [torch.arange(4.0), torch.ones(2, 3), torch.zeros(3)]
    common.all_reduce_sum(loads)
    assert calls == [(4 + 6 + 3,)]
    assert torch.equal(loads[0], 2 * torch.arange(4.0)) and torch.equal(loads[1], torch.full((2, 3), 2.0))


def test_claiming_an_out_dir_removes_only_our_writers_temporary_files(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    ours = [os.path.basename(common.tmp_path(str(out / name))) for name in ('ckpt.pt', 'log.jsonl', 'done.json')]
    theirs = ['prompt.tmpl', 'backup.tmp.ckpt', 'notes.tmp', '.hidden.tmp', 'x.tmp123']
    for name in ours + theirs:
        (out / name).write_text('x')
    try:
        common.claim_out_dir(str(out))
    finally:
        common.release_out_dirs()
    assert sorted(p.name for p in out.iterdir()) == sorted(theirs + ['.lock'])


def test_every_writer_names_its_temporary_file_alike(tmp_path, monkeypatch):
    """save_checkpoint, write_json and repair_log write aside under tmp_path's name (what claim_out_dir cleans)."""
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, 'replace', lambda src, dst: (seen.append(os.path.basename(src)), real_replace(src, dst)))
    common.save_checkpoint({'format': common.CKPT_FORMAT}, str(tmp_path / 'ckpt.pt'))
    common.write_json(str(tmp_path / 'done.json'), {})
    (tmp_path / 'log.jsonl').write_text('{"iter": 0}\n{"iter": 0}\n')
    common.repair_log(str(tmp_path / 'log.jsonl'))
    assert len(seen) == 3 and all(common.TMP_NAME.fullmatch(name) for name in seen), seen


def test_repair_log_skips_records_whose_iter_is_not_a_number(tmp_path):
    path = tmp_path / 'log.jsonl'
    path.write_text('{"iter": 0}\n{"iter": "x"}\n{"iter": null}\n{"iter": true}\n[1]\n{"iter": 2}\n')
    common.repair_log(str(path), last_iter=2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{'iter': 0}, {'iter': 2}]


def test_a_second_name_of_a_checkpoint_is_whole_and_separate(tmp_path):
    common.save_checkpoint({'format': common.CKPT_FORMAT, 'iter_num': 1}, str(tmp_path / 'ckpt.pt'))
    common.keep_as(str(tmp_path / 'ckpt.pt'), str(tmp_path / 'best.pt'))
    common.save_checkpoint({'format': common.CKPT_FORMAT, 'iter_num': 2}, str(tmp_path / 'ckpt.pt'))
    assert common.load_checkpoint(str(tmp_path / 'best.pt'))['iter_num'] == 1  # replacing ckpt.pt leaves it
    assert common.load_checkpoint(str(tmp_path / 'ckpt.pt'))['iter_num'] == 2
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt.pt']


@pytest.mark.parametrize('error, collective', [
    (torch.distributed.DistBackendError('NCCL communicator was aborted on rank 0'), True),
    (RuntimeError('[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:3'),
     True),
    (RuntimeError('mat1 and mat2 shapes cannot be multiplied (4x8 and 16x16)'), False),
    (ValueError('gloo'), False),
])
def test_a_failed_collective_is_told_from_other_errors(error, collective):
    """train.py turns a collective's failure (another rank killed) into one line naming the last checkpoint."""
    assert common.collective_error(error) is collective


def test_only_the_first_signal_interrupts():
    """Ctrl-C reaches ablate.py's runs, then ablate stops them with kill: that second signal, raised again while the
    run is stopping, would land in a destructor or an atexit hook ('Exception ignored in tqdm.__del__')."""
    import signal
    import sys
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.excepthook
    common.catch_interrupts()
    try:
        with pytest.raises(common.Interrupted) as e:
            os.kill(os.getpid(), signal.SIGINT)
        assert e.value.code == 130
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # stopping already: nothing raised
        except common.Interrupted:
            pytest.fail('a second signal interrupted the stopping run again')
        common.catch_interrupts()  # a new start arms it again
        with pytest.raises(common.Interrupted) as e:
            os.kill(os.getpid(), signal.SIGTERM)
        assert e.value.code == 143
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
        sys.excepthook = handlers[2]


def test_a_checkpoint_from_before_norm_position_loads_with_its_placement(tmp_path):
    """Checkpoints saved with prenorm=False (before norm_position) build the same post-norm model."""
    from chapters import GPT, GPTConfig
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


def test_an_output_never_replaces_a_checkpoint_or_a_hard_linked_file(tmp_path):
    ckpt = tmp_path / 'ckpt.pt'
    torch.save({'model': {}}, ckpt)
    os.link(ckpt, tmp_path / 'best.pt')
    before = ckpt.read_bytes()
    for target in (ckpt, tmp_path / 'best.pt'):
        with pytest.raises(SystemExit):
            common.write_output(str(target), '{}', '--json')
    assert ckpt.read_bytes() == before
    plain = tmp_path / 'notes.txt'
    plain.write_text('a note')  # a plain file that only this name holds is switched for the new text
    os.link(plain, tmp_path / 'other.txt')
    with pytest.raises(SystemExit):
        common.write_output(str(plain), 'x')
    os.remove(tmp_path / 'other.txt')
    common.write_output(str(plain), 'new')
    assert plain.read_text() == 'new'
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt.pt', 'notes.txt']  # nothing left aside


def test_an_output_into_a_directory_or_nowhere_is_one_line(tmp_path, capsys):
    for target in (tmp_path, tmp_path / 'missing' / 'out.json'):
        with pytest.raises(SystemExit) as e:
            common.write_output(str(target), '{}')
        assert e.value.code == 1
        assert str(target) in capsys.readouterr().err.strip().splitlines()[-1]


class RunsCode:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


def test_an_unsafe_checkpoint_is_refused_saying_it_would_run_code(tmp_path, capsys):
    marker = tmp_path / 'code_ran'
    torch.save({'format': common.CKPT_FORMAT, 'model': RunsCode(str(marker))}, tmp_path / 'ckpt.pt')
    with pytest.raises(SystemExit) as e:
        common.load_checkpoint(str(tmp_path / 'ckpt.pt'))
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
        common.load_checkpoint(str(tmp_path / 'ckpt.pt'))
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and 'corrupt' in line and 'unless you trust' in line, line


def test_a_recall_vocabulary_reads_as_names_and_an_unknown_kind_is_one_line(tmp_path, capsys):
    """data/recall's ids are shown as '.', k<i>, v<i> (never decoded as GPT-2 BPE); a kind no tokenizer reads is
    one line naming it."""
    meta = {'kind': 'recall', 'vocab_size': 16, 'vocabulary': {'filler': 0, 'keys': [1, 8], 'values': [8, 16]}}
    (tmp_path / 'meta.json').write_text(json.dumps(meta))
    tok = common.load_tokenizer(str(tmp_path / 'meta.json'))
    assert tok.decode([4, 11, 1, 9, 0, 4]) == 'k3 v3 k0 v1 . k3 ' and tok.vocab_size == 16
    assert tok.decode([4, 11]) + tok.decode([1]) == tok.decode([4, 11, 1])  # streamed pieces read as the whole
    assert tok.encode('k3 v3 k0 v1 . k3') == [4, 11, 1, 9, 0, 4]
    with pytest.raises(SystemExit):
        tok.encode('k3 v9')
    assert 'v9' in capsys.readouterr().err
    (tmp_path / 'meta.json').write_text(json.dumps({**meta, 'kind': 'bytes'}))
    with pytest.raises(SystemExit):
        common.load_tokenizer(str(tmp_path / 'meta.json'))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "kind 'bytes'" in err[0] and "'char', 'tiktoken', 'recall'" in err[0]
