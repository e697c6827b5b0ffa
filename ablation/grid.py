"""The grid: train.py's base recipe, the variants of the grid's groups (each flag set once), and what makes a run
one: its train.py arguments and its directory."""

import hashlib
import json
import os
import re
import shlex
import sys

from ablation.files import TRAIN_PY, read_json
from ablation.groups import base_vocab, group_members, model_args
from chapters import GPTConfig
from common.errors import die
from configurator import configure, script_defaults


def base_recipe(cwd, settings):
    """train.py's settings for train_config and train_args, read as train.py would in run_dir."""
    train_config, train_args = settings['train_config'], settings['train_args']
    try:
        argv = [train_config] + shlex.split(train_args)
    except ValueError as e:
        die(f"train_args {train_args!r}: {e}")
    here = os.getcwd()
    os.chdir(cwd)  # recipes exec() the files they build on by relative path
    try:
        return configure(script_defaults(TRAIN_PY), argv, prog='train.py')
    finally:
        os.chdir(here)


def build_grid(base, settings, where=''):
    """{name: flags} in grid order; a flag set already present (e.g. mlp=gelu is vanilla) runs once. where: what
    the errors add after a variant's name (the miniseries' depth)."""
    variants, names_by_key = {}, {}
    in_train_args = {a[2:].partition('=')[0] for a in shlex.split(settings['train_args']) if a.startswith('--')}
    for group in [g.strip() for g in settings['grid'].split(',') if g.strip()] or die("grid is empty"):
        try:  # a builder sizes some members on a model (widened MLPs): a recipe that cannot hold them is one line
            members = group_members(group, base, settings)
        except ValueError as e:
            die(f"grid group {group!r}{where}: {e}")
        for name, flags in members:
            name = re.sub(r'[^A-Za-z0-9._+=-]', '_', name).strip('.') or '_'  # a directory name
            # a flag at the base recipe's value changes nothing
            key = repr(sorted((k, v) for k, v in flags.items() if base.get(k, ...) != v))
            if key in names_by_key:
                if names_by_key[key] != name:
                    print(f"{name} has the flags of {names_by_key[key]}: it runs once, as {names_by_key[key]}")
                continue
            if name in variants:
                die(f"variant name {name!r} stands for two different flag sets")
            both = sorted(in_train_args & set(flags))
            if both:  # train_args come last and would win, under the variant's name
                die(f"train_args set {', '.join(both)}, which variant {name!r} sets itself; leave it to the variants")
            variants[name], names_by_key[key] = flags, name
    variants = chosen_members(variants, settings.get('members', ''))
    check_variants(base, variants, settings, where)
    return variants


def chosen_members(variants, members):
    """The variants `members` names (all for ''), in grid order; a name the grid lacks is one line."""
    names = [m.strip() for m in members.split(',') if m.strip()]
    unknown = [n for n in names if n not in variants]
    if unknown:
        die(f"members {', '.join(map(repr, unknown))} are not in the grid; its variants are {', '.join(variants)}")
    return {name: flags for name, flags in variants.items() if not names or name in names}


def check_variants(base, variants, settings, where=''):
    """Each variant's model config, built once before any run trains (as train.py will build it): the first that
    fails is one line naming the variant, not a failure per run after launch."""
    for name, flags in variants.items():
        recipe = {**base, **flags}
        try:
            GPTConfig(**model_args(recipe), vocab_size=base_vocab(recipe, settings))
        except ValueError as e:
            die(f"variant {name!r}{where}: {e}")


def flag_args(flags):
    return [f'--{k}={v!r}' for k, v in flags.items()]  # repr: read back as the same literal


def run_args(flags, seed, settings):
    """train.py's arguments but out_dir: what makes two runs the same. seed last, so train_args cannot move it."""
    return ([settings['train_config']] + flag_args(flags) + shlex.split(settings['train_args'])
            + [f'--seed={seed}', '--wandb_log=False'])


def run_path(out, name, flags, seed, settings):
    """runs/<variant>/seed<seed>; a run finished there with other arguments (another train_args) is kept,
    and this one goes beside it, named by a hash of its arguments."""
    path = os.path.join(out, 'runs', name, f'seed{seed}')
    done = os.path.join(path, 'done.json')
    if os.path.exists(done) and read_json(done)['args'] != run_args(flags, seed, settings):
        digest = hashlib.sha1(json.dumps(run_args(flags, seed, settings)).encode()).hexdigest()[:8]
        path = f'{path}-{digest}'
    return path


def shell_quote(arg):
    return arg if re.fullmatch(r'[\w@%+=:,./-]+', arg) else '"' + re.sub(r'(["\\$`])', r'\\\1', arg) + '"'


def ablate_command():
    """This invocation as a command to paste (each run keeps it in its done.json: a report may hold runs of several)."""
    return ' '.join(['python ablate.py'] + [shell_quote(a) for a in sys.argv[1:]])


def made_here(done, settings):
    """Whether a finished run was made with this invocation's train_config and train_args."""
    base = [a for a in done['args'] if a not in flag_args(done['flags'])]
    return base == run_args({}, done['seed'], settings)

