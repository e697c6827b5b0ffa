"""What train.py's evaluations write: a task's accuracy in the printed line and in log.jsonl, and a record as
wandb's flat keys (wandb started in one line)."""

from common.errors import die


def accuracy_fields(losses, eval_splits):
    """A task's accuracy for log.jsonl: val's and train's, and loss and accuracy at each longer evaluation split."""
    if 'accuracy' not in losses:
        return {}
    accuracy = losses['accuracy']
    fields = {'accuracy': accuracy['val'], 'train_accuracy': accuracy['train']}
    longer = [s for s in eval_splits if s != 'val']
    if longer:
        fields['lengths'] = {s: {'loss': losses[s], 'accuracy': accuracy[s]} for s in longer}
    return fields


def accuracy_text(losses, eval_splits):
    """', accuracy 0.872 (val_2x 0.314, val_4x n/a)' for the evaluation's line; '' for text."""
    if 'accuracy' not in losses:
        return ''
    longer = ', '.join(f"{s} {'n/a' if losses['accuracy'][s] is None else format(losses['accuracy'][s], '.3f')}"
                       for s in eval_splits if s != 'val')
    return f", accuracy {losses['accuracy']['val']:.3f}" + (f" ({longer})" if longer else '')


def flat_record(record):
    """A log.jsonl record with its nested values (MoE load per layer and expert) as wandb's flat keys."""
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            value = {f'{key}/{k}': v for k, v in value.items()}
        elif isinstance(value, list):
            value = {f'{key}/{i}': v for i, v in enumerate(value)}
        else:
            value = {key: value}
        for k, v in value.items():
            flat.update(flat_record({k: v}) if isinstance(v, (dict, list)) else {k: v})
    return flat


def start_wandb(project, name, settings, out_dir):
    """wandb's module, its run started; a failure is one line (WANDB_MODE=offline works without a login)."""
    try:
        import wandb
        wandb.init(project=project, name=name, config=dict(settings), dir=out_dir)
    except ImportError:
        die("wandb_log=True needs wandb: pip install wandb")
    except Exception as e:  # no login, no network: say so in one line
        die(f"wandb could not start ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"try WANDB_MODE=offline")
    return wandb
