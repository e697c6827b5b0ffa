"""common/tokenizer.py: the recall vocabulary's names; a vocabulary kind no tokenizer reads."""

import json

import pytest

from common.tokenizer import load_tokenizer


def test_a_recall_vocabulary_reads_as_names_and_an_unknown_kind_is_one_line(tmp_path, capsys):
    """data/recall's ids are shown as '.', k<i>, v<i> (never decoded as GPT-2 BPE); a kind no tokenizer reads is
    one line naming it."""
    meta = {'kind': 'recall', 'vocab_size': 16, 'vocabulary': {'filler': 0, 'keys': [1, 8], 'values': [8, 16]}}
    (tmp_path / 'meta.json').write_text(json.dumps(meta))
    tok = load_tokenizer(str(tmp_path / 'meta.json'))
    assert tok.decode([4, 11, 1, 9, 0, 4]) == 'k3 v3 k0 v1 . k3 ' and tok.vocab_size == 16
    assert tok.decode([4, 11]) + tok.decode([1]) == tok.decode([4, 11, 1])  # streamed pieces read as the whole
    assert tok.encode('k3 v3 k0 v1 . k3') == [4, 11, 1, 9, 0, 4]
    with pytest.raises(SystemExit):
        tok.encode('k3 v9')
    assert 'v9' in capsys.readouterr().err
    (tmp_path / 'meta.json').write_text(json.dumps({**meta, 'kind': 'bytes'}))
    with pytest.raises(SystemExit):
        load_tokenizer(str(tmp_path / 'meta.json'))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "kind 'bytes'" in err[0] and "'char', 'tiktoken', 'recall'" in err[0]
