"""
Export a trained checkpoint as a Hugging Face transformers model:

    python export.py --out_dir=out-shakespeare-modern --hf_dir=hf-shakespeare-modern

The model goes to the first family of model.HF_FAMILIES that can carry every one of its flags (GPT-2's
block becomes GPT2LMHeadModel, the modern block LlamaForCausalLM, ...). A flag no family can carry is
refused with one line naming it, and nothing is written. to_hf(model) gives the transformers model in memory.
"""

import os
import sys

# model (and so torch) is imported where it is used: the CLI's --help and typos answer before torch loads


def hf_family(config):
    """The family that represents config, or ValueError naming the flags that keep it out of each."""
    from model import HF_FAMILIES
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


def to_hf(model):
    """The transformers model computing the same logits as our GPT (fp32, eval mode)."""
    import transformers

    from model import ours_to_hf
    config = model.config
    family = hf_family(config)
    hf_class = getattr(transformers, family.hf_class)
    hf = hf_class(hf_class.config_class(**family.write_config(config)))
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


if __name__ == '__main__':
    from configurator import configure, settings_of
    out_dir = 'out'  # where train.py wrote ckpt.pt
    hf_dir = ''  # where to write the transformers model (required)
    cfg = configure(settings_of(globals()), sys.argv[1:], prog='export.py', doc=__doc__)
    from common import die, load_checkpoint, model_from_checkpoint
    if not cfg['hf_dir']:
        die("hf_dir is required: python export.py --out_dir=DIR --hf_dir=DIR2")
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    model = model_from_checkpoint(load_checkpoint(ckpt_path), ckpt_path)
    try:
        hf = to_hf(model)
    except ValueError as e:
        die(f"cannot export '{ckpt_path}': {e}")
    except ImportError:
        die("export needs transformers: pip install transformers")
    try:
        hf.save_pretrained(cfg['hf_dir'])
    except OSError as e:
        die(f"cannot write hf_dir '{cfg['hf_dir']}': {e.strerror or e}")
    print(f"wrote {type(hf).__name__} ({model.get_num_params() / 1e6:.2f}M parameters) to {cfg['hf_dir']}")
