"""What every data/*/prepare.py shares, so that each keeps only its dataset's steps: one-line errors, the
download with its offline message, the out_dir's lock and the check that it holds no other dataset's files,
writing aside and switching in, and the one line an interrupt ends with. A script imports it as

    sys.path.insert(0, os.path.dirname(HERE))  # data/: this module
    import prepare_common as common

and still runs as `python data/X/prepare.py` from the repository root (or anywhere)."""
import argparse
import fcntl
import json
import os
import re
import signal
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager

INTERRUPTED = "nothing is half-written: the dataset there is the earlier one, or the new one whole"


def fail(msg, code=2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def reason(e):
    """What went wrong, in one line: an OS error's words, a bad byte, or a library error's first line (and its
    cause: datasets wraps parser errors in a generic one)."""
    if isinstance(e, UnicodeDecodeError):
        return f"not valid UTF-8 text (byte {e.start})"
    if isinstance(e, urllib.error.URLError):
        return getattr(e.reason, "strerror", None) or str(e.reason)
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    lines = str(e).strip().splitlines()  # library errors can span many lines; keep the error to one
    msg = lines[0] if lines else type(e).__name__
    if e.__cause__ is not None:
        msg += f" ({reason(e.__cause__)})"
    return msg


def download(url, path):
    """url to path, through a temporary name: an interrupted download never passes for the file."""
    tmp = path + ".part"
    try:
        urllib.request.urlretrieve(url, tmp)
        os.replace(tmp, path)
    except OSError as e:
        fail(f"cannot download '{url}': {reason(e)}; offline, give a local copy with --input PATH")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_text(path, newline=""):
    """The file's text; newline='' keeps its line endings, so the .bin files decode back to it exactly."""
    try:
        with open(path, encoding="utf-8", newline=newline) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read input '{path}': {reason(e)}")


def gpt2_encoding():
    """tiktoken's GPT-2 BPE, or one line on how to get it offline."""
    import tiktoken
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # offline without a cache, tiktoken raises whatever its HTTP client raises
        fail(f"cannot load the GPT-2 encoding ({type(e).__name__}); offline, set TIKTOKEN_CACHE_DIR to a tiktoken "
             f"cache")


# ----------------------------------------------------------------------------- writing aside, then switching

def aside(out, name):
    """Where name is written before the switch: a name of this process's own."""
    return os.path.join(out, f"{name}.{os.getpid()}.tmp")


@contextmanager
def switched(out, names):
    """Inside, write each of names to aside(out, name); on leaving, all are switched in together (Ctrl-C waits):
    a failed run (a full disk) leaves the previous dataset whole, never a new train.bin beside an old meta.json."""
    try:
        yield
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for name in names:
                os.replace(aside(out, name), os.path.join(out, name))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    except OSError as e:
        fail(f"cannot write to '{out}': {reason(e)}; the dataset there is as it was")
    finally:
        for name in names:
            if os.path.isfile(aside(out, name)):
                os.remove(aside(out, name))


def write_meta(path, meta):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False)
        f.write("\n")


def write_dataset(out, files, meta):
    """The arrays ({file name: array}) and meta.json, written aside and switched in together."""
    with switched(out, [*files, "meta.json"]):
        for name, array in files.items():
            array.tofile(aside(out, name))
        write_meta(aside(out, "meta.json"), meta)


# ----------------------------------------------------------------------------- whose folder it is

def makers(meta):
    """The preparations that could have written a meta.json: its 'dataset'; for a record older than that field,
    what its shape says (the two GPT-2 BPE text preparations wrote the same one)."""
    if not isinstance(meta, dict):
        return ()
    if "dataset" in meta:
        return (str(meta["dataset"]),)
    if "shards" in meta:
        return ("fineweb_edu",)
    if "task" in meta:
        return (str(meta["task"]),)
    return {"char": ("shakespeare_char",), "tiktoken": ("shakespeare", "openwebtext")}.get(meta.get("kind"), ())


def listing(held):
    return ', '.join(held[:3]) + (f" and {len(held) - 3} more files" if len(held) > 3 else "")


def refuse_others(out, names, dataset):
    """One line, naming out and what it holds, where it holds another dataset's files: a meta.json another
    preparation wrote, or .bin files that no meta.json of ours accounts for, or that ours does not write (names:
    the files this preparation writes). A folder of our own (other settings, another seed) is replaced whole."""
    held = sorted(n for n in os.listdir(out) if n.endswith(".bin") or n == "meta.json")
    try:
        with open(os.path.join(out, "meta.json"), encoding="utf-8") as f:
            whose = makers(json.load(f))
    except (OSError, ValueError):  # none, or not a record
        whose = ()
    strays = [n for n in held if n not in names]
    if not held or (dataset in whose and not strays):
        return
    if dataset in whose:
        what = f"{', '.join(strays[:3])}, which {dataset}'s preparation does not write"
    else:
        what = (f"{' or '.join(whose)}'s dataset ({listing(held)})" if whose else
                f"{listing(held)}, with no meta.json saying which preparation wrote them" if "meta.json" not in held
                else f"{listing(held)}, whose meta.json names no preparation")
    fail(f"'{out}' holds {what}; {dataset} does not write over another's files: use another --out_dir, or remove "
         f"them first")


def lock(out):
    """out/.lock held for this preparation: a second one on the same folder while this runs is refused, as their
    files would mix. The kernel drops the lock however this process ends. -> the lock's file descriptor."""
    try:
        fd = os.open(os.path.join(out, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        fail(f"cannot write to --out_dir '{out}': {reason(e)}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        fail(f"'{out}' is being prepared by another process (pid {holder}); wait for it to end or use another "
             f"--out_dir")
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


@contextmanager
def claimed(out, dataset, names=None):
    """out, made if need be and locked for this preparation; with names (the files it writes), checked by
    refuse_others and cleared of what a killed preparation left aside. A folder made here is removed again if
    the preparation fails before writing to it."""
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out_dir '{out}' is a file, not a directory")
    created = not os.path.exists(out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail(f"cannot write to --out_dir '{out}': {reason(e)}")
    fd = lock(out)
    try:
        if names is not None:
            refuse_others(out, names, dataset)
            for name in os.listdir(out):  # aside(): none is being written, as we hold the lock
                left = re.fullmatch(r"(.+)\.\d+\.tmp", name)
                if left and left.group(1) in names and os.path.isfile(os.path.join(out, name)):
                    os.remove(os.path.join(out, name))
        yield
    finally:
        os.close(fd)
        if created and os.listdir(out) == [".lock"]:
            os.remove(os.path.join(out, ".lock"))
            os.rmdir(out)


# ----------------------------------------------------------------------------- the script's end

def interrupted(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def run(main, after=INTERRUPTED):
    """main(), where `kill` stops as Ctrl-C does, and either ends in one line saying `after` (what is on disk)."""
    signal.signal(signal.SIGTERM, interrupted)
    try:
        main()
    except KeyboardInterrupt as e:  # what was written aside is removed on the way out
        name = "SIGTERM" if e.args == ("SIGTERM",) else "SIGINT"
        print(f"error: interrupted ({name}); {after}", file=sys.stderr)
        sys.exit(143 if name == "SIGTERM" else 130)


# ----------------------------------------------------------------------------- a text file, split 90 / 10

def text_splits(path, url, here):
    """(path, train text, val text) of a text file: path, or url downloaded to here/input.txt once. The first 90%
    of the characters go to train, the rest to val."""
    if path is None:
        path = os.path.join(here, "input.txt")
        if not os.path.exists(path):
            download(url, path)
    text = read_text(path)
    if not text:
        fail(f"input '{path}' is empty")
    n = len(text)
    train_text, val_text = text[: int(n * 0.9)], text[int(n * 0.9):]
    if not train_text or not val_text:
        fail(f"input '{path}' is too short to split ({n} characters)")
    return path, train_text, val_text


TINY_SHAKESPEARE = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SPLIT_FILES = ("train.bin", "val.bin", "meta.json")


def run_text_preparation(doc, dataset, here, prepare, url=TINY_SHAKESPEARE):
    """A preparation of one text file into train.bin, val.bin and meta.json, run: --input (a local copy of url, else
    url downloaded next to the script) and --out_dir (here by default), claimed for dataset; then
    prepare(out_dir, the input's path, train text, val text) writes them."""
    def main():
        parser = argparse.ArgumentParser(description=doc.splitlines()[0])
        parser.add_argument("--input", help="local text file to use instead of downloading tinyshakespeare")
        parser.add_argument("--out_dir", default=here, help="where to write train.bin, val.bin, meta.json")
        args = parser.parse_args()
        with claimed(args.out_dir, dataset, SPLIT_FILES):
            prepare(args.out_dir, *text_splits(args.input, url, here))
    run(main)


def write_splits(out_dir, splits, meta):
    """The splits ({'train': ids, 'val': ids}, uint16) as train.bin and val.bin, and meta with each one's token
    count, written (write_dataset) and their sizes said."""
    write_dataset(out_dir, {f"{name}.bin": ids for name, ids in splits.items()},
                  {**meta, **{f"{name}_tokens": len(ids) for name, ids in splits.items()}})
    for name, ids in splits.items():
        print(f"{name} has {len(ids):,} tokens")
