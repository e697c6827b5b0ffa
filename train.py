"""
Train a GPT with any mix of vanilla and modern swaps, on one CPU, one GPU, or many with DDP or FSDP.

    python train.py config/shakespeare_modern_cpu.py --batch_size=32
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_modern.py
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_modern.py --fsdp=True

Settings are the globals below; a config file, then --key=value, override them (configurator.py).
An out_dir is one run: a second process on it, or a scratch run over a trained checkpoint, is refused.
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields
from typing import Optional

from configurator import configure, init_from_problem, model_flags, settings_of

# ----------------------------------------------------------------------------- settings
# I/O
out_dir = 'out'
eval_interval = 2000
log_interval = 10  # iterations between printed losses: reading one waits for the device
eval_iters = 200
eval_only = False  # evaluate once (appending to log.jsonl) and exit
# one lm-evaluation-harness task scored at every evaluation, beside val loss, on rank 0 alone (pip install lm-eval)
eval_task = ''  # '': off; a harness task name, e.g. 'hellaswag'
eval_task_limit = 500  # items scored each time; 0: all of them
eval_task_fewshot = 0
eval_task_include_path = ''  # a folder of task YAML files of your own
always_save_checkpoint = True  # else save only when val loss improves
init_from = 'scratch'  # 'scratch', 'resume', or a Hugging Face name or directory (GPT-2, Llama, Qwen, ...)
# wandb (works with WANDB_MODE=offline)
wandb_log = False
wandb_project = 'nanoswap'
wandb_run_name = 'run'
# data
dataset = 'openwebtext'
gradient_accumulation_steps = 5 * 8  # global: divided by the number of DDP processes
batch_size = 12  # per process, per micro step
block_size = 1024
# model: every field of GPTConfig (model.py) is a setting, with its default there (GPT-2's block); the
# recipes set the swaps (norm, mlp, n_kv_head, pos) and the sizes (n_layer, n_head, n_embd)
globals().update(model_flags())
bias = False  # nanoGPT trains without biases
vocab_size: Optional[int] = None  # None: the dataset's (meta.json), else GPT-2's 50304
# optimizer: 'adamw' on every parameter, or 'muon': torch.optim.Muon on the blocks' hidden matrices at muon_lr
# and AdamW on the rest (embeddings, head, norms, biases, scalars) at learning_rate; one schedule scales both
optimizer = 'adamw'
learning_rate = 6e-4  # AdamW's peak
max_iters = 600000
weight_decay = 1e-1  # both optimizers' (decoupled)
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables
muon_lr = 0.02  # Muon's peak (Keller Jordan's scale: the update's RMS grows with sqrt(rows/cols))
muon_momentum = 0.95
# learning rate: linear warmup, then 'cosine' decay to min_lr at lr_decay_iters, or 'wsd' (warmup, stable, decay):
# the peak until the last lr_decay_fraction of lr_decay_iters, then a linear decay to min_lr (MiniCPM, the speedrun)
lr_schedule = 'cosine'
decay_lr = True  # False: the peak throughout
warmup_iters = 2000
lr_decay_iters = 600000
lr_decay_fraction = 0.2  # wsd only
min_lr = 6e-5  # AdamW's floor; Muon's is muon_lr times the same fraction of the peak
# system
backend = 'auto'  # DDP/FSDP: 'nccl' on CUDA, 'gloo' on CPU
fsdp = False  # under torchrun: shard parameters, gradients and optimizer state (FSDP) instead of replicating (DDP)
device = 'auto'  # 'auto' (cuda, mps, cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' (bf16, else fp16 on CUDA; fp32 elsewhere), 'float32', 'bfloat16', 'float16'
compile: Optional[bool] = None  # None: on for CUDA only
peak_flops = 0.0  # for MFU; 0: a known GPU's peak, else a matmul measured at start
seed = 1337
settings = configure(settings_of(globals()), sys.argv[1:], prog='train.py', doc=__doc__)
globals().update(settings)


def check(ok, message):
    if not ok:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


# settings that are wrong whatever the machine: said before torch loads
for name in ('batch_size', 'gradient_accumulation_steps', 'eval_interval', 'log_interval', 'eval_iters'):
    check(globals()[name] >= 1, f"{name} must be at least 1, got {globals()[name]}")
for name in ('max_iters', 'warmup_iters', 'lr_decay_iters', 'learning_rate', 'min_lr', 'weight_decay', 'grad_clip'):
    check(globals()[name] >= 0, f"{name} must be >= 0, got {globals()[name]}")
for name in ('beta1', 'beta2', 'muon_momentum'):
    check(0 <= globals()[name] < 1, f"{name} must be in [0, 1), got {globals()[name]}")
check(optimizer in ('adamw', 'muon'), f"optimizer must be 'adamw' or 'muon', got {optimizer!r}")
check(lr_schedule in ('cosine', 'wsd'), f"lr_schedule must be 'cosine' or 'wsd', got {lr_schedule!r}")
check(0 <= lr_decay_fraction <= 1, f"lr_decay_fraction must be in [0, 1], got {lr_decay_fraction}")
check(muon_lr > 0, f"muon_lr must be > 0, got {muon_lr}")
check(not (fsdp and optimizer == 'muon' and 'RANK' in os.environ),
      "optimizer='muon' cannot run with fsdp=True: Muon orthogonalizes each whole matrix and FSDP shards them over the "
      "processes; use DDP (fsdp=False) or optimizer='adamw'")
check(min_lr <= learning_rate or not decay_lr, f"min_lr ({min_lr}) must not be above learning_rate ({learning_rate}): "
                                              f"the schedule decays from the peak to it (or set decay_lr=False)")
check(0 <= seed < 2 ** 63, f"seed must be in [0, 2**63), got {seed}")
check(not (os.path.exists(out_dir) and not os.path.isdir(out_dir)), f"out_dir '{out_dir}' is a file, not a directory")
check(init_from_problem(init_from) is None, init_from_problem(init_from))
if eval_task:
    import importlib.util
    check(eval_task_limit >= 0, f"eval_task_limit must be >= 0 (0: every item), got {eval_task_limit}")
    check(eval_task_fewshot >= 0, f"eval_task_fewshot must be >= 0, got {eval_task_fewshot}")
    check(not eval_task_include_path or os.path.isdir(eval_task_include_path),
          f"eval_task_include_path '{eval_task_include_path}' is not a directory (it should hold task YAML files)")
    check(importlib.util.find_spec('lm_eval') is not None,
          f"eval_task={eval_task!r} needs lm-evaluation-harness: pip install lm-eval")

# the heavy imports only now: --help and a mistyped setting answer before torch loads
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from common.checkpoints import (keep_as, load_checkpoint, load_pretrained, model_from_checkpoint,  # noqa: E402
                                new_checkpoint, save_checkpoint)
from common.data import dataset_meta, example_split, masked_accuracy, read_examples, split_files  # noqa: E402
from common.errors import (Interrupted, catch_interrupts, collective_error, critical, deliver_interrupts,  # noqa: E402
                           die, first_line, hold_interrupts, out_of_memory)
from common.files import append_log, claim_out_dir, repair_log, write_json  # noqa: E402
from common.hardware import (DTYPES, all_reduce_sum, autocast, grad_scaler, measure_matmul_flops,  # noqa: E402
                             peak_flops as measure_peak_flops, pick_device, pick_dtype)
from chapters import GPT, RUNTIME_FLAGS, GPTConfig, moe, mtp, sparse_attention  # noqa: E402

catch_interrupts()
MODEL_FLAGS = tuple(f.name for f in fields(GPTConfig))
GPT_DEFAULTS = asdict(GPTConfig())
SIZES = ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size')  # always shown; other flags when not default
EVAL_SEED = 20240101  # one fixed set of eval batches for every run, variant and seed
# -----------------------------------------------------------------------------

# DDP or FSDP: torchrun sets RANK; one process per device
distributed = int(os.environ.get('RANK', -1)) != -1
if distributed:
    rank, local_rank, world_size = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
    if backend == 'auto':
        backend = 'nccl' if torch.cuda.is_available() and device != 'cpu' else 'gloo'
    dist.init_process_group(backend=backend)
    if device != 'cpu' and torch.cuda.is_available():  # one GPU per process, whatever --device named
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
else:
    rank, local_rank, world_size = 0, 0, 1
    fsdp = False  # one process: nothing to shard
master = rank == 0
device = pick_device(device)
device_type = device.split(':')[0]
dtype = pick_dtype(device, dtype)
if compile is None:
    compile = device_type == 'cuda'
if gradient_accumulation_steps % world_size != 0:
    die(f"gradient_accumulation_steps ({gradient_accumulation_steps}) must be divisible by the number of "
        f"processes ({world_size})")
local_accum = gradient_accumulation_steps // world_size

torch.manual_seed(seed)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
ctx = autocast(device, dtype)

# ----------------------------------------------------------------------------- data
meta_path, meta = dataset_meta(dataset)
meta_vocab_size = meta.get('vocab_size')
if meta.get('kind') == 'tiktoken':  # GPT-2's 50257 padded to 50304: a multiple of 64 runs faster on GPUs
    meta_vocab_size = 64 * math.ceil(meta_vocab_size / 64)
data_dir = os.path.join('data', dataset)
# a task dataset (data/recall, data/copy): whole examples, a mask of the scored targets, and splits to evaluate at
# other lengths; its batches are examples, aligned, and its evaluations also log accuracy
example_data = 'example_length' in meta
eval_splits = list(meta.get('eval_splits') or ['val']) if example_data else ['val']
if example_data and isinstance(meta.get('shards'), dict):
    die(f"'{meta_path}' has both example_length and shards: a task dataset is one file per split; rerun its "
        f"prepare.py")
example_shape = {split: example_split(data_dir, split, meta) for split in ('train', *eval_splits)} \
    if example_data else {}
shard_files = {split: split_files(dataset, meta, split) for split in ('train', 'val')}
split_tokens = {split: [os.path.getsize(p) // 2 for p in files] for split, files in shard_files.items()}


def get_batch(split, generator, fetch=True):
    """(x, y) on the device; fetch=False only draws the batch's offsets (the generator moves alike) -> None.
    Over shards, every window of every shard is equally likely (uniform by tokens): one draw over them all.
    A task dataset's rows are whole examples, x and y within one, y -1 where not scored."""
    if example_data:
        rows = torch.randint(example_shape[split][0], (batch_size,), generator=generator).tolist()
        return example_batch(split, rows) if fetch else None
    # each shard's windows, one after another: one file's draws are those of the single file they always were
    starts = [max(0, n - block_size) for n in split_tokens[split]]
    ix = torch.randint(sum(starts), (batch_size,), generator=generator).tolist()
    if not fetch:
        return None
    rows, files, ends = [], [], np.cumsum(starts)
    for i in ix:
        k = int(np.searchsorted(ends, i, side='right'))
        files.append(shard_files[split][k])
        # a fresh memmap per batch: numpy keeps a long-lived one's pages and memory grows
        data = np.memmap(shard_files[split][k], dtype=np.uint16, mode='r')
        offset = i - (ends[k - 1] if k else 0)
        rows.append(data[offset:offset + 1 + block_size])
    xy = np.stack(rows).astype(np.int64)
    check_token_ids(xy, files[int(xy.max(axis=1).argmax())])
    xy = to_device(xy)  # one contiguous (B, T+1) block; inputs and targets are its views on the device
    return xy[:, :-1], xy[:, 1:]


def example_batch(split, rows):
    """(x, y) of the split's examples at indices rows, on the device."""
    x, y = read_examples(data_dir, split, rows, example_shape[split][1])
    check_token_ids(np.maximum(x, y), os.path.join(data_dir, f'{split}.bin'))
    xy = to_device(np.stack((x, y)))
    return xy[0], xy[1]


def check_token_ids(tokens, path):
    if tokens.max() >= vocab_limit:
        die(f"'{path}' holds token id {tokens.max()} but the model's vocabulary has {vocab_limit}: the data and "
            f"meta.json (or the model) do not belong together")


def to_device(array):
    """A numpy array pinned and sent once."""
    tensor = torch.from_numpy(array)
    return tensor.pin_memory().to(device, non_blocking=True) if device_type == 'cuda' else tensor.to(device)


def train_generator(it, micro):
    """Batches depend only on (seed, iteration, global micro step): resume is exact, and N processes draw
    exactly the batches one process would with the same global gradient_accumulation_steps."""
    return torch.Generator().manual_seed(hash((seed, it, micro)) & (2 ** 63 - 1))


def check_splits_fit(length):
    """Each split needs a file longer than one window of length tokens; a task dataset's block_size must hold its
    training and val examples (their inputs: one token shorter)."""
    if example_data:
        longest = max(example_shape['train'][1], example_shape['val'][1])
        if length < longest - 1:
            die(f"block_size {length} is shorter than the examples of {data_dir} ({longest} tokens: inputs of "
                f"{longest - 1}); set --block_size={longest - 1}")
        return
    for split in ('train', 'val'):
        tokens = max(split_tokens[split])
        if tokens <= length:
            die(f"'{shard_files[split][split_tokens[split].index(tokens)]}' holds {tokens} tokens, too few for "
                f"block_size {length}")


# ----------------------------------------------------------------------------- out_dir: this run's alone
ckpt_path = os.path.join(out_dir, 'ckpt.pt')  # the latest state: what resume continues from
best_path = os.path.join(out_dir, 'best.pt')  # the model of the best val loss so far
log_path = os.path.join(out_dir, 'log.jsonl')


def scratch_config():
    """A new model's GPTConfig from the settings (the dataset's vocabulary unless vocab_size is set)."""
    model_args = {k: settings[k] for k in MODEL_FLAGS}
    model_args['vocab_size'] = vocab_size or meta_vocab_size or 50304
    try:
        return GPTConfig(**model_args)
    except ValueError as e:
        die(str(e))


def claim_run_dir():
    """out_dir for this process alone; a new run there must not bury a trained one, and a log without a
    checkpoint (a run that saved nothing) moves aside, never lost."""
    claim_out_dir(out_dir)  # held until the process ends
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


# every setting is checked before out_dir is looked at: a scratch run's model flags too
if init_from == 'scratch':
    new_config = scratch_config()
    check_splits_fit(block_size)
if master:
    claim_run_dir()


# ----------------------------------------------------------------------------- model: new, resumed or pretrained
def training_checkpoint():
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
    check_same_vocabulary(checkpoint)
    return checkpoint


def check_same_vocabulary(checkpoint):
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


def saved_meta(name):
    """data/<name>/meta.json if it can be read, else None (an old checkpoint saved no copy of it)."""
    try:
        with open(os.path.join('data', name, 'meta.json')) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def resumed_model(checkpoint):
    """The checkpoint's architecture, with this run's runtime flags (a longer block_size with a RoPE scaling, a
    window) and dropout, a training choice."""
    model = model_from_checkpoint(checkpoint, ckpt_path, settings)
    trained_block_size = checkpoint['model_args'].get('block_size', GPT_DEFAULTS['block_size'])
    learned = checkpoint['model_args'].get('pos', GPT_DEFAULTS['pos']) == 'learned'
    if not eval_only and learned and model.config.block_size != trained_block_size:
        die(f"block_size {model.config.block_size} is not the checkpoint's {trained_block_size}: a model with "
            f"learned positions resumes training at its own block_size (another is for --eval_only=True or "
            f"sample.py)")
    ignored = [k for k in MODEL_FLAGS if k in settings.given and k not in RUNTIME_FLAGS
               and checkpoint['model_args'].get(k) != settings[k]]
    if ignored and master:
        print(f"resuming with the checkpoint's model flags, not this run's: {', '.join(ignored)}")
    return model


def new_model():
    """(the model, the checkpoint it resumes or None): from scratch, from ckpt.pt, or a pretrained one."""
    if init_from == 'scratch':
        return GPT(new_config), None
    if init_from != 'resume':
        return load_pretrained(init_from, settings), None
    checkpoint = training_checkpoint()
    return resumed_model(checkpoint), checkpoint


try:
    model, checkpoint = new_model()
    if meta_vocab_size and meta_vocab_size > model.config.vocab_size:
        die(f"dataset '{dataset}' has {meta_vocab_size} token ids but the model only {model.config.vocab_size}")
    model.to(device)
except Exception as e:
    if not out_of_memory(e):
        raise
    die(f"out of memory building the model on {device}: lower n_layer, n_embd or block_size ({type(e).__name__})",
        code=1)
vocab_limit = model.config.vocab_size
check_splits_fit(model.config.block_size)
# the model flags it trained with (a resumed checkpoint's), and what was really built, which is logged and saved
trained_args = {**GPT_DEFAULTS, **checkpoint['model_args']} if checkpoint else asdict(model.config)
settings.update({k: getattr(model.config, k) for k in MODEL_FLAGS})
block_size = model.config.block_size
# a task's examples may be shorter than block_size: a step trains on its inputs' tokens
tokens_per_iter = gradient_accumulation_steps * batch_size * (example_shape['train'][1] - 1 if example_data
                                                             else block_size)
# learned positions stop at block_size; rotary tables grow: a longer evaluation split runs only with them
unreachable_splits = [s for s in eval_splits if example_data and model.config.pos == 'learned'
                      and example_shape[s][1] - 1 > block_size]

# where the run stands: a resume continues from its checkpoint's counters
iter_num, best_val_loss, elapsed_before, tokens_seen = 0, float('inf'), 0.0, 0
last_saved = best_saved = None  # (iter, val loss) of ckpt.pt and of best.pt
evaluated = None  # the last iteration evaluated and logged
if checkpoint:
    iter_num, best_val_loss = checkpoint['iter_num'], checkpoint['best_val_loss']
    elapsed_before = checkpoint.get('elapsed_s', 0.0)
    last_saved = (iter_num, checkpoint.get('val_loss', best_val_loss))
    best_saved = (checkpoint['best_iter'], best_val_loss) if checkpoint.get('best_iter') is not None else None
    # an interrupt's checkpoint may be of an iteration not evaluated yet; older checkpoints carry no flag
    evaluated = iter_num if checkpoint.get('eval_done', True) else None
    trained_config = checkpoint.get('config') or {}  # older checkpoints carry no token count
    tokens_seen = checkpoint.get('tokens', iter_num * trained_config.get('gradient_accumulation_steps', 0)
                                 * trained_config.get('batch_size', 0) * trained_args['block_size'])
    if master and not eval_only:
        print(f"resuming {ckpt_path} at iteration {iter_num} of {max_iters} (best val loss so far "
              f"{best_val_loss:.4f})")
if master:  # records a crash left past the checkpoint go: this run logs them again
    repair_log(log_path, last_iter=iter_num if checkpoint and not eval_only else None)

# ----------------------------------------------------------------------------- processes and optimizer
if distributed:  # every rank starts from rank 0's weights; dropout should differ per rank
    torch.manual_seed(seed + rank + iter_num)
raw_model = model  # what gets saved: no compile prefix, no DDP/FSDP wrapper
if fsdp:  # each block's parameters sharded over the processes, then the rest of the model
    from torch.distributed.fsdp import fully_shard
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
scaler = grad_scaler(device_type, dtype, sharded=fsdp)
optim = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type, optimizer, muon_lr,
                                   muon_momentum, fused=not (fsdp and scaler.is_enabled()))  # `optimizer` names which


def load_optimizer_state(state):
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


def restore_generators(rng):
    """The random generators as the checkpoint saved them (rank 0's: other ranks keep the streams seeded above)."""
    if not master:
        return
    torch.set_rng_state(rng['torch'])
    if device_type == 'cuda' and rng.get('cuda'):
        torch.cuda.set_rng_state(rng['cuda'], device)


if checkpoint:
    load_optimizer_state(checkpoint['optimizer'])
    if scaler.is_enabled() and checkpoint.get('scaler'):  # empty when saved without fp16 (CPU, bf16)
        scaler.load_state_dict(checkpoint['scaler'])
    restore_generators(checkpoint['rng'])
    checkpoint = None  # free the memory
sharded = model  # FSDP's module: what state-dict gathering takes
if compile:
    model = torch.compile(model)
# evaluation: DDP's ranks share out its batches unevenly outside the wrapper; FSDP's must all run each forward
eval_model = model
if distributed and not fsdp:
    # the only buffers are rope tables every rank builds alike (and MoE biases every rank moves alike)
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None, broadcast_buffers=False)


@torch.no_grad()
def estimate_loss():
    """Mean loss on fixed batches per split, shared out across processes: eval_iters random windows of text, or
    a task's first eval_iters * batch_size examples (the same ones every time), whose greedy accuracy over the
    scored targets goes in out['accuracy']; a split the positions cannot reach is None. With MoE layers, also
    their load and balancing losses on the val batches (out['moe']). A long evaluation shows a progress bar."""
    eval_model.eval()
    out = {'accuracy': {}} if example_data else {}
    splits = [s for s in ('train', *eval_splits) if s not in unreachable_splits]
    bar = progress(sum(len(range(rank, eval_batches(s), world_size)) for s in splits), 'evaluating',
                   slow=eval_seconds > 10)
    for split in ('train', *eval_splits):
        moe.report_and_reset(raw_model)  # restart the experts' counts
        loss, accuracy = evaluate_split(split, bar) if split in splits else (None, None)
        out[split] = loss
        if example_data:
            out['accuracy'][split] = accuracy
        if split == 'val' and moe.moe_layers(raw_model):
            if distributed:
                all_reduce_sum(moe.counters(raw_model))
            out['moe'] = moe.report_and_reset(raw_model)
    bar.close()
    eval_model.train()
    return out


def eval_batches(split):
    """How many batches an evaluation of split reads."""
    if not example_data:
        return eval_iters
    return math.ceil(min(example_shape[split][0], eval_iters * batch_size) / batch_size)


def eval_batch(split, k, generator, fetch):
    """The split's k-th evaluation batch (None unless fetch): a window drawn by generator, or examples in order."""
    if not example_data:
        return get_batch(split, generator, fetch)
    end = min(example_shape[split][0], eval_iters * batch_size, (k + 1) * batch_size)
    return example_batch(split, range(k * batch_size, end)) if fetch else None


def evaluate_split(split, bar):
    """(mean loss, greedy accuracy or None) on the split's evaluation batches: per batch for text, per scored
    target for a task (its batches score different counts)."""
    generator = torch.Generator().manual_seed(EVAL_SEED + (split != 'train'))
    sums, batch, n = torch.zeros(3, device=device), None, eval_batches(split)  # loss, right, weight
    for k in range(n):  # every process draws every batch (the same ones, in order), reads its own
        own = k % world_size == rank
        # FSDP: a rank short of a batch runs the last one too (below), so it reads that one
        batch = eval_batch(split, k, generator, fetch=own or (fsdp and k == n - 1)) or batch
        if own:
            sums += batch_sums(*batch)
            bar.update()
    if fsdp and n % world_size and rank >= n % world_size:
        join_last_round(batch)
    if distributed:
        dist.all_reduce(sums)
    loss, right, weight = sums.tolist()
    return loss / weight, right / weight if example_data else None


def batch_sums(x, y):
    """(loss, right, weight) of one evaluation batch: a text batch weighs 1; a task's, its scored targets."""
    with ctx:
        logits, loss = eval_model(x, y)
    loss = loss.float()
    if not example_data:
        return torch.stack([loss, torch.zeros_like(loss), torch.ones_like(loss)])
    right, scored = masked_accuracy(logits, y)
    return torch.stack([torch.where(scored > 0, loss * scored, 0.0), right.float(), scored.float()])


def join_last_round(batch):
    """FSDP's forwards are collective: a rank short of a batch joins the last round, counted nowhere."""
    counters = [(c, c.clone()) for c in moe.counters(raw_model)]
    with ctx:
        eval_model(*batch)
    for c, before in counters:
        c.copy_(before)


def progress(total, what, slow):
    """A tqdm bar on the master's stderr when the work is slow, else a stand-in that does nothing."""
    from tqdm import tqdm
    return tqdm(total=total, desc=what, leave=False, file=sys.stderr, disable=not (master and slow), mininterval=1)


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


def lr_scale(it):
    """The schedule at iteration it, as a fraction of the peak (every optimizer's own learning rate)."""
    floor = min_lr / learning_rate if learning_rate else 0.0
    if not decay_lr:
        return 1.0
    if it < warmup_iters:
        return (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return floor
    if lr_schedule == 'wsd':
        decay_start = max(warmup_iters, lr_decay_iters - lr_decay_fraction * lr_decay_iters)
        ratio = (it - decay_start) / max(1, lr_decay_iters - decay_start)
        return 1.0 if it < decay_start else floor + (1.0 - ratio) * (1.0 - floor)
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - floor)


def set_lr(it):
    """Every optimizer's learning rate at iteration it; -> AdamW's (the one logged)."""
    scale = lr_scale(it)
    for group in optim.param_groups:
        group['lr'] = scale * (muon_lr if 'ns_steps' in group else learning_rate)  # Muon's groups have ns_steps
    return scale * learning_rate


# ----------------------------------------------------------------------------- checkpoints
def last_checkpoint():
    if last_saved is None:
        return "no checkpoint was saved"
    val = 'not evaluated' if last_saved[1] is None else f'val loss {last_saved[1]:.4f}'
    text = f"the last checkpoint is '{ckpt_path}' (iter {last_saved[0]}, {val})"
    if best_saved is not None and best_saved[0] != last_saved[0]:
        text += f"; the best is '{best_path}' (iter {best_saved[0]}, val loss {best_saved[1]:.4f})"
    return text


def save_state(weights, opt_state, val_loss, elapsed_s, best):
    """Write ckpt.pt whole (model, optimizer, RNG, counters: all a resume needs to go on as if never stopped)
    and, when best, best.pt as a second name of it; rank 0 writes. -> the new (last_saved, best_saved), which
    the caller sets within the same critical() block: an interrupt during the writes waits until they name them."""
    saved = (iter_num, val_loss)
    if master:
        rng = {'torch': torch.get_rng_state(), **({'cuda': torch.cuda.get_rng_state(device)}
                                                  if device_type == 'cuda' else {})}
        checkpoint = new_checkpoint(raw_model, optimizer=opt_state, scaler=scaler.state_dict(), iter_num=iter_num,
                                    best_val_loss=best_val_loss, best_iter=iter_num if best else best_saved and best_saved[0],
                                    val_loss=val_loss, eval_done=evaluated == iter_num, tokens=tokens_seen,
                                    config=dict(settings), meta=meta, rng=rng, elapsed_s=elapsed_s)
        checkpoint['model'] = weights
        save_checkpoint(checkpoint, ckpt_path)
        if best:
            keep_as(ckpt_path, best_path)
    return saved, saved if best else best_saved


def full_state():
    """(model weights, optimizer state) in our checkpoint's format; with FSDP gathered to rank 0 (all ranks
    must call), the optimizer state keyed by position as a single process keys it."""
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


def stop_non_finite(what, value):
    if math.isfinite(value):
        return
    if master:
        write_json(os.path.join(out_dir, 'diverged.json'), {'iter': iter_num, 'what': what, 'value': str(value)})
    if distributed:
        dist.destroy_process_group()
    if not master:
        sys.exit(1)
    die(f"{what} is {value} at iter {iter_num}: training diverged (try a lower learning_rate or grad_clip); "
        f"{last_checkpoint()}", code=1)


# ----------------------------------------------------------------------------- what the run prints and logs
def describe_run():
    """The first lines: where it runs, the model, and a note when the run will not go as the user may think."""
    print(f"device {device}, dtype {dtype}, compile {compile}, {world_size} process(es)"
          f"{' sharded (FSDP)' if fsdp else ''}, {tokens_per_iter:,} tokens per iteration")
    total, active = raw_model.get_num_params(), raw_model.get_num_params(active=True)
    print(f"model: {total / 1e6:.2f}M parameters{f' ({active / 1e6:.2f}M active)' if active != total else ''}; "
          + ' '.join(f"{k}={v}" for k, v in asdict(raw_model.config).items() if k in SIZES or v != GPT_DEFAULTS.get(k)))
    if unreachable_splits:
        print(f"note: learned positions cannot go past block_size {block_size}: "
              + ', '.join(f"{s} ({example_shape[s][1]} tokens)" for s in unreachable_splits)
              + " not evaluated (logged as None); pos='rope' can go there")
    if decay_lr and not eval_only and iter_num < max_iters <= warmup_iters:
        print(f"note: warmup_iters ({warmup_iters}) outlasts max_iters ({max_iters}): the learning rate never reaches "
              f"its peak (the last step runs at {lr_scale(max_iters - 1):.0%} of it); lower warmup_iters to reach it")


def say_if_sized_for_a_gpu(peak):
    """At a CPU's usual ~40% MFU: a recipe sized for a GPU says so at once, not after minutes of silence."""
    total_seconds = (max_iters - iter_num) * flops_per_iter / (0.4 * peak) \
        + eval_seconds * (1 + (max_iters - iter_num) // eval_interval)
    if device_type != 'cpu' or total_seconds <= 1800 or eval_only:
        return
    recipe = next((a for a in sys.argv[1:] if a.endswith('.py')), None)
    cpu_recipe = recipe[:-3] + '_cpu.py' if recipe and os.path.exists(recipe[:-3] + '_cpu.py') else None
    print(f"note: this run is sized for a GPU: on this CPU it would take about {total_seconds / 3600:.1f} h; "
          + (f"the CPU recipe is {cpu_recipe}" if cpu_recipe else
             "config/shakespeare_modern_cpu.py is a recipe sized for a CPU"), flush=True)


def start_wandb():
    """wandb's module, its run started; a failure is one line (WANDB_MODE=offline works without a login)."""
    try:
        import wandb
        wandb.init(project=wandb_project, name=wandb_run_name, config=dict(settings), dir=out_dir)
    except ImportError:
        die("wandb_log=True needs wandb: pip install wandb")
    except Exception as e:  # no login, no network: say so in one line
        die(f"wandb could not start ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"try WANDB_MODE=offline")
    return wandb


class Speed:
    """ms/iter, MFU and the ETA of the logged steps, past this process's first ones (warm-up, compilation). A
    peak measured at start may have been slowed by another job: MFU over 100% measures it again (3 times)."""

    def __init__(self, peak, measured):
        self.peak, self.measured, self.remeasured = peak, measured, 0
        self.mfu, self.recent_dt = -1.0, []

    def update(self, dt):
        self.recent_dt = (self.recent_dt + [dt])[-20:]
        mfu = raw_model.estimate_mfu(batch_size * local_accum, dt, self.peak)  # per device
        if mfu > 1 and self.measured and self.remeasured < 3:
            self.remeasured += 1
            self.peak = max(self.peak, measure_matmul_flops(device, DTYPES[dtype]))
            mfu, self.mfu = raw_model.estimate_mfu(batch_size * local_accum, dt, self.peak), -1.0
        self.mfu = mfu if self.mfu == -1.0 else 0.9 * self.mfu + 0.1 * mfu

    def line(self, iters_left):
        """'mfu ..., eta ...' for the progress line."""
        eta = time.strftime('%H:%M:%S', time.gmtime(sum(self.recent_dt) / len(self.recent_dt) * iters_left)) \
            if self.recent_dt else '--:--:--'
        mfu = '--' if self.mfu < 0 else f'{self.mfu * 100:.2f}%' + (
            ' (over 100%: the peak is too low, set --peak_flops)' if self.mfu > 1 else '')
        return f"mfu {mfu}, eta {eta}"


flops_per_iter = raw_model.flops_per_token() * tokens_per_iter
eval_seconds = 0.0  # an estimate, for the progress bar
speed = wandb = None  # rank 0's
if master:
    describe_run()
    peak, how = (peak_flops, 'given') if peak_flops > 0 else measure_peak_flops(device, dtype)
    if peak_flops <= 0:
        print(f"peak {peak / 1e12:.3g} TFLOP/s for MFU ({how})")
    speed = Speed(peak, measured=how.startswith('measured'))
    eval_seconds = 2 * eval_iters * batch_size * block_size * raw_model.flops_per_token() / 3 / (0.4 * peak)
    say_if_sized_for_a_gpu(peak)
    wandb = start_wandb() if wandb_log else None

# ----------------------------------------------------------------------------- a downstream task
task_lm = None  # rank 0 scores it alone (the others wait at the next step's all-reduce)
if eval_task and fsdp:  # every rank stops: the model's forward would need every rank's shards
    die("eval_task runs on rank 0 alone, which cannot run an FSDP-sharded model; train with DDP (fsdp=False) "
        "or score checkpoints with eval.py")
if eval_task and master:
    from common.tokenizer import load_tokenizer
    from eval import check_tasks, harness_lm, run_tasks, scores, task_manager  # only now: lm-eval is optional
    task_index = task_manager(eval_task_include_path, [eval_task])
    task_tokenizer = load_tokenizer(meta_path if os.path.exists(meta_path) else None,
                                    pretrained=None if init_from in ('scratch', 'resume') else init_from)
    check_tasks(task_index, [eval_task])  # a typo said now, not at the first evaluation
    task_lm = harness_lm(raw_model, task_tokenizer, device, dtype, batch_size)


def score_task():
    """The task's metrics now ({'acc': ..., 'acc_norm': ...}); the model back in training mode after. A task
    that fails (an item longer than block_size, ...) is one line and None: the training it would end goes on."""
    try:
        return scores(run_tasks(task_lm, [eval_task], task_index, eval_task_limit or None, eval_task_fewshot,
                                seeds=False), eval_task)
    except (Exception, SystemExit) as e:  # SystemExit: a one-line error of ours, already printed
        reason = 'the error above' if isinstance(e, SystemExit) else f"{type(e).__name__}: {first_line(e)}"
        print(f"warning: eval_task {eval_task!r} failed at iter {iter_num} ({reason}); not scored this time, "
              f"training goes on", file=sys.stderr, flush=True)
        return None
    finally:
        raw_model.train()


def report_evaluation(losses, lr, elapsed_s, save, blown_up):
    """Rank 0: the evaluation's lines printed, the task scored -> its log.jsonl record (None on other ranks)."""
    if not master:
        return None
    print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}{accuracy_text(losses)}")
    record = {'iter': iter_num, 'train_loss': losses['train'], 'val_loss': losses['val'], 'lr': lr,
              'tokens': tokens_seen, 'elapsed_s': elapsed_s,
              'ms_per_iter': 1000 * train_time / train_steps if train_steps else None, **accuracy_fields(losses)}
    task_scores = score_task() if task_lm is not None else None
    if task_scores is not None:
        record['task'] = {eval_task: task_scores}
        print(f"step {iter_num}: {eval_task} " + ', '.join(f"{k} {v:.4f}" for k, v in task_scores.items()))
    if eval_only:  # an evaluation of the trained model, maybe at another length or scaling: say so
        record.update(eval_only=True, **{k: getattr(raw_model.config, k) for k in RUNTIME_FLAGS
                                         if k != 'dropout' and getattr(raw_model.config, k) != trained_args[k]})
    if 'moe' in losses:  # the experts' load: a collapsed router shows as an expert with share 0
        record['moe'] = losses['moe']
    index_loss = sparse_attention.index_loss_and_reset(raw_model)
    if index_loss is not None:  # sparse attention: the indexers' KL loss over the steps since the last record
        record['index_loss'] = index_loss
    mtp_loss = mtp.mtp_loss_and_reset(raw_model)
    if mtp_loss is not None:  # multi-token prediction: the MTP modules' mean loss over the steps since the last record
        record['mtp_loss'] = mtp_loss
    if blown_up and not save:
        print(f"val loss {losses['val']:.4f} is over twice the best ({best_val_loss:.4f}): not saving; "
              f"{last_checkpoint()}")
    return record


def accuracy_fields(losses):
    """A task's accuracy for log.jsonl: val's and train's, and loss and accuracy at each longer evaluation split."""
    if 'accuracy' not in losses:
        return {}
    accuracy = losses['accuracy']
    fields = {'accuracy': accuracy['val'], 'train_accuracy': accuracy['train']}
    longer = [s for s in eval_splits if s != 'val']
    if longer:
        fields['lengths'] = {s: {'loss': losses[s], 'accuracy': accuracy[s]} for s in longer}
    return fields


def accuracy_text(losses):
    """', accuracy 0.872 (val_2x 0.314, val_4x n/a)' for the evaluation's line; '' for text."""
    if 'accuracy' not in losses:
        return ''
    longer = ', '.join(f"{s} {'n/a' if losses['accuracy'][s] is None else format(losses['accuracy'][s], '.3f')}"
                       for s in eval_splits if s != 'val')
    return f", accuracy {losses['accuracy']['val']:.3f}" + (f" ({longer})" if longer else '')


def log_evaluation(record):
    """Rank 0: the record into log.jsonl (and wandb)."""
    if not master:
        return
    append_log(log_path, record)
    if wandb:
        wandb.log({**flat_record(record), 'mfu': speed.mfu * 100})


def train_step(it):
    """One optimizer step over this process's micro batches -> their summed loss, on the device. The caller holds
    interrupts for it (a step is whole); a step that fails lets go of the hold, so the error can end the run."""
    try:
        loss_sum = torch.zeros((), device=device)
        for micro in range(local_accum):
            x, y = get_batch('train', train_generator(it, rank * local_accum + micro))
            last_micro = micro == local_accum - 1
            # gradients are reduced across processes only after the last micro step
            if fsdp:
                sharded.set_requires_gradient_sync(last_micro)
            no_sync = model.no_sync() if distributed and not fsdp and not last_micro else nullcontext()
            with no_sync, ctx:
                _, loss = model(x, y)
                loss_sum += loss.detach().float()
                loss = loss / local_accum
            scaler.scale(loss).backward()
        if grad_clip > 0.0:
            scaler.unscale_(optim)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optim)
        scaler.update()
        optim.zero_grad(set_to_none=True)
        update_expert_bias()
    except Exception:
        deliver_interrupts(discard=True)  # what ends the process is under way: an interrupt adds nothing
        raise
    return loss_sum


def update_expert_bias():
    """Sigmoid routers' balancing bias follows this step's load, alike on every rank."""
    if not moe.moe_layers(raw_model):
        return
    if distributed and moe.reads_expert_load(raw_model):  # a softmax router never reads the load
        all_reduce_sum([m.load for m in moe.moe_layers(raw_model)])
    moe.update_expert_bias(raw_model)


def mean_loss(loss_sum):
    """The mean loss over every micro step of every process (reading it waits for the device)."""
    if distributed:
        dist.all_reduce(loss_sum)
    return loss_sum.item() / gradient_accumulation_steps


def report_step(lossf, lr, dt):
    if not master:
        return
    if iter_num - start_iter > 3:  # this process's first steps include warm-up and compilation
        speed.update(dt)
    print(f"iter {iter_num}/{max_iters}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
          f"{tokens_per_iter / dt:,.0f} tok/s, {speed.line(max_iters - iter_num)}")


# ----------------------------------------------------------------------------- training loop
t_start = time.time() - elapsed_before  # elapsed_s continues across resumes
train_time, train_steps = 0.0, 0  # since the last evaluation, for ms/iter in log.jsonl
start_iter = iter_num
try:
    while True:
        lr = set_lr(iter_num)
        save = False

        # a resumed run's first iteration was evaluated, logged and saved before it stopped (unless an interrupt
        # saved it before its evaluation)
        if ((iter_num % eval_interval == 0 or iter_num == max_iters) and iter_num != evaluated) or eval_only:
            losses = estimate_loss()
            stop_non_finite('train loss', losses['train'])
            stop_non_finite('val loss', losses['val'])
            trained = iter_num > 0 and not eval_only  # a model this run may save: iter 0's is not trained yet
            improved = trained and losses['val'] < best_val_loss  # best.pt: never replaced by a worse model
            # a loss far above the best is a run blowing up: ckpt.pt keeps the better state too
            blown_up = trained and losses['val'] > 2 * best_val_loss
            # the first trained evaluation always saves: a run never ends without a checkpoint it could have had
            save = trained and (improved or last_saved is None or (always_save_checkpoint and not blown_up))
            weights, opt_state = full_state() if save else (None, None)  # FSDP: every rank gathers
            elapsed_s = round(time.time() - t_start, 3)
            record = report_evaluation(losses, lr, elapsed_s, save, blown_up)
            # the log first: a crash before the save leaves records past the checkpoint, which a resume drops
            with critical():
                log_evaluation(record)
                evaluated = iter_num
            train_time, train_steps = 0.0, 0
        if save:
            with critical():  # best_val_loss moves with best.pt; an interrupt waits until last_saved names them
                best_val_loss = min(best_val_loss, losses['val'])
                last_saved, best_saved = save_state(weights, opt_state, losses['val'], elapsed_s, best=improved)
            if master:
                print(f"saved checkpoint to {ckpt_path}" + (f" and {best_path} (the best val loss so far)"
                                                            if improved else ''))
        if eval_only or iter_num >= max_iters:
            break

        # one step whole: an interrupt waits for its end, where the state is one a resume continues from exactly
        hold_interrupts()
        t0 = time.time()
        loss_sum = train_step(iter_num)
        iter_num += 1
        tokens_seen += tokens_per_iter
        deliver_interrupts()

        logging = iter_num % log_interval == 0 or iter_num == max_iters
        lossf = mean_loss(loss_sum) if logging else None  # reading the loss waits for the device
        dt = time.time() - t0
        train_time, train_steps = train_time + dt, train_steps + 1
        if logging:
            stop_non_finite('train loss', lossf)
            report_step(lossf, lr, dt)
except Interrupted as e:
    # the state between two steps is whole: saved, a resume continues from this very iteration (FSDP's
    # gathering would need every process, which the interrupt may have stopped already)
    if master and iter_num > start_iter and not fsdp and (last_saved is None or last_saved[0] != iter_num):
        with critical():
            last_saved, best_saved = save_state(*full_state(), None, round(time.time() - t_start, 3), best=False)
        die(f"interrupted at iter {iter_num}, its state saved; {last_checkpoint()}; --init_from=resume continues "
            f"from there", code=e.code)
    if master:
        die(f"interrupted at iter {iter_num}; {last_checkpoint()}", code=e.code)
    sys.exit(e.code)
except Exception as e:
    if distributed and collective_error(e):  # another process ended or hung: one line each, not gloo's tracebacks
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        die(f"{'' if master else f'rank {rank}: '}another process stopped at iter {iter_num} ({first})"
            + (f"; {last_checkpoint()}" if master else ''), code=1)
    if not out_of_memory(e):
        raise
    die(f"out of memory at iter {iter_num} on {device}: lower batch_size ({batch_size}), block_size "
        f"({block_size}) or the model (n_layer, n_embd); {last_checkpoint()}", code=1)

if master and last_saved is None and not eval_only:  # say it: the out_dir holds only the log
    print(f"note: no checkpoint was saved: {'max_iters=0 trains nothing' if max_iters == 0 else 'no evaluation after training started'}; "
          f"out_dir '{out_dir}' holds only log.jsonl")

if wandb:
    wandb.finish()
if distributed:
    dist.destroy_process_group()
