"""Checkpoints: our format, saved atomically (and kept under a second name), loaded safely; the model a checkpoint
or a pretrained Hugging Face name holds, with a run's runtime flags."""

import os
import pickle
import shutil
import warnings
from dataclasses import asdict

import torch

from common.errors import critical, die, first_line
from common.files import tmp_path
from chapters import GPT, RUNTIME_FLAGS, GPTConfig
from configurator import upgrade_args

CKPT_FORMAT = 'nanoswap-ckpt-1'


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
