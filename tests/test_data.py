"""common/data.py: a task dataset's split files checked against its meta.json (sizes, and each file's sha256)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

import common.data
from common.data import example_split
from test_tasks import prepare, recall

ROOT = Path(__file__).resolve().parents[1]


def two_preparations(tmp_path, monkeypatch, capsys):
    """Two recall preparations of the same settings but another seed: files of equal sizes, other contents."""
    for seed in (1, 2):
        code, err = prepare(recall, monkeypatch, capsys, tmp_path / f'seed{seed}', '--num_pairs', 4, '--seq_len', 24,
                            '--vocab_size', 21, '--num_train', 50, '--num_val', 20, '--seed', seed)
        assert code == 0, err
    return tmp_path / 'seed1', tmp_path / 'seed2'


@pytest.mark.parametrize('name', ['train.bin', 'train_mask.bin', 'val_mask.bin'])
def test_a_split_file_from_another_preparation_is_one_line_naming_it(tmp_path, monkeypatch, capsys, name):
    """Two preparations into one folder at once can leave train.bin from one and the masks and meta.json from the
    other, of the same sizes: meta.json's sha256 tells, and the split stops with one line naming the file."""
    mine, other = two_preparations(tmp_path, monkeypatch, capsys)
    meta = json.loads((mine / 'meta.json').read_text())
    assert example_split(str(mine), 'train', meta) == (50, 24)
    shutil.copy(other / name, mine / name)
    split = name.split('.')[0].split('_')[0]
    with pytest.raises(SystemExit) as e:
        example_split(str(mine), split, meta)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code != 0 and len(err) == 1, err
    assert f"'{mine / name}'" in err[0] and 'different runs of prepare.py' in err[0]
    assert f'rerun python data/recall/prepare.py --out_dir {mine}' in err[0]


def test_a_meta_json_without_hashes_is_checked_by_size_alone(tmp_path, monkeypatch, capsys):
    mine, other = two_preparations(tmp_path, monkeypatch, capsys)
    meta = json.loads((mine / 'meta.json').read_text())
    del meta['sha256']
    shutil.copy(other / 'train.bin', mine / 'train.bin')
    assert example_split(str(mine), 'train', meta) == (50, 24)


def test_each_file_is_hashed_once_per_process(tmp_path, monkeypatch, capsys):
    mine, _ = two_preparations(tmp_path, monkeypatch, capsys)
    meta = json.loads((mine / 'meta.json').read_text())
    opened = []
    real_open = open
    monkeypatch.setattr(common.data, 'open', lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k),
                        raising=False)
    for _ in range(3):
        example_split(str(mine), 'train', meta)
        example_split(str(mine), 'val', meta)
    assert sorted(opened) == sorted(str(mine / n) for n in ('train.bin', 'train_mask.bin', 'val.bin', 'val_mask.bin'))
