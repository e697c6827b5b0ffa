"""Prepare tinyshakespeare in GPT-2's BPE, its token ids renumbered to the ones the text uses.

Usage:
    python data/shakespeare_compact/prepare.py           # downloads input.txt next to this script
    python data/shakespeare_compact/prepare.py --input my.txt --out_dir some/dir

The text is split and encoded exactly as data/shakespeare/prepare.py does (the first 90% of the characters to
train, encode_ordinary), then the GPT-2 ids that occur in either split are numbered 0..n-1 in their order:
tinyshakespeare uses 11,706 of GPT-2's 50,257. meta.json keeps them ('ids': the GPT-2 id of each new id), so the
text decodes as before (common.tokenizer) and bits per byte count the same bytes. Why: a model's head costs
6 x vocab x n_embd FLOPs a token, so at the widths a CPU trains (32-128) GPT-2's full vocabulary is 4.3x this
one's and nearly all of a small model's compute (config/ablate_miniseries_bpe_cpu.py). The val split's ids are
in the vocabulary too (472 of them never occur in train), as with GPT-2's: the model must still give them room.
Offline, point TIKTOKEN_CACHE_DIR at a directory holding tiktoken's cached GPT-2 files.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # data/: prepare_common, what every preparation shares
import prepare_common as common  # noqa: E402

DATASET = "shakespeare_compact"  # meta.json's 'dataset': which preparation wrote a folder


def prepare(out_dir, path, train_text, val_text):
    enc = common.gpt2_encoding()
    gpt2 = {name: np.array(enc.encode_ordinary(text), dtype=np.int64)
            for name, text in (("train", train_text), ("val", val_text))}
    used = np.unique(np.concatenate(list(gpt2.values())))  # sorted: the new id of a GPT-2 id is its rank here
    splits = {name: np.searchsorted(used, ids).astype(np.uint16) for name, ids in gpt2.items()}
    meta = {"dataset": DATASET, "kind": "tiktoken", "encoding": "gpt2", "vocab_size": len(used),
            "ids": used.tolist()}
    print(f"{len(used):,} of GPT-2's {enc.n_vocab:,} token ids occur in the text")
    common.write_splits(out_dir, splits, meta)


if __name__ == "__main__":
    common.run_text_preparation(__doc__, DATASET, HERE, prepare)
