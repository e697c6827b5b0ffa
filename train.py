"""
Train a GPT with any mix of vanilla and modern swaps, on one CPU, one GPU, or many with DDP or FSDP.

    python train.py config/shakespeare_modern_cpu.py --batch_size=32
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_modern.py
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_modern.py --fsdp=True

Settings are the globals below; a config file, then --key=value, override them (configurator.py).
An out_dir is one run: a second process on it, or a scratch run over a trained checkpoint, is refused.
"""

import inspect
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
# a task dataset (data/recall, data/copy): end at the first evaluation whose val accuracy reaches this, the task
# solved (0: train to max_iters). A grid of runs then spends its time on the runs that have not solved it yet
stop_accuracy = 0.0
# one lm-evaluation-harness task scored at every evaluation, beside val loss, on rank 0 alone (pip install lm-eval)
eval_task = ''  # '': off; a harness task name, e.g. 'hellaswag'
eval_task_limit = 500  # items scored each time; 0: all of them
eval_task_fewshot = 0
eval_task_include_path = ''  # a folder of task YAML files of your own
always_save_checkpoint = True  # else save only when val loss improves
init_from = 'scratch'  # 'scratch', 'resume', or a Hugging Face name or directory (GPT-2, Llama, Qwen, ...)
# resume on a task dataset prepared again since the checkpoint (other files: its val loss is another set's); the best
# val loss starts over and best.pt moves aside (else refused: a new out_dir starts afresh)
resume_on_new_data = False
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
threads = 0  # torch's intra-op threads; 0: on a CPU its usable cores (OMP_NUM_THREADS if set), else torch's default
cpu_anyway = False  # a recipe sized for a GPU (over half an hour) started on a CPU stops at once, unless True
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
    # finite too: --learning_rate=1e999 reads as inf
    check(0 <= globals()[name] < math.inf, f"{name} must be >= 0 and finite, got {globals()[name]}")
for name in ('beta1', 'beta2', 'muon_momentum'):
    check(0 <= globals()[name] < 1, f"{name} must be in [0, 1), got {globals()[name]}")
check(optimizer in ('adamw', 'muon'), f"optimizer must be 'adamw' or 'muon', got {optimizer!r}")
check(lr_schedule in ('cosine', 'wsd'), f"lr_schedule must be 'cosine' or 'wsd', got {lr_schedule!r}")
check(0 <= lr_decay_fraction <= 1, f"lr_decay_fraction must be in [0, 1], got {lr_decay_fraction}")
check(0 < muon_lr < math.inf, f"muon_lr must be > 0 and finite, got {muon_lr}")
check(not (fsdp and optimizer == 'muon' and 'RANK' in os.environ),
      "optimizer='muon' cannot run with fsdp=True: Muon orthogonalizes each whole matrix and FSDP shards them over the "
      "processes; use DDP (fsdp=False) or optimizer='adamw'")
check(min_lr <= learning_rate or not decay_lr, f"min_lr ({min_lr}) must not be above learning_rate ({learning_rate}): "
                                              f"the schedule decays from the peak to it (or set decay_lr=False)")
check(0 <= seed < 2 ** 63, f"seed must be in [0, 2**63), got {seed}")
check(0 <= stop_accuracy <= 1, f"stop_accuracy must be in [0, 1] (0: train to max_iters), got {stop_accuracy}")
check(threads >= 0, f"threads must be >= 0 (0: the usable cores on a CPU, else torch's default), got {threads}")
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
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from common.batches import Batches, train_generator  # noqa: E402
from common.checkpoints import keep_as, load_pretrained, model_from_checkpoint, new_checkpoint, save_checkpoint  # noqa: E402
from common.data import dataset_meta  # noqa: E402
from common.errors import (Interrupted, catch_interrupts, collective_error, critical, deliver_interrupts,  # noqa: E402
                           die, first_line, hold_interrupts, out_of_memory)
from common.evaluation import Evaluation  # noqa: E402
from common.files import append_log, repair_log, write_json  # noqa: E402
from common.hardware import all_reduce_sum, autocast, grad_scaler, pick_device, pick_dtype  # noqa: E402
from common.records import accuracy_fields, accuracy_text, flat_record, start_wandb  # noqa: E402
from common.resume import (check_same_data, claim_run_dir, full_state, generator_states,  # noqa: E402
                           last_checkpoint, load_optimizer_state, restore_generators, run_position,
                           training_checkpoint)
from common.schedule import Schedule  # noqa: E402
from common.speed import Speed, peak_for_mfu  # noqa: E402
from common.threads import use_threads  # noqa: E402
from common.tokenizer import token_bytes  # noqa: E402
from chapters import GPT, RUNTIME_FLAGS, GPTConfig  # noqa: E402

catch_interrupts()
MODEL_FLAGS = tuple(f.name for f in fields(GPTConfig))
GPT_DEFAULTS = asdict(GPTConfig())
SIZES = ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size')  # always shown; other flags when not default
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
threads_used = use_threads(threads, device)
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
schedule = Schedule.of(settings)

# ----------------------------------------------------------------------------- data
meta_path, meta = dataset_meta(dataset)
meta_vocab_size = meta.get('vocab_size')
if meta.get('kind') == 'tiktoken':  # GPT-2's 50257 padded to 50304: a multiple of 64 runs faster on GPUs
    meta_vocab_size = 64 * math.ceil(meta_vocab_size / 64)
# a task dataset (data/recall, data/copy): whole examples, a mask of the scored targets, and splits to evaluate at
# other lengths; its batches are examples, aligned, and its evaluations also log accuracy
batches = Batches(dataset, meta, meta_path, batch_size, block_size, device)
example_data, eval_splits, example_shape = batches.example_data, batches.eval_splits, batches.example_shape
check(example_data or not stop_accuracy, f"stop_accuracy={stop_accuracy} needs a task dataset (data/recall, data/copy), "
                                         f"whose evaluations score accuracy; dataset {dataset!r} is text")

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


# every setting is checked before out_dir is looked at: a scratch run's model flags too
if init_from == 'scratch':
    new_config = scratch_config()
    batches.check_fit(block_size)
if master:
    claim_run_dir(out_dir, init_from, eval_only)


# ----------------------------------------------------------------------------- model: new, resumed or pretrained
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
    checkpoint = training_checkpoint(ckpt_path, out_dir, optimizer, fsdp, dataset, meta, master)
    check_same_data(checkpoint, ckpt_path, dataset, meta, resume_on_new_data, eval_only, master)
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
batches.vocab_limit = model.config.vocab_size
batches.check_fit(model.config.block_size)
# the model flags it trained with (a resumed checkpoint's), and what was really built, which is logged and saved
trained_args = {**GPT_DEFAULTS, **checkpoint['model_args']} if checkpoint else asdict(model.config)
settings.update({k: getattr(model.config, k) for k in MODEL_FLAGS})
block_size = batches.block_size = model.config.block_size
tokens_per_iter = gradient_accumulation_steps * batch_size * batches.row_tokens()
# learned positions stop at block_size; rotary tables grow: a longer evaluation split runs only with them
unreachable_splits = [s for s in eval_splits if example_data and model.config.pos == 'learned'
                      and example_shape[s][1] - 1 > block_size]

# where the run stands: a resume continues from its checkpoint's counters; last_saved and best_saved are the
# (iter, val loss) of ckpt.pt and best.pt, evaluated the last iteration evaluated and logged
iter_num, best_val_loss, elapsed_before, tokens_seen, last_saved, best_saved, evaluated = \
    run_position(checkpoint, trained_args['block_size'])
resumed_accuracy = checkpoint.get('val_accuracy') if checkpoint else None
if checkpoint and master and not eval_only:
    print(f"resuming {ckpt_path} at iteration {iter_num} of {max_iters} (best val loss so far {best_val_loss:.4f})")
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
if checkpoint:
    load_optimizer_state(model, optim, checkpoint['optimizer'], fsdp, ckpt_path)
    if scaler.is_enabled() and checkpoint.get('scaler'):  # empty when saved without fp16 (CPU, bf16)
        scaler.load_state_dict(checkpoint['scaler'])
    if master:  # rank 0's generators: other ranks keep the streams seeded above
        restore_generators(checkpoint['rng'], device)
    checkpoint = None  # free the memory
sharded = model  # FSDP's module: what state-dict gathering takes
if compile:
    model = torch.compile(model)
# evaluation: DDP's ranks share out its batches unevenly outside the wrapper; FSDP's must all run each forward
eval_model = model
if distributed and not fsdp:
    # buffers stay each rank's, never broadcast from rank 0 at a forward: rope tables every rank builds alike, MoE's
    # biases every rank moves alike and its load counters, each rank's own until update_expert_bias sums them.
    # torch 2.13 says so with forward_sync_buffers=False (which still broadcasts rank 0's once, here, where every
    # rank's are the same), deprecating the broadcast_buffers=False of earlier versions
    keep = 'forward_sync_buffers' if 'forward_sync_buffers' in inspect.signature(DDP).parameters else 'broadcast_buffers'
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None, **{keep: False})


# ----------------------------------------------------------------------------- checkpoints
def save_state(weights, opt_state, val_loss, elapsed_s, best):
    """Write ckpt.pt whole (model, optimizer, RNG, counters: all a resume needs to go on as if never stopped)
    and, when best, best.pt as a second name of it; rank 0 writes. -> the new (last_saved, best_saved), which
    the caller sets within the same critical() block: an interrupt during the writes waits until they name them."""
    saved = (iter_num, val_loss)
    if master:
        checkpoint = new_checkpoint(raw_model, optimizer=opt_state, scaler=scaler.state_dict(), iter_num=iter_num,
                                    best_val_loss=best_val_loss, best_iter=iter_num if best else best_saved and best_saved[0],
                                    val_loss=val_loss, eval_done=evaluated == iter_num, tokens=tokens_seen,
                                    val_accuracy=accuracy if evaluated == iter_num else None,
                                    config=dict(settings), meta=meta, rng=generator_states(device), elapsed_s=elapsed_s)
        checkpoint['model'] = weights
        save_checkpoint(checkpoint, ckpt_path)
        if best:
            keep_as(ckpt_path, best_path)
    return saved, saved if best else best_saved


def training_state():
    """(model weights, optimizer state) in our checkpoint's format (FSDP: every rank must call)."""
    return full_state(raw_model, sharded, optim, fsdp, master)


def kept():
    """'the last checkpoint is ...' for a line that ends the run."""
    return last_checkpoint(last_saved, best_saved, ckpt_path, best_path)


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
        f"{kept()}", code=1)


# ----------------------------------------------------------------------------- what the run prints and logs
def describe_run():
    """The first lines: where it runs, the model, and a note when the run will not go as the user may think."""
    print(f"device {device}, dtype {dtype}, compile {compile}, {world_size} process(es)"
          f"{' sharded (FSDP)' if fsdp else ''}, {tokens_per_iter:,} tokens per iteration, {threads_used}")
    total, active = raw_model.get_num_params(), raw_model.get_num_params(active=True)
    print(f"model: {total / 1e6:.2f}M parameters{f' ({active / 1e6:.2f}M active)' if active != total else ''}; "
          + ' '.join(f"{k}={v}" for k, v in asdict(raw_model.config).items() if k in SIZES or v != GPT_DEFAULTS.get(k)))
    if unreachable_splits:
        print(f"note: learned positions cannot go past block_size {block_size}: "
              + ', '.join(f"{s} ({example_shape[s][1]} tokens)" for s in unreachable_splits)
              + " not evaluated (logged as None); pos='rope' can go there")
    if objective_terms() and not eval_only:
        print(f"note: a step prints its objective, what training minimizes: the next-token loss + "
              f"{' + '.join(objective_terms())}; evaluations print the next-token loss alone")
    if decay_lr and not eval_only and iter_num < max_iters <= warmup_iters:
        print(f"note: warmup_iters ({warmup_iters}) outlasts max_iters ({max_iters}): the learning rate never reaches "
              f"its peak (the last step runs at {schedule.scale(max_iters - 1):.0%} of it); lower warmup_iters to "
              f"reach it")


def objective_terms():
    """What a training step minimizes besides the next-token loss (an evaluation's): the features' loss terms,
    each in its own words (Feature.objective)."""
    return [term for term in (feature.objective(raw_model) for feature in raw_model.features) if term]


def stop_if_sized_for_a_gpu(peak):
    """At a CPU's usual ~40% MFU: a recipe sized for a GPU stops at once with its estimate, not after minutes of
    silence (or goes on, said in a note, with cpu_anyway)."""
    total_seconds = (max_iters - iter_num) * flops_per_iter / (0.4 * peak) \
        + eval_seconds * (1 + (max_iters - iter_num) // eval_interval)
    if device_type != 'cpu' or total_seconds <= 1800 or eval_only:
        return
    recipe = next((a for a in sys.argv[1:] if a.endswith('.py')), None)
    cpu_recipe = recipe[:-3] + '_cpu.py' if recipe and os.path.exists(recipe[:-3] + '_cpu.py') else None
    estimate = (f"this run is sized for a GPU: on this CPU it would take about {total_seconds / 3600:.1f} h; "
                + (f"the CPU recipe is {cpu_recipe}" if cpu_recipe else
                   "config/shakespeare_modern_cpu.py is a recipe sized for a CPU"))
    if not cpu_anyway:
        die(f"{estimate} (--cpu_anyway=True trains it here all the same)")
    print(f"note: {estimate}; training all the same (cpu_anyway)", flush=True)


flops_per_iter = raw_model.flops_per_token() * tokens_per_iter
loss_label = 'objective' if objective_terms() else 'loss'  # what a step's line calls the loss it prints
eval_seconds = 0.0  # an estimate, for the progress bar
speed = wandb = None  # rank 0's
if master:
    describe_run()
    peak, measured = peak_for_mfu(peak_flops, device, dtype)
    speed = Speed(raw_model, batch_size * local_accum, device, dtype, peak, measured)
    eval_seconds = 2 * eval_iters * batch_size * block_size * raw_model.flops_per_token() / 3 / (0.4 * peak)
    stop_if_sized_for_a_gpu(peak)
    wandb = start_wandb(wandb_project, wandb_run_name, settings, out_dir) if wandb_log else None
evaluation = Evaluation(batches, eval_iters, ctx, eval_model, raw_model, rank, world_size, distributed, fsdp,
                        skip=unreachable_splits, progress=master and eval_seconds > 10,
                        token_bytes=token_bytes(meta, raw_model.config.vocab_size))

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
    bpb = (losses.get('bpb') or {}).get('val')
    print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
          f"{'' if bpb is None else f' ({bpb:.4f} bits per byte)'}{accuracy_text(losses, eval_splits)}")
    record = {'iter': iter_num, 'train_loss': losses['train'], 'val_loss': losses['val'], 'lr': lr,
              'tokens': tokens_seen, 'elapsed_s': elapsed_s,
              'ms_per_iter': 1000 * train_time / train_steps if train_steps else None,
              **accuracy_fields(losses, eval_splits), **({} if bpb is None else {'val_bpb': bpb})}
    task_scores = score_task() if task_lm is not None else None
    if task_scores is not None:
        record['task'] = {eval_task: task_scores}
        print(f"step {iter_num}: {eval_task} " + ', '.join(f"{k} {v:.4f}" for k, v in task_scores.items()))
    if eval_only:  # an evaluation of the trained model, maybe at another length or scaling: say so
        record.update(eval_only=True, **{k: getattr(raw_model.config, k) for k in RUNTIME_FLAGS
                                         if k != 'dropout' and getattr(raw_model.config, k) != trained_args[k]})
    if 'moe' in losses:  # the experts' load: a collapsed router shows as an expert with share 0
        record['moe'] = losses['moe']
    for feature in raw_model.features:  # their loss terms' means over the steps since the last record (mtp_loss, ...)
        record.update({name: value for name, value in feature.figures(raw_model).items() if value is not None})
    if blown_up and not save:
        print(f"val loss {losses['val']:.4f} is over twice the best ({best_val_loss:.4f}): not saving; {kept()}")
    return record


def log_evaluation(record):
    """Rank 0: the record into log.jsonl (and wandb)."""
    if not master:
        return
    append_log(log_path, record)
    if wandb:
        wandb.log({**flat_record(record), **({'mfu': speed.mfu * 100} if speed.show_mfu else {})})


def schedule_features(fraction):
    """What the model's features schedule over training (Feature.progress: windows that grow)."""
    for feature in raw_model.features:
        feature.progress(raw_model, fraction)


def train_step(it):
    """One optimizer step over this process's micro batches -> their summed loss, on the device. The caller holds
    interrupts for it (a step is whole); a step that fails lets go of the hold, so the error can end the run."""
    try:
        loss_sum = torch.zeros((), device=device)
        for micro in range(local_accum):
            x, y = batches.get('train', train_generator(seed, it, rank * local_accum + micro))
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
        for feature in raw_model.features:  # what follows the step (sigmoid routers' balancing bias)
            feature.after_step(raw_model, all_reduce_sum if distributed else lambda tensors: None)
    except Exception:
        deliver_interrupts(discard=True)  # what ends the process is under way: an interrupt adds nothing
        raise
    return loss_sum


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
    print(f"iter {iter_num}/{max_iters}: {loss_label} {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
          f"{tokens_per_iter / dt:,.0f} tok/s, {speed.line(max_iters - iter_num)}")


def summary(final_val, trained_s):
    """The run's last line: what a user would otherwise dig out of the log. trained_s: this process's seconds in
    training steps (evaluations and saves left out), which its tokens/s divides by."""
    from common.progress import fmt_duration
    final = f"final val loss {final_val:.4f}" if final_val is not None else "no evaluation this run"
    best = f", best {best_saved[1]:.4f} (iter {best_saved[0]})" if best_saved else ''
    steps = iter_num - start_iter
    rate = f", {steps * tokens_per_iter / trained_s:,.0f} tok/s" if steps and trained_s > 0 else ''
    return (f"done: iter {iter_num}/{max_iters}, {final}{best}, {steps} iterations in "
            f"{fmt_duration(time.time() - t_process)}{rate}")


# ----------------------------------------------------------------------------- training loop
t_start = time.time() - elapsed_before  # elapsed_s continues across resumes
train_time, train_steps = 0.0, 0  # since the last evaluation, for ms/iter in log.jsonl
start_iter = iter_num
t_process, trained_s, final_val = time.time(), 0.0, None  # for the summary line
# val accuracy of the last evaluation (a task dataset's): a resumed checkpoint that solved the task trains no further
accuracy = resumed_accuracy
solved = bool(stop_accuracy) and not eval_only and evaluated == iter_num and (accuracy or 0) >= stop_accuracy
try:
    while True:
        lr = schedule.set_lr(optim, iter_num)
        save = False

        # a resumed run's first iteration was evaluated, logged and saved before it stopped (unless an interrupt
        # saved it before its evaluation)
        if ((iter_num % eval_interval == 0 or iter_num == max_iters) and iter_num != evaluated) or eval_only:
            schedule_features(1.0)  # what a feature schedules, at its end
            losses = evaluation.estimate_loss()
            final_val = losses['val']
            stop_non_finite('train loss', losses['train'])
            stop_non_finite('val loss', losses['val'])
            trained = iter_num > 0 and not eval_only  # a model this run may save: iter 0's is not trained yet
            improved = trained and losses['val'] < best_val_loss  # best.pt: never replaced by a worse model
            # a loss far above the best is a run blowing up: ckpt.pt keeps the better state too
            blown_up = trained and losses['val'] > 2 * best_val_loss
            # every process reads the same accuracy (the evaluation sums over them all), so all stop together
            accuracy = losses['accuracy']['val'] if example_data else None
            solved = trained and bool(stop_accuracy) and accuracy >= stop_accuracy
            # the first trained evaluation always saves: a run never ends without a checkpoint it could have had;
            # nor without the state that solved its task, whatever its val loss
            save = trained and (improved or solved or last_saved is None or (always_save_checkpoint and not blown_up))
            weights, opt_state = training_state() if save else (None, None)  # FSDP: every rank gathers
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
        if solved and master:  # the line says which checkpoint holds the solving state, and which the best val loss
            again = '' if iter_num > start_iter else ' (the checkpoint had: a higher stop_accuracy, or 0, trains on)'
            print(f"val accuracy {accuracy:.4f} reached stop_accuracy={stop_accuracy} at iter {iter_num}: the task is "
                  f"solved, training ends here{again}; {kept()}")
        if eval_only or iter_num >= max_iters or solved:
            break

        # one step whole: an interrupt waits for its end, where the state is one a resume continues from exactly
        hold_interrupts()
        t0 = time.time()
        schedule_features(iter_num / max_iters)
        loss_sum = train_step(iter_num)
        iter_num += 1
        tokens_seen += tokens_per_iter
        deliver_interrupts()

        logging = iter_num % log_interval == 0 or iter_num == max_iters
        lossf = mean_loss(loss_sum) if logging else None  # reading the loss waits for the device
        dt = time.time() - t0
        train_time, train_steps = train_time + dt, train_steps + 1
        trained_s += dt
        if logging:
            stop_non_finite('train loss', lossf)
            report_step(lossf, lr, dt)
except Interrupted as e:
    # the state between two steps is whole: saved, a resume continues from this very iteration (FSDP's
    # gathering would need every process, which the interrupt may have stopped already)
    if master and iter_num > start_iter and not fsdp and (last_saved is None or last_saved[0] != iter_num):
        with critical():
            last_saved, best_saved = save_state(*training_state(), None, round(time.time() - t_start, 3), best=False)
        die(f"interrupted at iter {iter_num}, its state saved; {kept()}; --init_from=resume continues from there",
            code=e.code)
    if master:
        die(f"interrupted at iter {iter_num}; {kept()}", code=e.code)
    sys.exit(e.code)
except Exception as e:
    if distributed and collective_error(e):  # another process ended or hung: one line each, not gloo's tracebacks
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        die(f"{'' if master else f'rank {rank}: '}another process stopped at iter {iter_num} ({first})"
            + (f"; {kept()}" if master else ''), code=1)
    if not out_of_memory(e):
        raise
    die(f"out of memory at iter {iter_num} on {device}: lower batch_size ({batch_size}), block_size "
        f"({block_size}) or the model (n_layer, n_embd); {kept()}", code=1)

if master and last_saved is None and not eval_only:  # say it: the out_dir holds only the log
    print(f"note: no checkpoint was saved: {'max_iters=0 trains nothing' if max_iters == 0 else 'no evaluation after training started'}; "
          f"out_dir '{out_dir}' holds only log.jsonl")

if master and not eval_only:
    print(summary(final_val, trained_s))
if wandb:
    wandb.finish()
if distributed:
    dist.destroy_process_group()
