"""
The engine every Hugging Face family runs on: the record a family fills in (HFFamily), the registry export tries
in order (HF_FAMILIES: each module of this package adds its families at its bottom, hf/__init__.py imports them
in that order), the transforms a name table's rows name, the weights both ways (hf_to_ours, ours_to_hf),
from_pretrained, and why no family can represent a config (refusal).
"""

from dataclasses import dataclass, fields

import torch

from chapters import GPT, TRAINING_FLAGS, GPTConfig
from chapters.long_context import ROPE_SCALINGS  # noqa: F401  (hf.shared reads it from here)

# One entry per transformers architecture: the flag values it can carry (every other flag must keep its
# default), its config read into our flags and written back, and one name table used both ways.
# A table row is (our name, HF name or names, how): several HF names are concatenated along dim 0 in our
# tensor (q, k, v into c_attn; gate, up into c_fc); `how` names a transform of _TRANSFORMS ('T': GPT-2's Conv1D
# matrices are transposed; 'rope_q', 'rope_kv': DeepSeek's rotated rows reordered). {i} is the layer, {b}
# 'weight' or 'bias'; rows whose tensor a model does not have are skipped.

ANY = None  # in a family's `carries`: any value of that flag
_MOE_SETTINGS = ('n_expert', 'n_expert_active', 'moe_hidden', 'n_shared_expert', 'shared_expert_gate', 'router',
                 'router_norm_topk',
                 'n_expert_group', 'topk_group', 'routed_scaling', 'first_dense_layers', 'moe_aux_loss_coef',
                 'moe_z_loss_coef', 'moe_bias_update_rate',
                 'moe_scale_input', 'moe_every')  # Llama 4's: as the other MoE settings, a dense model's change nothing
_DEFAULTS = GPTConfig.__dataclass_fields__
HF_FAMILIES = {}  # model_type -> HFFamily, in the order export tries them: the first that carries every flag is used


@dataclass
class HFFamily:
    model_type: str
    hf_class: str  # the transformers class export builds
    carries: dict  # flag -> tuple of values it can represent, ANY, or a test (value -> bool)
    names: list  # the name table
    read_config: callable  # HF config -> our flags
    write_config: callable  # GPTConfig -> HF config kwargs
    # HF state -> the same with packed tensors split under names of their parts, and back: for a family whose
    # one tensor holds parts of several of ours (Qwen3-Next's q_proj holds q and the output gate)
    unpack: callable = None  # (hf_state, config) -> hf_state
    pack: callable = None  # (hf_state, config) -> hf_state
    # flags that, as the MoE settings, a dense model of this family leaves at their defaults and an MoE model must
    # set as `carries` says (HY-V4's experts' clamp: its dense layers have none)
    moe_only: tuple = ()
    # the transformers auto class that loads a checkpoint of it (GLM-5.3-Flash's text generation class is
    # image-text-to-text: AutoModelForImageTextToText)
    auto_class: str = 'AutoModelForCausalLM'
    # prefixes of HF weights that are no part of our model, left out on import and left as transformers' class
    # builds them (zeros) on export: GLM-5.3-Flash's vision tower, which a text model never runs
    left_out: tuple = ()

    def blocked(self, config):
        """{flag: value} of config this family cannot represent (a dense model's MoE settings, which change
        nothing, aside, and the flags that shape training alone: dropped)."""
        out = {}
        for f in fields(config):
            if (f.name in _MOE_SETTINGS or f.name in self.moe_only) and config.mlp != 'moe':
                continue
            if f.name in TRAINING_FLAGS and f.name not in self.carries:
                continue
            value, allowed = getattr(config, f.name), self.carries.get(f.name, (f.default,))
            if allowed is not ANY and not (allowed(value) if callable(allowed) else value in allowed):
                out[f.name] = value
        return out

    def blocking(self, config):
        """The flags (name=value) of config this family cannot represent."""
        return [f"{name}={value!r}" for name, value in self.blocked(config).items()]

    def dropped(self, config):
        """The flags (name=value) of config that shape training alone (chapters.TRAINING_FLAGS: a loss term, a
        schedule) set away from their defaults, which this family does not write: the export goes without them."""
        return [f"{name}={getattr(config, name)!r}" for name in TRAINING_FLAGS if name not in self.carries
                and getattr(config, name) != _DEFAULTS[name].default]

    def needs(self, flag, value):
        """What this family takes for flag in place of value, in words: flag=v (or v2), or, where a test decides,
        flag other than value."""
        allowed = self._allowed(flag)
        return f"{flag} other than {value!r}" if callable(allowed) else f"{flag}={' or '.join(map(repr, allowed))}"

    def _allowed(self, flag):
        """The values this family carries for flag: `carries`' entry, else the flag's default alone."""
        return self.carries.get(flag, (_DEFAULTS[flag].default,))


_TRANSFORMS = {  # how -> (HF to ours, ours to HF), each (tensor, config) -> tensor; families add their own
    'T': (lambda t, c: t.t() if t.dim() == 2 else t, lambda t, c: t.t().contiguous() if t.dim() == 2 else t),
    '1+w': (lambda t, c: t + 1, lambda t, c: t - 1),  # Gemma's norm gains (1 + w)
}


def _rows(family, config):
    """(our name, HF names, how) for every concrete tensor name of this config's depth."""
    for ours, hf, how in family.names:
        hf = hf if isinstance(hf, tuple) else (hf,)
        for i in range(config.n_layer) if '{i}' in ours else [None]:
            for b in ('weight', 'bias') if '{b}' in ours else [None]:
                yield ours.format(i=i, b=b), tuple(h.format(i=i, b=b) for h in hf), how


def hf_to_ours(hf_state, model, family):
    """Our state dict from a transformers one; and the HF tensors nothing used (a feature we lack)."""
    ours = model.state_dict()
    if family.unpack:
        hf_state = family.unpack(hf_state, model.config)
    state, used = {}, set()
    for name, hf_names, how in _rows(family, model.config):
        if name not in ours or not all(h in hf_state for h in hf_names):
            continue
        tensor = torch.cat([hf_state[h] for h in hf_names]) if len(hf_names) > 1 else hf_state[hf_names[0]]
        state[name] = _TRANSFORMS[how][0](tensor, model.config) if how else tensor
        used.update(hf_names)
    if model.config.tie_embeddings:
        state['lm_head.weight'] = state['transformer.wte.weight']
        used.add('lm_head.weight')
    # causal-mask buffers of older GPT-2 checkpoints and rotary tables are not weights
    unused = {k for k in hf_state if k not in used and not k.endswith(('.attn.bias', '.attn.masked_bias', 'inv_freq'))
              and not k.startswith(family.left_out or '\0')}
    return state, unused


def ours_to_hf(model, hf_state, family):
    """A transformers state dict from ours, shaped like hf_state (the target model's own)."""
    out, ours = {}, model.state_dict()
    if family.unpack:
        hf_state = family.unpack(hf_state, model.config)
    for name, hf_names, how in _rows(family, model.config):
        if name not in ours or not all(h in hf_state for h in hf_names):  # a row of another layer kind
            continue
        tensor = ours[name].detach().clone()
        tensor = _TRANSFORMS[how][1](tensor, model.config) if how else tensor
        parts = tensor.split([hf_state[h].size(0) for h in hf_names]) if len(hf_names) > 1 else (tensor,)
        out.update(zip(hf_names, parts))
    # a family whose layers always have biases (GPT-2) gets zeros where our bias=False model has none
    out.update({k: torch.zeros_like(v) for k, v in hf_state.items() if k not in out and k.endswith('.bias')})
    return family.pack(out, model.config) if family.pack else out


def from_pretrained(name_or_path, override_args=None):
    """Our GPT holding a Hugging Face checkpoint (a hub name or a local directory) of one of HF_FAMILIES, in the
    config that computes the same logits (GPT.from_pretrained calls this)."""
    import transformers
    from transformers import AutoConfig
    override_args = dict(override_args or {})
    unknown = set(override_args) - {'dropout'}
    if unknown:
        raise ValueError(f"override_args may only set 'dropout', got {sorted(unknown)}")
    hf_config = AutoConfig.from_pretrained(name_or_path)
    if hf_config.model_type == 'qwen3_5':  # Qwen3.5's vision-language checkpoint: its text model (what
        hf_config = hf_config.text_config  # AutoModelForCausalLM loads of it)
    family = HF_FAMILIES.get(hf_config.model_type)
    if family is None:
        raise ValueError(f"{name_or_path}: model_type {hf_config.model_type!r} is not supported "
                         f"({', '.join(map(repr, HF_FAMILIES))})")
    model = GPT(GPTConfig(**{**family.read_config(hf_config), **override_args}))
    hf_state = getattr(transformers, family.auto_class).from_pretrained(name_or_path).state_dict()
    state, unused = hf_to_ours(hf_state, model, family)
    if unused:
        raise ValueError(f"{name_or_path}: weights this model has no place for: {sorted(unused)[:5]}")
    model.load_state_dict(state)
    # export goes back to this family by default (where several carry the same flags, as Qwen3-Next and
    # Qwen3.5 do, the flags alone cannot say); checkpoints carry it on (common.checkpoints.new_checkpoint)
    model.hf_family = family.model_type
    return model


def refusal(config):
    """Why no family of HF_FAMILIES can represent config, in one line: the flags none of them carries; else what
    keeps out the nearest family (the fewest flags it cannot carry; of equals, the first export tries): the flags
    it cannot carry that the model turns on, with the families nearest among those that carry them (all together
    where some do, else each apart) and what else those need; the flags left at their default, with what the
    nearest family needs instead."""
    blocked = {name: family.blocked(config) for name, family in HF_FAMILIES.items()}
    nowhere = [f"{flag}={value!r}" for flag, value in next(iter(blocked.values())).items()
               if all(flag in other for other in blocked.values())]
    if nowhere:
        return f"no Hugging Face family can represent this model: none carries {', '.join(nowhere)}"
    nearest = min(blocked, key=lambda name: len(blocked[name]))
    turned_on = {flag: value for flag, value in blocked[nearest].items() if value != _DEFAULTS[flag].default}
    together = _carried_by(turned_on, blocked) if turned_on else None
    clauses = [together] if together else [_carried_by({flag: value}, blocked) for flag, value in turned_on.items()]
    left = {flag: value for flag, value in blocked[nearest].items() if flag not in turned_on}
    if left:
        clauses.append(f"the nearest, {nearest}, cannot carry {', '.join(f'{k}={v!r}' for k, v in left.items())} "
                       f"(it needs {', '.join(HF_FAMILIES[nearest].needs(k, v) for k, v in left.items())})")
    return "no Hugging Face family can represent this model: " + '; '.join(clauses)


def _carried_by(flags, blocked):
    """'a=1, b=2 are carried by A and B, which also need ...': of the families that carry every one of flags, those
    with the fewest others to change (and the same ones); None where no family carries them all. blocked: each
    family's blocked flags."""
    carriers = sorted((name for name, other in blocked.items() if not set(flags) & set(other)),
                      key=lambda name: len(blocked[name]))
    if not carriers:
        return None
    needs = {name: [HF_FAMILIES[name].needs(k, v) for k, v in blocked[name].items()] for name in carriers}
    best = [name for name in carriers if needs[name] == needs[carriers[0]]]
    names = ' and '.join(best) if len(best) < 3 else f"{', '.join(best[:-1])} and {best[-1]}"
    return (f"{', '.join(f'{k}={v!r}' for k, v in flags.items())} {'is' if len(flags) == 1 else 'are'} carried by "
            f"{names}, which also need{'s' if len(best) == 1 else ''} {', '.join(needs[best[0]])}")
