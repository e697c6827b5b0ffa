"""Prepare FineWeb-Edu (a sample, 10B tokens by default) as GPT-2 BPE token shards (tiktoken).

Usage:
    python data/fineweb_edu/prepare.py                          # sample-10BT from the Hugging Face hub
    python data/fineweb_edu/prepare.py --sample sample-100BT --num_proc 16
    python data/fineweb_edu/prepare.py --input DIR_OR_FILE.parquet    # offline: local parquet files

--input takes a parquet file or a directory holding them (searched recursively, as the dataset's own layout
nests them in subfolders); their 'text' column is read. Each document is encoded with encode_ordinary and
followed by the end-of-text token. The first documents, until they reach --val_tokens, are the val split.
Writes raw uint16 token shards of --shard_tokens tokens (the last one shorter), fineweb_edu_val_000000.bin,
fineweb_edu_train_000001.bin, ... (np.memmap-able, like train.bin), and meta.json listing them with their
counts and this preparation's settings. An interrupted run resumes where its last shard ended when rerun with
the same settings; other settings over those shards are refused rather than mixed.
Offline, point TIKTOKEN_CACHE_DIR at a directory holding tiktoken's cached GPT-2 files.
"""
import argparse
import glob
import json
import os
import re
import signal
import sys
from contextlib import nullcontext
from multiprocessing import Pool

import numpy as np
import tiktoken
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
SHARD = re.compile(r"fineweb_edu_(train|val)_(\d{6})\.bin")
enc = None  # each worker's encoder


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def reason(e):
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    lines = str(e).strip().splitlines()  # library errors can span many lines; keep the error to one
    return lines[0] if lines else type(e).__name__


def load_encoder():
    global enc
    if enc is None:
        enc = tiktoken.get_encoding("gpt2")
    return enc


def tokenize(text):
    e = load_encoder()
    ids = e.encode_ordinary(text or "")
    ids.append(e.eot_token)  # marks document boundaries so the model learns where texts end
    return np.array(ids, dtype=np.uint16)  # GPT-2's 50257 ids fit in uint16


def quiet_worker():
    """A worker ignores Ctrl-C (the terminal sends it to the whole group: this process alone stops, with one
    line) and ends silently on the SIGTERM with which the pool stops it (not with our handler's traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def load(args):
    from datasets import load_dataset
    if args.input is None:
        try:
            ds = load_dataset("HuggingFaceFW/fineweb-edu", name=args.sample, split="train", num_proc=args.num_proc)
            return ds.select_columns(["text"])  # its other columns (url, score, ...) need not be read
        except Exception as e:
            fail(f"cannot load FineWeb-Edu '{args.sample}' from the Hugging Face hub: {reason(e)}; offline, give "
                 f"local parquet files with --input PATH")
    src = args.input
    if os.path.isdir(src):
        files = sorted(glob.glob(os.path.join(src, "**", "*.parquet"), recursive=True))
        if not files:
            fail(f"input '{src}' holds no .parquet files (searched recursively)")
    elif os.path.isfile(src):
        files = [src]
    else:
        fail(f"cannot read input '{src}': No such file or directory")
    import pyarrow.parquet as pq
    for f in files:  # checked before any work: a file without text would fail hours in
        try:
            names = pq.read_schema(f).names
        except Exception as e:
            fail(f"cannot read parquet file '{f}': {reason(e)}")
        if "text" not in names:
            fail(f"parquet file '{f}' has no 'text' column (columns: {', '.join(names)})")
    try:
        return load_dataset("parquet", data_files=files, split="train", columns=["text"])
    except Exception as e:
        fail(f"cannot read input '{src}': {reason(e)}")


def texts(ds, start, batch=1024):
    for i in range(start, len(ds), batch):
        yield from ds[i:i + batch]["text"]


def write_atomic(path, write):
    """Write path aside, then switch: a crash or Ctrl-C leaves the old file or the new one, never half."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", help="a local parquet file or a directory of them, instead of the hub")
    parser.add_argument("--sample", default="sample-10BT", help="the hub's configuration (sample-10BT, "
                        "sample-100BT, sample-350BT, default: all)")
    parser.add_argument("--out_dir", default=HERE, help="where to write the shards and meta.json")
    parser.add_argument("--num_proc", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="tokenizing processes")
    parser.add_argument("--shard_tokens", type=int, default=10 ** 8, help="tokens per shard (build-nanogpt's 100M)")
    parser.add_argument("--val_tokens", type=int, default=10 ** 7, help="tokens of the val split (its first documents)")
    args = parser.parse_args()
    if args.num_proc < 1:
        parser.error("--num_proc must be at least 1")
    if args.shard_tokens < 1 or args.val_tokens < 1:
        parser.error("--shard_tokens and --val_tokens must be at least 1")
    try:
        load_encoder()
    except Exception as e:  # offline without a cache, tiktoken raises whatever its HTTP client raises
        fail(f"cannot load the GPT-2 encoding ({type(e).__name__}); offline, set TIKTOKEN_CACHE_DIR to a tiktoken "
             f"cache")

    # what decides the shards' contents: a rerun continues only a preparation with the same
    source = os.path.abspath(args.input) if args.input else f"HuggingFaceFW/fineweb-edu:{args.sample}"
    preparation = {"source": source, "shard_tokens": args.shard_tokens, "val_tokens": args.val_tokens}
    out = args.out_dir
    os.makedirs(out, exist_ok=True)
    meta_path = os.path.join(out, "meta.json")
    meta = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": enc.n_vocab, "preparation": preparation,
            "shards": {"val": [], "train": []}, "train_tokens": 0, "val_tokens": 0, "docs": 0, "doc_offset": 0,
            "complete": False}
    if os.path.exists(meta_path):
        try:
            with open(meta_path, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"cannot read '{meta_path}' ({reason(e)}); remove the directory's shards and meta.json to start over")
        if old.get("preparation") != preparation:
            fail(f"'{out}' holds shards of another preparation ({old.get('preparation')}); use another --out_dir, "
                 f"or remove its shards and meta.json to start over")
        meta = old
        if meta["complete"]:
            print(f"'{out}' is already prepared: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens")
            return
    listed = {entry[0] for split in meta["shards"].values() for entry in split}
    strays = sorted(n for n in os.listdir(out) if SHARD.fullmatch(n) and n not in listed)
    if strays:  # shards meta.json does not list: another preparation's, which would mix with ours
        fail(f"'{out}' holds shards meta.json does not list ({strays[0]}, ...): from another preparation; remove "
             f"them or use another --out_dir")

    ds = load(args)
    if len(ds) == 0:
        fail(f"input '{args.input or source}' is empty (no documents)")
    if meta["docs"]:
        print(f"resuming after {meta['docs']:,} documents, {len(listed)} shards written")
    shard = np.empty(args.shard_tokens, dtype=np.uint16)
    filled = 0
    docs, offset = meta["docs"], meta["doc_offset"]  # offset: tokens of document `docs` already in a shard

    def split_now():
        return "val" if meta["val_tokens"] < args.val_tokens else "train"

    def flush(last=False):
        """Write the shard being filled and record it, the two together (Ctrl-C waits)."""
        nonlocal filled
        split = split_now()
        number = sum(len(s) for s in meta["shards"].values())
        name = f"fineweb_edu_{split}_{number:06d}.bin"
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            write_atomic(os.path.join(out, name), lambda f: shard[:filled].tofile(f))
            meta["shards"][split].append([name, filled, docs, offset])  # and where in the input it ends
            meta[f"{split}_tokens"] += filled
            meta.update(docs=docs, doc_offset=offset, complete=last)
            write_atomic(meta_path, lambda f: f.write(json.dumps(meta, indent=1).encode() + b"\n"))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        filled = 0

    workers = Pool(args.num_proc, quiet_worker) if args.num_proc > 1 else None
    with workers or nullcontext() as pool:
        stream = pool.imap(tokenize, texts(ds, docs), chunksize=16) if pool else map(tokenize, texts(ds, docs))
        with tqdm(total=len(ds), initial=docs, unit="doc", desc="tokenizing") as bar:
            for ids in stream:
                ids = ids[offset:]
                while len(ids):
                    # the val split ends at val_tokens, a train shard at shard_tokens: the document goes on in the next
                    room = args.shard_tokens - filled
                    if split_now() == "val":
                        room = min(room, args.val_tokens - meta["val_tokens"] - filled)
                    take = ids[:room]
                    shard[filled:filled + len(take)] = take
                    filled += len(take)
                    offset += len(take)
                    ids = ids[len(take):]
                    if len(ids):
                        flush()
                docs, offset = docs + 1, 0
                bar.update()
    if filled:
        flush(last=True)
    else:  # the input ended with a shard (or a resume found nothing left): only the record says it is done
        meta.update(docs=docs, doc_offset=0, complete=True)
        write_atomic(meta_path, lambda f: f.write(json.dumps(meta, indent=1).encode() + b"\n"))
    if not meta["shards"]["train"]:
        print(f"note: the input fills only the val split ({meta['val_tokens']:,} tokens); lower --val_tokens",
              file=sys.stderr)
    print(f"wrote {len(meta['shards']['train'])} train shards ({meta['train_tokens']:,} tokens) and "
          f"{len(meta['shards']['val'])} val ({meta['val_tokens']:,} tokens) from {docs:,} documents to {out}")


def interrupted(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupted)  # `kill` stops as Ctrl-C does
    try:
        main()
    except KeyboardInterrupt as e:
        name = "SIGTERM" if e.args == ("SIGTERM",) else "SIGINT"
        print(f"error: interrupted ({name}); the shards meta.json lists are whole: rerun the same command to resume",
              file=sys.stderr)
        sys.exit(143 if name == "SIGTERM" else 130)
