"""Prepare OpenWebText (or a local corpus) tokenized with the GPT-2 BPE (tiktoken).

Usage:
    python data/openwebtext/prepare.py                      # OpenWebText from the Hugging Face hub
    python data/openwebtext/prepare.py --input PATH --out_dir DIR --num_proc 4 --test_size 0.1

--input accepts:
    a directory of .txt files          one document per file (searched recursively)
    a directory made by save_to_disk   its 'text' column (a DatasetDict: its 'train' split)
    a .jsonl / .json / .parquet file   its 'text' column, one document per row
    any other file (e.g. a .txt)       documents separated by blank lines
Each document is encoded with encode_ordinary and followed by the end-of-text token. A random
--test_size fraction of the documents (at least 1, and never all) becomes the val split.
Writes train.bin / val.bin (uint16 token ids, raw) and meta.json.
Offline, point TIKTOKEN_CACHE_DIR at a directory holding tiktoken's cached GPT-2 files.
A folder holding another dataset's files (another preparation's meta.json, or .bin files no meta.json of ours
accounts for) is refused in one line, and so is a second preparation of the same folder while one runs
(out_dir/.lock); meta.json's 'dataset' says which preparation wrote it.
"""
import argparse
import glob
import math
import os
import sys

import numpy as np
from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # data/: prepare_common, what every preparation shares
import prepare_common as common  # noqa: E402

DATASET = "openwebtext"  # meta.json's 'dataset': which preparation wrote a folder
NAMES = ("train.bin", "val.bin", "meta.json")


def paragraphs(text):
    docs, lines = [], []
    for line in text.split("\n") + [""]:  # the sentinel blank line flushes the last document
        if line.strip():
            lines.append(line)
        elif lines:
            docs.append("\n".join(lines))
            lines = []
    return docs


def load_local(src):
    if not os.path.exists(src):
        common.fail(f"cannot read input '{src}': No such file or directory")
    if os.path.isdir(src):
        try:
            ds = load_from_disk(src)
        except FileNotFoundError:  # not a saved dataset: treat it as a folder of text files
            files = sorted(glob.glob(os.path.join(src, "**", "*.txt"), recursive=True))
            if not files:
                common.fail(f"cannot read input '{src}': no .txt files and not a saved dataset")
            return Dataset.from_dict({"text": [common.read_text(f) for f in files]})
        if isinstance(ds, DatasetDict):
            if "train" not in ds:
                common.fail(f"cannot read input '{src}': saved DatasetDict has no 'train' split")
            ds = ds["train"]
        return ds
    ext = os.path.splitext(src)[1].lower()
    if ext in (".jsonl", ".json"):
        return load_dataset("json", data_files=src, split="train")
    if ext == ".parquet":
        return load_dataset("parquet", data_files=src, split="train")
    # Universal newlines here: documents are re-joined with '\n' anyway.
    return Dataset.from_dict({"text": paragraphs(common.read_text(src, newline=None))})


def write_split(dset, path):
    lens = dset.select_columns(["len"]).with_format("numpy")[:]["len"]
    total = int(lens.sum(dtype=np.uint64))
    out = np.memmap(path, dtype=np.uint16, mode="w+", shape=(total,))
    pos = 0
    with tqdm(total=total, unit="tok", unit_scale=True, desc=f"writing {os.path.basename(path)}") as bar:
        # Batches keep memory bounded: the full OpenWebText train split is ~9B tokens.
        for batch in dset.with_format("numpy").iter(batch_size=1024):
            chunk = np.concatenate(batch["ids"]).astype(np.uint16)
            out[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
            bar.update(len(chunk))
    out.flush()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", help="local corpus to use instead of the hub's openwebtext (see above)")
    parser.add_argument("--out_dir", default=HERE, help="where to write train.bin, val.bin, meta.json")
    parser.add_argument("--num_proc", type=int, default=8, help="worker processes (capped at the CPU count)")
    parser.add_argument("--test_size", type=float, default=0.0005, help="fraction of documents for val")
    args = parser.parse_args()
    if args.num_proc < 1:
        parser.error("--num_proc must be at least 1")
    if not 0 < args.test_size < 1:
        parser.error("--test_size must be between 0 and 1")
    with common.claimed(args.out_dir, DATASET, NAMES):
        prepare(args)


def prepare(args):
    num_proc = min(args.num_proc, os.cpu_count() or 1)
    enc = common.gpt2_encoding()
    split = split_documents(args, num_proc)

    def tokenize(example):
        ids = enc.encode_ordinary(example["text"] or "")
        ids.append(enc.eot_token)  # marks document boundaries so the model learns where texts end
        return {"ids": ids, "len": len(ids)}

    tokenized = {}
    for name, d in split.items():
        procs = min(num_proc, len(d))  # datasets warns when asked for more workers than rows
        tokenized[name] = d.map(
            tokenize, remove_columns=d.column_names, num_proc=procs if procs > 1 else None, desc=f"tokenizing {name}"
        )
    counts = write_tokenized(args.out_dir, tokenized, enc.n_vocab)
    for name, d in tokenized.items():
        print(f"{name} has {len(d):,} documents, {counts[name]:,} tokens")


def split_documents(args, num_proc):
    """The input's documents, shuffled into {'train': ..., 'val': ...} (each at least one document)."""
    src = args.input if args.input is not None else "openwebtext"
    try:
        if args.input is None:
            ds = load_dataset("openwebtext", split="train", num_proc=num_proc)
        else:
            ds = load_local(args.input)
    except Exception as e:
        where = "load 'openwebtext' from the Hugging Face hub" if args.input is None else f"read input '{src}'"
        hint = "; offline, give a local corpus with --input PATH" if args.input is None else ""
        common.fail(f"cannot {where}: {common.reason(e)}{hint}")
    if "text" not in ds.column_names:
        common.fail(f"cannot read input '{src}': no 'text' column (columns: {', '.join(ds.column_names)})")
    n = len(ds)
    if n == 0:
        common.fail(f"input '{src}' is empty (no documents)")
    if n < 2:
        common.fail(f"input '{src}' has only 1 document; need at least 2 (one for train, one for val)")

    # An explicit count keeps tiny corpora from getting an empty split; for large ones it equals
    # what datasets would compute from the fraction (ceil), so the shuffle picks the same documents.
    n_val = min(max(1, math.ceil(args.test_size * n)), n - 1)
    split = ds.train_test_split(test_size=n_val, seed=2357, shuffle=True)
    split["val"] = split.pop("test")
    return split


def write_tokenized(out, tokenized, vocab_size):
    """train.bin, val.bin and meta.json of the tokenized splits, written aside and switched in together -> each
    split's token count."""
    with common.switched(out, NAMES):
        counts = {name: write_split(d, common.aside(out, f"{name}.bin")) for name, d in tokenized.items()}
        common.write_meta(common.aside(out, "meta.json"), {
            "dataset": DATASET, "kind": "tiktoken", "encoding": "gpt2", "vocab_size": vocab_size,
            **{f"{name}_tokens": count for name, count in counts.items()}})
    return counts


if __name__ == "__main__":
    common.run(main)
