"""What lets a train.py run stop and go on: its out_dir claimed, ckpt.pt read back (a training state of this run's
optimizer and vocabulary, and where the run stood), the optimizer state and the generators restored, the state
gathered for a save (FSDP's too), and a line naming the checkpoints kept."""

import json
import os

import torch

from common.checkpoints import load_checkpoint
from common.errors import die
from common.files import claim_out_dir


def claim_run_dir(out_dir, init_from, eval_only):
    """out_dir for this process alone; a new run there must not bury a trained one, and a log without a
    checkpoint (a run that saved nothing) moves aside, never lost."""
    claim_out_dir(out_dir)  # held until the process ends
    log_path = os.path.join(out_dir, 'log.jsonl')
    if init_from != 'resume':
        held = [name for name in ('ckpt.pt', 'best.pt') if os.path.exists(os.path.join(out_dir, name))]
        if held:
            die(f"out_dir '{out_dir}' already holds a run ({held[0]}); continue (or evaluate) it with "
                f"--init_from=resume, or start over with another out_dir (or delete this one)")
        if os.path.isfile(log_path):
            n = 1
            while os.path.exists(os.path.join(out_dir, f'log.{n}.jsonl')):
                n += 1
            os.replace(log_path, os.path.join(out_dir, f'log.{n}.jsonl'))
            print(f"note: out_dir '{out_dir}' held a log.jsonl without a checkpoint: moved it to log.{n}.jsonl")
    stale = os.path.join(out_dir, 'diverged.json')  # what the last run said when it stopped
    if os.path.exists(stale) and not eval_only:
        os.remove(stale)


def training_checkpoint(ckpt_path, out_dir, optimizer, fsdp, dataset, meta, master):
    """ckpt.pt, with the training state a resume needs, trained with this run's optimizer and vocabulary."""
    checkpoint = load_checkpoint(ckpt_path, hint=f"train first with init_from='scratch' into out_dir '{out_dir}'")
    if not all(k in checkpoint for k in ('optimizer', 'iter_num', 'best_val_loss', 'rng')):
        die(f"checkpoint '{ckpt_path}' has no training state (optimizer, iteration): it can be sampled or "
            f"exported, not resumed")
    trained_with = 'muon' if set(checkpoint['optimizer']) == {'adamw', 'muon'} else 'adamw'
    if trained_with == 'muon' and fsdp:
        die(f"checkpoint '{ckpt_path}' was trained with optimizer='muon', which cannot run with fsdp=True: resume "
            f"it under DDP (fsdp=False) with --optimizer=muon")
    if trained_with != optimizer:
        die(f"checkpoint '{ckpt_path}' was trained with optimizer={trained_with!r}: resume with "
            f"--optimizer={trained_with}")
    check_same_vocabulary(checkpoint, dataset, meta, master)
    return checkpoint


def check_same_vocabulary(checkpoint, dataset, meta, master):
    """Resuming on another dataset: its token ids must mean the same text as the checkpoint's dataset's."""
    trained_on = (checkpoint.get('config') or {}).get('dataset', dataset)
    if trained_on == dataset:
        return
    trained_meta = checkpoint.get('meta')
    if trained_meta is None:
        trained_meta = saved_meta(trained_on)
    vocabulary = lambda m: tuple(m.get(k) for k in ('kind', 'chars', 'encoding', 'vocab_size'))
    if isinstance(trained_meta, dict) and vocabulary(trained_meta) != vocabulary(meta):
        die(f"dataset '{dataset}' has another vocabulary than '{trained_on}', which the checkpoint trained on: its "
            f"token ids would mean other text (resume with --dataset={trained_on})")
    if master:
        print(f"note: resuming on dataset '{dataset}'; the checkpoint trained on '{trained_on}'"
              f"{'' if trained_meta else ' (whose vocabulary is unknown here)'}")


def check_same_data(checkpoint, ckpt_path, dataset, meta, on_new_data, eval_only, master):
    """Resuming on a dataset of the checkpoint's name whose files are not the ones it trained on (the sha256 its
    meta.json recorded: prepared again, with other settings or another seed): its val loss is another val set's, so
    a best from the old one would decide best.pt. Refused in one line unless on_new_data: then the best starts over
    (best.pt moved aside). eval_only evaluates on it, saying so."""
    trained_on, old = (checkpoint.get('config') or {}).get('dataset', dataset), checkpoint.get('meta')
    if trained_on != dataset or not isinstance(old, dict) or not old.get('sha256') \
            or old['sha256'] == meta.get('sha256'):
        return
    before, now, hashes = old.get('settings') or {}, meta.get('settings') or {}, meta.get('sha256') or {}
    changes = [f"{k} {before.get(k)} -> {now.get(k)}" for k in sorted(set(before) | set(now))
               if before.get(k) != now.get(k)]
    files = [name for name in sorted(set(old['sha256']) | set(hashes)) if old['sha256'].get(name) != hashes.get(name)]
    what = (f"dataset '{dataset}' was prepared again since '{ckpt_path}' trained on it "
            f"({', '.join(changes) or 'the same settings'}; {', '.join(files)} differ)")
    if eval_only:
        if master:
            print(f"note: {what}: evaluating on the new data")
        return
    if not on_new_data:
        die(f"{what}: its val loss is not the checkpoint's val set's; continue on it with --resume_on_new_data=True "
            f"(the best val loss starts over), or train into a new out_dir")
    checkpoint['best_val_loss'], checkpoint['best_iter'] = float('inf'), None
    if not master:
        return
    folder = os.path.dirname(ckpt_path)
    aside = ''
    if os.path.exists(os.path.join(folder, 'best.pt')):  # the old data's best: kept, not replaced by the new's
        n = 1
        while os.path.exists(os.path.join(folder, f'best.{n}.pt')):
            n += 1
        aside = os.path.join(folder, f'best.{n}.pt')
        os.replace(os.path.join(folder, 'best.pt'), aside)
    print(f"note: {what}: resuming on the new data, the best val loss starting over"
          + (f"; the old data's best.pt moved to {aside}" if aside else ''))


def saved_meta(name):
    """data/<name>/meta.json if it can be read, else None (an old checkpoint saved no copy of it)."""
    try:
        with open(os.path.join('data', name, 'meta.json')) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_position(checkpoint, block_size):
    """Where the run stands: (iter_num, best_val_loss, elapsed_s before, tokens seen, last_saved, best_saved,
    evaluated), a new run's or a resumed checkpoint's; last_saved and best_saved are (iter, val loss) of ckpt.pt and
    best.pt, evaluated the last iteration evaluated and logged. block_size: the checkpoint's, for the token count of
    an old one that carries none."""
    if not checkpoint:
        return 0, float('inf'), 0.0, 0, None, None, None
    iter_num, best_val_loss = checkpoint['iter_num'], checkpoint['best_val_loss']
    last_saved = (iter_num, checkpoint.get('val_loss', best_val_loss))
    best_saved = (checkpoint['best_iter'], best_val_loss) if checkpoint.get('best_iter') is not None else None
    # an interrupt's checkpoint may be of an iteration not evaluated yet; older checkpoints carry no flag
    evaluated = iter_num if checkpoint.get('eval_done', True) else None
    trained_config = checkpoint.get('config') or {}  # older checkpoints carry no token count
    tokens = checkpoint.get('tokens', iter_num * trained_config.get('gradient_accumulation_steps', 0)
                            * trained_config.get('batch_size', 0) * block_size)
    return iter_num, best_val_loss, checkpoint.get('elapsed_s', 0.0), tokens, last_saved, best_saved, evaluated


def load_optimizer_state(model, optim, state, fsdp, ckpt_path):
    """The checkpoint's optimizer state (keyed by position) into optim (FSDP's is keyed by parameter name)."""
    try:
        if not fsdp:
            return optim.load_state_dict(state)
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                             set_optimizer_state_dict)
        full = StateDictOptions(full_state_dict=True)
        names = [n for g in get_optimizer_state_dict(model, optim, options=full)['param_groups'] for n in g['params']]
        set_optimizer_state_dict(model, optim, {
            'state': {names[i]: v for i, v in state['state'].items()},
            'param_groups': [{**g, 'params': [names[i] for i in g['params']]} for g in state['param_groups']]},
            options=full)
    except (ValueError, RuntimeError, KeyError, IndexError) as e:
        die(f"checkpoint '{ckpt_path}' holds optimizer state for another model: {str(e).splitlines()[0][:200]}")


def restore_generators(rng, device):
    """The random generators as the checkpoint saved them (rank 0's: other ranks keep the streams they seeded)."""
    torch.set_rng_state(rng['torch'])
    if device.startswith('cuda') and rng.get('cuda'):
        torch.cuda.set_rng_state(rng['cuda'], device)


def generator_states(device):
    """The random generators' states, as a checkpoint saves them."""
    return {'torch': torch.get_rng_state(), **({'cuda': torch.cuda.get_rng_state(device)}
                                               if device.startswith('cuda') else {})}


def full_state(raw_model, sharded, optim, fsdp, master):
    """(model weights, optimizer state) in our checkpoint's format; with FSDP gathered to rank 0 (all ranks
    must call) from sharded, the optimizer state keyed by position as a single process keys it."""
    if not fsdp:
        return raw_model.state_dict(), optim.state_dict()
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(sharded, options=full)
    state = get_optimizer_state_dict(sharded, optim, options=full)
    if not master:  # the gathered state lands on rank 0 only
        return None, None
    position = {n: i for i, n in enumerate(n for g in state['param_groups'] for n in g['params'])}
    return weights, {'state': {position[n]: v for n, v in state['state'].items()},
                     'param_groups': [{**g, 'params': [position[n] for n in g['params']]}
                                      for g in state['param_groups']]}


def last_checkpoint(last_saved, best_saved, ckpt_path, best_path):
    """Where the checkpoints kept are, for a line that ends the run: '... the last checkpoint is ...'."""
    if last_saved is None:
        return "no checkpoint was saved"
    val = 'not evaluated' if last_saved[1] is None else f'val loss {last_saved[1]:.4f}'
    text = f"the last checkpoint is '{ckpt_path}' (iter {last_saved[0]}, {val})"
    if best_saved is not None and best_saved[0] != last_saved[0]:
        text += f"; the best is '{best_path}' (iter {best_saved[0]}, val loss {best_saved[1]:.4f})"
    return text
