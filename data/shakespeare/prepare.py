"""Prepare tinyshakespeare tokenized with the GPT-2 BPE (tiktoken).

Usage:
    python data/shakespeare/prepare.py                   # downloads input.txt next to this script
    python data/shakespeare/prepare.py --input my.txt --out_dir some/dir

The first 90% of the characters go to train, the rest to val; each part is encoded
separately with encode_ordinary (special tokens are treated as plain text).
Writes train.bin / val.bin (uint16 token ids, raw) and meta.json.
Offline, point TIKTOKEN_CACHE_DIR at a directory holding tiktoken's cached GPT-2 files.
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

DATASET = "shakespeare"  # meta.json's 'dataset': which preparation wrote a folder


def prepare(out_dir, path, train_text, val_text):
    enc = common.gpt2_encoding()
    splits = {name: np.array(enc.encode_ordinary(text), dtype=np.uint16)
              for name, text in (("train", train_text), ("val", val_text))}
    meta = {"dataset": DATASET, "kind": "tiktoken", "encoding": "gpt2", "vocab_size": enc.n_vocab}
    common.write_splits(out_dir, splits, meta)


if __name__ == "__main__":
    common.run_text_preparation(__doc__, DATASET, HERE, prepare)
