"""common/tokenizer.py: the recall vocabulary's names; a vocabulary kind no tokenizer reads."""

import json
import os

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


# ----------------------------------------------------------------------------- token_bytes: bits per byte

def test_token_bytes_count_each_characters_utf8_bytes_and_pad_to_the_vocabulary():
    from common.tokenizer import token_bytes
    meta = {'kind': 'char', 'vocab_size': 3, 'chars': ['a', 'é', '€']}
    assert token_bytes(meta, 5) == [1, 2, 3, 0, 0]  # ids past the data's vocabulary stand for no text


def test_a_task_has_no_bytes_to_count():
    from common.tokenizer import token_bytes
    assert token_bytes({'kind': 'recall', 'vocab_size': 10, 'example_length': 32}, 10) is None
    assert token_bytes({'kind': 'char', 'vocab_size': 2, 'chars': ['a', 'b'], 'example_length': 8}, 2) is None


@pytest.mark.skipif(not os.environ.get('TIKTOKEN_CACHE_DIR'), reason="tiktoken's GPT-2 files (TIKTOKEN_CACHE_DIR)")
def test_gpt2_pieces_count_their_bytes_and_the_end_of_text_token_none():
    from common.tokenizer import token_bytes
    import tiktoken
    enc = tiktoken.get_encoding('gpt2')
    sizes = token_bytes({'kind': 'tiktoken', 'encoding': 'gpt2'}, 50304)
    assert len(sizes) == 50304 and sizes[enc.eot_token] == 0 and sizes[50257:] == [0] * 47
    text = 'Hello, wörld'
    assert sum(sizes[i] for i in enc.encode(text)) == len(text.encode('utf-8'))


@pytest.mark.skipif(not os.environ.get('TIKTOKEN_CACHE_DIR'), reason="tiktoken's GPT-2 files (TIKTOKEN_CACHE_DIR)")
def test_a_renumbered_bpe_reads_its_ids_as_gpt2_text_counts_their_bytes_and_refuses_the_others(tmp_path, capsys):
    """meta.json's 'ids' (data/shakespeare_compact): id i is GPT-2's ids[i]; text decodes and bytes count as
    GPT-2's, a prompt with a GPT-2 token outside them is one line naming it; no transformers tokenizer exports it."""
    from common.tokenizer import hf_tokenizer, token_bytes
    import tiktoken
    enc = tiktoken.get_encoding('gpt2')
    text = 'Hello, wörld'
    ids = sorted(set(enc.encode(text)))
    meta = {'kind': 'tiktoken', 'encoding': 'gpt2', 'vocab_size': len(ids), 'ids': ids}
    (tmp_path / 'meta.json').write_text(json.dumps(meta))
    tok = load_tokenizer(str(tmp_path / 'meta.json'))
    assert tok.vocab_size == len(ids) and max(tok.encode(text)) < len(ids)
    assert [ids[i] for i in tok.encode(text)] == enc.encode(text) and tok.decode(tok.encode(text)) == text
    sizes = token_bytes(meta, 64)
    assert len(sizes) == 64 and sum(sizes[i] for i in tok.encode(text)) == len(text.encode('utf-8'))
    with pytest.raises(SystemExit):
        tok.encode('Hello, moon')
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "' moon'" in err[0] and 'meta.json' in err[0]
    for bad in ([5, 5], [70000], 'abc'):  # repeated, past GPT-2's ids, not a list: one line, no traceback
        (tmp_path / 'meta.json').write_text(json.dumps({**meta, 'ids': bad}))
        with pytest.raises(SystemExit):
            load_tokenizer(str(tmp_path / 'meta.json'))
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "'ids'" in err[0] and 'prepare.py' in err[0]
    assert token_bytes({**meta, 'ids': [70000]}, 64) is None  # no bits per byte from ids that are no GPT-2 token
    os.makedirs(tmp_path / 'data' / 'tiny', exist_ok=True)
    (tmp_path / 'data' / 'tiny' / 'meta.json').write_text(json.dumps(meta))
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        with pytest.raises(ValueError, match="renumbers GPT-2's ids"):
            hf_tokenizer({'dataset': 'tiny'})
    finally:
        os.chdir(cwd)
