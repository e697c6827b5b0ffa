"""common/batches.py, through train.py: a dataset's batches (windows drawn uniformly by tokens over its shards, a
task's whole examples with its unscored targets at -1), and a damaged dataset said in one line."""

import json
import runpy
import sys

import numpy as np
import pytest
import torch

from test_train import REPO, one_line_error, train_here, train_namespace, workdir  # noqa: F401 (fixtures)


@pytest.mark.parametrize('damage, fragments', [
    (lambda d: (d / 'train.bin').write_bytes((d / 'train.bin').read_bytes() + b'x'), ['bytes', 'uint16']),
    (lambda d: (d / 'meta.json').write_text('{"vocab'), ['meta.json', 'prepare.py']),
    (lambda d: (d / 'meta.json').write_text('[1, 2]'), ['meta.json', 'vocab_size']),
    (lambda d: (d / 'meta.json').write_text('{"kind": "char"}'), ['meta.json', 'vocab_size']),
    (lambda d: (d / 'meta.json').write_text('{"vocab_size": 5}'), ['token id', 'vocabulary has 5']),
    (lambda d: (d / 'meta.json').write_text('{"vocab_size": 64, "train_tokens": 3}'), ['meta.json says 3']),
], ids=['odd-sized', 'bad-json', 'a-list', 'no-vocab', 'small-vocab', 'out-of-step'])
def test_damaged_datasets_are_one_line(workdir, damage, fragments, monkeypatch, capsys):
    damage(workdir / 'data' / 'tiny')
    code, _, err = train_here(workdir, '--max_iters=2', '--eval_interval=2', '--out_dir=out',
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, *fragments)


def make_sharded_dataset(root, train_sizes=(100, 300, 8), val_sizes=(40, 60)):
    """root/data/shards as data/fineweb_edu/prepare.py writes one: meta.json lists each split's shards; shard k
    of train holds only token k, so a window shows which shard it came from."""
    d = root / 'data' / 'shards'
    d.mkdir(parents=True)
    listed = {}
    for split, sizes in (('train', train_sizes), ('val', val_sizes)):
        listed[split] = []
        for k, n in enumerate(sizes):
            name = f'tiny_{split}_{k:06d}.bin'
            np.full(n, k, dtype=np.uint16).tofile(d / name)
            listed[split].append([name, n])
    (d / 'meta.json').write_text(json.dumps({'kind': 'char', 'chars': ['a', 'b', 'c'], 'vocab_size': 3,
                                             'shards': listed, 'train_tokens': sum(train_sizes),
                                             'val_tokens': sum(val_sizes)}))
    return d


def test_sharded_datasets_are_sampled_uniformly_by_tokens(tmp_path, monkeypatch, capsys, single_thread):
    make_sharded_dataset(tmp_path)
    ns = train_namespace(tmp_path, '--dataset=shards', '--max_iters=2', '--eval_interval=2', '--out_dir=out',
                         monkeypatch=monkeypatch)
    assert 'step 2: train loss' in capsys.readouterr().out  # it trained and evaluated on the shards
    generator = torch.Generator().manual_seed(0)
    rows = torch.cat([ns['batches'].get('train', generator)[0] for _ in range(200)])
    # every window lies inside one shard; the 8-token shard is shorter than a window (block_size 16): never read
    assert bool((rows == rows[:, :1]).all())
    counts = torch.bincount(rows[:, 0], minlength=3).tolist()
    windows = [100 - 16, 300 - 16]  # a shard's share is its number of windows
    assert counts[2] == 0
    assert abs(counts[1] / sum(counts) - windows[1] / sum(windows)) < 0.05, counts
    # the draws depend on the generator alone: the same seed, the same batch
    again = ns['batches'].get('train', torch.Generator().manual_seed(0))[0]
    assert torch.equal(again, rows[:4])


def no_train_split(d):
    """A preparation whose input all went to its val split, as prepare.py leaves one from a small input."""
    meta = json.loads((d / 'meta.json').read_text())
    for name, _ in meta['shards']['train']:
        (d / name).unlink()
    meta['shards']['train'], meta['train_tokens'] = [], 0
    (d / 'meta.json').write_text(json.dumps(meta))


@pytest.mark.parametrize('damage, fragments', [
    (lambda d: (d / 'tiny_train_000009.bin').write_bytes(b'\0\0'), ['tiny_train_000009.bin', 'two preparations']),
    (lambda d: (d / 'tiny_val_000001.bin').unlink(), ['tiny_val_000001.bin', 'not found']),
    (lambda d: (d / 'tiny_train_000001.bin').write_bytes(b'\0\0' * 7), ['train tokens', 'meta.json says 408']),
    (lambda d: no_train_split(d), ["lists no train shards", 'the whole input (100 tokens) went to the val split',
                                   '--val_tokens=10 (a tenth for val', 'remove data/shards']),
], ids=['stray-shard', 'missing-shard', 'out-of-step', 'no-train-split'])
def test_damaged_shard_directories_are_one_line(tmp_path, damage, fragments, monkeypatch, capsys):
    damage(make_sharded_dataset(tmp_path))
    code, _, err = train_here(tmp_path, '--dataset=shards', '--max_iters=1', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, *fragments)


TASKS = {'recall': ['--num_pairs', '2', '--seq_len', '16', '--vocab_size', '16'], 'copy': ['--length', '4']}


def make_task(root, task, monkeypatch, capsys):
    """data/<task> in root, written by the task's own prepare.py (64 train, 16 val examples): -> its directory."""
    out = root / 'data' / task
    monkeypatch.setattr(sys, 'argv', ['prepare.py', *TASKS[task], '--num_train', '64', '--num_val', '16',
                                      '--out_dir', str(out)])
    runpy.run_path(str(REPO / 'data' / task / 'prepare.py'), run_name='__main__')
    capsys.readouterr()
    return out


def task_file(data_dir, split, length):
    """(tokens, mask) of a split as (examples, length) arrays, read plainly."""
    tokens = np.fromfile(data_dir / f'{split}.bin', dtype=np.uint16).astype(np.int64).reshape(-1, length)
    return tokens, np.fromfile(data_dir / f'{split}_mask.bin', dtype=np.uint8).reshape(-1, length)


def test_task_batches_are_whole_examples_with_unscored_targets_minus_one(tmp_path, monkeypatch, capsys,
                                                                         single_thread):
    """Every row is one example (x its first L-1 tokens, y the next ones), y is -1 exactly where the mask does not
    score, and the loss is the cross-entropy over the scored targets alone."""
    data_dir = make_task(tmp_path, 'recall', monkeypatch, capsys)
    ns = train_namespace(tmp_path, '--dataset=recall', '--block_size=15', '--max_iters=0', '--out_dir=out',
                         monkeypatch=monkeypatch)
    tokens, mask = task_file(data_dir, 'train', 16)
    for seed in range(5):
        x, y = ns['batches'].get('train', torch.Generator().manual_seed(seed))
        assert x.shape == y.shape == (4, 15)
        for row_x, row_y in zip(x.numpy(), y.numpy()):
            i = int(np.flatnonzero((tokens[:, :-1] == row_x).all(axis=1))[0])  # the example it came from
            assert np.array_equal(row_y, np.where(mask[i, :-1] == 1, tokens[i, 1:], -1))
    logits, loss = ns['raw_model'](x, y)
    scored = y != -1
    assert scored.sum() == 4 * 2  # recall scores num_pairs targets per example
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(logits[scored], y[scored]).item(), rel=1e-5)


@pytest.mark.parametrize('damage, args, fragments', [
    (lambda d: (d / 'val_mask.bin').unlink(), [], ["'data/recall/val_mask.bin' not found", 'data/recall/prepare.py']),
    (lambda d: (d / 'train_mask.bin').write_bytes(b'\1' * 10), [], ['train_mask.bin', 'is 10 bytes', 'rerun']),
    (lambda d: None, ['--block_size=8'], ['block_size 8 is shorter than the examples', '--block_size=15']),
    (lambda d: (d / 'meta.json').write_text(json.dumps({**json.loads((d / 'meta.json').read_text()),
                                                        'shards': {'train': [], 'val': []}})),
     [], ['both example_length and shards']),
], ids=['no mask', 'mask of another size', 'block_size too short', 'shards'])
def test_a_damaged_task_dataset_is_one_line(tmp_path, monkeypatch, capsys, damage, args, fragments):
    damage(make_task(tmp_path, 'recall', monkeypatch, capsys))
    code, _, err = train_here(tmp_path, '--dataset=recall', '--block_size=15', '--max_iters=0', *args,
                              monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, *fragments)


@pytest.mark.parametrize('eval_splits, fragments', [
    (['val_2x', 'val_4x'], ["has eval_splits ['val_2x', 'val_4x'] without 'val'", "add 'val'"]),
    ('val', ["has eval_splits 'val', a string", "a list of split names, e.g. ['val']"]),
    ([1, 'val'], ["has eval_splits [1, 'val']", 'a list of split names']),
], ids=['no val', 'a string', 'not names'])
def test_eval_splits_without_val_or_not_a_list_of_names_are_one_line(tmp_path, monkeypatch, capsys, eval_splits,
                                                                     fragments):
    """meta.json's eval_splits: a list of split names holding val, whose loss every evaluation saves by (without it,
    a KeyError; as the string 'val', "lists no split 'v'")."""
    data_dir = make_task(tmp_path, 'copy', monkeypatch, capsys)
    meta = json.loads((data_dir / 'meta.json').read_text())
    (data_dir / 'meta.json').write_text(json.dumps({**meta, 'eval_splits': eval_splits}))
    code, _, err = train_here(tmp_path, '--dataset=copy', '--max_iters=0', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "'data/copy/meta.json'", *fragments)
