"""Datasets under data/<dataset>/: meta.json, the token files of a split (train.bin / val.bin or shards), and a
task's whole examples with the mask of their scored tokens."""

import hashlib
import json
import os

import numpy as np

from common.errors import die


def dataset_meta(dataset):
    """(meta.json's path, its contents) of data/<dataset>; {} when there is none (GPT-2's BPE, as nanoGPT's
    openwebtext writes no meta.json)."""
    meta_path = os.path.join('data', dataset, 'meta.json')
    if not os.path.exists(meta_path):
        return meta_path, {}
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        die(f"cannot read '{meta_path}' ({type(e).__name__}): rerun python data/{dataset}/prepare.py")
    if not isinstance(meta, dict) or not isinstance(meta.get('vocab_size'), int) or meta['vocab_size'] < 1:
        die(f"'{meta_path}' has no vocab_size (a positive int); rerun python data/{dataset}/prepare.py")
    return meta_path, meta


def split_files(dataset, meta, split):
    """The files of uint16 tokens of one split: train.bin / val.bin, or the shards meta.json lists
    (data/fineweb_edu/prepare.py: [name, tokens, ...] per shard); each there, whole, and of this preparation."""
    data_dir = os.path.join('data', dataset)
    if isinstance(meta.get('shards'), dict):
        files = listed_shards(dataset, meta, split)
    else:
        files = [os.path.join(data_dir, f'{split}.bin')]
    for path in files:
        if not os.path.isfile(path):
            die(f"dataset file '{path}' not found; create it with: python data/{dataset}/prepare.py")
        size = os.path.getsize(path)
        if size % 2:
            die(f"'{path}' is {size} bytes, not whole uint16 tokens: rerun python data/{dataset}/prepare.py")
    total = sum(os.path.getsize(p) // 2 for p in files)
    if meta.get(f'{split}_tokens', total) != total:
        die(f"'{data_dir}' holds {total} {split} tokens but meta.json says {meta[f'{split}_tokens']}: the files are "
            f"from different runs of prepare.py; rerun it")
    return files


def listed_shards(dataset, meta, split):
    """The paths of the shards meta.json lists for a split; none listed, or a shard beside them that it does not
    list (another preparation's, which would be read as ours), is one error line."""
    data_dir = os.path.join('data', dataset)
    listed = [entry[0] for entry in meta['shards'].get(split, [])]
    if not listed:
        fix = no_train_split_fix(dataset, meta) if split == 'train' else f"rerun python data/{dataset}/prepare.py"
        die(f"'{os.path.join(data_dir, 'meta.json')}' lists no {split} shards: {fix}")
    strays = sorted(n for n in os.listdir(data_dir) if n.endswith('.bin') and f'_{split}_' in n and n not in listed)
    if strays:
        die(f"'{data_dir}' holds {split} shards '{os.path.join(data_dir, 'meta.json')}' does not list ({strays[0]}, "
            f"...): two preparations mixed; remove them or rerun python data/{dataset}/prepare.py into an empty "
            f"directory")
    return [os.path.join(data_dir, name) for name in listed]


def no_train_split_fix(dataset, meta):
    """What to change when a preparation put its whole input in the val split: a --val_tokens that leaves a train
    split (a tenth of the input for val, from meta.json's count), in a fresh preparation."""
    preparation = meta.get('preparation') if isinstance(meta.get('preparation'), dict) else {}
    source = preparation.get('source')
    command = f"python data/{dataset}/prepare.py" + (f" --input {source}" if source and os.path.exists(source) else '')
    start_over = f"remove data/{dataset}'s shards and meta.json first (a preparation resumes only with its own settings)"
    val_tokens = meta.get('val_tokens')
    if not isinstance(val_tokens, int) or isinstance(val_tokens, bool) or val_tokens < 10:
        return (f"the input went to the val split; rerun {command} with a --val_tokens below the input's token "
                f"count; {start_over}")
    return (f"the whole input ({val_tokens:,} tokens) went to the val split (--val_tokens is at least that); rerun "
            f"{command} --val_tokens={val_tokens // 10} (a tenth for val, the rest for train); {start_over}")


# ----------------------------------------------------------------------------- task datasets: whole examples
def example_split(data_dir, split, meta):
    """(examples, example_length) of one split of a task dataset (data/recall, data/copy: whole examples back to
    back in {split}.bin, one byte per token in {split}_mask.bin, 1 where the next token is scored), its files
    checked against meta.json."""
    task = meta.get('task', os.path.basename(data_dir))
    fix = f"python data/{task}/prepare.py" + ('' if os.path.basename(data_dir) == task else f" --out_dir {data_dir}")
    info = (meta.get('splits') or {}).get(split)
    if not isinstance(info, dict) or not all(isinstance(info.get(k), int) for k in ('examples', 'example_length')):
        die(f"'{os.path.join(data_dir, 'meta.json')}' lists no split {split!r} (examples, example_length); rerun {fix}")
    examples, length = info['examples'], info['example_length']
    if examples < 1 or length < 2:
        die(f"split {split!r} of '{data_dir}' holds {examples} examples of {length} tokens: nothing to train or "
            f"evaluate on; rerun {fix}")
    for name, size in ((f'{split}.bin', 2 * examples * length), (f'{split}_mask.bin', examples * length)):
        path = os.path.join(data_dir, name)
        if not os.path.isfile(path):
            die(f"dataset file '{path}' not found; create it with: {fix}")
        if os.path.getsize(path) != size:
            die(f"'{path}' is {os.path.getsize(path)} bytes but meta.json promises {size} ({examples} examples of "
                f"{length} tokens): the files are from different runs of prepare.py; rerun {fix}")
        expected = (meta.get('sha256') or {}).get(name)  # a meta.json from before the hashes: sizes only
        if expected and file_sha256(path) != expected:
            die(f"'{path}' does not match the sha256 meta.json gives it: the files are from different runs of "
                f"prepare.py (two at once into one folder?); rerun {fix}")
    return examples, length


_HASHES = {}  # (path, size, mtime) -> sha256: each file hashed once per process


def file_sha256(path):
    """The sha256 of a file's bytes, read 1 MiB at a time, computed once per process for a file as it is."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with open(path, 'rb') as f:
            for chunk in iter(lambda: f.read(1 << 20), b''):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def read_examples(data_dir, split, rows, length):
    """(inputs, targets): int64 (len(rows), length - 1) of the examples at indices rows, the targets -1 where
    the mask does not score them (GPT.forward ignores -1). Fresh memmaps: a long-lived one's pages stay."""
    span = np.asarray(rows, dtype=np.int64)[:, None] * length + np.arange(length)
    tokens = np.memmap(os.path.join(data_dir, f'{split}.bin'), dtype=np.uint16, mode='r')[span].astype(np.int64)
    mask = np.memmap(os.path.join(data_dir, f'{split}_mask.bin'), dtype=np.uint8, mode='r')[span]
    targets = tokens[:, 1:].copy()
    targets[mask[:, :-1] == 0] = -1
    return tokens[:, :-1], targets


def masked_accuracy(logits, targets):
    """(right, scored): how many greedy next-token predictions hit their scored targets (not -1), and how many
    targets are scored, as tensors."""
    scored = targets != -1
    return (logits.argmax(-1)[scored] == targets[scored]).sum(), scored.sum()
