"""Folders as other data/*/prepare.py scripts leave them, for tests/test_prepare.py and tests/test_tasks.py: what a
preparation aimed at them must refuse rather than write over (issue 44)."""
import fcntl
import json
from contextlib import contextmanager


def dataset_files(out):
    """{name: bytes} of out's files but the lock (it holds the pid of the preparation that last ran)."""
    return {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"}


def fineweb_like(out):
    """What data/fineweb_edu/prepare.py leaves: 42 shards and the meta.json listing them (a record from before
    meta.json's 'dataset')."""
    out.mkdir()
    names = [f"fineweb_edu_{'val' if i == 0 else 'train'}_{i:06d}.bin" for i in range(42)]
    for name in names:
        (out / name).write_bytes(b"\1\0" * 3)
    (out / "meta.json").write_text(json.dumps({
        "kind": "tiktoken", "encoding": "gpt2", "vocab_size": 50257, "preparation": {"source": "x"},
        "shards": {"val": [[names[0], 3, 1, 0]], "train": [[n, 3, 1, 0] for n in names[1:]]}, "complete": True}))


def recall_like(out):
    """What data/recall/prepare.py writes: tokens and masks of two splits and its meta.json."""
    out.mkdir()
    for name in ("train.bin", "train_mask.bin", "val.bin", "val_mask.bin"):
        (out / name).write_bytes(b"\1\0" * 4)
    (out / "meta.json").write_text(json.dumps({"dataset": "recall", "kind": "recall", "task": "recall",
                                               "vocab_size": 9}))


def text_bins(out):
    """train.bin and val.bin with no meta.json (nanoGPT's own openwebtext writes none)."""
    out.mkdir()
    (out / "train.bin").write_bytes(b"\1\0" * 9)
    (out / "val.bin").write_bytes(b"\0\0")


def char_like(out, dataset=True):
    """What data/shakespeare_char/prepare.py writes: train.bin, val.bin and a character vocabulary's meta.json
    (with its 'dataset', or as written before that field)."""
    text_bins(out)
    meta = {"kind": "char", "vocab_size": 2, "chars": ["a", "b"], "train_tokens": 9, "val_tokens": 1}
    (out / "meta.json").write_text(json.dumps({"dataset": "shakespeare_char", **meta} if dataset else meta))


@contextmanager
def locked(out):
    """out/.lock held as a running preparation (pid 4242) holds it."""
    out.mkdir(exist_ok=True)
    with open(out / ".lock", "w") as held:
        held.write("4242")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
