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
counts and this preparation's settings. An interrupted run (Ctrl-C, kill -9, a full disk) resumes where its
last listed shard ended when rerun with the same settings, and a rerun rewrites a listed shard that went missing
or short (and those after it); other settings over those shards are refused rather than mixed, and so is a
second preparation of the same folder while one runs (out_dir/.lock), and a folder holding another dataset's
files (another preparation's meta.json, .bin files that are no shards of ours), named in one line. An input that
fills only the val split is an error naming the --val_tokens that would leave a train split.
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
sys.path.insert(0, os.path.dirname(HERE))  # data/: prepare_common, what every preparation shares
import prepare_common as common  # noqa: E402

SHARD = re.compile(r"fineweb_edu_(train|val)_(\d{6})\.bin")
enc = None  # each worker's encoder


def fail(msg, code=2):
    tqdm.write(f"error: {msg}", file=sys.stderr)  # on a line of its own, above a progress bar
    sys.exit(code)


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
            fail(f"cannot load FineWeb-Edu '{args.sample}' from the Hugging Face hub: {common.reason(e)}; offline, "
                 f"give local parquet files with --input PATH")
    src = args.input
    if os.path.isdir(src):
        files = sorted(glob.glob(os.path.join(src, "**", "*.parquet"), recursive=True))
        if not files:
            fail(f"input '{src}' holds no .parquet files (searched recursively)")
    elif os.path.isfile(src):
        files = [src]
    else:
        fail(f"cannot read input '{src}': No such file or directory")
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = 0
    for f in files:  # checked before any work: a file without text would fail hours in
        try:
            schema, rows = pq.read_schema(f), rows + pq.read_metadata(f).num_rows
        except Exception as e:
            fail(f"cannot read parquet file '{f}': {common.reason(e)}")
        if "text" not in schema.names:
            fail(f"parquet file '{f}' has no 'text' column (columns: {', '.join(schema.names)})")
        kind = schema.field("text").type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            fail(f"parquet file '{f}' has a 'text' column of {kind}, not of strings (the documents' text)")
    if rows == 0:
        fail(f"input '{src}' holds no documents (its parquet files have no rows)")
    try:
        return load_dataset("parquet", data_files=files, split="train", columns=["text"])
    except Exception as e:
        fail(f"cannot read input '{src}': {common.reason(e)}")


def read_meta(meta_path, preparation):
    """The record of an earlier preparation in this folder, checked: None when there is none."""
    if not os.path.exists(meta_path):
        return None
    start_over = "remove the directory's shards and meta.json to start over"
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read '{meta_path}' ({common.reason(e)}); {start_over}")
    whose = common.makers(meta)
    if whose and "fineweb_edu" not in whose:
        out = os.path.dirname(meta_path)
        held = sorted(n for n in os.listdir(out) if n.endswith(".bin") or n == "meta.json")
        fail(f"'{out}' holds {' or '.join(whose)}'s dataset ({common.listing(held)}); fineweb_edu does not write "
             f"over another's files: use another --out_dir, or remove them first")
    shards = meta.get("shards") if isinstance(meta, dict) else None
    if not (isinstance(shards, dict) and isinstance(meta.get("complete"), bool)
            and all(isinstance(shards.get(split), list) and all(
                isinstance(e, list) and len(e) == 4 and isinstance(e[0], str) and SHARD.fullmatch(e[0])
                and all(isinstance(n, int) and n >= 0 for n in e[1:]) for e in shards[split])
                for split in ("val", "train"))):
        fail(f"'{meta_path}' is not a FineWeb-Edu preparation's record (a JSON object with 'complete' and 'shards' "
             f"of [name, tokens, docs, offset]); {start_over}")
    if meta.get("preparation") != preparation:
        fail(f"'{os.path.dirname(meta_path)}' holds shards of another preparation ({meta.get('preparation')}); use "
             f"another --out_dir, or {start_over}")
    meta.setdefault("dataset", "fineweb_edu")  # a record from before the field
    return meta


def shard_number(entry):
    return int(SHARD.fullmatch(entry[0]).group(2))


def keep_whole_shards(out, meta):
    """Cut the record at the first shard it lists that is missing or not its listed size (deleted, truncated):
    it and the shards after it are written again from where the shard before it ended in the input. The totals
    and the resume point are recounted from the shards kept (the record's own could have been edited)."""
    entries = sorted((e + [split] for split, listed in meta["shards"].items() for e in listed), key=shard_number)
    kept = []
    for entry in entries:
        path = os.path.join(out, entry[0])
        if not os.path.isfile(path) or os.path.getsize(path) != 2 * entry[1]:
            print(f"note: shard {entry[0]} is missing or not its {entry[1]:,} tokens; preparing it and the "
                  f"ones after it again", file=sys.stderr)
            for later in entries[len(kept):]:  # ours, listed: rewritten below
                if os.path.isfile(os.path.join(out, later[0])):
                    os.remove(os.path.join(out, later[0]))
            meta["complete"] = False
            break
        kept.append(entry)
    meta["shards"] = {split: [e[:4] for e in kept if e[4] == split] for split in ("val", "train")}
    for split in ("val", "train"):
        meta[f"{split}_tokens"] = sum(e[1] for e in meta["shards"][split])
    if not meta["complete"]:  # where the last whole shard ends in the input: there the rerun goes on
        docs, offset = (kept[-1][2], kept[-1][3]) if kept else (0, 0)
        if (meta.get("docs"), meta.get("doc_offset")) != (docs, offset):
            print(f"note: meta.json says document {meta.get('docs')} (offset {meta.get('doc_offset')}), its last "
                  f"shard ends at document {docs} (offset {offset}): going on from the shard", file=sys.stderr)
        meta.update(docs=docs, doc_offset=offset)
    return meta


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


def write_or_fail(path, write):
    """write_atomic, a full disk (or a file size limit) said in one line: what meta.json lists stays whole."""
    try:
        write_atomic(path, write)
    except OSError as e:
        fail(f"cannot write '{path}' ({common.reason(e)}); the shards meta.json lists are whole: make room and rerun "
             f"the same command to resume", code=1)


def refuse_val_only(out, meta, args):
    """A preparation whose input fits in the val split has nothing to train on: not a success. Its shards
    are removed (the input is small, a rerun rewrites them in seconds), so the rerun suggested starts afresh."""
    if meta["shards"]["train"]:
        return
    for entry in meta["shards"]["val"]:
        os.remove(os.path.join(out, entry[0]))
    os.remove(os.path.join(out, "meta.json"))
    fail(f"the input's {meta['val_tokens']:,} tokens all fit in the val split (--val_tokens={args.val_tokens}), "
         f"leaving no train split; rerun with a smaller one, e.g. --val_tokens={max(1, meta['val_tokens'] // 10)}")


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
    for name in ("num_proc", "shard_tokens", "val_tokens"):
        if getattr(args, name) < 1:
            fail(f"--{name} must be at least 1, got {getattr(args, name)}")
    global enc
    enc = common.gpt2_encoding()  # the workers' too, forked from here
    with common.claimed(args.out_dir, "fineweb_edu"):  # its own check of the folder: refuse_strays below
        prepare(args, args.out_dir)


def prepare(args, out):
    meta_path = os.path.join(out, "meta.json")
    meta = start_meta(args, out, meta_path)
    if meta is None:
        return
    refuse_strays(out, meta)
    ds = load(args)
    if len(ds) == 0:
        fail(f"input '{args.input or source_of(args)}' is empty (no documents)")
    if meta["docs"]:
        print(f"resuming after {meta['docs']:,} documents, {sum(len(s) for s in meta['shards'].values())} shards "
              f"written")
    shards = Shards(out, meta_path, meta, args)
    workers = Pool(args.num_proc, quiet_worker) if args.num_proc > 1 else None
    with workers or nullcontext() as pool:
        stream = pool.imap(tokenize, texts(ds, shards.docs), chunksize=16) if pool else \
            map(tokenize, texts(ds, shards.docs))
        with tqdm(total=len(ds), initial=shards.docs, unit="doc", desc="tokenizing") as bar:
            for ids in stream:
                shards.add(ids)
                bar.update()
    shards.finish()
    refuse_val_only(out, meta, args)
    print(f"wrote {len(meta['shards']['train'])} train shards ({meta['train_tokens']:,} tokens) and "
          f"{len(meta['shards']['val'])} val ({meta['val_tokens']:,} tokens) from {shards.docs:,} documents to {out}")


def source_of(args):
    return os.path.abspath(args.input) if args.input else f"HuggingFaceFW/fineweb-edu:{args.sample}"


def start_meta(args, out, meta_path):
    """The record to fill: a new one, or the one an earlier run with the same settings left (its shards whole);
    None when that run finished (said)."""
    # what decides the shards' contents: a rerun continues only a preparation with the same
    preparation = {"source": source_of(args), "shard_tokens": args.shard_tokens, "val_tokens": args.val_tokens}
    meta = read_meta(meta_path, preparation)
    if meta is None:
        return {"dataset": "fineweb_edu", "kind": "tiktoken", "encoding": "gpt2", "vocab_size": enc.n_vocab,
                "preparation": preparation, "shards": {"val": [], "train": []}, "train_tokens": 0, "val_tokens": 0,
                "docs": 0, "doc_offset": 0, "complete": False}
    meta = keep_whole_shards(out, meta)
    if meta["complete"]:
        refuse_val_only(out, meta, args)
        print(f"'{out}' is already prepared: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens")
        return None
    return meta


def refuse_strays(out, meta):
    """One line for a file in out that is not ours: a shard meta.json does not list, or another dataset's .bin."""
    listed = {entry[0] for split in meta["shards"].values() for entry in split}
    # the shard the next flush writes: one there was renamed in before a kill let meta.json list it
    upcoming = {f"fineweb_edu_{split}_{len(listed):06d}.bin" for split in ("val", "train")}
    strays = sorted(n for n in os.listdir(out) if SHARD.fullmatch(n) and n not in listed | upcoming)
    if strays:  # shards meta.json does not list: another preparation's, which would mix with ours
        fail(f"'{out}' holds shards meta.json does not list ({strays[0]}, ...): from another preparation; remove "
             f"them or use another --out_dir")
    others = sorted(n for n in os.listdir(out) if n.endswith(".bin") and not SHARD.fullmatch(n))
    if others:  # another dataset's, as train.bin (with no meta.json: nanoGPT's openwebtext writes none)
        fail(f"'{out}' holds {', '.join(others[:3])}, which fineweb_edu's preparation does not write; fineweb_edu does "
             f"not write beside another's files: use another --out_dir, or remove them first")


class Shards:
    """The shard being filled and meta.json, the record of those written: documents' tokens go in, a full shard
    goes out with the record naming it. The first val_tokens are the val split."""

    def __init__(self, out, meta_path, meta, args):
        self.out, self.meta_path, self.meta = out, meta_path, meta
        self.shard_tokens, self.val_tokens = args.shard_tokens, args.val_tokens
        self.shard, self.filled = np.empty(args.shard_tokens, dtype=np.uint16), 0
        self.docs, self.offset = meta["docs"], meta["doc_offset"]  # offset: tokens of document `docs` already in a shard

    def split_now(self):
        return "val" if self.meta["val_tokens"] < self.val_tokens else "train"

    def add(self, ids):
        """Document number docs, its tokens from offset on; a shard that fills up is written."""
        ids = ids[self.offset:]
        while len(ids):
            # the val split ends at val_tokens, a train shard at shard_tokens: the document goes on in the next
            room = self.shard_tokens - self.filled
            if self.split_now() == "val":
                room = min(room, self.val_tokens - self.meta["val_tokens"] - self.filled)
            take = ids[:room]
            self.shard[self.filled:self.filled + len(take)] = take
            self.filled += len(take)
            self.offset += len(take)
            ids = ids[len(take):]
            if len(ids):
                self.flush()
        self.docs, self.offset = self.docs + 1, 0

    def flush(self, last=False):
        """Write the shard being filled and record it, the two together (Ctrl-C waits)."""
        meta = self.meta
        split = self.split_now()
        number = sum(len(s) for s in meta["shards"].values())
        name = f"fineweb_edu_{split}_{number:06d}.bin"
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            # file.write, not ndarray.tofile: tofile takes a short write (a full disk, a size limit) for done
            write_or_fail(os.path.join(self.out, name), lambda f: f.write(memoryview(self.shard[:self.filled])))
            meta["shards"][split].append([name, self.filled, self.docs, self.offset])  # and where in the input it ends
            meta[f"{split}_tokens"] += self.filled
            meta.update(docs=self.docs, doc_offset=self.offset, complete=last)
            self.write_meta()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        self.filled = 0

    def finish(self):
        """The last shard written and the record marked complete."""
        if self.filled:
            self.flush(last=True)
        else:  # the input ended with a shard (or a resume found nothing left): only the record says it is done
            self.meta.update(docs=self.docs, doc_offset=0, complete=True)
            self.write_meta()

    def write_meta(self):
        write_or_fail(self.meta_path, lambda f: f.write(json.dumps(self.meta, indent=1).encode() + b"\n"))


if __name__ == "__main__":
    common.run(main, "the shards meta.json lists are whole: rerun the same command to resume")
