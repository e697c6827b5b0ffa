"""common/files.py: log repair; an out_dir's lock; writers' temporary files; outputs that never replace a
checkpoint."""

import json
import os

import pytest
import torch

import common.files
from common.checkpoints import CKPT_FORMAT, save_checkpoint
from common.files import TMP_NAME, claim_out_dir, release_out_dirs, repair_log, write_json, write_output


def test_repair_log_keeps_one_run(tmp_path):
    path = tmp_path / 'log.jsonl'
    records = [{'iter': 0}, {'iter': 2}, {'iter': 2, 'eval_only': True, 'block_size': 64}, {'iter': 2},
               {'iter': 4}, {'iter': 6}]
    path.write_text(''.join(json.dumps(r) + '\n' for r in records) + '{"iter": 8, "tr')
    repair_log(str(path), last_iter=4)
    assert [json.loads(line) for line in path.read_text().splitlines()] == records[:3] + [{'iter': 4}]


def test_an_out_dir_is_one_processs(tmp_path):
    claim_out_dir(str(tmp_path / 'out'))
    try:
        claim_out_dir(str(tmp_path / 'out'))  # the same process again: still its own
        assert (tmp_path / 'out' / '.lock').read_text() == str(os.getpid())
    finally:
        release_out_dirs()


def test_claiming_an_out_dir_removes_only_our_writers_temporary_files(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    ours = [os.path.basename(common.files.tmp_path(str(out / name))) for name in ('ckpt.pt', 'log.jsonl', 'done.json')]
    theirs = ['prompt.tmpl', 'backup.tmp.ckpt', 'notes.tmp', '.hidden.tmp', 'x.tmp123']
    for name in ours + theirs:
        (out / name).write_text('x')
    try:
        claim_out_dir(str(out))
    finally:
        release_out_dirs()
    assert sorted(p.name for p in out.iterdir()) == sorted(theirs + ['.lock'])


def test_every_writer_names_its_temporary_file_alike(tmp_path, monkeypatch):
    """save_checkpoint, write_json and repair_log write aside under tmp_path's name (what claim_out_dir cleans)."""
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, 'replace', lambda src, dst: (seen.append(os.path.basename(src)), real_replace(src, dst)))
    save_checkpoint({'format': CKPT_FORMAT}, str(tmp_path / 'ckpt.pt'))
    write_json(str(tmp_path / 'done.json'), {})
    (tmp_path / 'log.jsonl').write_text('{"iter": 0}\n{"iter": 0}\n')
    repair_log(str(tmp_path / 'log.jsonl'))
    assert len(seen) == 3 and all(TMP_NAME.fullmatch(name) for name in seen), seen


def test_repair_log_skips_records_whose_iter_is_not_a_number(tmp_path):
    path = tmp_path / 'log.jsonl'
    path.write_text('{"iter": 0}\n{"iter": "x"}\n{"iter": null}\n{"iter": true}\n[1]\n{"iter": 2}\n')
    repair_log(str(path), last_iter=2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{'iter': 0}, {'iter': 2}]


def test_an_output_never_replaces_a_checkpoint_or_a_hard_linked_file(tmp_path):
    ckpt = tmp_path / 'ckpt.pt'
    torch.save({'model': {}}, ckpt)
    os.link(ckpt, tmp_path / 'best.pt')
    before = ckpt.read_bytes()
    for target in (ckpt, tmp_path / 'best.pt'):
        with pytest.raises(SystemExit):
            write_output(str(target), '{}', '--json')
    assert ckpt.read_bytes() == before
    plain = tmp_path / 'notes.txt'
    plain.write_text('a note')  # a plain file that only this name holds is switched for the new text
    os.link(plain, tmp_path / 'other.txt')
    with pytest.raises(SystemExit):
        write_output(str(plain), 'x')
    os.remove(tmp_path / 'other.txt')
    write_output(str(plain), 'new')
    assert plain.read_text() == 'new'
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt.pt', 'notes.txt']  # nothing left aside


def test_an_output_into_a_directory_or_nowhere_is_one_line(tmp_path, capsys):
    for target in (tmp_path, tmp_path / 'missing' / 'out.json'):
        with pytest.raises(SystemExit) as e:
            write_output(str(target), '{}')
        assert e.value.code == 1
        assert str(target) in capsys.readouterr().err.strip().splitlines()[-1]
