"""Copying a random string: a length-generalisation task (trained at one length, evaluated at 1x, 2x and 4x).

Usage:
    python data/copy/prepare.py                                 # strings of 1..16 symbols to train on
    python data/copy/prepare.py --length 32 --vocab_size 12 --out_dir some/dir

An example is `s | s` then padding: a random string s of symbols, the separator, s again, '_' to the
example's length. Only the copy is scored. Training strings have min_length..length symbols (uniformly); the
evaluation splits hold strings of exactly one length each: val length, val_2x 2 * length, val_4x 4 * length,
so each example of a split is 2 * (its longest string) + 1 tokens, and a model trained on train.bin meets
positions in val_2x and val_4x it never saw (its block_size must hold val_4x's examples to run on them).

Writes {split}.bin (uint16, whole examples back to back), {split}_mask.bin (uint8, one per token: 1 where the
NEXT token is scored: the separator and the copy but its last symbol, whose next tokens are the copy) for the
splits train, val, val_2x, val_4x, and meta.json: a character vocabulary (kind 'char': '_' padding, '|' the
separator, then letters and digits), example_length (train's and val's), each split's own example_length and
string lengths under 'splits', 'eval_splits', the splits to evaluate at, 'dataset': "copy", and each file's
sha256, by which a reader can tell a mask from another preparation beside its tokens.

A folder holding another dataset's files (another preparation's meta.json, or .bin files no meta.json of ours
accounts for) is refused in one line, and so is a second preparation of the same folder while one runs
(out_dir/.lock); a folder of copy's own, of any settings, is replaced whole.
"""
import argparse
import fcntl
import hashlib
import json
import os
import re
import signal
import sys
from contextlib import contextmanager

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PAD, SEP = 0, 1
CHARS = "_|" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "0123456789"
SCALES = {"val": 1, "val_2x": 2, "val_4x": 4}  # evaluation split -> string length as a multiple of --length
DATASET = "copy"  # meta.json's 'dataset': which preparation wrote a folder
NAMES = tuple(f"{split}{kind}" for split in ("train", *SCALES) for kind in (".bin", "_mask.bin")) + ("meta.json",)


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def make_examples(rng, count, min_length, max_length, vocab_size):
    """(tokens (count, 2 * max_length + 1) uint16, mask of the same shape uint8, lengths (count,)): example i
    copies a string of lengths[i] symbols (ids 2..vocab_size-1), drawn uniformly in min_length..max_length."""
    lengths = rng.integers(min_length, max_length + 1, size=count)
    symbols = rng.integers(SEP + 1, vocab_size, size=(count, max_length))
    column = np.arange(2 * max_length + 1)[None, :]
    m = lengths[:, None]
    source = np.where(column < m, column, column - m - 1)  # which symbol each position holds, in either copy
    tokens = np.take_along_axis(symbols, np.clip(source, 0, max_length - 1), axis=1)
    tokens = np.where(column == m, SEP, np.where(column < 2 * m + 1, tokens, PAD)).astype(np.uint16)
    mask = ((column >= m) & (column < 2 * m)).astype(np.uint8)  # their next tokens are the copy
    return tokens, mask, lengths


def check(args):
    """One line per bad setting, naming it and what is allowed."""
    if args.seed < 0:
        fail(f"--seed {args.seed}: must be a non-negative int (numpy's seeds are)")
    for name in ("length", "min_length", "num_train", "num_val"):
        if getattr(args, name) < 1:
            fail(f"--{name} {getattr(args, name)}: must be a positive int")
    if args.min_length > args.length:
        fail(f"--min_length {args.min_length}: must be at most --length {args.length}")
    if not 3 <= args.vocab_size <= len(CHARS):
        fail(f"--vocab_size {args.vocab_size}: must be 3..{len(CHARS)} (padding, the separator and 1.."
             f"{len(CHARS) - 2} symbols)")


def write_dataset(out_dir, files, meta):
    """Write every file and meta.json aside, then switch them all: a failed run (a full disk) leaves the
    previous dataset whole, never half a new one beside it."""
    names = list(files) + ["meta.json"]
    try:
        for name, array in files.items():
            array.tofile(aside(out_dir, name))
        with open(aside(out_dir, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
            f.write("\n")
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:  # Ctrl-C waits until all are switched
            for name in names:
                os.replace(aside(out_dir, name), os.path.join(out_dir, name))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    except OSError as e:
        fail(f"cannot write to '{out_dir}': {e.strerror or e}; the dataset there is as it was")
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
    parser.add_argument("--length", type=int, default=16, help="the longest training string (val's length)")
    parser.add_argument("--min_length", type=int, default=1, help="the shortest training string")
    parser.add_argument("--vocab_size", type=int, default=28, help=f"ids: padding, separator, symbols; 3..{len(CHARS)}")
    parser.add_argument("--num_train", type=int, default=50_000, help="training examples")
    parser.add_argument("--num_val", type=int, default=1_000, help="examples in each evaluation split")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same files")
    parser.add_argument("--out_dir", default=HERE, help="where to write the .bin files and meta.json")
    args = parser.parse_args()
    check(args)
    with claimed(args.out_dir, NAMES):
        prepare(args)


def prepare(args):
    plan = {"train": (args.num_train, args.min_length, args.length)}
    plan.update({split: (args.num_val, scale * args.length, scale * args.length) for split, scale in SCALES.items()})
    files, splits = {}, {}
    for index, (split, (count, shortest, longest)) in enumerate(plan.items()):
        rng = np.random.default_rng([args.seed, index])  # a stream per split: val does not move with num_train
        tokens, mask, _ = make_examples(rng, count, shortest, longest, args.vocab_size)
        files[f"{split}.bin"], files[f"{split}_mask.bin"] = tokens.ravel(), mask.ravel()
        splits[split] = {"examples": count, "example_length": tokens.shape[1], "string_length": [shortest, longest],
                         "scored": int(mask.sum())}

    settings = {k: v for k, v in vars(args).items() if k != "out_dir"}
    meta = {
        "dataset": DATASET, "kind": "char", "chars": list(CHARS[:args.vocab_size]), "vocab_size": args.vocab_size,
        "task": "copy",
        "example_length": splits["train"]["example_length"], "settings": settings, "splits": splits,
        "eval_splits": list(SCALES),
        **{f"{split}_tokens": s["examples"] * s["example_length"] for split, s in splits.items()},
        "sha256": {name: hashlib.sha256(array).hexdigest() for name, array in files.items()},  # which belong together
    }
    write_dataset(args.out_dir, files, meta)
    for split, s in splits.items():
        print(f"{split} has {s['examples']:,} examples of {s['example_length']} tokens (strings of "
              f"{s['string_length'][0]}..{s['string_length'][1]} symbols)")


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
