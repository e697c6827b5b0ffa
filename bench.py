"""
Benchmark block variants side by side in one run, so their ratios are comparable: parameters, training
ms/iter, tokens/s and MFU, decoding tokens/s with and without the KV cache, and KV cache bytes per token.

    python bench.py --variants=vanilla,modern
    python bench.py --variants=vanilla,rms,swiglu,gqa,rope,modern --json=bench.json
    python bench.py --variants=vanilla --nanogpt_dir=../nanoGPT   # is vanilla as fast as nanoGPT's GPT?

variants: '' benchmarks the one model the flags describe; else a comma-separated list, each applied on top
of the flags: vanilla (the flags unchanged: with the defaults, GPT-2's block), each swap of model.SWAPS
(rms, swiglu, gqa: n_kv_head = n_head // 2, rope), modern (all of them), and on top of modern: mha (n_kv_head
None), mqa (n_kv_head 1), each of chapters.BEYOND_MODERN (moe, mla, mhc:
four copies of the stream), mla-rebuild (MLA decoding that rebuilds
past keys and values instead of attending over the latents with absorbed weights), and per-layer attention with a
window of block_size/4: each layer kind of model.LAYER_KINDS by its name, every layer of that kind (local, chunked,
shortconv, deltanet, kda, mamba2) and three of them to one global layer (local-hybrid, ...; deltanet-hybrid is
Qwen3-Next's 'DDDG'), with aliases lllg (local-hybrid) and hybrid (deltanet-hybrid); lg+sinks (gpt-oss's
alternation with sinks), gate (the output gate), nope (a layer in four without RoPE), partial (half of each head
rotated); dsa and
mla+dsa (DeepSeek Sparse Attention on modern and on MLA: each query reads the block_size/8 keys its indexer picks);
v4 (DeepSeek-V4's attention at its release's sizes: a window of 128 on every layer, HCA and CSA layers in turn).
decode_prompt: decoding starts after this many prompt tokens (the cache already holds them: a long context).
nanogpt_dir: a checkout of karpathy/nanoGPT; its GPT, at the same sizes, is timed as an extra row.
vs_hf: greedy decoding of each variant against Hugging Face generate on the same weights (bench_decode.py):

    python bench.py --vs_hf=True --variants=vanilla,modern --threads=2 --device=cpu --vs_hf_dtype=float32,bfloat16
    python bench.py --vs_hf=True --variants=mha,modern,mla --decode_prompt=1024 --block_size=1280 --threads=2
vs_hf_families: the same race on the Hugging Face families' own models (a comma-separated list of model_types of
hf.HF_FAMILIES, or all): each the tiny random model its parity test builds (hf/tiny.py), grown to n_layer layers of
n_embd (a multiple of 32) and block_size positions, and imported (GPT.from_pretrained); with variants '' only those:

    python bench.py --vs_hf=True --vs_hf_families=mixtral,qwen3_next --n_layer=4 --n_embd=256 --threads=1 --device=cpu
Training times full steps (forward, backward, AdamW) on random tokens; decoding samples decode_tokens new
tokens (temperature 1) from a one-token prompt. peak_flops 0: a known GPU's datasheet, else a measured matmul.
FLOPs per token are given twice: by our formula (model.flops_per_token, what MFU reads) and as torch's
FlopCounterMode counts one training step (a mask's skipped keys counted as computed: 'mask' in the row; other work
our formula leaves out, 5% or more of it, such as MLA's values padded to its keys' width on a CPU: '+N%').
baseline: a variant whose training steps each variant's take in turn; the table then gives each one's time, FLOPs
(torch's) and cost per FLOP (ms per FLOP; the JSON adds it over our formula's FLOPs too, cost_per_flop_formula)
over the baseline's, from the fastest step of each, so that a machine
other jobs slow shows the ratios nearly as a quiet one would (timer='process', one thread: the CPU seconds the steps
took, which waiting for a core does not add to, on a machine shared with many jobs):

    python bench.py --variants=deltanet,kda-hybrid,mamba2-hybrid --baseline=modern --n_layer=4 --n_head=4 \
        --n_embd=128 --batch_size=8 --threads=1 --timer=process --device=cpu --train_iters=10 --decode_uncached=False
"""

import contextlib
import copy
import importlib.util
import io
import json as jsonlib  # `json` is a setting
import os
import platform
import statistics
import sys
import time
from dataclasses import fields
from typing import Optional

from configurator import configure, model_flags, settings_of

# model: every field of GPTConfig (model.py) is a setting, with its default there; the sizes of nanoGPT's
# shakespeare_char recipe (without dropout: it only adds noise to the timings)
globals().update(model_flags())
n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
bias = False
vocab_size = 65  # shakespeare_char's
# benchmark
variants = ''  # '' or e.g. 'vanilla,modern' (see above)
nanogpt_dir = ''
batch_size = 12
warmup_iters = 3  # untimed: compilation, allocator and cache warm-up
train_iters = 10  # timed training steps; 0: decoding only (a long context's steps can take minutes on a CPU)
decode_tokens = 200  # decoding steps timed (the prompt and they must fit in block_size: no context shift)
decode_batch = 1
decode_prompt = 1  # prompt tokens before the timed decoding
decode_uncached = True  # False: skip decoding without the cache (each step recomputes the context: slow at 8k)
device = 'auto'
dtype = 'auto'
compare_dtype = ''  # e.g. 'bfloat16': training steps in this dtype too, taken in turn with dtype's (an extra row)
compile: Optional[bool] = None  # None: on for CUDA only (training model only; decoding uses the raw model)
peak_flops = 0.0
seed = 1337
timer = 'wall'  # 'wall': seconds on the clock; 'process': CPU seconds of this process (a CPU's steps, one thread: what they cost where other jobs share the cores and take turns with them)
baseline = ''  # a variant: each variant's training steps taken in turn with its, for time and cost per FLOP over it
train_profile = False  # also the top operators of each variant's training step (torch.profiler): where a cost per FLOP goes
json = ''  # path: also write the figures as JSON (a bare --json: bench.json)
# decoding against Hugging Face (no training rows): each variant exported with the same weights (export.to_hf),
# greedy, decode_tokens new tokens after a decode_prompt-token prompt, at each of vs_hf_batches
vs_hf = False
vs_hf_batches = '1,8'
vs_hf_repeats = 3  # the runs of each side, interleaved (ours, ours compiled, HF, ours, ...): the best is kept
vs_hf_profile = False  # also the top operators of a decoding step, ours eager and compiled (torch.profiler)
vs_hf_dtype = 'float32'  # both sides' weights and KV caches; a list (float32,bfloat16) gives rows for each
vs_hf_families = ''  # e.g. 'mixtral,qwen3_next' or 'all': each family's tiny random HF model (hf/tiny.py), n_layer x n_embd, imported
threads = 0  # torch's intra-op threads; 0: on a CPU its usable cores (OMP_NUM_THREADS if set), else torch's default
# a bare --json means the default file
argv = ['--json=bench.json' if arg == '--json' else arg for arg in sys.argv[1:]]
defaults = settings_of(globals())
settings = configure(defaults, argv, prog='bench.py', doc=__doc__)
globals().update(settings)
# settings one kind of run reads and the other does not: given to the other, a note says so, not silence
TABLE_ONLY = ('compare_dtype', 'baseline', 'timer', 'nanogpt_dir', 'train_iters', 'warmup_iters', 'batch_size', 'decode_batch',
              'decode_uncached', 'compile', 'peak_flops')
VS_HF_ONLY = ('vs_hf_batches', 'vs_hf_repeats', 'vs_hf_profile', 'vs_hf_dtype', 'vs_hf_families')

# the heavy imports only now: --help and a mistyped setting answer before torch loads
import torch  # noqa: E402

from common.errors import catch_interrupts, die  # noqa: E402
from common.flops import training_flops  # noqa: E402
from common.files import output_refusal, write_output  # noqa: E402
from common.hardware import DTYPES, autocast, peak_flops as measure_peak_flops, pick_device, pick_dtype  # noqa: E402
from common.progress import progress  # noqa: E402
from common.threads import use_threads  # noqa: E402
from chapters import BEYOND_MODERN, GPT, SWAPS, GPTConfig, swap_flags  # noqa: E402
from model import LAYER_KINDS, TokenMixer  # noqa: E402

catch_interrupts()  # Ctrl-C or kill: one line, exit 130 or 143
MODEL_FLAGS = tuple(f.name for f in fields(GPTConfig))
model_args = {k: settings[k] for k in MODEL_FLAGS}
# the vanilla block as the flags give it, each swap of model.SWAPS on top of it, and all of them
modern = swap_flags('modern', model_args)
VARIANTS = {'vanilla': {}, **{name: swap_flags([name], model_args) for name in SWAPS}, 'modern': modern,
            'mha': {**modern, 'n_kv_head': None}, 'mqa': {**modern, 'n_kv_head': 1},
            **{name: {**modern, **flags} for name, flags in BEYOND_MODERN.items()},
            'mla-rebuild': {**modern, **BEYOND_MODERN['mla']}}
# each layer kind of LAYER_KINDS on top of modern, alone ('<name>') and three to one global layer ('<name>-hybrid'),
# with what it needs (a window or a chunk of a quarter of block_size, as ablate.py's groups); the names kept from
# before the registry said them: lllg (local-hybrid), hybrid (deltanet-hybrid), nope (a NoPE layer in four)
_window = max(1, model_args['block_size'] // 4)
for _letter, _kind in LAYER_KINDS.items():
    if _letter == 'G' or not getattr(_kind.build, 'mixes', True):  # global attention is modern's; '-' mixes nothing
        continue
    for _name, _pattern in ((_kind.name, _letter), (f'{_kind.name}-hybrid', _letter * 3 + 'G')):
        VARIANTS[_name] = {**modern, 'layers': _pattern, **(_kind.needs(model_args, _window) if _kind.needs else {})}
VARIANTS.update({'lllg': VARIANTS['local-hybrid'], 'hybrid': VARIANTS['deltanet-hybrid'],
                 'nope': {**modern, 'layers': 'GGGN'},
                 'lg+sinks': {**VARIANTS['local'], 'layers': 'LG', 'attn_sinks': True},
                 'gate': {**modern, 'attn_gate': True}, 'partial': {**modern, 'rope_fraction': 0.5}})
# DeepSeek Sparse Attention on top of modern and of MLA: each query reads block_size/8 keys its indexer picks
_sparse = {'index_topk': max(1, block_size // 8), 'index_head_dim': max(32, n_embd // n_head)}
VARIANTS.update({'dsa': {**modern, **_sparse}, 'mla+dsa': {**modern, **BEYOND_MODERN['mla'], **_sparse}})
# DeepSeek-V4's attention at its release's sizes whatever block_size: one shared key-value head with sinks, a window of
# 128 on every layer, 'H' and 'I' layers in turn (an entry per 128 tokens; an entry per 4, the indexer reading 512)
VARIANTS['v4'] = {**modern, 'n_kv_head': None, 'attn': 'shared_kv', 'attn_sinks': True, 'layers': 'HI',
                  'sliding_window': 128, 'hca_rate': 128, 'csa_rate': 4, 'csa_topk': 512,
                  'csa_index_dim': max(32, n_embd // n_head)}

# ----------------------------------------------------------------------------- checks first, then minutes of timing
for name in ('batch_size', 'decode_tokens', 'decode_batch', 'decode_prompt'):
    if settings[name] < 1:
        die(f"{name} must be at least 1, got {settings[name]}")
if warmup_iters < 0 or train_iters < 0:
    die(f"warmup_iters and train_iters must be >= 0 (train_iters 0: decoding only), got {warmup_iters} and "
        f"{train_iters}")
if decode_prompt + decode_tokens > block_size:
    die(f"decode_prompt + decode_tokens ({decode_prompt} + {decode_tokens}) must fit in block_size ({block_size}): "
        f"past it the context shifts and re-prefills, which is not decoding speed")

def note_unread():
    """A note on the settings this run does not read (said once the settings are checked, before the timing)."""
    unread = [k for k in (TABLE_ONLY if vs_hf else VS_HF_ONLY) if settings[k] != defaults[k]]
    if unread:
        print(f"note: {', '.join(f'--{k}' for k in unread)} " + (
            "apply to the training and decoding table, which --vs_hf=True does not make: ignored" if vs_hf else
            "apply to --vs_hf=True only: ignored"), file=sys.stderr, flush=True)
    elif compare_dtype and not train_iters:
        print(f"note: compare_dtype={compare_dtype} times training steps in that dtype, and train_iters=0 takes "
              f"none: no {compare_dtype} rows", file=sys.stderr, flush=True)


names = [v.strip() for v in variants.split(',') if v.strip()]
families = []
if vs_hf_families:  # hf imports no transformers until a family is built
    from hf import HF_FAMILIES
    families = list(HF_FAMILIES) if vs_hf_families == 'all' else [f.strip() for f in vs_hf_families.split(',')]
    bad = [f for f in families if f not in HF_FAMILIES]
    if bad:
        die(f"unknown vs_hf_families {', '.join(map(repr, bad))}; choose from all, {', '.join(HF_FAMILIES)}")
    if n_embd < 32 or n_embd % 32:
        die(f"vs_hf_families scales each family's 32-wide tiny model: n_embd must be a multiple of 32, got {n_embd}")
unknown = [v for v in names + ([baseline] if baseline else []) if v not in VARIANTS]
if unknown:
    die(f"unknown variant(s) {', '.join(map(repr, unknown))}; choose from {', '.join(VARIANTS)}")
configs = []
for name in names or ([] if families and vs_hf else ['']):  # the families alone, unless variants are named
    try:
        cfg = GPTConfig(**{**model_args, **VARIANTS.get(name, {})})
    except ValueError as e:
        die(f"variant {name!r}: {e}" if name else str(e))
    configs.append((name or f"{cfg.norm}+{cfg.mlp}+kv{cfg.kv_heads}/{cfg.n_head}+{cfg.pos}", cfg))
if timer not in ('wall', 'process'):
    die(f"timer must be 'wall' or 'process', got {timer!r}")
try:  # the settings apply to the baseline too: one it cannot take is said as a variant's is
    baseline_config = GPTConfig(**{**model_args, **VARIANTS[baseline]}) if baseline else None
except ValueError as e:
    die(f"baseline {baseline!r}: {e}")
if baseline and not train_iters:
    die(f"baseline={baseline!r} compares training steps and train_iters=0 takes none: give train_iters >= 1")
if json:  # a checkpoint, a hard-linked file, a directory or a place we cannot write: said now, not after the timing
    refusal = output_refusal(json)
    if refusal:
        die(f"cannot write --json={json}: {refusal}")
nanogpt = None
if nanogpt_dir:
    path = os.path.join(nanogpt_dir, 'model.py')
    if not os.path.isfile(path):
        die(f"nanogpt_dir '{nanogpt_dir}' has no model.py (expected a checkout of karpathy/nanoGPT)")
    # a name of its own: plain 'model' is ours, already imported
    spec = importlib.util.spec_from_file_location('nanogpt_model', path)
    nanogpt = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = nanogpt  # dataclasses look their module up there
    try:
        spec.loader.exec_module(nanogpt)
    except Exception as e:
        die(f"cannot import nanoGPT's model from '{path}': {type(e).__name__}: {e}")
    if not (hasattr(nanogpt, 'GPT') and hasattr(nanogpt, 'GPTConfig')):
        die(f"'{path}' defines no GPT and GPTConfig: is it nanoGPT's model.py?")

device = pick_device(device)
device_type = device.split(':')[0]
if timer == 'process' and device_type != 'cpu':
    die(f"timer='process' counts this process's CPU seconds, which time no {device_type} kernel: use timer='wall'")
dtype = pick_dtype(device, dtype)
if threads < 0:
    die(f"threads must be >= 0 (0: the usable cores on a CPU, else torch's default), got {threads}")
threads_said = use_threads(threads, device)  # torch's default, every core, waits on other work on a busy machine
if vs_hf:
    from bench_decode import compare_with_hf
    try:
        batches = [int(b) for b in vs_hf_batches.split(',')]
    except ValueError:
        batches = [0]
    if min(batches) < 1 or vs_hf_repeats < 1:
        die(f"vs_hf_batches must be a comma-separated list of ints >= 1 and vs_hf_repeats >= 1, got "
            f"{vs_hf_batches!r} and {vs_hf_repeats}")
    vs_hf_dtypes = [d.strip() for d in vs_hf_dtype.split(',')]
    if not all(d in DTYPES for d in vs_hf_dtypes):
        die(f"vs_hf_dtype must be a comma-separated list of {', '.join(DTYPES)}; got {vs_hf_dtype!r}")
    note_unread()
    compare_with_hf(configs, batches, decode_prompt, decode_tokens, vs_hf_repeats, device, seed, json, vs_hf_profile,
                    vs_hf_dtypes, families, {'n_layer': n_layer, 'n_embd': n_embd, 'block': block_size})
    sys.exit(0)
if compile is None:
    compile = device_type == 'cuda'
settings.update(device=device, dtype=dtype, compile=compile)
torch.backends.cuda.matmul.allow_tf32 = True  # as train.py: fp32 matmuls on tensor cores
ctx = autocast(device, dtype)
cache_dtype = DTYPES[dtype]  # generate keeps the cache in the autocast dtype

gpu = torch.cuda.get_device_name(torch.device(device)) if device_type == 'cuda' else ''
if compare_dtype and compare_dtype not in DTYPES:
    die(f"compare_dtype must be '' or one of {', '.join(map(repr, DTYPES))}; got {compare_dtype!r}")
if peak_flops > 0:
    peak, how = peak_flops, 'from --peak_flops'
else:
    peak, how = measure_peak_flops(device, dtype)
note_unread()
compare_peak = (peak_flops or measure_peak_flops(device, compare_dtype)[0]) if compare_dtype else None
hardware = gpu or platform.processor() or platform.machine()
print(f"{device} ({hardware}), dtype {dtype}, compile {compile}, torch {torch.__version__}, {threads_said}; "
      f"batch {batch_size}x{block_size}, "
      f"{f'median of {train_iters} steps after {warmup_iters}' if train_iters else 'no training steps'}"
      f"{f', each in turn with {baseline} (the fastest step of each for the ratios)' if baseline else ''}"
      f"{', CPU seconds of this process' if timer == 'process' else ''}, "
      f"decode {decode_batch}x{decode_tokens} tokens after a "
      f"{decode_prompt}-token prompt", flush=True)


# ----------------------------------------------------------------------------- timing
def sync():
    # CUDA and MPS queue kernels and return at once: wait for them before reading the clock
    if device_type == 'cuda':
        torch.cuda.synchronize(device)
    elif device_type == 'mps':
        torch.mps.synchronize()


def training_batch():
    """One fixed batch of random tokens, the same for every row: inputs and targets."""
    tokens = torch.randint(vocab_size, (batch_size, block_size + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def torch_flops_per_token(model):
    """Forward + backward FLOPs per token of one training step as torch's FlopCounterMode counts them: its
    formulas for matmuls, convolutions and attention, whatever model.flops_per_token's say."""
    model.train()
    return training_flops(model, *training_batch(), ctx) / (batch_size * block_size)


def masked(model):
    """Whether a token mixer sees fewer keys than the context (a window, a chunk): its attention runs with a
    mask, over which torch counts every key."""
    return any(isinstance(m, TokenMixer) and m.window for m in model.modules())


def train_step_seconds(*runs):
    """Seconds of each timed full training step of each (model, dtype), on training_batch(); several runs take
    their steps in turn, so a noisy machine slows them alike."""
    x, y = training_batch()
    clock = time.process_time if timer == 'process' else time.perf_counter
    steppers = []
    for model, run_dtype in runs:
        model.train()
        with contextlib.redirect_stdout(io.StringIO()):  # nanoGPT's prints its parameter groups
            optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type)
        scaler = torch.amp.GradScaler(device_type, enabled=run_dtype == 'float16')
        steppers.append((model, optimizer, scaler, autocast(device, run_dtype), []))
    for it in progress(range(warmup_iters + train_iters), warmup_iters + train_iters, 'training steps'):
        for model, optimizer, scaler, run_ctx, times in steppers:
            sync()
            t0 = clock()
            with run_ctx:
                _, loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            sync()
            if it >= warmup_iters:
                times.append(clock() - t0)
    return [times for *_, times in steppers]


def train_step_profile(model, steps=3, rows=12):
    """The top operators (self CPU time) of `steps` training steps, forward and backward, as torch.profiler's table:
    what a variant's time is spent on beyond the matmuls FlopCounterMode counts."""
    from torch.profiler import ProfilerActivity, profile
    x, y = training_batch()
    model.train()
    with ctx:
        model(x, y)[1].backward()  # first-call overheads stay out of the table
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with ctx:
                _, loss = model(x, y)
            loss.backward()
    model.zero_grad(set_to_none=True)
    return prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=rows)


def decode_tokens_per_second(model, ours=True, **use_cache):
    """Decoding speed after a decode_prompt-token prompt (its prefill not timed; nanoGPT's generate has no
    steps to time apart, so its row times the whole call)."""
    model.eval()
    idx = torch.randint(vocab_size, (decode_batch, decode_prompt), generator=torch.Generator().manual_seed(seed))
    idx = idx.to(device)
    with ctx:
        model.generate(idx[:, :1], 2, **use_cache)  # first-call overheads stay out of the timing
        torch.manual_seed(seed)
        if not ours:
            sync()
            t0 = time.perf_counter()
            model.generate(idx, decode_tokens, temperature=1.0, top_k=None, **use_cache)
            sync()
            return decode_batch * decode_tokens / (time.perf_counter() - t0)
        steps = model.generate_stream(idx, decode_tokens + 1, temperature=1.0, **use_cache)
        next(steps)  # the prefill and its token
        sync()
        t0 = time.perf_counter()
        for _ in progress(steps, decode_tokens, 'decoding', ' tokens'):
            pass
        sync()
    return decode_batch * decode_tokens / (time.perf_counter() - t0)


def bench(name, model, accounting, ours=True, base=None):
    """The variant's rows (a second with compare_dtype). accounting: our GPT of the same shape, for MFU and cache
    size (nanoGPT has no KV cache). 'mfu' holds the achieved FLOP/s until the peaks are known (below). base: the
    baseline's model, whose steps are taken in turn with these, or None."""
    print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
    model.to(device)
    if compile:
        torch._dynamo.reset()  # compile each row afresh: dynamo's per-function cache would fill and fall back
    # train_iters 0: decoding only (a long context's training step can take minutes on a CPU)
    runs = [(model, dtype)] + ([(copy.deepcopy(model), compare_dtype)] if compare_dtype else []) if train_iters else []
    torch_flops = torch_flops_per_token(model) if runs else None
    base_runs = [(base, dtype)] if base is not None else []
    times = train_step_seconds(*[(torch.compile(m) if compile else m, d) for m, d in runs + base_runs]) if runs else []
    base_times = times.pop() if base_runs else None
    dt, *other = [statistics.median(t) for t in times] or [None]
    versus = {'time_vs_baseline': None, 'flops_vs_baseline': None, 'cost_per_flop': None,
              'cost_per_flop_formula': None}
    if base_times:  # the fastest step of each: what the machine allows when other jobs leave it be
        base_flops = torch_flops_per_token(base)
        versus['time_vs_baseline'] = min(times[0]) / min(base_times)
        versus['flops_vs_baseline'] = torch_flops / base_flops
        versus['cost_per_flop'] = versus['time_vs_baseline'] / versus['flops_vs_baseline']
        # the same over our formula's FLOPs: where torch counts work the layer does not need (a mask's keys, values
        # padded to the keys' width), this one is the honest figure
        formula_ratio = accounting.flops_per_token() / base.flops_per_token()
        versus['cost_per_flop_formula'] = versus['time_vs_baseline'] / formula_ratio
    compared = [{'variant': f'{name} ({compare_dtype})', 'params': None, 'active_params': None,
                 'train_ms_per_iter': 1000 * t, 'train_tokens_per_s': batch_size * block_size / t,
                 'mfu': accounting.estimate_mfu(batch_size, t, 1.0), 'decode_tokens_per_s_cached': None,
                 'decode_tokens_per_s_uncached': None, 'cache_speedup': None, 'kv_bytes_per_token': None,
                 'kv_bytes_per_sequence': None, 'flops_per_token': None, 'torch_flops_per_token': None,
                 'masked': None, 'time_vs_baseline': None, 'flops_vs_baseline': None, 'cost_per_flop': None,
                 'cost_per_flop_formula': None}
                for t in other]  # the same steps in compare_dtype, taken in turn with these
    if train_profile and runs:
        print(f"{name}: the top operators of 3 training steps (forward and backward)\n{train_step_profile(model)}")
    if name == 'mla-rebuild':
        for block in model.transformer.h:
            block.attn.absorb = False
    cached = decode_tokens_per_second(model, use_cache=True) if ours else None
    uncached = decode_tokens_per_second(model, ours, **({'use_cache': False} if ours else {})) \
        if decode_uncached or not ours else None
    row = {'variant': name, 'params': sum(p.numel() for p in model.parameters()),
           'active_params': accounting.get_num_params(active=True),
           'train_ms_per_iter': 1000 * dt if dt else None,
           'train_tokens_per_s': batch_size * block_size / dt if dt else None,
           'mfu': accounting.estimate_mfu(batch_size, dt, 1.0) if dt else None,
           'flops_per_token': accounting.flops_per_token(), 'torch_flops_per_token': torch_flops,
           'masked': masked(model) if ours else None, **versus,
           'decode_tokens_per_s_cached': cached, 'decode_tokens_per_s_uncached': uncached,
           'cache_speedup': cached / uncached if ours and uncached else None,
           'kv_bytes_per_token': accounting.kv_cache_bytes(1, block_size, cache_dtype) // block_size if ours else None,
           # a Gated DeltaNet's state is per sequence, whatever its length: the whole cache at block_size
           'kv_bytes_per_sequence': accounting.kv_cache_bytes(1, block_size, cache_dtype) if ours else None}
    return [row] + compared


rows = []
for name, cfg in configs:
    torch.manual_seed(seed)  # every variant starts from the same random state
    model = GPT(cfg)
    base = None
    if baseline_config is not None:
        torch.manual_seed(seed)
        base = GPT(baseline_config).to(device)
    row, *compared = bench(name, model, model, base=base)
    rows += [row] + compared
    del model, base
    # each row as it ends, so a run stopped early (a time limit) still leaves its figures
    trained = f"train {row['train_ms_per_iter']:.4g} ms/iter, " if train_iters else ''
    print(f"  {name}: {trained}decode {row['decode_tokens_per_s_cached']:.4g} tok/s", file=sys.stderr, flush=True)
if nanogpt is not None:
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        model = nanogpt.GPT(nanogpt.GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer,
                                              n_head=n_head, n_embd=n_embd, dropout=dropout, bias=bias))
    with torch.device('meta'):  # the same shape as ours, for the FLOP count only: no memory
        accounting = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                                   n_embd=n_embd, dropout=dropout, bias=bias))
    rows += bench('nanoGPT', model, accounting, ours=False)

# a measured peak is the best of a matmul before and after the runs: one slowed for a moment by another job would
# put MFU over 100%
measured = how.startswith('measured')
if measured:
    before, after = peak, measure_peak_flops(device, dtype)[0]
    peak = max(before, after)
    compare_peak = max(compare_peak, measure_peak_flops(device, compare_dtype)[0]) if compare_dtype else None
    how += ', the best of before and after the runs'
    if max(before, after) > 1.2 * min(before, after):  # the machine's load changed while it ran
        how += f"; {before / 1e12:.3g} and {after / 1e12:.3g} TFLOP/s: the load changed"
beyond = []
for row in rows:
    if row['mfu'] is None:  # not trained (train_iters 0)
        continue
    row['mfu'] /= compare_peak if compare_dtype and row['variant'].endswith(f'({compare_dtype})') else peak
    if measured and row['mfu'] > 1:  # a square matmul slower than the model's shapes (bf16 on a CPU without
        beyond.append(row['variant'])  # bf16 units) is no peak
        row['mfu'] = None
if beyond:
    how += f"; MFU not shown for {', '.join(beyond)}: it ran faster than the measured matmul, so that is no peak"

# ----------------------------------------------------------------------------- report
print(f"peak {peak / 1e12:.3g} TFLOP/s ({how})" + (f"; {compare_dtype} {compare_peak / 1e12:.3g} TFLOP/s"
                                                   if compare_dtype else ''))
if measured:  # as train.py: a measured peak is only as good as the machine was quiet
    print("MFU is against a matmul measured on this machine, not a datasheet: under load (another job on these "
          "cores) the peak reads low and MFU high, so MFU is not trustworthy then; give --peak_flops for a fixed one")
COLUMNS = [('variant', 'variant', '{}'), ('params (M)', 'params', '{:.2f}', 1e-6),
           ('active (M)', 'active_params', '{:.2f}', 1e-6),
           ('train ms/iter', 'train_ms_per_iter', '{:.1f}'), ('train tok/s', 'train_tokens_per_s', '{:,.0f}'),
           ('MFU %', 'mfu', '{:.2f}', 100), ('FLOPs/token', 'flops_per_token', '{:.4g}'),
           ('torch FLOPs/token', 'torch_flops_per_token', '{:.4g}'),
           *([('time / base', 'time_vs_baseline', '{:.2f}x'), ('FLOPs / base', 'flops_vs_baseline', '{:.2f}x'),
              ('cost per FLOP / base', 'cost_per_flop', '{:.2f}x')] if baseline else []),
           ('decode tok/s cached', 'decode_tokens_per_s_cached', '{:,.0f}'),
           ('decode tok/s uncached', 'decode_tokens_per_s_uncached', '{:,.0f}'),
           ('cached/uncached decode', 'cache_speedup', '{:.2f}x'), ('KV bytes/token', 'kv_bytes_per_token', '{:,}'),
           ('cache MB/sequence', 'kv_bytes_per_sequence', '{:.4g}', 1e-6)]


def cell(row, key, fmt, scale=None):
    value = row[key]
    text = '-' if value is None else fmt.format(value * scale if scale else value)
    if value is None or key not in ('torch_flops_per_token', 'cost_per_flop'):
        return text
    # a window's mask: torch counts the keys it skips, so its FLOPs read high and its cost per FLOP low; so does
    # other work the layer does not need (MLA's values padded to its keys' width for the CPU's fused attention)
    if row['masked']:
        return text + ' (mask)'
    more = row['torch_flops_per_token'] / row['flops_per_token'] - 1
    return text + f' (torch +{more:.0%})' if more >= 0.05 else text


print('| ' + ' | '.join(c[0] for c in COLUMNS) + ' |')
print('|' + '|'.join(['---'] + ['---:'] * (len(COLUMNS) - 1)) + '|')
for row in rows:
    print('| ' + ' | '.join(cell(row, *c[1:]) for c in COLUMNS) + ' |')
if json:  # the table above holds the figures whatever happens to the file
    write_output(json, jsonlib.dumps({'settings': settings, 'peak_flops': peak, 'peak_flops_source': how,
                                      'torch': torch.__version__, 'threads': torch.get_num_threads(), 'rows': rows},
                                     indent=2), '--json')
