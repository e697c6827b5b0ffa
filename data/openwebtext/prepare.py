"""Prepare OpenWebText (or a local corpus) tokenized with the GPT-2 BPE (tiktoken).

Usage:
    python data/openwebtext/prepare.py                      # OpenWebText from the Hugging Face hub
    python data/openwebtext/prepare.py --input PATH --out_dir DIR --num_proc 4 --test_size 0.1

--input accepts:
    a directory of .txt files          one document per file (searched recursively)
    a directory made by save_to_disk   its 'text' column (a DatasetDict: its 'train' split)
    a .jsonl / .json / .parquet file   its 'text' column, one document per row
    any other file (e.g. a .txt)       documents separated by blank lines
Each document is encoded with encode_ordinary and followed by the end-of-text token. A random
--test_size fraction of the documents (at least 1, and never all) becomes the val split.
Writes train.bin / val.bin (uint16 token ids, raw) and meta.json.
Offline, point TIKTOKEN_CACHE_DIR at a directory holding tiktoken's cached GPT-2 files.
A folder holding another dataset's files (another preparation's meta.json, or .bin files no meta.json of ours
accounts for) is refused in one line, and so is a second preparation of the same folder while one runs
(out_dir/.lock); meta.json's 'dataset' says which preparation wrote it.
"""
import argparse
import fcntl
import glob
import json
import math
import os
import re
import signal
import sys
from contextlib import contextmanager

import numpy as np
import tiktoken
from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
DATASET = "openwebtext"  # meta.json's 'dataset': which preparation wrote a folder
NAMES = ("train.bin", "val.bin", "meta.json")


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def reason(e):
    if isinstance(e, UnicodeDecodeError):
        return f"not valid UTF-8 text (byte {e.start})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    lines = str(e).strip().splitlines()  # library errors can span many lines; keep the error to one
    msg = lines[0] if lines else type(e).__name__
    if e.__cause__ is not None:  # datasets wraps parser errors in a generic one; the cause says what is wrong
        msg += f" ({reason(e.__cause__)})"
    return msg


def read_text(path, newline=""):
    try:
        with open(path, encoding="utf-8", newline=newline) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read input '{path}': {reason(e)}")


def paragraphs(text):
    docs, lines = [], []
    for line in text.split("\n") + [""]:  # the sentinel blank line flushes the last document
        if line.strip():
            lines.append(line)
        elif lines:
            docs.append("\n".join(lines))
            lines = []
    return docs


def load_local(src):
    if not os.path.exists(src):
        fail(f"cannot read input '{src}': No such file or directory")
    if os.path.isdir(src):
        try:
            ds = load_from_disk(src)
        except FileNotFoundError:  # not a saved dataset: treat it as a folder of text files
            files = sorted(glob.glob(os.path.join(src, "**", "*.txt"), recursive=True))
            if not files:
                fail(f"cannot read input '{src}': no .txt files and not a saved dataset")
            return Dataset.from_dict({"text": [read_text(f) for f in files]})
        if isinstance(ds, DatasetDict):
            if "train" not in ds:
                fail(f"cannot read input '{src}': saved DatasetDict has no 'train' split")
            ds = ds["train"]
        return ds
    ext = os.path.splitext(src)[1].lower()
    if ext in (".jsonl", ".json"):
        return load_dataset("json", data_files=src, split="train")
    if ext == ".parquet":
        return load_dataset("parquet", data_files=src, split="train")
    # Universal newlines here: documents are re-joined with '\n' anyway.
    return Dataset.from_dict({"text": paragraphs(read_text(src, newline=None))})


def write_split(dset, path):
    lens = dset.select_columns(["len"]).with_format("numpy")[:]["len"]
    total = int(lens.sum(dtype=np.uint64))
    out = np.memmap(path, dtype=np.uint16, mode="w+", shape=(total,))
    pos = 0
    with tqdm(total=total, unit="tok", unit_scale=True, desc=f"writing {os.path.basename(path)}") as bar:
        # Batches keep memory bounded: the full OpenWebText train split is ~9B tokens.
        for batch in dset.with_format("numpy").iter(batch_size=1024):
            chunk = np.concatenate(batch["ids"]).astype(np.uint16)
            out[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
            bar.update(len(chunk))
    out.flush()
    return total


def makers(meta):
    """The preparations that could have written a meta.json: its 'dataset'; for a record older than that field,
    what its shape says (the two GPT-2 BPE text preparations wrote the same one)."""
    if not isinstance(meta, dict):
        return ()
    if "dataset" in meta:
        return (str(meta["dataset"]),)
    if "shards" in meta:
        return ("fineweb_edu",)
    if "task" in meta:
        return (str(meta["task"]),)
    return {"char": ("shakespeare_char",), "tiktoken": ("shakespeare", "openwebtext")}.get(meta.get("kind"), ())


def refuse_others(out, names):
    """One line, naming out and what it holds, where it holds another dataset's files: a meta.json another
    preparation wrote, or .bin files that no meta.json of ours accounts for, or that ours does not write (names:
    the files this preparation writes). A folder of our own (other settings, another seed) is replaced whole."""
    held = sorted(n for n in os.listdir(out) if n.endswith(".bin") or n == "meta.json")
    try:
        with open(os.path.join(out, "meta.json"), encoding="utf-8") as f:
            whose = makers(json.load(f))
    except (OSError, ValueError):  # none, or not a record
        whose = ()
    strays = [n for n in held if n not in names]
    if not held or (DATASET in whose and not strays):
        return
    if DATASET in whose:
        what = f"{', '.join(strays[:3])}, which {DATASET}'s preparation does not write"
    else:
        listed = ', '.join(held[:3]) + (f" and {len(held) - 3} more files" if len(held) > 3 else "")
        what = (f"{' or '.join(whose)}'s dataset ({listed})" if whose else
                f"{listed}, with no meta.json saying which preparation wrote them" if "meta.json" not in held else
                f"{listed}, whose meta.json names no preparation")
    fail(f"'{out}' holds {what}; {DATASET} does not write over another's files: use another --out_dir, or remove "
         f"them first")


@contextmanager
def claimed(out, names):
    """out, made if need be, locked for this preparation (out/.lock: a second one on the same folder while this
    runs is refused, as their files would mix; the kernel drops the lock however this process ends) and checked
    by refuse_others. Files a killed preparation left aside are removed; a folder made here is removed again if
    the preparation fails before writing to it."""
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out_dir '{out}' is a file, not a directory")
    created = not os.path.exists(out)
    try:
        os.makedirs(out, exist_ok=True)
        lock = os.open(os.path.join(out, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        fail(f"cannot write to --out_dir '{out}': {e.strerror or e}")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(lock, 32).decode(errors="replace").strip() or "?"
            fail(f"'{out}' is being prepared by another process (pid {holder}); wait for it to end or use another "
                 f"--out_dir")
        os.ftruncate(lock, 0)
        os.pwrite(lock, str(os.getpid()).encode(), 0)
        refuse_others(out, names)
        for name in os.listdir(out):  # aside(): none is being written, as we hold the lock
            left = re.fullmatch(r"(.+)\.\d+\.tmp", name)
            if left and left.group(1) in names and os.path.isfile(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
        yield
    finally:
        os.close(lock)
        if created and os.listdir(out) == [".lock"]:
            os.remove(os.path.join(out, ".lock"))
            os.rmdir(out)


def aside(out, name):
    """Where name is written before the switch: a name of this process's own."""
    return os.path.join(out, f"{name}.{os.getpid()}.tmp")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", help="local corpus to use instead of the hub's openwebtext (see above)")
    parser.add_argument("--out_dir", default=HERE, help="where to write train.bin, val.bin, meta.json")
    parser.add_argument("--num_proc", type=int, default=8, help="worker processes (capped at the CPU count)")
    parser.add_argument("--test_size", type=float, default=0.0005, help="fraction of documents for val")
    args = parser.parse_args()
    if args.num_proc < 1:
        parser.error("--num_proc must be at least 1")
    if not 0 < args.test_size < 1:
        parser.error("--test_size must be between 0 and 1")
    with claimed(args.out_dir, NAMES):
        prepare(args)


def prepare(args):
    num_proc = min(args.num_proc, os.cpu_count() or 1)
    try:
        enc = tiktoken.get_encoding("gpt2")
    except Exception as e:  # offline without a cache, tiktoken raises whatever its HTTP client raises
        fail(f"cannot load the GPT-2 encoding ({type(e).__name__}); offline, set TIKTOKEN_CACHE_DIR to a tiktoken cache")
    split = split_documents(args, num_proc)

    def tokenize(example):
        ids = enc.encode_ordinary(example["text"] or "")
        ids.append(enc.eot_token)  # marks document boundaries so the model learns where texts end
        return {"ids": ids, "len": len(ids)}

    tokenized = {}
    for name, d in split.items():
        procs = min(num_proc, len(d))  # datasets warns when asked for more workers than rows
        tokenized[name] = d.map(
            tokenize, remove_columns=d.column_names, num_proc=procs if procs > 1 else None, desc=f"tokenizing {name}"
        )
    counts = write_dataset(args.out_dir, tokenized, enc.n_vocab)
    for name, d in tokenized.items():
        print(f"{name} has {len(d):,} documents, {counts[name]:,} tokens")


def split_documents(args, num_proc):
    """The input's documents, shuffled into {'train': ..., 'val': ...} (each at least one document)."""
    src = args.input if args.input is not None else "openwebtext"
    try:
        if args.input is None:
            ds = load_dataset("openwebtext", split="train", num_proc=num_proc)
        else:
            ds = load_local(args.input)
    except Exception as e:
        where = "load 'openwebtext' from the Hugging Face hub" if args.input is None else f"read input '{src}'"
        hint = "; offline, give a local corpus with --input PATH" if args.input is None else ""
        fail(f"cannot {where}: {reason(e)}{hint}")
    if "text" not in ds.column_names:
        fail(f"cannot read input '{src}': no 'text' column (columns: {', '.join(ds.column_names)})")
    n = len(ds)
    if n == 0:
        fail(f"input '{src}' is empty (no documents)")
    if n < 2:
        fail(f"input '{src}' has only 1 document; need at least 2 (one for train, one for val)")

    # An explicit count keeps tiny corpora from getting an empty split; for large ones it equals
    # what datasets would compute from the fraction (ceil), so the shuffle picks the same documents.
    n_val = min(max(1, math.ceil(args.test_size * n)), n - 1)
    split = ds.train_test_split(test_size=n_val, seed=2357, shuffle=True)
    split["val"] = split.pop("test")
    return split


def write_dataset(out, tokenized, vocab_size):
    """train.bin, val.bin and meta.json of the tokenized splits -> each split's token count. They are written aside,
    then switched: a failed run (a full disk) leaves the previous dataset whole, never half a new one beside it."""
    try:
        counts = {name: write_split(d, aside(out, f"{name}.bin")) for name, d in tokenized.items()}
        with open(aside(out, "meta.json"), "w", encoding="utf-8") as f:
            json.dump({"dataset": DATASET, "kind": "tiktoken", "encoding": "gpt2", "vocab_size": vocab_size,
                       **{f"{name}_tokens": count for name, count in counts.items()}}, f)
            f.write("\n")
        # Ctrl-C waits until all three are switched: never a new train.bin beside an old meta.json
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for name in NAMES:
                os.replace(aside(out, name), os.path.join(out, name))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    except OSError as e:
        fail(f"cannot write to '{out}': {reason(e)}; the dataset there is as it was")
    finally:
        for name in NAMES:
            if os.path.isfile(aside(out, name)):
                os.remove(aside(out, name))
    return counts


def interrupted(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupted)  # `kill` stops as Ctrl-C does
    try:
        main()
    except KeyboardInterrupt as e:  # what was written aside is removed on the way out
        name = "SIGTERM" if e.args == ("SIGTERM",) else "SIGINT"
        print(f"error: interrupted ({name}); nothing is half-written: the dataset there is the earlier one, or "
              f"the new one whole", file=sys.stderr)
        sys.exit(143 if name == "SIGTERM" else 130)
