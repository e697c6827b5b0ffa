"""Files written whole: tmp paths and atomic writes, an out_dir's lock (one writer), a run's log.jsonl, JSON, and the
outputs that may never replace a checkpoint or a file with a second name."""

import atexit
import fcntl
import json
import os
import re

from common.errors import critical, die


TMP_NAME = re.compile(r'\..+\.tmp\d+')  # tmp_path's names: what claim_out_dir may remove as a crash's leftovers


def tmp_path(path):
    """Where a file is written before it atomically replaces path: `.NAME.tmpPID` beside it."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f'.{name}.tmp{os.getpid()}')


# ----------------------------------------------------------------------------- an out_dir: one writer, one log

_locks = {}  # out_dir's real path -> the open lock file: held until this process ends (or release_out_dirs)
_created = set()  # the out_dirs this process made: removed again if it ends leaving only their .lock


def claim_out_dir(out_dir):
    """Lock out_dir for this process, so a second writer is refused (the kernel drops the lock however the
    holder ends, kill -9 included), and remove the temporary files an earlier crash left there."""
    if os.path.realpath(out_dir) in _locks:
        return
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        die(f"out_dir '{out_dir}' is a file, not a directory")
    try:
        if not os.path.exists(out_dir):
            os.makedirs(out_dir)
            _created.add(os.path.realpath(out_dir))
        fd = os.open(os.path.join(out_dir, '.lock'), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        die(f"cannot write to out_dir '{out_dir}': {e.strerror or e}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 64).decode(errors='replace').strip() or '?'
        die(f"out_dir '{out_dir}' is in use by another process (pid {holder}); wait for it to end or use "
            f"another out_dir")
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _locks[os.path.realpath(out_dir)] = fd
    for name in os.listdir(out_dir):  # ours alone now: what our writers left mid-write at a crash is garbage
        if TMP_NAME.fullmatch(name) and os.path.isfile(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))


@atexit.register
def release_out_dirs():
    """Let go of every out_dir this process claimed (at exit; a process that runs scripts in itself, e.g. the
    tests, calls it too), removing one it created that holds nothing but its .lock (a run that failed before
    writing anything leaves no empty out_dir behind)."""
    while _locks:
        real, fd = _locks.popitem()
        os.close(fd)
        if real in _created:
            _created.discard(real)
            try:
                if os.listdir(real) == ['.lock']:
                    os.remove(os.path.join(real, '.lock'))
                    os.rmdir(real)
            except OSError:
                pass  # someone else's file arrived, or it went: nothing of ours to clean


def repair_log(path, last_iter=None):
    """Make a log.jsonl read as one run: drop torn or repeated lines and, when a run resumes from its
    checkpoint at last_iter, the records past it (the resumed run logs those iterations again)."""
    if not os.path.exists(path):
        return
    if not os.path.isfile(path):
        die(f"log '{path}' is not a file; move it out of the way")
    with open(path, encoding='utf-8', errors='replace') as f:
        lines = f.read().splitlines()
    keep, seen = [], set()
    for line in lines:
        try:
            record = json.loads(line)
            it = record['iter']
        except (ValueError, TypeError, KeyError):
            continue
        if isinstance(it, bool) or not isinstance(it, int):  # not one of our records
            continue
        if last_iter is not None and it > last_iter:
            continue
        if not record.get('eval_only'):  # evaluations of a trained model (at other lengths) share its iteration
            if it in seen:
                continue
            seen.add(it)
        keep.append(line)
    if keep != lines:
        with critical():
            with open(tmp_path(path), 'w', encoding='utf-8') as f:
                f.write(''.join(line + '\n' for line in keep))
            os.replace(tmp_path(path), path)


def append_log(path, record):
    """Append one record to a log.jsonl, whole (an interrupt waits; a full disk is one error line)."""
    with critical():
        try:
            with open(path, 'a', encoding='utf-8') as f:
                f.write(json.dumps(record) + '\n')
        except OSError as e:
            die(f"cannot write log '{path}' ({e.strerror or e})", code=1)


def write_json(path, obj):
    """Write JSON atomically: a reader sees the old file or the new one, never half of it."""
    tmp = tmp_path(path)
    with critical():
        with open(tmp, 'w') as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)


def is_checkpoint(path):
    """Whether path holds a torch.save file (zip or legacy pickle), so no output may replace it."""
    try:
        with open(path, 'rb') as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(b'PK\x03\x04') or head[:2] in (b'\x80\x02', b'\x80\x04', b'\x80\x05')


def output_refusal(path):
    """Why an output (a report, a JSON of figures) may not be written at path, or None: it must not replace a
    directory, a checkpoint, or a file with a second name (a hard link: best.pt is ckpt.pt's)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"'{path}' is a directory (give a file name)"
    if not os.path.isdir(directory):
        return f"no directory '{directory}'"
    probe = tmp_path(os.path.abspath(path))  # the file is written aside there and switched in: try it (root's
    try:  # os.access says yes to a read-only mount or /proc)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.remove(probe)
    except OSError as e:
        return f"directory '{directory}' is not writable ({e.strerror or e})"
    if os.path.exists(path):
        if is_checkpoint(path):
            return f"'{path}' is a checkpoint; outputs never replace one (choose another file name)"
        if os.stat(path).st_nlink > 1:
            return f"'{path}' has another name (a hard link); writing it would change both (choose another file)"
    return None


def write_output(path, text, setting='--output'):
    """Write an output file aside and switch it in (a reader sees the old file or the new one), after the
    checks of output_refusal; any failure is one line naming the setting."""
    refusal = output_refusal(path)
    if refusal:
        die(f"cannot write {setting}={path}: {refusal}", code=1)
    tmp = tmp_path(os.path.abspath(path))
    with critical():
        try:
            with open(tmp, 'w', encoding='utf-8') as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as e:
            die(f"cannot write {setting}={path}: {e.strerror or e}", code=1)
        finally:
            if os.path.lexists(tmp):
                os.remove(tmp)
