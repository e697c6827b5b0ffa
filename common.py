"""Helpers the scripts share: one-line errors and interrupts, device and dtype choice, an out_dir's lock,
log and checkpoints, tokenizers, peak FLOP/s."""

import atexit
import fcntl
import json
import os
import pickle
import re
import shutil
import signal
import sys
import time
import warnings
from collections import namedtuple
from contextlib import contextmanager, nullcontext
from dataclasses import asdict

import numpy as np
import torch

from chapters import GPT, RUNTIME_FLAGS, GPTConfig
from model import upgrade_args

CKPT_FORMAT = 'nanoswap-ckpt-1'
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def die(message, code=2):
    """Report a user mistake as one line on stderr and exit: a traceback would only hide it."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or `kill` (SIGTERM): the scripts stop with one line, exit 128 + the signal."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


_critical, _pending, _stopping = 0, None, False


def _on_signal(signum, frame):
    global _pending, _stopping
    if _stopping:
        # already stopping: a second signal (Ctrl-C reaches ablate.py's runs, then ablate stops them with `kill`)
        # raised again would land in whatever cleanup runs then, a destructor or an atexit hook, as a traceback
        return
    if _critical:  # inside a write that must finish whole: stop right after it
        _pending = signum
    else:
        _stopping = True
        raise Interrupted(signum)


def catch_interrupts():
    """Ctrl-C and `kill` raise Interrupted, except inside critical(), which they end; one not caught by the
    script stops it with one line. Only the first signal raises: the process is stopping after it."""
    global _stopping
    _stopping = False
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    default_hook = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, Interrupted):
            return default_hook(kind, value, tb)
        print(f"error: interrupted ({value})", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(value.code)
    sys.excepthook = hook


def hold_interrupts():
    """Start a stretch an interrupt must not cut, as critical() for one that is not a single block (a training
    step): an interrupt waits until deliver_interrupts()."""
    global _critical
    _critical += 1


def deliver_interrupts(discard=False):
    """End hold_interrupts(): an interrupt that came meanwhile is raised now (discard: the stretch failed, and
    what ends the process is already under way)."""
    global _critical, _pending, _stopping
    _critical -= 1
    if not _critical and _pending is not None:
        signum, _pending, _stopping = _pending, None, True
        if not discard:
            raise Interrupted(signum)


@contextmanager
def critical():
    """A block that an interrupt must not cut in two (a checkpoint or log write): it is delivered after."""
    hold_interrupts()
    try:
        yield
    finally:
        deliver_interrupts()


def out_of_memory(error):
    """Whether an exception is the device or the host running out of memory."""
    if isinstance(error, (MemoryError, getattr(torch, 'OutOfMemoryError', MemoryError))):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ('out of memory' in text or "can't allocate memory" in text
                                                or 'not enough memory' in text)


# ----------------------------------------------------------------------------- device and dtype

def pick_device(device='auto'):
    """'auto' picks cuda, then mps, then cpu; an explicit choice must exist on this machine."""
    if device == 'auto':
        if torch.cuda.is_available():
            return 'cuda'
        if getattr(torch.backends, 'mps', None) is not None and torch.backends.mps.is_available():
            return 'mps'
        return 'cpu'
    kind = device.split(':')[0]
    if kind not in ('cpu', 'cuda', 'mps'):
        die(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    if kind == 'cuda' and not torch.cuda.is_available():
        die(f"device={device!r} but CUDA is not available here (use --device=auto or --device=cpu)")
    if kind == 'mps' and not (getattr(torch.backends, 'mps', None) and torch.backends.mps.is_available()):
        die(f"device={device!r} but MPS is not available here (use --device=auto or --device=cpu)")
    return device


def pick_dtype(device, dtype='auto'):
    """'auto': bf16 where the GPU supports it, else fp16 (with a GradScaler) on CUDA, fp32 elsewhere."""
    if dtype == 'auto':
        if device.startswith('cuda'):
            return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
        return 'float32'
    if dtype not in DTYPES:
        die(f"dtype must be 'auto', {', '.join(map(repr, DTYPES))}; got {dtype!r}")
    return dtype


def autocast(device, dtype):
    """Mixed precision for forward passes; fp32 needs none."""
    if dtype == 'float32':
        return nullcontext()
    return torch.autocast(device_type=device.split(':')[0], dtype=DTYPES[dtype])


def grad_scaler(device_type, dtype, sharded=False):
    """fp16's loss scaler (a no-op otherwise). Under FSDP each rank holds only its shard of the gradients, so
    the sharded scaler all-reduces the overflow check: every rank skips the same steps and keeps one scale."""
    if sharded and dtype == 'float16':
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        return ShardedGradScaler(device_type)
    return torch.amp.GradScaler(device_type, enabled=dtype == 'float16')


def all_reduce_sum(tensors):
    """Sums these tensors (of one dtype) over the processes in place, with one all-reduce for all of them."""
    import torch.distributed as dist
    flat = torch.cat([t.flatten() for t in tensors])
    dist.all_reduce(flat)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


# ----------------------------------------------------------------------------- checkpoints

TMP_NAME = re.compile(r'\..+\.tmp\d+')  # tmp_path's names: what claim_out_dir may remove as a crash's leftovers


def tmp_path(path):
    """Where a file is written before it atomically replaces path: `.NAME.tmpPID` beside it."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f'.{name}.tmp{os.getpid()}')


def keep_as(path, other):
    """Make `other` a second name of the checkpoint at path, atomically: a hard link (no second write), or a
    copy where the filesystem has none."""
    tmp = tmp_path(os.path.abspath(other))
    with critical():
        try:
            try:
                os.link(path, tmp)
            except OSError:
                shutil.copyfile(path, tmp)
            os.replace(tmp, other)
        except OSError as e:
            die(f"cannot write checkpoint '{other}' ({e.strerror or e}); the previous one is intact", code=1)
        finally:
            if os.path.lexists(tmp):
                os.remove(tmp)


def save_checkpoint(checkpoint, path):
    """Write atomically: a crash, an interrupt or a full disk mid-write leaves the previous checkpoint, never a
    broken file (a full disk is one error line)."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = tmp_path(os.path.abspath(path))
    with critical():
        try:
            with open(tmp, 'wb') as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(directory, os.O_RDONLY)  # make the rename itself durable
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except (OSError, RuntimeError) as e:  # torch.save says a full disk as RuntimeError('... file write failed')
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:200] if str(e) \
                else type(e).__name__
            die(f"cannot write checkpoint '{path}' ({reason}); the previous one is intact", code=1)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


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


def collective_error(error):
    """Whether an exception is a collective of torch.distributed failing (another process ended or hung)."""
    dist_error = getattr(torch.distributed, 'DistError', ())
    if dist_error and isinstance(error, dist_error):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ('gloo', 'NCCL', 'Connection closed by peer', 'Connection reset by peer'))


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


def new_checkpoint(model, **fields):
    """A checkpoint dict in our format; model is the raw (uncompiled, unwrapped) GPT. A model loaded from a
    Hugging Face family keeps its name (hf_family), so export.py goes back to it from any later checkpoint."""
    family = {'hf_family': model.hf_family} if getattr(model, 'hf_family', None) else {}
    return {'format': CKPT_FORMAT, 'model': model.state_dict(), 'model_args': asdict(model.config), **family,
            **fields}


def load_checkpoint(path, hint="train one with: python train.py config/shakespeare_modern_cpu.py"):
    """Load one of our checkpoints safely (weights_only) to the CPU, or exit with one clear line."""
    if not os.path.exists(path):
        die(f"no checkpoint at '{path}'; {hint}")
    try:
        checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # truncated, not a torch file, or holding objects weights_only refuses
        if 'Weights only load failed' in str(e) and 'GLOBAL' in str(e):  # torch advises weights_only=False: never
            die(f"checkpoint '{path}' holds Python objects beyond tensors and plain values, so it was not loaded: "
                f"loading them could run arbitrary code; it is not a nanoswap checkpoint (do not load it anywhere "
                f"unless you trust where it came from)")
        if 'Weights only load failed' in str(e):  # bytes the safe unpickler cannot read: garbage or a raw pickle
            die(f"cannot read checkpoint '{path}': corrupt, or a pickle the safe loader cannot read, so it was not "
                f"loaded (loading it otherwise could run arbitrary code: do not, unless you trust where it came from)")
        die(f"cannot read checkpoint '{path}': corrupt or not a nanoswap checkpoint "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})")
    if not isinstance(checkpoint, dict) or checkpoint.get('format') != CKPT_FORMAT:
        die(f"'{path}' is not a nanoswap checkpoint (no format '{CKPT_FORMAT}')")
    if isinstance(checkpoint.get('model_args'), dict):  # flags saved under an older name read as today's
        checkpoint['model_args'] = upgrade_args(checkpoint['model_args'])
    return checkpoint


def runtime_args(trained, settings):
    """A trained model's flags with this run's value of each RUNTIME_FLAGS flag the run set (settings.given),
    and of dropout, a training choice. A RoPE scaling stretches from the length the model was trained at."""
    args = dict(trained)
    for k in RUNTIME_FLAGS:
        if k in getattr(settings, 'given', ()) or (k == 'dropout' and k in settings):
            args[k] = settings[k]
    if args.get('rope_scaling') and args.get('rope_original_length') is None \
            and args['block_size'] != trained['block_size']:
        args['rope_original_length'] = trained['block_size']
    return args


def build_model(args, state, where):
    """GPT(args) holding the weights of state (a learned position table cut to a shorter block_size)."""
    try:
        model = GPT(GPTConfig(**args))
    except (TypeError, ValueError) as e:
        die(f"{where}: {str(e).splitlines()[0]}")
    wpe = state.get('transformer.wpe.weight')
    if wpe is not None and wpe.size(0) != model.config.block_size:
        if model.config.block_size > wpe.size(0):
            die(f"block_size {model.config.block_size} is past the {wpe.size(0)} learned positions of {where}; "
                f"only RoPE models (pos='rope') run longer")
        state = {**state, 'transformer.wpe.weight': wpe[:model.config.block_size]}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        die(f"{where} does not hold a model this code can build: {str(e).splitlines()[0]}")
    return model


def model_from_checkpoint(checkpoint, path='checkpoint', settings=None):
    """The checkpoint's model; with a run's settings, its runtime flags as runtime_args gives them."""
    args = checkpoint.get('model_args')
    if not isinstance(args, dict) or not isinstance(checkpoint.get('model'), dict):
        die(f"checkpoint '{path}' does not hold a model (no model_args or weights)")
    model = build_model(runtime_args(args, settings) if settings is not None else args, checkpoint['model'],
                        f"checkpoint '{path}'")
    if isinstance(checkpoint.get('hf_family'), str):
        model.hf_family = checkpoint['hf_family']
    return model


def load_pretrained(name_or_path, settings=None):
    """GPT.from_pretrained with one-line errors (unknown name, no network, unsupported architecture, a config.json
    that is not JSON or whose values are wrong, weights that do not fit it); with a run's settings, its runtime
    flags as runtime_args gives them."""
    try:
        import transformers
        from huggingface_hub import errors as hub_errors
    except ImportError:
        die("loading pretrained models needs transformers: pip install transformers")
    # transformers >= 5 checks a config's values itself (a string size, heads that do not divide the width)
    bad_value = getattr(hub_errors, 'StrictDataclassError', ValueError)
    where = f"pretrained model '{name_or_path}'"
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its many-line load report would bury our one line
    try:
        with warnings.catch_warnings():  # torch's note on a pickle's protocol would precede our one line
            warnings.filterwarnings('ignore', message='Detected pickle protocol')
            model = GPT.from_pretrained(name_or_path)
    except (OSError, ValueError, TypeError, KeyError, bad_value) as e:
        # a bad value in config.json; OSError also: no such model, no network, config.json not JSON
        die(f"cannot load {where}: {first_line(e)}")
    except pickle.UnpicklingError:  # torch.load(weights_only=True) stopped before anything in the file ran
        die(f"cannot load {where}: its .bin weights are not plain tensors (a damaged file, or a pickle holding "
            f"objects that weights_only loading refuses; nothing in it was run). Loading it another way could run "
            f"any code it holds: do not, unless you trust its source")
    except RuntimeError as e:
        if 'PytorchStreamReader' in str(e):  # a truncated or damaged zip, not a shape mismatch
            die(f"cannot load {where}: its .bin weights are damaged (truncated or not a torch file): "
                f"{str(e).split('.')[0]}")
        # the weights' shapes are not the ones config.json gives
        detail = '' if 'above report' in str(e) else f": {first_line(e)}"  # the report we silenced
        die(f"cannot load {where}: its weights do not fit its config.json (a vocab_size or size there differs "
            f"from the weights' shapes){detail}")
    finally:
        transformers.logging.set_verbosity(verbosity)
    trained = asdict(model.config)
    args = runtime_args(trained, settings) if settings is not None else trained
    if args == trained:
        return model
    rebuilt = build_model(args, model.state_dict(), f"'{name_or_path}'")
    rebuilt.hf_family = model.hf_family
    return rebuilt


def first_line(error):
    """An exception's first line, the fields of a config validation error included (for a one-line message)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = ' '.join(lines[:3]) if lines and lines[0].endswith(':') else (lines[0] if lines else type(error).__name__)
    return text[:300]


# ----------------------------------------------------------------------------- datasets: data/<dataset>/

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
    return examples, length


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


# ----------------------------------------------------------------------------- tokenizers

# source: what the text is encoded with, named in errors ("GPT-2's BPE (tried because 'DIR' holds no tokenizer)");
# guessed: GPT-2's BPE for a model that brings no tokenizer (worth a note)
Tokenizer = namedtuple('Tokenizer', 'encode decode vocab_size source guessed', defaults=(False,))
# the files a Hugging Face tokenizer is saved as: a model directory holding none of them has no tokenizer
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'vocab.json', 'tokenizer.model')


def load_tokenizer(meta_path=None, pretrained=None, name=''):
    """A Tokenizer from a dataset's meta.json (character level or tiktoken), a pretrained model's own
    Hugging Face tokenizer, or else GPT-2's BPE; name (a user's choice) overrides them all: 'gpt2' is tiktoken's
    BPE, anything else a Hugging Face tokenizer name or directory. vocab_size: ids 0..vocab_size-1 decode to
    text."""
    if name:
        return _tiktoken('gpt2', "GPT-2's BPE") if name == 'gpt2' else _hf_tokenizer(name, f"the tokenizer '{name}'")
    meta = {'kind': 'tiktoken', 'encoding': 'gpt2'}
    if meta_path is not None:
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            die(f"cannot read '{meta_path}': {e}")
        if not isinstance(meta, dict):
            die(f"'{meta_path}' is not a dataset's meta.json (not a JSON object); rerun the dataset's prepare.py")
    if meta.get('kind') == 'char':
        chars = meta.get('chars')
        if not isinstance(chars, list) or not chars or not all(isinstance(c, str) for c in chars):
            die(f"'{meta_path}' is a character vocabulary (kind 'char') without its 'chars' list of characters; "
                f"rerun the dataset's prepare.py")
        stoi = {c: i for i, c in enumerate(chars)}

        def encode(text):
            unknown = sorted(set(text) - stoi.keys())
            if unknown:
                die(f"characters not in the vocabulary of '{meta_path}': "
                    f"{' '.join(repr(c) for c in unknown)}")
            return [stoi[c] for c in text]
        return Tokenizer(encode, lambda ids: ''.join(chars[i] for i in ids), len(chars), f"'{meta_path}'")
    if meta.get('kind') == 'recall':
        return _recall_tokenizer(meta, meta_path)
    if meta.get('kind', 'tiktoken') != 'tiktoken':  # a task's own ids are no BPE text: never decode them as one
        die(f"'{meta_path}' has a vocabulary of kind {meta['kind']!r}, which no tokenizer here reads (kinds: 'char', "
            f"'tiktoken', 'recall')")
    if pretrained is not None and not pretrained.startswith('gpt2'):
        # a Llama checkpoint brings its own tokenizer (an export.py directory too); a bare GPT-2 one may not, and
        # transformers then makes an empty one that encodes any text to nothing
        missing = None
        if os.path.isdir(pretrained) and not any(os.path.exists(os.path.join(pretrained, f)) for f in TOKENIZER_FILES):
            missing = f"'{pretrained}' holds no tokenizer"
        else:
            try:
                return _hf_tokenizer(pretrained, f"the tokenizer of '{pretrained}'", required=False)
            except LookupError:
                missing = f"no tokenizer was found with '{pretrained}'"
        return _tiktoken('gpt2', f"GPT-2's BPE (tried because {missing})")._replace(guessed=True)
    return _tiktoken(meta.get('encoding', 'gpt2'), f"tiktoken's {meta.get('encoding', 'gpt2')!r}")


def _recall_tokenizer(meta, meta_path):
    """data/recall's ids as names, each followed by a space: '.' the filler, k<i> the i-th key, v<i> the i-th
    value."""
    vocabulary = meta.get('vocabulary') or {}
    try:
        (k_lo, k_hi), (v_lo, v_hi) = vocabulary['keys'], vocabulary['values']
        names = {vocabulary['filler']: '.'}
    except (KeyError, TypeError, ValueError):
        die(f"'{meta_path}' is a recall vocabulary without its 'vocabulary' (filler, keys, values); rerun "
            f"python data/recall/prepare.py")
    names.update({i: f'k{i - k_lo}' for i in range(k_lo, k_hi)})
    names.update({i: f'v{i - v_lo}' for i in range(v_lo, v_hi)})
    ids = {name: i for i, name in names.items()}

    def encode(text):
        unknown = [word for word in text.split() if word not in ids]
        if unknown:
            die(f"not names of the recall vocabulary of '{meta_path}' ('.', k0..k{k_hi - k_lo - 1}, "
                f"v0..v{v_hi - v_lo - 1}): {' '.join(unknown[:5])}")
        return [ids[word] for word in text.split()]
    # each name ends in its space: pieces decoded one after another (sample.py streams) read as the whole
    return Tokenizer(encode, lambda tokens: ''.join(names.get(i, f'<{i}>') + ' ' for i in tokens), meta['vocab_size'],
                     f"'{meta_path}'")


def _tiktoken(encoding, source):
    import tiktoken
    try:
        enc = tiktoken.get_encoding(encoding)
    except Exception as e:
        die(f"cannot load tiktoken encoding {encoding!r} ({type(e).__name__}); "
            f"offline, point TIKTOKEN_CACHE_DIR at a cache holding it")
    return Tokenizer(lambda text: enc.encode(text, allowed_special={'<|endoftext|>'}), enc.decode, enc.n_vocab, source)


def _hf_tokenizer(name, source, required=True):
    """A Hugging Face tokenizer; one that cannot load is an error line, or LookupError when not required."""
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:
        if not required:
            raise LookupError(name) from e
        die(f"cannot load the tokenizer '{name}' (a Hugging Face tokenizer name or directory, or 'gpt2'): "
            f"{first_line(e)}")

    def encode(text):
        try:  # special tokens on: a Llama prompt starts with its BOS token, as the model was trained
            return tok.encode(text)
        except Exception as e:  # e.g. a character vocabulary without an unknown token
            die(f"{source} cannot encode the prompt: {str(e).splitlines()[0][:200]}")
    return Tokenizer(encode, lambda ids: tok.decode(ids, skip_special_tokens=True), len(tok), source)


GPT2_FILES = 'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/'  # tiktoken's source and cache key


def hf_tokenizer(config):
    """A run's tokenizer as transformers loads it, from the run's config (a checkpoint's 'config'): its
    dataset's character vocabulary, GPT-2's BPE (tiktoken's own files), or the pretrained model's tokenizer;
    None when the run does not say."""
    dataset, init_from = config.get('dataset'), config.get('init_from')
    meta_path = os.path.join('data', dataset, 'meta.json') if dataset else None
    if meta_path and os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get('kind') == 'char' and not meta.get('chars'):
            raise ValueError(f"'{meta_path}' is a character vocabulary without its 'chars' list (rerun the "
                             f"dataset's prepare.py)")
        if meta.get('kind') == 'char':  # one token per character, joined back without spaces
            from tokenizers import Regex, Tokenizer as RawTokenizer, decoders, models, pre_tokenizers
            from transformers import PreTrainedTokenizerFast
            raw = RawTokenizer(models.WordLevel({c: i for i, c in enumerate(meta['chars'])}, unk_token=None))
            raw.pre_tokenizer = pre_tokenizers.Split(Regex(r'[\s\S]'), behavior='isolated')
            raw.decoder = decoders.Fuse()
            return PreTrainedTokenizerFast(tokenizer_object=raw)
        if meta.get('encoding') == 'gpt2':  # GPT-2's vocab.json and merges.txt are tiktoken's (cached) files
            import tempfile

            from tiktoken.load import read_file_cached
            from transformers import GPT2Tokenizer
            with tempfile.TemporaryDirectory() as d:
                for name, source in (('vocab.json', 'encoder.json'), ('merges.txt', 'vocab.bpe')):
                    with open(os.path.join(d, name), 'wb') as f:
                        f.write(read_file_cached(GPT2_FILES + source))
                return GPT2Tokenizer.from_pretrained(d)
    if init_from not in (None, 'scratch', 'resume'):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(init_from)
    return None


# ----------------------------------------------------------------------------- peak FLOP/s

# dense tensor-core peaks from the vendors' datasheets, by a substring of the device name: (bf16/fp16, tf32).
# fp32 runs with allow_tf32 (as train.py and bench.py set) use the TF32 peak; None: no such datasheet figure.
# The first match wins, so a variant's name ('H200 NVL') comes before its family's ('H200').
GPU_PEAK_FLOPS = [('H200 NVL', 835.5e12, 417.5e12), ('H200', 989e12, 494.7e12), ('H100 PCIe', 756e12, 378e12),
                  ('H100', 989e12, 494.7e12), ('A100', 312e12, 156e12), ('L40S', 362e12, 183e12),
                  ('A10G', 70e12, None), ('L4', 121e12, 60e12), ('4090', 165e12, None), ('3090', 71e12, None),
                  ('V100', 125e12, None), ('T4', 65e12, None), ('A6000', 155e12, None)]


def measure_matmul_flops(device, dtype=torch.float32, n=1024, seconds=0.3):
    """FLOP/s of a square matmul on this device, the best of repeated runs: the CPU's practical peak."""
    # own generator: measuring must not move the global RNG a resumed run restores
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        t0 = time.perf_counter()
        (a @ b).sum().item()
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def datasheet_peak(name, dtype):
    """The datasheet's dense FLOP/s for a GPU of this name in this dtype (fp32: TF32), or None."""
    for key, half, tf32 in GPU_PEAK_FLOPS:
        if key in name:
            return tf32 if dtype == 'float32' else half
    return None


def peak_flops(device, dtype='float32'):
    """(FLOP/s, where it came from) for the dtype that runs: a known GPU's datasheet peak, else a measured
    matmul (CPU, MPS, other GPUs, or a datasheet without that dtype)."""
    if device.startswith('cuda'):
        name = torch.cuda.get_device_name(torch.device(device))
        flops = datasheet_peak(name, dtype)
        if flops:
            return flops, f"datasheet of {name}, {'tf32' if dtype == 'float32' else dtype}"
    return measure_matmul_flops(device, DTYPES.get(dtype, torch.float32)), f"measured {dtype} matmul"
