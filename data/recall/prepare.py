"""Multi-query associative recall (MQAR, Zoology: Arora et al. 2023) as a dataset.

Usage:
    python data/recall/prepare.py                              # Zoology's defaults: 8 pairs in 64 tokens
    python data/recall/prepare.py --num_pairs 16 --seq_len 128 --vocab_size 256 --out_dir some/dir

Each example is seq_len tokens. First num_pairs key-value pairs `k1 v1 k2 v2 ...` (keys drawn without
replacement from one part of the vocabulary, values without replacement from another), then the query region:
seq_len - 2 * num_pairs tokens in two-token slots. Every key is asked once: the key in a slot, its value right
after it. Which slot each query takes is drawn without replacement with p(slot s) ~ (s + 1) ** (power_a - 1),
Zoology's power law: most queries come soon after the pairs, some far. Every other position is the filler.

Writes train.bin / val.bin (uint16, whole examples back to back), train_mask.bin / val_mask.bin (uint8, one per
token: 1 where the NEXT token is scored, i.e. at each query key, whose next token is its value; the last
position of an example is never scored, its next token is the next example) and meta.json (example_length, the
settings, the vocabulary, vocab_size, 'dataset': "recall", and each file's sha256, by which a reader can tell a
mask from another preparation beside its tokens). Ids: 0 the filler, then the keys, then the values.

A folder holding another dataset's files (another preparation's meta.json, or .bin files no meta.json of ours
accounts for) is refused in one line, and so is a second preparation of the same folder while one runs
(out_dir/.lock); a folder of recall's own, of any settings, is replaced whole.
"""
import argparse
import hashlib
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # data/: prepare_common, what every preparation shares
import prepare_common as common  # noqa: E402

FILLER = 0
SPLITS = ("train", "val")
CHUNK = 4096  # examples drawn at once
DATASET = "recall"  # meta.json's 'dataset': which preparation wrote a folder
NAMES = tuple(f"{split}{kind}" for split in SPLITS for kind in (".bin", "_mask.bin")) + ("meta.json",)


def vocabulary(vocab_size):
    """(keys, values): the half-open id ranges; the filler is id 0, keys take half of the rest."""
    first_value = 1 + (vocab_size - 1) // 2
    return (1, first_value), (first_value, vocab_size)


def query_slot_weights(slots, power_a):
    """Zoology's power law over the query slots: slot s drawn with weight ~ (s + 1) ** (power_a - 1)."""
    w = np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1)
    return w / w.sum()


def draw_without_replacement(rng, rows, weights, k):
    """k distinct indices per row, each row drawn as successive weighted draws without replacement (the
    smallest -log(u) / w keys: Efraimidis-Spirakis), in draw order."""
    keys = -np.log(rng.random((rows, len(weights)))) / weights
    picked = np.argpartition(keys, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(keys, picked, axis=1).argsort(axis=1)
    return np.take_along_axis(picked, order, axis=1)


def draw_distinct(rng, rows, n, k):
    """k distinct ids in 0..n-1 per row, uniformly: each draw is a rank among the ids not yet drawn (draw j's
    rank uniform in 0..n-1-j, one rng.integers call per draw), turned into its id in O(k log^2 k) per row.

    The ranks become ids by halves: the second half of the draws, as ids among those the first half left free,
    is the same problem one level down; an id r among the free ones is r + (how many drawn ids g_i = (i-th
    smallest drawn id) - i are <= r), one searchsorted for every row and block of a level at once."""
    size = 1 << max(k - 1, 0).bit_length()  # k padded to a power of two; the padding's ranks come after all of ours
    ids = np.zeros((rows, size), dtype=np.int64)
    for j in range(k):
        ids[:, j] = rng.integers(0, n - j, size=rows)
    room = n + size  # every id, the padding's too, is below it
    half = 1
    while half < size:
        blocks = ids.reshape(rows, size // (2 * half), 2, half)  # a view: each block's second half is written in it
        first, second = blocks[:, :, 0, :], blocks[:, :, 1, :]
        below = np.sort(first, axis=-1) - np.arange(half)  # per block: its drawn ids less their rank, non-decreasing
        offset = np.arange(rows * (size // (2 * half))).reshape(rows, -1, 1) * room  # blocks apart in one sorted array
        second += np.searchsorted((below + offset).ravel(), (second + offset).ravel(), side="right").reshape(
            second.shape) - offset // room * half
        half *= 2
    return ids[:, :k]


def make_examples(rng, count, num_pairs, seq_len, vocab_size, power_a):
    """(tokens (count, seq_len) uint16, mask (count, seq_len) uint8, slots (count, num_pairs)): slots[i, j] is
    the query slot of example i's j-th pair, so its key sits at 2 * num_pairs + 2 * slots[i, j]."""
    (k_lo, k_hi), (v_lo, v_hi) = vocabulary(vocab_size)
    keys = k_lo + draw_distinct(rng, count, k_hi - k_lo, num_pairs)
    values = v_lo + draw_distinct(rng, count, v_hi - v_lo, num_pairs)
    context = 2 * num_pairs
    slots = draw_without_replacement(rng, count, query_slot_weights((seq_len - context) // 2, power_a), num_pairs)

    tokens = np.full((count, seq_len), FILLER, dtype=np.uint16)
    tokens[:, 0:context:2], tokens[:, 1:context:2] = keys, values
    at = context + 2 * slots  # each query key's position
    np.put_along_axis(tokens, at, keys, axis=1)
    np.put_along_axis(tokens, at + 1, values, axis=1)
    mask = np.zeros((count, seq_len), dtype=np.uint8)
    np.put_along_axis(mask, at, 1, axis=1)
    return tokens, mask, slots


def check(args):
    """One line per bad setting, naming it and what is allowed."""
    if args.seed < 0:
        common.fail(f"--seed {args.seed}: must be a non-negative int (numpy's seeds are)")
    for name in ("num_pairs", "seq_len", "num_train", "num_val"):
        if getattr(args, name) < 1:
            common.fail(f"--{name} {getattr(args, name)}: must be a positive int")
    if not 3 <= args.vocab_size <= 2 ** 16:
        common.fail(f"--vocab_size {args.vocab_size}: must be 3..65536 (the filler, keys and values as uint16 ids)")
    if not 0 < args.power_a <= 1:
        common.fail(f"--power_a {args.power_a}: must be in (0, 1] (1: query slots uniform, near 0: mostly the first)")
    (k_lo, k_hi), (v_lo, v_hi) = vocabulary(args.vocab_size)
    if args.num_pairs > min(k_hi - k_lo, v_hi - v_lo):
        common.fail(f"--num_pairs {args.num_pairs}: --vocab_size {args.vocab_size} has {k_hi - k_lo} keys and "
                    f"{v_hi - v_lo} values; at most {min(k_hi - k_lo, v_hi - v_lo)} pairs, or a larger --vocab_size")
    if args.seq_len < 4 * args.num_pairs:
        common.fail(f"--seq_len {args.seq_len}: must be at least 4 * --num_pairs = {4 * args.num_pairs} "
                    f"(the pairs, then a key and its value for each query)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_pairs", type=int, default=8, help="key-value pairs per example (each queried once)")
    parser.add_argument("--seq_len", type=int, default=64, help="tokens per example")
    parser.add_argument("--vocab_size", type=int, default=8192, help="ids: the filler, then keys, then values")
    parser.add_argument("--num_train", type=int, default=100_000, help="training examples")
    parser.add_argument("--num_val", type=int, default=3_000, help="validation examples")
    parser.add_argument("--power_a", type=float, default=0.01, help="the query slots' power law (Zoology's 0.01)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same files")
    parser.add_argument("--out_dir", default=HERE, help="where to write the .bin files and meta.json")
    args = parser.parse_args()
    check(args)
    with common.claimed(args.out_dir, DATASET, NAMES):
        prepare(args)


def prepare(args):
    files, splits = {}, {}
    for index, split in enumerate(SPLITS):
        rng = np.random.default_rng([args.seed, index])  # a stream per split: val does not move with num_train
        count = args.num_train if split == "train" else args.num_val
        # in chunks: the query slots' draw holds a random number per slot per example
        chunks = [make_examples(rng, min(CHUNK, count - start), args.num_pairs, args.seq_len, args.vocab_size,
                                args.power_a)[:2] for start in range(0, count, CHUNK)]
        tokens, mask = (np.concatenate(parts) for parts in zip(*chunks))
        files[f"{split}.bin"], files[f"{split}_mask.bin"] = tokens.ravel(), mask.ravel()
        splits[split] = {"examples": count, "example_length": args.seq_len, "scored": int(mask.sum())}

    (k_lo, k_hi), (v_lo, v_hi) = vocabulary(args.vocab_size)
    settings = {k: v for k, v in vars(args).items() if k != "out_dir"}
    meta = {
        "dataset": DATASET, "kind": "recall", "task": "recall", "vocab_size": args.vocab_size,
        "example_length": args.seq_len, "settings": settings, "splits": splits, "eval_splits": ["val"],
        "vocabulary": {"filler": FILLER, "keys": [k_lo, k_hi], "values": [v_lo, v_hi]},  # id ranges, half-open
        **{f"{split}_tokens": s["examples"] * args.seq_len for split, s in splits.items()},
        "sha256": {name: hashlib.sha256(array).hexdigest() for name, array in files.items()},  # which belong together
    }
    common.write_dataset(args.out_dir, files, meta)
    for split, s in splits.items():
        print(f"{split} has {s['examples']:,} examples of {args.seq_len} tokens, {s['scored']:,} scored")


if __name__ == "__main__":
    common.run(main)
