"""The synthetic tasks (data/recall, data/copy): every prepared example checked token by token, in-process."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from dataset_folders import char_like, dataset_files, fineweb_like, locked, text_bins

ROOT = Path(__file__).resolve().parents[1]


def load_script(task):
    spec = importlib.util.spec_from_file_location(f"{task}_prepare", ROOT / "data" / task / "prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recall, copy = load_script("recall"), load_script("copy")


def prepare(module, monkeypatch, capsys, out, *args):
    """The script's main() here: (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["prepare.py", "--out_dir", str(out), *map(str, args)])
    try:
        module.main()
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def load_split(out, split):
    """(meta, tokens (examples, example_length), mask of the same shape)."""
    meta = json.loads((out / "meta.json").read_text())
    length = meta["splits"][split]["example_length"]
    tokens = np.fromfile(out / f"{split}.bin", dtype=np.uint16)
    mask = np.fromfile(out / f"{split}_mask.bin", dtype=np.uint8)
    assert len(tokens) == len(mask) == meta[f"{split}_tokens"] == meta["splits"][split]["examples"] * length
    return meta, tokens.reshape(-1, length), mask.reshape(-1, length)


# --- recall --------------------------------------------------------------------------------------


def test_recall_examples_pair_by_pair(tmp_path, monkeypatch, capsys):
    pairs, seq_len, vocab = 4, 24, 21
    code, err = prepare(recall, monkeypatch, capsys, tmp_path, "--num_pairs", pairs, "--seq_len", seq_len,
                        "--vocab_size", vocab, "--num_train", 50, "--num_val", 20)
    assert code == 0, err
    for split, count in (("train", 50), ("val", 20)):
        meta, tokens, mask = load_split(tmp_path, split)
        assert tokens.shape == (count, seq_len) and meta["example_length"] == seq_len
        assert meta["vocab_size"] == vocab and meta["settings"]["num_pairs"] == pairs
        assert meta["vocabulary"] == {"filler": 0, "keys": [1, 11], "values": [11, 21]}
        for example, scored in zip(tokens.tolist(), mask.tolist()):
            keys, values = example[0:2 * pairs:2], example[1:2 * pairs:2]
            assert len(set(keys)) == pairs and all(1 <= k < 11 for k in keys)
            assert len(set(values)) == pairs and all(11 <= v < 21 for v in values)
            value_of = dict(zip(keys, values))
            queries = [p for p in range(2 * pairs, seq_len) if example[p] != 0]
            # the query region: keys at even offsets, each followed by its own value, all else filler
            asked = [p for p in queries if (p - 2 * pairs) % 2 == 0]
            assert sorted(example[p] for p in asked) == sorted(keys)  # every key asked exactly once
            assert all(example[p + 1] == value_of[example[p]] for p in asked)
            assert sorted(queries) == sorted(asked + [p + 1 for p in asked])
            assert [p for p in range(seq_len) if scored[p]] == asked  # the mask: the query keys, nothing else


def test_recall_query_slots_follow_the_power_law():
    """One pair in ten slots: the slot's frequencies are Zoology's p(s) ~ (s + 1) ** (a - 1), not uniform."""
    rng = np.random.default_rng(0)
    for a in (0.01, 0.5):
        tokens, mask, slots = recall.make_examples(rng, 20_000, 1, 2 + 2 * 10, 9, a)
        expected = np.array([(s + 1) ** (a - 1) for s in range(10)])
        expected /= expected.sum()
        seen = np.bincount(slots[:, 0], minlength=10) / len(slots)
        assert np.abs(seen - expected).max() < 0.015, (a, seen, expected)
        # the slot drawn is where the key sits in the tokens
        assert (mask.argmax(axis=1) == 2 + 2 * slots[:, 0]).all()
        assert (tokens[np.arange(len(tokens)), 2 + 2 * slots[:, 0]] == tokens[:, 0]).all()


def test_recall_several_queries_are_drawn_without_replacement():
    _, _, slots = recall.make_examples(np.random.default_rng(1), 500, 6, 32, 40, 0.01)
    assert all(len(set(row)) == 6 for row in slots.tolist())
    assert slots.max() < (32 - 12) // 2


def draw_by_draw(rng, rows, n, k):
    """draw_distinct as it was first written, the definition: draw j a rank uniform in 0..n-1-j, stepped over
    the ids drawn before it, smallest first (quadratic in k: 4,000 pairs took 78 s, issue 44)."""
    picked = np.empty((rows, k), dtype=np.int64)
    for j in range(k):
        pick = rng.integers(0, n - j, size=rows)
        for taken in np.sort(picked[:, :j], axis=1).T:
            pick += pick >= taken
        picked[:, j] = pick
    return picked


@pytest.mark.parametrize("rows, n, k", [(7, 5, 5), (200, 9, 4), (300, 40, 33), (64, 1000, 777), (3, 100, 1),
                                        (5, 2, 2), (50, 4095, 1000), (4096, 4095, 8)])
def test_recall_draws_the_same_ids_as_draw_by_draw(rows, n, k):
    """The same ids for the same seed as the draw-by-draw definition: same distribution, same files."""
    for seed in range(3):
        expected = draw_by_draw(np.random.default_rng(seed), rows, n, k)
        np.testing.assert_array_equal(recall.draw_distinct(np.random.default_rng(seed), rows, n, k), expected)


def test_recall_thousands_of_pairs_are_drawn_in_seconds():
    """8,000 distinct keys for 4 examples: under 10 s (the draw-by-draw loop takes minutes, growing with the
    square of the pairs)."""
    import signal

    def too_slow(signum, frame):
        raise TimeoutError("draw_distinct took more than 10 s for 8,000 pairs")
    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, 10)
    try:
        ids = recall.draw_distinct(np.random.default_rng(0), 4, 8191, 8000)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert all(len(set(row)) == 8000 and min(row) >= 0 and max(row) < 8191 for row in ids.tolist())


# --- copy ----------------------------------------------------------------------------------------


def test_copy_examples_symbol_by_symbol(tmp_path, monkeypatch, capsys):
    length, vocab = 5, 7
    code, err = prepare(copy, monkeypatch, capsys, tmp_path, "--length", length, "--min_length", 2,
                        "--vocab_size", vocab, "--num_train", 200, "--num_val", 10)
    assert code == 0, err
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["chars"] == ["_", "|", "a", "b", "c", "d", "e"] and meta["vocab_size"] == vocab
    assert meta["eval_splits"] == ["val", "val_2x", "val_4x"] and meta["example_length"] == 2 * length + 1
    seen_lengths = set()
    for split, (shortest, longest) in {"train": (2, 5), "val": (5, 5), "val_2x": (10, 10), "val_4x": (20, 20)}.items():
        _, tokens, mask = load_split(tmp_path, split)
        assert tokens.shape[1] == 2 * longest + 1
        for example, scored in zip(tokens.tolist(), mask.tolist()):
            m = example.index(1)  # the separator: the string's length
            assert shortest <= m <= longest and (m > length) == (split in ("val_2x", "val_4x"))
            string = example[:m]
            assert all(2 <= s < vocab for s in string)
            assert example[m + 1:2 * m + 1] == string and set(example[2 * m + 1:]) <= {0}
            assert [p for p in range(len(example)) if scored[p]] == list(range(m, 2 * m))
            if split == "train":
                seen_lengths.add(m)
    assert seen_lengths == {2, 3, 4, 5}


# --- both ----------------------------------------------------------------------------------------

TASKS = [pytest.param(recall, ("--num_pairs", 2, "--seq_len", 12, "--vocab_size", 9), id="recall"),
         pytest.param(copy, ("--length", 3), id="copy")]


@pytest.mark.parametrize("module, args", TASKS)
def test_a_seed_reproduces_its_files_and_val_stays_with_num_train(tmp_path, monkeypatch, capsys, module, args):
    def files(out, *more):
        assert prepare(module, monkeypatch, capsys, tmp_path / out, *args, "--num_val", 30, *more)[0] == 0
        return {p.name: p.read_bytes() for p in (tmp_path / out).iterdir()}

    first, again = files("a", "--num_train", 40), files("b", "--num_train", 40)
    assert first == again
    other_seed = files("c", "--num_train", 40, "--seed", 1)
    assert other_seed["train.bin"] != first["train.bin"] and other_seed["val.bin"] != first["val.bin"]
    more_train = files("d", "--num_train", 80)
    assert more_train["val.bin"] == first["val.bin"] and more_train["val_mask.bin"] == first["val_mask.bin"]


BAD = [
    (recall, ("--num_pairs", 0), "--num_pairs 0: must be a positive int"),
    (recall, ("--num_val", -1), "--num_val -1: must be a positive int"),
    (recall, ("--vocab_size", 70000), "--vocab_size 70000: must be 3..65536"),
    (recall, ("--power_a", 0), "--power_a 0.0: must be in (0, 1]"),
    (recall, ("--num_pairs", 5, "--vocab_size", 9), "--num_pairs 5: --vocab_size 9 has 4 keys and 4 values"),
    (recall, ("--num_pairs", 8, "--seq_len", 31), "--seq_len 31: must be at least 4 * --num_pairs = 32"),
    (recall, ("--seed", -1), "--seed -1: must be a non-negative int"),
    (copy, ("--length", 0), "--length 0: must be a positive int"),
    (copy, ("--min_length", 4, "--length", 3), "--min_length 4: must be at most --length 3"),
    (copy, ("--vocab_size", 65), "--vocab_size 65: must be 3..64"),
    (copy, ("--vocab_size", 2), "--vocab_size 2: must be 3..64"),
    (copy, ("--seed", -1), "--seed -1: must be a non-negative int"),
]


@pytest.mark.parametrize("module, args, message", BAD, ids=[f"{m.__name__}{a}" for m, a, _ in BAD])
def test_a_bad_setting_is_one_line(tmp_path, monkeypatch, capsys, module, args, message):
    code, err = prepare(module, monkeypatch, capsys, tmp_path / "out", *args)
    assert code == 2 and err.startswith(f"error: {message}")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("module, args", TASKS)
def test_a_failed_rerun_leaves_the_dataset_as_it_was(tmp_path, monkeypatch, capsys, module, args):
    import resource

    assert prepare(module, monkeypatch, capsys, tmp_path, *args, "--num_train", 10, "--num_val", 5)[0] == 0
    before = dataset_files(tmp_path)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, limits[1]))  # as a full disk: the new train.bin does not fit
    try:
        code, err = prepare(module, monkeypatch, capsys, tmp_path, *args, "--num_train", 200, "--num_val", 5,
                            "--seed", 3)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    assert code == 2 and err.startswith(f"error: cannot write to '{tmp_path}'") and err.count("\n") == 1
    assert dataset_files(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, ".lock"])


OTHERS = [(fineweb_like, "fineweb_edu's dataset (fineweb_edu_train_000001.bin, fineweb_edu_train_000002.bin, "
                         "fineweb_edu_train_000003.bin and 40 more files)"),
          (char_like, "shakespeare_char's dataset (meta.json, train.bin, val.bin)"),
          (lambda out: char_like(out, dataset=False), "shakespeare_char's dataset (meta.json, train.bin, val.bin)"),
          (text_bins, "train.bin, val.bin, with no meta.json saying which preparation wrote them")]


@pytest.mark.parametrize("module, args", TASKS)
@pytest.mark.parametrize("other, holds", OTHERS, ids=["fineweb_edu", "shakespeare_char", "char_before_dataset",
                                                      "no_meta"])
def test_another_datasets_folder_is_refused_in_one_line_and_kept(tmp_path, monkeypatch, capsys, module, args,
                                                                  other, holds):
    """Issue 44: aimed at a FineWeb-Edu preparation recall replaced its meta.json, aimed at shakespeare_char its
    train.bin, without a word."""
    out = tmp_path / "out"
    other(out)
    before = dataset_files(out)
    code, err = prepare(module, monkeypatch, capsys, out, *args, "--num_train", 10, "--num_val", 5)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: '{out}' holds {holds}; {module.DATASET} does not write over another's files")
    assert dataset_files(out) == before


def test_a_task_does_not_write_over_the_other_tasks_folder(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert prepare(copy, monkeypatch, capsys, out, "--length", 3, "--num_train", 10, "--num_val", 5)[0] == 0
    before = dataset_files(out)
    code, err = prepare(recall, monkeypatch, capsys, out, "--num_pairs", 2, "--seq_len", 12, "--vocab_size", 9)
    assert code == 2 and err.count("\n") == 1 and f"'{out}' holds copy's dataset (meta.json, train.bin," in err
    assert dataset_files(out) == before
    # its own kind with other settings is replaced whole, a stray file of no preparation of its own is not
    assert prepare(copy, monkeypatch, capsys, out, "--length", 4, "--num_train", 10, "--num_val", 5)[0] == 0
    assert json.loads((out / "meta.json").read_text())["settings"]["length"] == 4
    (out / "notes.bin").write_bytes(b"")
    code, err = prepare(copy, monkeypatch, capsys, out, "--length", 3, "--num_train", 10, "--num_val", 5)
    assert code == 2 and "holds notes.bin, which copy's preparation does not write" in err
    # a meta.json that names no preparation (not JSON, or no record of ours) is not taken for ours
    (out / "notes.bin").unlink()
    (out / "meta.json").write_text("{")
    code, err = prepare(copy, monkeypatch, capsys, out, "--length", 3, "--num_train", 10, "--num_val", 5)
    assert code == 2 and err.count("\n") == 1 and f"'{out}' holds meta.json, train.bin, train_mask.bin and 6 more " \
        "files, whose meta.json names no preparation; copy does not write over another's files" in err


@pytest.mark.parametrize("module, args", TASKS)
def test_one_preparation_of_a_folder_at_a_time(tmp_path, monkeypatch, capsys, module, args):
    """Issue 44: two preparations into one folder at once mixed their files (both wrote NAME.tmp). The folder is
    locked (another's lock is one line, nothing written), and what each writes aside is named by its pid."""
    out = tmp_path / "out"
    with locked(out):
        code, err = prepare(module, monkeypatch, capsys, out, *args, "--num_train", 10, "--num_val", 5)
    assert code == 2 and err.count("\n") == 1, err
    assert "being prepared by another process (pid 4242)" in err and dataset_files(out) == {}
    # another process's file aside (a preparation of an older prepare.py's) is not ours to write or remove; a
    # killed preparation's (no preparation runs: we hold the lock) is removed
    (out / "val.bin.tmp").mkdir()
    (out / "train.bin.999999999.tmp").write_bytes(b"half")
    renamed = []
    monkeypatch.setattr(module.os, "replace", lambda src, dst: renamed.append(os.path.basename(src)) or
                        os.rename(src, dst))
    assert prepare(module, monkeypatch, capsys, out, *args, "--num_train", 10, "--num_val", 5)[0] == 0
    assert renamed and all(name.endswith(f".{os.getpid()}.tmp") for name in renamed)
    assert sorted(p.name for p in out.iterdir()) == sorted([*module.NAMES, ".lock", "val.bin.tmp"])


@pytest.mark.parametrize("module, args", TASKS)
def test_meta_json_holds_each_files_sha256(tmp_path, monkeypatch, capsys, module, args):
    """What lets train.py tell a mask from another preparation beside its tokens (issue 44 item 3)."""
    import hashlib

    assert prepare(module, monkeypatch, capsys, tmp_path, *args, "--num_train", 10, "--num_val", 5)[0] == 0
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["dataset"] == module.DATASET
    assert meta["sha256"] == {name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
                              for name in module.NAMES if name != "meta.json"}
