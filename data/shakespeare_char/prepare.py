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
import sys
import urllib.error
import urllib.request

import numpy as np

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


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
        if os.path.exists(tmp):
            os.remove(tmp)
        fail(f"cannot download '{URL}': {reason(e)}")


def read_text(path):
    try:
        # newline='' keeps the file's line endings so the .bin files decode back to it exactly.
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read input '{path}': {reason(e)}")


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
    try:
        os.makedirs(args.out_dir, exist_ok=True)
        for name, ids in splits.items():
            ids.tofile(os.path.join(args.out_dir, f"{name}.bin"))
        with open(os.path.join(args.out_dir, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)
            f.write("\n")
    except OSError as e:
        fail(f"cannot write to '{args.out_dir}': {reason(e)}")

    print(f"vocab size: {len(chars):,}")
    print(f"train has {len(splits['train']):,} tokens")
    print(f"val has {len(splits['val']):,} tokens")


if __name__ == "__main__":
    main()
