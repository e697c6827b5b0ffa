"""Prepare tinyshakespeare as a character-level dataset.

Usage:
    python data/shakespeare_char/prepare.py                   # downloads input.txt next to this script
    python data/shakespeare_char/prepare.py --input my.txt --out_dir some/dir

Writes train.bin / val.bin (uint16 token ids, raw) and meta.json
({"kind": "char", "vocab_size": V, "chars": [...]}, where token id i is chars[i]).
The first 90% of the characters go to train, the rest to val.
A folder holding another dataset's files (another preparation's meta.json, or .bin files no meta.json of ours
accounts for) is refused in one line, and so is a second preparation of the same folder while one runs
(out_dir/.lock); meta.json's 'dataset' says which preparation wrote it.
"""
import argparse
import fcntl
import json
import os
import re
import signal
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager

import numpy as np

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
HERE = os.path.dirname(os.path.abspath(__file__))
DATASET = "shakespeare_char"  # meta.json's 'dataset': which preparation wrote a folder
NAMES = ("train.bin", "val.bin", "meta.json")


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def reason(e):
    if isinstance(e, UnicodeDecodeError):
        return f"not valid UTF-8 text (byte {e.start})"
    if isinstance(e, urllib.error.URLError):
        return getattr(e.reason, "strerror", None) or str(e.reason)
    return e.strerror or str(e)


def download(path):
    # Download to a temporary name first so an interrupted download never passes for input.txt.
    tmp = path + ".part"
    try:
        urllib.request.urlretrieve(URL, tmp)
        os.replace(tmp, path)
    except OSError as e:
        fail(f"cannot download '{URL}': {reason(e)}; offline, give a local copy with --input PATH")
    finally:  # failed or interrupted: never left to pass for input.txt
        if os.path.exists(tmp):
            os.remove(tmp)


def read_text(path):
    try:
        # newline='' keeps the file's line endings so the .bin files decode back to it exactly.
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read input '{path}': {reason(e)}")


def write_dataset(out_dir, splits, meta):
    """Write train.bin, val.bin and meta.json (with each split's token count) aside, then switch all three:
    a failed run (a full disk) leaves the previous dataset whole, never half a new one beside it."""
    meta = {**meta, **{f"{name}_tokens": len(ids) for name, ids in splits.items()}}
    names = [f"{name}.bin" for name in splits] + ["meta.json"]
    try:
        for name, ids in splits.items():
            ids.tofile(aside(out_dir, f"{name}.bin"))
        with open(aside(out_dir, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)
            f.write("\n")
        # Ctrl-C waits until all three are switched: never a new train.bin beside an old meta.json
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for name in names:
                os.replace(aside(out_dir, name), os.path.join(out_dir, name))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    except OSError as e:
        fail(f"cannot write to '{out_dir}': {reason(e)}; the dataset there is as it was")
    finally:
        for name in names:
            if os.path.isfile(aside(out_dir, name)):
                os.remove(aside(out_dir, name))


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
    parser.add_argument("--input", help="local text file to use instead of downloading tinyshakespeare")
    parser.add_argument("--out_dir", default=HERE, help="where to write train.bin, val.bin, meta.json")
    args = parser.parse_args()
    with claimed(args.out_dir, NAMES):
        prepare(args)


def prepare(args):
    path = args.input
    if path is None:
        path = os.path.join(HERE, "input.txt")
        if not os.path.exists(path):
            download(path)
    text = read_text(path)
    if not text:
        fail(f"input '{path}' is empty")

    chars = sorted(set(text))
    if len(chars) > 2**16:
        fail(f"input '{path}' has {len(chars)} distinct characters, more than uint16 ids can hold")
    stoi = {c: i for i, c in enumerate(chars)}
    n = len(text)
    train_text, val_text = text[: int(n * 0.9)], text[int(n * 0.9):]
    if not train_text or not val_text:
        fail(f"input '{path}' is too short to split ({n} characters)")

    splits = {
        "train": np.array([stoi[c] for c in train_text], dtype=np.uint16),
        "val": np.array([stoi[c] for c in val_text], dtype=np.uint16),
    }
    meta = {"dataset": DATASET, "kind": "char", "vocab_size": len(chars), "chars": chars}
    write_dataset(args.out_dir, splits, meta)

    print(f"vocab size: {len(chars):,}")
    print(f"train has {len(splits['train']):,} tokens")
    print(f"val has {len(splits['val']):,} tokens")


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
