"""Tests for the data/*/prepare.py scripts, run as subprocesses on small self-made corpora."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dataset_folders import dataset_files, fineweb_like, locked, recall_like, text_bins

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
TINY = SHARED / "tinyshakespeare" / "input.txt"
CHAR = ROOT / "data" / "shakespeare_char" / "prepare.py"
BPE = ROOT / "data" / "shakespeare" / "prepare.py"
COMPACT = ROOT / "data" / "shakespeare_compact" / "prepare.py"
OWT = ROOT / "data" / "openwebtext" / "prepare.py"

SAMPLE = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak!  <|endoftext|> (not special) -- 'quotes' & \"double\"; 3+4=7?\n"
    "\tTabs, café, naïve, 日本語, emoji 🙂 and a lone \\ backslash.\n"
)


def tiktoken_env():
    """Env for subprocesses that need the GPT-2 BPE offline, or None if no cache is available."""
    env = dict(os.environ)
    if not env.get("TIKTOKEN_CACHE_DIR"):
        cache = SHARED / "tiktoken_cache"
        if not cache.is_dir():
            return None
        env["TIKTOKEN_CACHE_DIR"] = str(cache)
    return env


@pytest.fixture
def bpe_env(tmp_path):
    env = tiktoken_env()
    if env is None:
        pytest.skip("no tiktoken cache: set TIKTOKEN_CACHE_DIR to run the GPT-2 BPE tests offline")
    env["HF_DATASETS_CACHE"] = str(tmp_path / "hf_cache")  # keep datasets' cache out of the home dir
    return env


@pytest.fixture
def enc(bpe_env, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", bpe_env["TIKTOKEN_CACHE_DIR"])
    import tiktoken

    return tiktoken.get_encoding("gpt2")


def run(script, *args, env=None, file_size_limit=None):
    """The script as a command; file_size_limit: `ulimit -f` in bytes, as a full disk fails a write."""
    cmd = [sys.executable, str(script), *map(str, args)]

    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300,
                          preexec_fn=limit if file_size_limit else None)


def run_ok(script, *args, env=None):
    r = run(script, *args, env=env)
    assert r.returncode == 0, r.stderr
    return r


def load_bins(out):
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    return train, val, meta


def write(path, text):
    path.write_bytes(text.encode("utf-8"))  # bytes so no newline translation sneaks in
    return path


# --- shakespeare_char ---------------------------------------------------------------------------


def test_char_roundtrip(tmp_path):
    text = SAMPLE * 40 + "\r\nend"
    src = write(tmp_path / "in.txt", text)
    out = tmp_path / "out"
    r = run_ok(CHAR, "--input", src, "--out_dir", out)
    train, val, meta = load_bins(out)
    n = len(text)
    assert len(train) == int(n * 0.9) and len(val) == n - int(n * 0.9)
    assert (out / "train.bin").stat().st_size == 2 * len(train)  # raw uint16, no header
    chars = sorted(set(text))
    assert meta == {"dataset": "shakespeare_char", "kind": "char", "vocab_size": len(chars), "chars": chars,
                    "train_tokens": len(train), "val_tokens": len(val)}
    ids = np.concatenate([train, val])
    assert ids.max() < meta["vocab_size"]
    assert "".join(meta["chars"][i] for i in ids) == text
    assert f"{len(chars)}" in r.stdout


# --- shakespeare (GPT-2 BPE) --------------------------------------------------------------------


def test_bpe_roundtrip(tmp_path, bpe_env, enc):
    text = SAMPLE * 30
    src = write(tmp_path / "in.txt", text)
    out = tmp_path / "out"
    run_ok(BPE, "--input", src, "--out_dir", out, env=bpe_env)
    train, val, meta = load_bins(out)
    assert {k: meta[k] for k in ("kind", "encoding", "vocab_size")} == {"kind": "tiktoken", "encoding": "gpt2",
                                                                         "vocab_size": 50257}
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))
    cut = int(len(text) * 0.9)
    assert train.tolist() == enc.encode_ordinary(text[:cut])
    assert val.tolist() == enc.encode_ordinary(text[cut:])
    assert enc.decode(train.tolist()) + enc.decode(val.tolist()) == text


def test_compact_bpe_is_gpt2s_tokens_renumbered_to_the_ones_the_text_uses(tmp_path, bpe_env, enc):
    text = SAMPLE * 30
    src = write(tmp_path / "in.txt", text)
    out = tmp_path / "out"
    r = run_ok(COMPACT, "--input", src, "--out_dir", out, env=bpe_env)
    train, val, meta = load_bins(out)
    cut = int(len(text) * 0.9)
    gpt2 = {"train": enc.encode_ordinary(text[:cut]), "val": enc.encode_ordinary(text[cut:])}
    assert meta["ids"] == sorted(set(gpt2["train"]) | set(gpt2["val"])) and meta["vocab_size"] == len(meta["ids"])
    assert {k: meta[k] for k in ("dataset", "kind", "encoding")} == {"dataset": "shakespeare_compact",
                                                                     "kind": "tiktoken", "encoding": "gpt2"}
    assert [meta["ids"][i] for i in train] == gpt2["train"] and [meta["ids"][i] for i in val] == gpt2["val"]
    assert f"{len(meta['ids'])} of GPT-2's 50,257" in r.stdout


# --- openwebtext --------------------------------------------------------------------------------


def owt_docs():
    return [f"Doc {i}: " + SAMPLE[: 40 + 37 * i] + f" <|endoftext|> tail {i}" for i in range(20)]


def check_owt(out, docs, enc):
    train, val, meta = load_bins(out)
    assert {k: meta[k] for k in ("kind", "encoding", "vocab_size")} == {"kind": "tiktoken", "encoding": "gpt2",
                                                                         "vocab_size": 50257}
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))
    assert len(val) > 0 and len(train) > 0
    ids = np.concatenate([train, val])
    assert len(ids) == sum(len(enc.encode_ordinary(d)) + 1 for d in docs)
    assert int((ids == enc.eot_token).sum()) == len(docs)  # literal '<|endoftext|>' text is not special
    assert train[-1] == enc.eot_token and val[-1] == enc.eot_token
    # Every document must come back whole, in one split or the other.
    ends = np.flatnonzero(ids == enc.eot_token)
    pieces = np.split(ids, ends + 1)[:-1]
    assert sorted(enc.decode(p[:-1].tolist()) for p in pieces) == sorted(docs)
    return train, val


def test_owt_txt_dir(tmp_path, bpe_env, enc):
    docs = owt_docs()
    src = tmp_path / "docs"
    src.mkdir()
    for i, d in enumerate(docs):
        write(src / f"{i:03d}.txt", d)
    (src / "notes.md").write_text("ignored: not a .txt file")
    out = tmp_path / "out"
    r = run_ok(OWT, "--input", src, "--out_dir", out, "--num_proc", 1, "--test_size", 0.1, env=bpe_env)
    train, val = check_owt(out, docs, enc)
    assert int((val == enc.eot_token).sum()) == 2  # ceil(0.1 * 20) documents
    assert "val has 2 documents" in r.stdout


def test_owt_jsonl_default_test_size(tmp_path, bpe_env, enc):
    docs = owt_docs()
    src = tmp_path / "corpus.jsonl"
    write(src, "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    out = tmp_path / "out"
    run_ok(OWT, "--input", src, "--out_dir", out, "--num_proc", 1, env=bpe_env)
    train, val = check_owt(out, docs, enc)
    assert int((val == enc.eot_token).sum()) == 1  # the tiny default fraction still leaves one val doc


def test_owt_single_txt_splits_on_blank_lines(tmp_path, bpe_env, enc):
    docs = ["first doc\nline two", "second", "third\n  indented line"]
    src = write(tmp_path / "corpus.txt", "\n\n".join(docs[:2]) + "\n \n\n" + docs[2] + "\n")
    out = tmp_path / "out"
    run_ok(OWT, "--input", src, "--out_dir", out, "--num_proc", 1, "--test_size", 0.5, env=bpe_env)
    check_owt(out, docs, enc)


def test_owt_saved_dataset(tmp_path, bpe_env, enc):
    from datasets import Dataset

    docs = owt_docs()[:6]
    Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "saved"))
    out = tmp_path / "out"
    run_ok(OWT, "--input", tmp_path / "saved", "--out_dir", out, "--num_proc", 1, env=bpe_env)
    check_owt(out, docs, enc)


def test_owt_too_few_documents(tmp_path, bpe_env):
    src = write(tmp_path / "one.txt", "just one document\n")
    r = run(OWT, "--input", src, "--out_dir", tmp_path / "out", "--num_proc", 1, env=bpe_env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error:") and "at least 2" in r.stderr


# --- real data ----------------------------------------------------------------------------------


@pytest.mark.skipif(not TINY.is_file(), reason="tinyshakespeare not available")
def test_real_tinyshakespeare_char(tmp_path):
    run_ok(CHAR, "--input", TINY, "--out_dir", tmp_path)
    train, val, meta = load_bins(tmp_path)
    assert meta["vocab_size"] == 65
    assert (len(train), len(val)) == (1_003_854, 111_540)


@pytest.mark.skipif(not TINY.is_file(), reason="tinyshakespeare not available")
def test_real_tinyshakespeare_bpe(tmp_path, bpe_env):
    run_ok(BPE, "--input", TINY, "--out_dir", tmp_path, env=bpe_env)
    train, val, _ = load_bins(tmp_path)
    assert (len(train), len(val)) == (301_966, 36_059)


# --- errors -------------------------------------------------------------------------------------

SCRIPTS = [pytest.param(CHAR, id="shakespeare_char"), pytest.param(BPE, id="shakespeare"), pytest.param(OWT, id="openwebtext")]


def env_for(script):
    env = tiktoken_env() if script != CHAR else dict(os.environ)
    if env is None:
        pytest.skip("no tiktoken cache")
    return env


def assert_one_line_error(r, *fragments):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, r.stderr
    for frag in fragments:
        assert frag in lines[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_missing_input(tmp_path, script):
    missing = tmp_path / "x.txt"
    r = run(script, "--input", missing, "--out_dir", tmp_path / "out", env=env_for(script))
    assert_one_line_error(r, f"error: cannot read input '{missing}'", "No such file or directory")
    assert r.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_empty_input(tmp_path, script):
    src = write(tmp_path / "empty.txt", "")
    r = run(script, "--input", src, "--out_dir", tmp_path / "out", env=env_for(script))
    assert_one_line_error(r, "empty")


@pytest.mark.parametrize("script", SCRIPTS)
def test_undecodable_input(tmp_path, script):
    src = tmp_path / "bad.txt"
    src.write_bytes(b"ok text\n\n\xff\xfe not utf-8\n")
    r = run(script, "--input", src, "--out_dir", tmp_path / "out", env=env_for(script))
    assert_one_line_error(r, f"cannot read input '{src}'", "UTF-8")


def test_owt_dir_without_txt(tmp_path):
    env = env_for(OWT)
    (tmp_path / "src").mkdir()
    r = run(OWT, "--input", tmp_path / "src", "--out_dir", tmp_path / "out", env=env)
    assert_one_line_error(r, "no .txt files")


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_failed_rerun_leaves_the_dataset_as_it_was(tmp_path, script):
    """Written aside, then switched: a rerun that fails while writing (here val.bin's temporary name is
    taken by a directory, as a full disk would fail it) leaves the earlier train.bin, val.bin and meta.json."""
    env = env_for(script)
    out = tmp_path / "out"
    args = ("--num_proc", 1, "--test_size", 0.5) if script == OWT else ()
    first = "\n\n".join(f"doc {i}: the first corpus." for i in range(8)) + "\n"
    run_ok(script, "--input", write(tmp_path / "a.txt", first), "--out_dir", out, *args, env=env)
    before = dataset_files(out)
    assert json.loads(before["meta.json"])["train_tokens"] * 2 == len(before["train.bin"])
    second = "\n\n".join(f"another document {i}, longer than the first ones." for i in range(8)) + "\n"
    r = run(script, "--input", write(tmp_path / "b.txt", second), "--out_dir", out, *args, env=env,
            file_size_limit=len(before["val.bin"]) + 2)  # as a full disk: the new train.bin does not fit
    assert_one_line_error(r, f"cannot write to '{out}'", "as it was")
    assert dataset_files(out) == before and sorted(p.name for p in out.iterdir()) == sorted([*before, ".lock"])


@pytest.mark.parametrize("script", [pytest.param(CHAR, id="shakespeare_char"), pytest.param(BPE, id="shakespeare")])
def test_a_failed_download_names_the_offline_way(tmp_path, script):
    env = {**env_for(script), "https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    copy = tmp_path / "data" / script.parent.name / "prepare.py"  # a copy: input.txt is fetched next to the script
    copy.parent.mkdir(parents=True)
    copy.write_text(script.read_text())
    (tmp_path / "data" / "prepare_common.py").write_text((ROOT / "data" / "prepare_common.py").read_text())
    r = run(copy, "--out_dir", tmp_path / "out", env=env)
    assert_one_line_error(r, "cannot download", "--input PATH")


@pytest.mark.parametrize("script", [pytest.param(CHAR, id="shakespeare_char"), pytest.param(BPE, id="shakespeare")])
def test_an_interrupted_rerun_is_one_line_and_leaves_the_dataset_whole(tmp_path, script):
    """Ctrl-C while the new files are written aside (here: while meta.json is): one line, exit 130, and the earlier
    dataset as it was, with nothing left beside it."""
    env = env_for(script)
    out = tmp_path / "out"
    run_ok(script, "--input", write(tmp_path / "a.txt", SAMPLE), "--out_dir", out, env=env)
    before = dataset_files(out)
    ctrl_c = ("import json, runpy, sys\n"
              "def dump(*args, **kwargs): raise KeyboardInterrupt\n"
              "json.dump = dump\n"
              "sys.argv = sys.argv[1:]\n"
              "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", ctrl_c, str(script), "--input", str(write(tmp_path / "b.txt", SAMPLE * 2)),
                        "--out_dir", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: interrupted (SIGINT)")
    assert dataset_files(out) == before and sorted(p.name for p in out.iterdir()) == sorted([*before, ".lock"])


CORPUS = "\n\n".join(f"doc {i}: the first corpus." for i in range(8)) + "\n"


def prepare_args(script):
    return ("--num_proc", 1, "--test_size", 0.5) if script == OWT else ()


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("other, holds", [
    (recall_like, "recall's dataset (meta.json, train.bin, train_mask.bin and 2 more files)"),
    (fineweb_like, "fineweb_edu's dataset (fineweb_edu_train_000001.bin, fineweb_edu_train_000002.bin, "
                   "fineweb_edu_train_000003.bin and 40 more files)")], ids=["recall", "fineweb_edu"])
def test_another_datasets_folder_is_refused_in_one_line_and_kept(tmp_path, script, other, holds):
    """Issue 44: a preparation aimed at another dataset's folder replaced its files without a word."""
    out = tmp_path / "out"
    other(out)
    before = dataset_files(out)
    r = run(script, "--input", write(tmp_path / "a.txt", CORPUS), "--out_dir", out, *prepare_args(script),
            env=env_for(script))
    assert_one_line_error(r, f"error: '{out}' holds {holds}; ", "does not write over another's files")
    assert dataset_files(out) == before


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_other_text_preparations_folder_is_refused_and_its_own_replaced(tmp_path, script):
    """shakespeare_char's train.bin is not written over by a GPT-2 BPE preparation, nor the other way round; a
    folder of its own kind (another input), also one from before meta.json named its dataset, is replaced."""
    other = BPE if script == CHAR else CHAR
    out = tmp_path / "out"
    run_ok(other, "--input", write(tmp_path / "a.txt", CORPUS), "--out_dir", out, env=env_for(other))
    before = dataset_files(out)
    r = run(script, "--input", write(tmp_path / "b.txt", CORPUS * 2), "--out_dir", out, *prepare_args(script),
            env=env_for(script))
    name = "shakespeare_char" if other == CHAR else "shakespeare"
    assert_one_line_error(r, f"error: '{out}' holds {name}'s dataset (meta.json, train.bin, val.bin); ")
    assert dataset_files(out) == before
    own = tmp_path / "own"
    run_ok(script, "--input", write(tmp_path / "c.txt", CORPUS), "--out_dir", own, *prepare_args(script),
           env=env_for(script))
    meta = json.loads((own / "meta.json").read_text(encoding="utf-8"))
    assert meta.pop("dataset") == script.parent.name
    (own / "meta.json").write_text(json.dumps(meta))  # as written before the field
    run_ok(script, "--input", write(tmp_path / "d.txt", CORPUS * 2), "--out_dir", own, *prepare_args(script),
           env=env_for(script))
    assert json.loads((own / "meta.json").read_text(encoding="utf-8"))["train_tokens"] > meta["train_tokens"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_one_preparation_of_a_folder_at_a_time(tmp_path, script):
    """Two preparations into one folder at once mixed their files (both wrote NAME.tmp): the folder is locked,
    another's lock is one line and nothing is written."""
    out = tmp_path / "out"
    with locked(out):
        r = run(script, "--input", write(tmp_path / "a.txt", CORPUS), "--out_dir", out, *prepare_args(script),
                env=env_for(script))
    assert_one_line_error(r, f"error: '{out}' is being prepared by another process (pid 4242)")
    assert dataset_files(out) == {}
    run_ok(script, "--input", tmp_path / "a.txt", "--out_dir", out, *prepare_args(script), env=env_for(script))


# --- fineweb_edu: token shards from local parquet files -------------------------------------------

FWE = ROOT / "data" / "fineweb_edu" / "prepare.py"
DOCS = [f"Document {i}: " + "photosynthesis turns light into sugar. " * (i % 7 + 1) for i in range(40)]


def write_parquet(root, docs=DOCS, column="text"):
    """docs over two parquet files in nested folders, as the dataset's own layout nests them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    half = len(docs) // 2
    for i, part in enumerate((docs[:half], docs[half:])):
        d = root / "sample" / "10BT" / f"part{i}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({column: part, "id": list(range(len(part)))}), d / f"{i:03d}_00000.parquet")
    return root / "sample"


def prepare_here(monkeypatch, capsys, *args):
    """data/fineweb_edu/prepare.py in this process (datasets imports once): (exit code, stdout, stderr)."""
    import importlib.util

    # a module by name (not runpy's namespace): its worker processes unpickle its functions by that name
    spec = importlib.util.spec_from_file_location("fineweb_edu_prepare", FWE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fineweb_edu_prepare", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["prepare.py", *map(str, args)])
    try:
        module.main()
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def fwe(tmp_path, bpe_env, monkeypatch):
    for key in ("TIKTOKEN_CACHE_DIR", "HF_DATASETS_CACHE"):
        monkeypatch.setenv(key, bpe_env[key])
    return write_parquet(tmp_path)


def shards(out, meta):
    return {split: [np.fromfile(out / entry[0], dtype=np.uint16) for entry in meta["shards"][split]]
            for split in ("val", "train")}


def test_fineweb_shards_hold_every_document_and_its_end_of_text(tmp_path, fwe, enc, monkeypatch, capsys):
    out = tmp_path / "out"
    code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, "--shard_tokens", 300,
                                "--val_tokens", 200, "--num_proc", 2)
    assert code == 0, err
    meta = json.loads((out / "meta.json").read_text())
    got = shards(out, meta)
    assert meta["complete"] and meta["docs"] == len(DOCS) and meta["vocab_size"] == 50257
    assert meta["dataset"] == "fineweb_edu"
    assert [e[0] for e in meta["shards"]["val"]] == ["fineweb_edu_val_000000.bin"]
    assert meta["shards"]["train"][0][0] == "fineweb_edu_train_000001.bin"
    assert [len(s) for s in got["val"]] == [200] and all(len(s) == 300 for s in got["train"][:-1])
    assert meta["val_tokens"] == 200 and meta["train_tokens"] == sum(len(s) for s in got["train"])
    # the documents in order (the val split is the first ones), each followed by <|endoftext|>
    expected = np.concatenate([enc.encode_ordinary(d) + [enc.eot_token] for d in DOCS])
    np.testing.assert_array_equal(np.concatenate(got["val"] + got["train"]), expected)
    # a rerun of a finished preparation changes nothing
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, stdout, _ = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, "--shard_tokens", 300,
                                   "--val_tokens", 200)
    assert code == 0 and "already prepared" in stdout
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # interrupted after its third shard (its record says where in the input that shard ended, mid-document):
    # the rerun writes the rest as the whole run did
    for entry in meta["shards"]["train"][2:]:
        (out / entry[0]).unlink()
    cut = dict(meta, complete=False, shards={"val": meta["shards"]["val"], "train": meta["shards"]["train"][:2]},
               train_tokens=300 * 2, docs=meta["shards"]["train"][1][2], doc_offset=meta["shards"]["train"][1][3])
    assert cut["doc_offset"] or any(e[3] for e in meta["shards"]["train"])  # the documents do cross shards
    (out / "meta.json").write_text(json.dumps(cut))
    code, stdout, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, "--shard_tokens", 300,
                                     "--val_tokens", 200, "--num_proc", 1)
    assert code == 0 and "resuming" in stdout, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_fineweb_refuses_to_mix_preparations(tmp_path, fwe, monkeypatch, capsys):
    out = tmp_path / "out"
    assert prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, "--shard_tokens", 500,
                        "--val_tokens", 100)[0] == 0
    code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, "--shard_tokens", 400,
                                "--val_tokens", 100)
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert "another preparation" in err and "'shard_tokens': 500" in err
    # a shard meta.json does not list (another preparation's) in a fresh directory
    other = tmp_path / "other"
    other.mkdir()
    (other / "fineweb_edu_train_000007.bin").write_bytes(b"\0\0")
    code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", other)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "fineweb_edu_train_000007.bin" in err


def test_fineweb_parquet_without_text_is_one_line(tmp_path, bpe_env, monkeypatch, capsys):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", bpe_env["TIKTOKEN_CACHE_DIR"])
    src = write_parquet(tmp_path, column="content")
    code, _, err = prepare_here(monkeypatch, capsys, "--input", src, "--out_dir", tmp_path / "out")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no 'text' column" in err and "content" in err and "000_00000.parquet" in err
    code, _, err = prepare_here(monkeypatch, capsys, "--input", tmp_path / "nothing", "--out_dir", tmp_path / "out")
    assert code == 2 and "nothing" in err and len(err.strip().splitlines()) == 1


FWE_ARGS = ("--shard_tokens", 300, "--val_tokens", 200, "--num_proc", 1)


def prepared(monkeypatch, capsys, fwe, out):
    """A whole preparation of fwe into out (with two val/train boundaries crossed mid-document): its files."""
    code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, *FWE_ARGS)
    assert code == 0, err
    return dataset_files(out), json.loads((out / "meta.json").read_text())


def rerun(monkeypatch, capsys, fwe, out):
    code, stdout, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, *FWE_ARGS)
    assert code == 0, err
    return stdout, err


def test_fineweb_one_preparation_per_folder_at_a_time(tmp_path, fwe, monkeypatch, capsys):
    out = tmp_path / "out"
    with locked(out):
        code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, *FWE_ARGS)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "being prepared by another process (pid 4242)" in err and not (out / "meta.json").exists()
    rerun(monkeypatch, capsys, fwe, out)  # the lock gone, it runs
    assert json.loads((out / "meta.json").read_text())["complete"]


@pytest.mark.parametrize("damage", ["killed before meta.json listed its shard", "docs edited in meta.json"])
def test_fineweb_resumes_from_the_shards_it_lists(tmp_path, fwe, monkeypatch, capsys, damage):
    """The record cut back to two train shards, as a kill leaves it: the third shard's file already renamed in
    (a kill between its rename and meta.json's), or meta.json's resume point edited by hand. The rerun goes on
    from where the last listed shard ends and writes what the whole run wrote."""
    out = tmp_path / "out"
    whole, meta = prepared(monkeypatch, capsys, fwe, out)
    train = meta["shards"]["train"]
    keep = 3 if damage.startswith("killed") else 2  # the file of the shard meta.json does not list yet
    for entry in train[keep:]:
        (out / entry[0]).unlink()
    cut = dict(meta, complete=False, shards={"val": meta["shards"]["val"], "train": train[:2]},
               train_tokens=sum(e[1] for e in train[:2]), docs=train[1][2], doc_offset=train[1][3])
    if damage.startswith("docs"):
        cut["docs"] += 3
    (out / "meta.json").write_text(json.dumps(cut))
    stdout, err = rerun(monkeypatch, capsys, fwe, out)
    assert "resuming" in stdout and "error" not in err
    assert dataset_files(out) == whole


def test_fineweb_rewrites_a_deleted_or_truncated_shard(tmp_path, fwe, monkeypatch, capsys):
    out = tmp_path / "out"
    whole, meta = prepared(monkeypatch, capsys, fwe, out)
    deleted = meta["shards"]["train"][2][0]
    (out / deleted).unlink()
    stdout, err = rerun(monkeypatch, capsys, fwe, out)
    assert "already prepared" not in stdout and deleted in err and dataset_files(out) == whole
    val = out / meta["shards"]["val"][0][0]
    val.write_bytes(val.read_bytes()[:-2])
    stdout, err = rerun(monkeypatch, capsys, fwe, out)
    assert "already prepared" not in stdout and val.name in err and dataset_files(out) == whole
    assert "already prepared" in rerun(monkeypatch, capsys, fwe, out)[0]


def test_fineweb_a_full_disk_is_one_line_and_the_rerun_resumes(tmp_path, fwe, monkeypatch, capsys):
    import resource

    whole, _ = prepared(monkeypatch, capsys, fwe, tmp_path / "whole")  # also fills the datasets cache
    out = tmp_path / "out"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, limits[1]))  # as `ulimit -f 1`: a 300-token shard fits, 600 not
    try:
        code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, "--shard_tokens", 600,
                                    "--val_tokens", 200, "--num_proc", 1)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # below the progress bar
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert "cannot write" in err and "File too large" in err and "rerun the same command to resume" in err
    assert json.loads((out / "meta.json").read_text())["shards"]["val"]  # the val shard it could write, listed
    code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, "--shard_tokens", 600,
                                "--val_tokens", 200, "--num_proc", 1)
    assert code == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] and meta["train_tokens"] == json.loads(whole["meta.json"])["train_tokens"]


def test_fineweb_an_input_that_fills_only_the_val_split_is_not_a_success(tmp_path, fwe, monkeypatch, capsys):
    out = tmp_path / "out"
    code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, "--val_tokens", 10 ** 7,
                                "--num_proc", 1)
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # below the progress bars
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "no train split" in err and "--val_tokens=10000000" in err
    suggested = err.split("e.g. ")[1].split()[0]  # what the line says to change, as the user would
    assert not out.exists()  # nothing a rerun with another --val_tokens would call another preparation's
    code, _, err = prepare_here(monkeypatch, capsys, "--input", fwe, "--out_dir", out, suggested, "--num_proc", 1)
    assert code == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["train_tokens"] > 0 and meta["val_tokens"] == int(suggested.split("=")[1])


def refused(monkeypatch, capsys, source, out, *args):
    code, _, err = prepare_here(monkeypatch, capsys, "--input", source, "--out_dir", out, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error:"), err
    return err


@pytest.mark.parametrize("case, fragment", [("ints", "'text' column of int64"), ("empty", "holds no documents"),
                                            ("val_tokens=0", "--val_tokens must be at least 1, got 0")])
def test_fineweb_a_bad_input_or_setting_is_one_line_and_leaves_no_out_dir(tmp_path, fwe, monkeypatch, capsys, case,
                                                                           fragment):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source, args = tmp_path / f"{case}.parquet", ()
    if case == "ints":
        pq.write_table(pa.table({"text": [1, 2, 3]}), source)
    elif case == "empty":
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), source)
    else:
        source, args = fwe, ("--val_tokens=0",)
    assert fragment in refused(monkeypatch, capsys, source, tmp_path / "out", *args)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("record", [[], {"shards": {"val": [], "train": []}}, {"complete": False}])
def test_fineweb_a_malformed_meta_json_is_one_line_and_kept(tmp_path, fwe, monkeypatch, capsys, record):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "meta.json").write_text(json.dumps(record))
    assert "is not a FineWeb-Edu preparation's record" in refused(monkeypatch, capsys, fwe, tmp_path / "old")
    assert json.loads((tmp_path / "old" / "meta.json").read_text()) == record


@pytest.mark.parametrize("other, holds", [
    (recall_like, "holds recall's dataset (meta.json, train.bin, train_mask.bin and 2 more files); fineweb_edu does "
                  "not write over another's files"),
    (text_bins, "holds train.bin, val.bin, which fineweb_edu's preparation does not write")], ids=["recall", "no_meta"])
def test_fineweb_refuses_another_datasets_folder_naming_what_it_holds(tmp_path, fwe, monkeypatch, capsys, other,
                                                                      holds):
    out = tmp_path / "out"
    other(out)
    before = dataset_files(out)
    assert f"'{out}' {holds}" in refused(monkeypatch, capsys, fwe, out, *FWE_ARGS)
    assert dataset_files(out) == before


def test_every_preparation_takes_the_shared_machinery_from_one_module():
    """The lock, the ownership check, the write-aside, the download and the interrupt's line live in
    data/prepare_common.py alone: each data/*/prepare.py imports it and defines none of them again (they were
    copied six times, and defects found in one copy had to be fixed in each)."""
    import ast

    import prepare_common_path  # noqa: F401  (data/ on the path, as each script puts it)
    import prepare_common
    shared = {name for name, value in vars(prepare_common).items()
              if callable(value) and getattr(value, "__module__", None) == "prepare_common"}
    assert {"claimed", "refuse_others", "makers", "switched", "download", "run", "fail", "reason"} <= shared
    scripts = sorted((ROOT / "data").glob("*/prepare.py"))
    assert len(scripts) == 7
    for script in scripts:
        tree = ast.parse(script.read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert "prepare_common" in imported, script
        assert defined & (shared - {"fail"}) == set(), (script, defined & shared)
