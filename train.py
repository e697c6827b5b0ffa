"""
Train a GPT with any mix of vanilla and modern swaps, on one CPU, one GPU, or many with DDP.

    python train.py config/shakespeare_modern.py --batch_size=32 --n_kv_head=3
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_modern.py

Settings are the globals below; a config file, then --key=value, override them (configurator.py).
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields

from configurator import configure, model_flags, settings_of

# ----------------------------------------------------------------------------- settings
# I/O
out_dir = 'out'
eval_interval = 2000
log_interval = 1
eval_iters = 200
eval_only = False  # evaluate once and exit
always_save_checkpoint = True  # else save only when val loss improves
init_from = 'scratch'  # 'scratch', 'resume', or a GPT-2 / Llama name or directory
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
vocab_size = None  # None: the dataset's (meta.json), else GPT-2's 50304
# AdamW
learning_rate = 6e-4
max_iters = 600000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables
# learning rate: linear warmup, then cosine decay to min_lr
decay_lr = True
warmup_iters = 2000
lr_decay_iters = 600000
min_lr = 6e-5
# system
backend = 'auto'  # DDP: 'nccl' on CUDA, 'gloo' on CPU
device = 'auto'  # 'auto' (cuda, mps, cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' (bf16, else fp16 on CUDA; fp32 elsewhere), 'float32', 'bfloat16', 'float16'
compile = None  # None: on for CUDA only
peak_flops = 0.0  # for MFU; 0: a known GPU's peak, else a matmul measured at start
seed = 1337
settings = configure(settings_of(globals()), sys.argv[1:], prog='train.py', doc=__doc__)
globals().update(settings)

# the heavy imports only now: --help and a mistyped setting answer before torch loads
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.distributed import destroy_process_group, init_process_group  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from common import (autocast, die, load_checkpoint, load_pretrained, model_from_checkpoint,  # noqa: E402
                    new_checkpoint, peak_flops as measure_peak_flops, pick_device, pick_dtype, save_checkpoint)
from model import GPT, RUNTIME_FLAGS, GPTConfig  # noqa: E402

MODEL_FLAGS = tuple(f.name for f in fields(GPTConfig))
GPT_DEFAULTS = asdict(GPTConfig())
SIZES = ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size')  # always shown; other flags when not default
EVAL_SEED = 20240101  # one fixed set of eval batches for every run, variant and seed
# -----------------------------------------------------------------------------

# DDP: torchrun sets RANK; one process per device
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    rank, local_rank, world_size = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
    if backend == 'auto':
        backend = 'nccl' if torch.cuda.is_available() and device != 'cpu' else 'gloo'
    init_process_group(backend=backend)
    if device != 'cpu' and torch.cuda.is_available():  # one GPU per process, whatever --device named
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
else:
    rank, local_rank, world_size = 0, 0, 1
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
for name in ('batch_size', 'gradient_accumulation_steps', 'eval_interval', 'log_interval', 'eval_iters'):
    if globals()[name] < 1:
        die(f"{name} must be at least 1, got {globals()[name]}")
if max_iters < 0:
    die(f"max_iters must be >= 0, got {max_iters}")

torch.manual_seed(seed)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
ctx = autocast(device, dtype)

# ----------------------------------------------------------------------------- data
data_dir = os.path.join('data', dataset)
for split in ('train', 'val'):
    path = os.path.join(data_dir, f'{split}.bin')
    if not os.path.exists(path):
        die(f"dataset file '{path}' not found; create it with: python data/{dataset}/prepare.py")
    if os.path.getsize(path) // 2 <= block_size:
        die(f"'{path}' holds {os.path.getsize(path) // 2} tokens, too few for block_size {block_size}")


def get_batch(split, generator):
    # a fresh memmap per batch: numpy keeps a long-lived one's pages and memory grows
    data = np.memmap(os.path.join(data_dir, f'{split}.bin'), dtype=np.uint16, mode='r')
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix.tolist()])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix.tolist()])
    if device_type == 'cuda':
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def train_generator(it, micro):
    """Batches depend only on (seed, iteration, global micro step): resume is exact, and N processes draw
    exactly the batches one process would with the same global gradient_accumulation_steps."""
    return torch.Generator().manual_seed(hash((seed, it, micro)) & (2 ** 63 - 1))


meta_vocab_size = None
meta_path = os.path.join(data_dir, 'meta.json')
if os.path.exists(meta_path):
    with open(meta_path) as f:
        meta = json.load(f)
    meta_vocab_size = meta.get('vocab_size')
    if meta.get('kind') == 'tiktoken':  # GPT-2's 50257 padded to 50304: a multiple of 64 runs faster on GPUs
        meta_vocab_size = 64 * math.ceil(meta_vocab_size / 64)

# ----------------------------------------------------------------------------- model
iter_num, best_val_loss, checkpoint, elapsed_before = 0, float('inf'), None, 0.0
trained_args = None  # the model flags a resumed checkpoint was trained with
model_args = {k: settings[k] for k in MODEL_FLAGS}
ckpt_path = os.path.join(out_dir, 'ckpt.pt')
if init_from == 'scratch':
    model_args['vocab_size'] = vocab_size or meta_vocab_size or 50304
    try:
        model = GPT(GPTConfig(**model_args))
    except ValueError as e:
        die(str(e))
elif init_from == 'resume':
    checkpoint = load_checkpoint(ckpt_path, hint=f"train first with init_from='scratch' into out_dir '{out_dir}'")
    # the architecture is the checkpoint's; the runtime flags this run sets (a longer block_size with a RoPE
    # scaling, a window) and dropout, a training choice, are this run's
    model = model_from_checkpoint(checkpoint, ckpt_path, settings)
    ignored = [k for k in MODEL_FLAGS if k in settings.given and k not in RUNTIME_FLAGS
               and checkpoint['model_args'].get(k) != settings[k]]
    if ignored and master:
        print(f"resuming with the checkpoint's model flags, not this run's: {', '.join(ignored)}")
    iter_num, best_val_loss = checkpoint['iter_num'], checkpoint['best_val_loss']
    elapsed_before = checkpoint.get('elapsed_s', 0.0)
    trained_args = {**asdict(GPTConfig()), **checkpoint['model_args']}
else:
    model = load_pretrained(init_from, settings)
if meta_vocab_size and meta_vocab_size > model.config.vocab_size:
    die(f"dataset '{dataset}' has {meta_vocab_size} token ids but the model only {model.config.vocab_size}")
trained_args = trained_args or asdict(model.config)
for k in MODEL_FLAGS:  # what was really built is what gets logged and saved
    settings[k] = getattr(model.config, k)
block_size = model.config.block_size
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
model.to(device)

if ddp:  # every rank starts from rank 0's weights (DDP broadcasts them); dropout should differ per rank
    torch.manual_seed(seed + rank + iter_num)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint['optimizer'])
    if scaler.is_enabled() and checkpoint['scaler']:  # empty when saved without fp16 (CPU, bf16)
        scaler.load_state_dict(checkpoint['scaler'])
    if master:  # other ranks keep the dropout streams seeded above
        torch.set_rng_state(checkpoint['rng']['torch'])
        if device_type == 'cuda' and checkpoint['rng'].get('cuda'):
            torch.cuda.set_rng_state(checkpoint['rng']['cuda'], device)
    checkpoint = None  # free the memory
raw_model = model  # what gets saved: no compile prefix, no DDP wrapper
if compile:
    model = torch.compile(model)
eval_model = model  # evaluation runs outside DDP: ranks share out its batches unevenly
if ddp:
    # the only buffers are rope tables every rank builds alike: no need to broadcast them each step
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None, broadcast_buffers=False)


@torch.no_grad()
def estimate_loss():
    """Mean loss on eval_iters fixed batches per split, shared out across DDP processes; with MoE layers,
    also their load and balancing losses on the val batches (out['moe'])."""
    eval_model.eval()
    out = {}
    for split in ('train', 'val'):
        generator = torch.Generator().manual_seed(EVAL_SEED + (split == 'val'))
        raw_model.moe_report()  # restart the experts' counts
        total = torch.zeros((), device=device)
        for k in range(eval_iters):
            x, y = get_batch(split, generator)
            if k % world_size == rank:
                with ctx:
                    _, loss = eval_model(x, y)
                total += loss.float()
        if ddp:
            torch.distributed.all_reduce(total)
        out[split] = total.item() / eval_iters
    if raw_model.moe_layers():
        if ddp:
            for counter in raw_model.moe_counters():
                torch.distributed.all_reduce(counter)
        out['moe'] = raw_model.moe_report()
    eval_model.train()
    return out


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


def get_lr(it):
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def stop_non_finite(what, value):
    if not math.isfinite(value):
        if ddp:
            destroy_process_group()
        if not master:
            sys.exit(1)
        last = f"the last good checkpoint is '{ckpt_path}'" if os.path.exists(ckpt_path) else "no checkpoint was saved"
        die(f"{what} is {value} at iter {iter_num}: training diverged (try a lower learning_rate or "
            f"grad_clip); {last}", code=1)


# ----------------------------------------------------------------------------- logging
if master:
    os.makedirs(out_dir, exist_ok=True)
    print(f"device {device}, dtype {dtype}, compile {compile}, {world_size} process(es), "
          f"{tokens_per_iter:,} tokens per iteration")
    print(f"model: {raw_model.get_num_params() / 1e6:.2f}M parameters; " + ' '.join(
        f"{k}={v}" for k, v in asdict(raw_model.config).items() if k in SIZES or v != GPT_DEFAULTS.get(k)))
    if peak_flops <= 0:
        peak_flops, how = measure_peak_flops(device, dtype)
        print(f"peak {peak_flops / 1e12:.3g} TFLOP/s for MFU ({how})")
    if wandb_log:
        try:
            import wandb
            wandb.init(project=wandb_project, name=wandb_run_name, config=settings, dir=out_dir)
        except ImportError:
            die("wandb_log=True needs wandb: pip install wandb")
        except Exception as e:  # no login, no network: say so in one line (WANDB_MODE=offline works without)
            die(f"wandb could not start ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                f"try WANDB_MODE=offline")
log_path = os.path.join(out_dir, 'log.jsonl')

# ----------------------------------------------------------------------------- training loop
t_start = time.time() - elapsed_before  # elapsed_s continues across resumes
resumed_at = iter_num if init_from == 'resume' else None
train_time, train_steps = 0.0, 0  # since the last evaluation, for ms/iter in log.jsonl
running_mfu, recent_dt = -1.0, []
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group['lr'] = lr

    # a resumed run's first iteration was evaluated, logged and saved before it stopped
    if ((iter_num % eval_interval == 0 or iter_num == max_iters) and iter_num != resumed_at) or eval_only:
        losses = estimate_loss()
        stop_non_finite('train loss', losses['train'])
        stop_non_finite('val loss', losses['val'])
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            record = {'iter': iter_num, 'train_loss': losses['train'], 'val_loss': losses['val'], 'lr': lr,
                      'tokens': iter_num * tokens_per_iter, 'elapsed_s': round(time.time() - t_start, 3),
                      'ms_per_iter': 1000 * train_time / train_steps if train_steps else None}
            if eval_only:  # an evaluation of the trained model, maybe at another length or scaling: say so
                record.update(eval_only=True, **{k: getattr(raw_model.config, k) for k in RUNTIME_FLAGS
                                                 if k != 'dropout' and getattr(raw_model.config, k) != trained_args[k]})
            if 'moe' in losses:  # the experts' load: a collapsed router shows as an expert with share 0
                record['moe'] = losses['moe']
            with open(log_path, 'a') as f:
                f.write(json.dumps(record) + '\n')
            if wandb_log:
                wandb.log({**flat_record(record), 'mfu': running_mfu * 100})
            improved = losses['val'] < best_val_loss
            best_val_loss = min(best_val_loss, losses['val'])
            if (improved or always_save_checkpoint) and iter_num > 0 and not eval_only:
                rng = {'torch': torch.get_rng_state()}
                if device_type == 'cuda':
                    rng['cuda'] = torch.cuda.get_rng_state(device)
                save_checkpoint(new_checkpoint(raw_model, optimizer=optimizer.state_dict(),
                                               scaler=scaler.state_dict(), iter_num=iter_num,
                                               best_val_loss=best_val_loss, config=dict(settings), rng=rng,
                                               elapsed_s=record['elapsed_s']), ckpt_path)
                print(f"saved checkpoint to {ckpt_path}")
        train_time, train_steps = 0.0, 0
    if eval_only or iter_num >= max_iters:
        break

    t0 = time.time()
    loss_sum = torch.zeros((), device=device)
    for micro in range(local_accum):
        x, y = get_batch('train', train_generator(iter_num, rank * local_accum + micro))
        # gradients are all-reduced only after the last micro step
        no_sync = model.no_sync() if ddp and micro < local_accum - 1 else nullcontext()
        with no_sync, ctx:
            _, loss = model(x, y)
            loss_sum += loss.detach().float()
            loss = loss / local_accum
        scaler.scale(loss).backward()
    if grad_clip > 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if raw_model.moe_layers():  # sigmoid routers' balancing bias follows this step's load, the same on every rank
        if ddp:
            for counter in raw_model.moe_counters():
                torch.distributed.all_reduce(counter)
        raw_model.balance_experts()
    iter_num += 1

    logging = iter_num % log_interval == 0 or iter_num == max_iters
    if logging:  # reading the loss waits for the device, so only on logging iterations
        if ddp:
            torch.distributed.all_reduce(loss_sum)
        lossf = loss_sum.item() / gradient_accumulation_steps  # the mean over every micro step
    dt = time.time() - t0
    train_time, train_steps = train_time + dt, train_steps + 1
    if logging:
        stop_non_finite('train loss', lossf)
        if master:
            recent_dt = (recent_dt + [dt])[-20:]
            mean_dt = sum(recent_dt) / len(recent_dt)
            if iter_num >= 5:  # the first iterations include warm-up and compilation
                mfu = raw_model.estimate_mfu(batch_size * local_accum, dt, peak_flops)  # per device
                running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            eta = time.strftime('%H:%M:%S', time.gmtime(mean_dt * (max_iters - iter_num)))
            print(f"iter {iter_num}/{max_iters}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                  f"{tokens_per_iter / dt:,.0f} tok/s, mfu {max(running_mfu, 0) * 100:.2f}%, eta {eta}")

if ddp:
    destroy_process_group()
