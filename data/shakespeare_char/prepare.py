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
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # data/: prepare_common, what every preparation shares
import prepare_common as common  # noqa: E402

DATASET = "shakespeare_char"  # meta.json's 'dataset': which preparation wrote a folder


def prepare(out_dir, path, train_text, val_text):
    chars = sorted(set(train_text + val_text))
    if len(chars) > 2**16:
        common.fail(f"input '{path}' has {len(chars)} distinct characters, more than uint16 ids can hold")
    stoi = {c: i for i, c in enumerate(chars)}
    splits = {name: np.array([stoi[c] for c in text], dtype=np.uint16)
              for name, text in (("train", train_text), ("val", val_text))}
    meta = {"dataset": DATASET, "kind": "char", "vocab_size": len(chars), "chars": chars}
    print(f"vocab size: {len(chars):,}")
    common.write_splits(out_dir, splits, meta)


if __name__ == "__main__":
    common.run_text_preparation(__doc__, DATASET, HERE, prepare)
