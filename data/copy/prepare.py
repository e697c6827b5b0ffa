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
import hashlib
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # data/: prepare_common, what every preparation shares
import prepare_common as common  # noqa: E402

PAD, SEP = 0, 1
CHARS = "_|" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "0123456789"
SCALES = {"val": 1, "val_2x": 2, "val_4x": 4}  # evaluation split -> string length as a multiple of --length
DATASET = "copy"  # meta.json's 'dataset': which preparation wrote a folder
NAMES = tuple(f"{split}{kind}" for split in ("train", *SCALES) for kind in (".bin", "_mask.bin")) + ("meta.json",)


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
        common.fail(f"--seed {args.seed}: must be a non-negative int (numpy's seeds are)")
    for name in ("length", "min_length", "num_train", "num_val"):
        if getattr(args, name) < 1:
            common.fail(f"--{name} {getattr(args, name)}: must be a positive int")
    if args.min_length > args.length:
        common.fail(f"--min_length {args.min_length}: must be at most --length {args.length}")
    if not 3 <= args.vocab_size <= len(CHARS):
        common.fail(f"--vocab_size {args.vocab_size}: must be 3..{len(CHARS)} (padding, the separator and 1.."
                    f"{len(CHARS) - 2} symbols)")


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
    with common.claimed(args.out_dir, DATASET, NAMES):
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
    common.write_dataset(args.out_dir, files, meta)
    for split, s in splits.items():
        print(f"{split} has {s['examples']:,} examples of {s['example_length']} tokens (strings of "
              f"{s['string_length'][0]}..{s['string_length'][1]} symbols)")


if __name__ == "__main__":
    common.run(main)
