"""Prepare tinyshakespeare as a character-level dataset.

Usage:
    python data/shakespeare_char/prepare.py                   # downloads input.txt next to this script
    python data/shakespeare_char/prepare.py --input my.txt --out_dir some/dir

Writes train.bin / val.bin (uint16 token ids, raw) and meta.json
({"kind": "char", "vocab_size": V, "chars": [...]}, where token id i is chars[i]).
The first 90% of the characters go to train, the rest to val.
"""
import argparse
import json
import os
import signal
import sys
import urllib.error
import urllib.request

import numpy as np

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
HERE = os.path.dirname(os.path.abspath(__file__))


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
        os.makedirs(out_dir, exist_ok=True)
        for name, ids in splits.items():
            ids.tofile(os.path.join(out_dir, f"{name}.bin.tmp"))
        with open(os.path.join(out_dir, "meta.json.tmp"), "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)
            f.write("\n")
        # Ctrl-C waits until all three are switched: never a new train.bin beside an old meta.json
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for name in names:
                os.replace(os.path.join(out_dir, name + ".tmp"), os.path.join(out_dir, name))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    except OSError as e:
        fail(f"cannot write to '{out_dir}': {reason(e)}; the dataset there is as it was")
    finally:
        for name in names:
            if os.path.isfile(os.path.join(out_dir, name + ".tmp")):
                os.remove(os.path.join(out_dir, name + ".tmp"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", help="local text file to use instead of downloading tinyshakespeare")
    parser.add_argument("--out_dir", default=HERE, help="where to write train.bin, val.bin, meta.json")
    args = parser.parse_args()

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
    meta = {"kind": "char", "vocab_size": len(chars), "chars": chars}
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
