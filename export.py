"""
Export a trained checkpoint as a Hugging Face transformers model:

    python export.py --out_dir=out-shakespeare-modern --hf_dir=hf-shakespeare-modern

The model goes to the first family of hf.HF_FAMILIES that can carry every one of its flags (GPT-2's
block becomes GPT2LMHeadModel, the modern block LlamaForCausalLM, ...). A flag no family can carry is
refused with one line naming it, and nothing is written. The run's tokenizer goes with it (a character
vocabulary, GPT-2's BPE, or the pretrained model's), so sample.py --init_from=hf_dir and transformers read
the directory alone. to_hf(model) gives the transformers model in memory.
"""

import os
import sys

# model (and so torch) is imported where it is used: the CLI's --help and typos answer before torch loads


def hf_family(config):
    """The family that represents config, or ValueError naming the flags that keep it out of each."""
    from hf import HF_FAMILIES
    blocked = {}
    for name, family in HF_FAMILIES.items():
        flags = family.blocking(config)
        if not flags:
            return family
        blocked[name] = flags
    # the families that need the fewest changes are the most useful advice
    closest = sorted(blocked.items(), key=lambda item: len(item[1]))[:2]
    raise ValueError("no Hugging Face family can represent " + '; '.join(
        f"{name} cannot carry {', '.join(flags)}" for name, flags in closest))


def to_hf(model, bos_token_id=None, eos_token_id=None, family=None):
    """The transformers model computing the same logits as our GPT (fp32, eval mode); its special token ids are
    the tokenizer's (by default GPT-2's <|endoftext|> where the vocabulary has it, else none). family: a model_type
    of hf.HF_FAMILIES where several can carry the model (qwen3_next or qwen3_5_text); None: the first that can."""
    import transformers

    from hf import HF_FAMILIES, ours_to_hf
    config = model.config
    if family is not None:
        blocking = HF_FAMILIES[family].blocking(config)
        if blocking:
            raise ValueError(f"{family} cannot carry {', '.join(blocking)}")
    family = hf_family(config) if family is None else HF_FAMILIES[family]
    hf_class = getattr(transformers, family.hf_class)
    eot = 50256 if config.vocab_size > 50256 else None
    special = dict(bos_token_id=eot if bos_token_id is None else bos_token_id,
                   eos_token_id=eot if eos_token_id is None else eos_token_id)
    hf = hf_class(hf_class.config_class(**{**family.write_config(config), **special}))
    hf_state = ours_to_hf(model, hf.state_dict(), family)
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    missing = [k for k in missing if not (config.tie_embeddings and k == 'lm_head.weight')
               and not k.endswith('.attn.bias')]  # GPT-2's causal-mask buffer
    if missing or unexpected:
        raise RuntimeError(f"export to {family.hf_class} left weights unmatched: missing {missing}, "
                           f"unexpected {unexpected}")
    if config.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def main(out_dir, hf_dir):
    from common import catch_interrupts, die, hf_tokenizer, load_checkpoint, model_from_checkpoint
    catch_interrupts()
    if not hf_dir:
        die("hf_dir is required: python export.py --out_dir=DIR --hf_dir=DIR2")
    if os.path.exists(hf_dir) and not os.path.isdir(hf_dir):
        die(f"hf_dir '{hf_dir}' is a file, not a directory")
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    checkpoint = load_checkpoint(ckpt_path)
    model = model_from_checkpoint(checkpoint, ckpt_path)
    without = 'its run names none'  # why the directory gets no tokenizer, said with the result
    try:
        tokenizer = hf_tokenizer(checkpoint.get('config') or {})
    except Exception as e:  # a tokenizer we cannot rebuild must not stop the model's export
        without = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else type(e).__name__
        print(f"note: no tokenizer exported ({without}); sample.py --init_from={hf_dir} will need "
              f"--tokenizer=NAME_OR_DIR", file=sys.stderr)
        tokenizer = None
    try:
        hf = to_hf(model, *((tokenizer.bos_token_id, tokenizer.eos_token_id) if tokenizer else ()))
    except ValueError as e:
        die(f"cannot export '{ckpt_path}': {e}")
    except ImportError:
        die("export needs transformers: pip install transformers")
    try:
        hf.save_pretrained(hf_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(hf_dir)
    except OSError as e:
        die(f"cannot write hf_dir '{hf_dir}': {e.strerror or e}")
    if not os.path.isfile(os.path.join(hf_dir, 'config.json')):
        die(f"nothing was written to hf_dir '{hf_dir}'", code=1)
    print(f"wrote {type(hf).__name__} ({model.get_num_params() / 1e6:.2f}M parameters) "
          f"{'with its tokenizer' if tokenizer else f'without a tokenizer ({without})'} to {hf_dir}")


if __name__ == '__main__':
    from configurator import configure, settings_of
    out_dir = 'out'  # where train.py wrote ckpt.pt
    hf_dir = ''  # where to write the transformers model (required)
    cfg = configure(settings_of(globals()), sys.argv[1:], prog='export.py', doc=__doc__)
    main(cfg['out_dir'], cfg['hf_dir'])
