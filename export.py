"""
Export a trained checkpoint as a Hugging Face transformers model:

    python export.py --out_dir=out-shakespeare-modern --hf_dir=hf-shakespeare-modern

A model loaded from a Hugging Face family (train.py --init_from=DIR, and every checkpoint after it) goes back to
that family; any other goes to the first family of hf.HF_FAMILIES that can carry every one of its flags (GPT-2's
block becomes GPT2LMHeadModel, the modern block LlamaForCausalLM, ...). --family=MODEL_TYPE chooses one where
several can (qwen3_next or qwen3_5_text). A flag the family cannot carry is refused with one line naming it,
and nothing is written. The run's tokenizer goes with it (a character vocabulary, GPT-2's BPE, or the pretrained
model's), so sample.py --init_from=hf_dir and transformers read the directory alone.

The directory is written aside and switched in whole: a failed or interrupted export leaves what was there.
An hf_dir that already holds a model is replaced only with --overwrite=True (the directory as a whole), and only
when it holds nothing but a Hugging Face export; one holding anything else (a dataset, notes, a subfolder,
checkpoints at any depth) is refused. to_hf(model) gives the transformers model in memory.
"""

import glob
import json
import os
import re
import shutil
import sys

# model (and so torch) is imported where it is used: the CLI's --help and typos answer before torch loads


def hf_family(config):
    """The family that represents config: the first of hf.HF_FAMILIES that carries every flag; else ValueError,
    one line saying why none can (hf.refusal: the flags no family carries, or the families that carry the model's
    unusual flags and what else they need)."""
    from hf import HF_FAMILIES, refusal
    for family in HF_FAMILIES.values():
        if not family.blocking(config):
            return family
    raise ValueError(refusal(config))


def pick_family(model, family=None):
    """The family model exports to: `family` (a model_type of hf.HF_FAMILIES) when given; else the one it was
    loaded from (model.hf_family, kept in its checkpoints) while that can carry it; else the first that can.
    ValueError, one line, for an unknown family or one that cannot carry a flag of the model (named)."""
    from hf import HF_FAMILIES
    config = model.config
    if not family:
        origin = HF_FAMILIES.get(getattr(model, 'hf_family', None))
        return origin if origin is not None and not origin.blocking(config) else hf_family(config)
    if family not in HF_FAMILIES:
        raise ValueError(f"{family!r} is not a family (allowed: {', '.join(HF_FAMILIES)})")
    blocking = HF_FAMILIES[family].blocking(config)
    if blocking:
        able = [name for name, other in HF_FAMILIES.items() if not other.blocking(config)]
        raise ValueError(f"{family} cannot carry {', '.join(blocking)}"
                         + (f" (families that can: {', '.join(able)})" if able else ''))
    return HF_FAMILIES[family]


def to_hf(model, bos_token_id=None, eos_token_id=None, family=None):
    """The transformers model computing the same logits as our GPT (fp32, eval mode); its special token ids are
    the tokenizer's (by default GPT-2's <|endoftext|> where the vocabulary has it, else none). family: a model_type
    of hf.HF_FAMILIES, or None for pick_family's choice."""
    import torch
    import transformers

    from hf import ours_to_hf
    config = model.config
    family = pick_family(model, family)
    hf_class = getattr(transformers, family.hf_class)
    eot = 50256 if config.vocab_size > 50256 else None
    # the ids given win, then those the family writes (Qwen4-Exp's n-grams restart at the eos its weights were
    # learned with), then GPT-2's <|endoftext|>
    written = family.write_config(config)
    special = {k: v if v is not None else written.get(k, eot)
               for k, v in (('bos_token_id', bos_token_id), ('eos_token_id', eos_token_id))}
    hf = hf_class(hf_class.config_class(**{**written, **special}))
    hf_state = ours_to_hf(model, hf.state_dict(), family)
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    missing = [k for k in missing if not (config.tie_embeddings and k == 'lm_head.weight')
               and not k.endswith('.attn.bias')  # GPT-2's causal-mask buffer
               and not k.startswith(family.left_out or '\0')]  # what is no part of our model (a vision tower)
    if family.left_out:  # zeros, so that nothing random passes for weights
        with torch.no_grad():
            for name, tensor in hf.state_dict().items():
                if name.startswith(family.left_out):
                    tensor.zero_()
    if missing or unexpected:
        raise RuntimeError(f"export to {family.hf_class} left weights unmatched: missing {missing}, "
                           f"unexpected {unexpected}")
    if config.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


# what a Hugging Face export holds (save_pretrained of a model and its tokenizer), all that --overwrite may replace
_HF_FILES = re.compile(r'config\.json|generation_config\.json'
                       r'|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?'
                       r'|(tokenizer|tokenizer_config|special_tokens_map|added_tokens|vocab|chat_template)\.json'
                       r'|merges\.txt|vocab\.txt|tokenizer\.model|spiece\.model|sentencepiece\.bpe\.model'
                       r'|chat_template\.jinja')


def hf_dir_problem(hf_dir, overwrite):
    """Why export may not write hf_dir, or None. The directory is replaced whole, so it must be new or empty, or
    hold a Hugging Face export alone (a config.json naming a model_type or architectures, its weights, tokenizer
    and generation config: _HF_FILES) and --overwrite=True; anything else (a dataset: its meta.json and .bin
    files; notes; a subfolder; checkpoints at any depth, an out_dir) is never replaced."""
    if not os.path.exists(hf_dir):
        target = os.path.realpath(hf_dir)
        parent, name = os.path.split(target)
        asides = sorted(glob.glob(os.path.join(glob.escape(parent), f'.{glob.escape(name)}.old[0-9]*')))
        if asides:  # an export killed between its two renames (write_aside): the old model waits there
            return (f"is missing, and '{asides[0]}' holds the model an export cut off was replacing: move it back "
                    f"to '{hf_dir}' (or remove it), then export again")
        return None
    if not os.path.isdir(hf_dir):
        return "is a file, not a directory"
    names = sorted(os.listdir(hf_dir))
    if not names:
        return None
    checkpoints = _checkpoints(hf_dir)
    if checkpoints:
        return f"holds checkpoints ({', '.join(checkpoints)}), which export never replaces"
    others = [n + os.sep if os.path.isdir(os.path.join(hf_dir, n)) else n for n in names
              if os.path.isdir(os.path.join(hf_dir, n)) or not _HF_FILES.fullmatch(n)]
    held = ', '.join(others[:5]) + (f", ... ({len(others)} in all)" if len(others) > 5 else '')
    if not _holds_model(hf_dir):
        return f"holds files but no model ({held or ', '.join(names[:5])}): export into a new or empty directory"
    if others:
        return (f"holds a model and what export did not write ({held}), which --overwrite=True would delete: move "
                f"them out, or choose another hf_dir")
    if not overwrite:
        return "already holds a model: --overwrite=True replaces it (the directory whole), or choose another hf_dir"
    return None


def _checkpoints(directory, most=3, looked_at=10_000):
    """Up to `most` checkpoint files (*.pt, *.pth) at any depth below directory, as paths in it; it stops looking
    after `looked_at` files (whatever else is there is refused anyway)."""
    found, seen = [], 0
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            seen += 1
            if name.endswith(('.pt', '.pth')):
                found.append(os.path.relpath(os.path.join(root, name), directory))
            if len(found) == most or seen == looked_at:
                return found
    return found


def _holds_model(directory):
    """Whether directory's config.json is a transformers model's: a JSON object naming a model_type or
    architectures."""
    try:
        with open(os.path.join(directory, 'config.json')) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get('model_type') or config.get('architectures'))


def write_aside(hf, tokenizer, hf_dir):
    """Save model and tokenizer into a fresh directory beside hf_dir, then switch it in for whatever hf_dir held:
    a failure or an interrupt before the switch leaves hf_dir as it was, and removes the new one."""
    from common.errors import critical, die
    from common.files import tmp_path
    target = os.path.realpath(hf_dir)  # a link to the directory stays one
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    fresh, old = tmp_path(target), os.path.join(parent, f'.{name}.old{os.getpid()}')
    try:
        for leftover in (fresh, old):  # a crashed export of an earlier process with this pid
            shutil.rmtree(leftover, ignore_errors=True)
        os.mkdir(fresh)
        hf.save_pretrained(fresh)
        if tokenizer is not None:
            tokenizer.save_pretrained(fresh)
        if not os.path.isfile(os.path.join(fresh, 'config.json')):
            die(f"nothing was written to hf_dir '{hf_dir}'", code=1)
        # transformers writes model.safetensors 0600 (a temporary file's mode): each file as config.json, whose
        # mode is the umask's, so a shared model folder is readable by whoever can read its config
        mode = os.stat(os.path.join(fresh, 'config.json')).st_mode & 0o777
        for file in os.listdir(fresh):
            if os.path.isfile(os.path.join(fresh, file)):
                os.chmod(os.path.join(fresh, file), mode)
        with critical():  # both renames, or an interrupt waits
            if os.path.exists(target):
                os.rename(target, old)
            try:
                os.rename(fresh, target)
            except OSError:
                if os.path.exists(old):
                    os.rename(old, target)
                raise
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        die(f"cannot write hf_dir '{hf_dir}': {e.strerror or e}; what it held is unchanged", code=1)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def main(out_dir, hf_dir, family='', overwrite=False):
    from common.checkpoints import load_checkpoint, model_from_checkpoint
    from common.errors import catch_interrupts, die
    from common.tokenizer import hf_tokenizer
    catch_interrupts()
    if not hf_dir:
        die("hf_dir is required: python export.py --out_dir=DIR --hf_dir=DIR2")
    problem = hf_dir_problem(hf_dir, overwrite)
    if problem:
        die(f"hf_dir '{hf_dir}' {problem}")
    held = os.path.isdir(hf_dir) and bool(os.listdir(hf_dir))
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    checkpoint = load_checkpoint(ckpt_path)
    model = model_from_checkpoint(checkpoint, ckpt_path)
    try:
        chosen = pick_family(model, family)
    except ValueError as e:
        die(f"cannot export '{ckpt_path}': {f'--family={e}' if family else e}")
    origin = getattr(model, 'hf_family', None)
    if not family and origin and origin != chosen.model_type:
        from hf import HF_FAMILIES
        why = (f"cannot carry {', '.join(HF_FAMILIES[origin].blocking(model.config))}" if origin in HF_FAMILIES
               else "this code does not know")
        print(f"note: the model was loaded from {origin}, which {why}; exporting to {chosen.model_type}",
              file=sys.stderr)
    dropped = chosen.dropped(model.config)
    if dropped:  # a loss term or a schedule: the state dict is the plain model's, the logits the same without them
        print(f"note: {', '.join(dropped)} shaped training alone (no weight, the same logits): {chosen.model_type} "
              f"goes without", file=sys.stderr)
    without = 'its run names none'  # why the directory gets no tokenizer, said with the result
    try:
        tokenizer = hf_tokenizer(checkpoint.get('config') or {})
    except Exception as e:  # a tokenizer we cannot rebuild must not stop the model's export
        without = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else type(e).__name__
        print(f"note: no tokenizer exported ({without}); sample.py --init_from={hf_dir} will need "
              f"--tokenizer=NAME_OR_DIR", file=sys.stderr)
        tokenizer = None
    try:
        hf = to_hf(model, *((tokenizer.bos_token_id, tokenizer.eos_token_id) if tokenizer else ()),
                   family=chosen.model_type)
    except ValueError as e:
        die(f"cannot export '{ckpt_path}': {e}")
    except ImportError:
        die("export needs transformers: pip install transformers")
    write_aside(hf, tokenizer, hf_dir)
    print(f"wrote {type(hf).__name__} ({model.get_num_params() / 1e6:.2f}M parameters) "
          f"{'with its tokenizer' if tokenizer else f'without a tokenizer ({without})'} to {hf_dir}"
          f"{' (replacing the model it held)' if held else ''}")


if __name__ == '__main__':
    from configurator import configure, settings_of
    out_dir = 'out'  # where train.py wrote ckpt.pt
    hf_dir = ''  # where to write the transformers model (required)
    family = ''  # a Hugging Face model_type (qwen3_5_text, llama, ...); '': the model's own, else the first that can
    overwrite = False  # replace a model hf_dir already holds
    cfg = configure(settings_of(globals()), sys.argv[1:], prog='export.py', doc=__doc__)
    main(cfg['out_dir'], cfg['hf_dir'], cfg['family'], cfg['overwrite'])
