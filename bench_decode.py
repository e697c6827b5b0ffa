"""
Greedy decoding against Hugging Face generate on the same weights, for bench.py --vs_hf=True (its settings
give the variants, the prompt, the new tokens, the device and the dtypes):

    python bench.py --vs_hf=True --variants=vanilla,modern --threads=2 --device=cpu
    python bench.py --vs_hf=True --variants=vanilla,modern --threads=2 --device=cpu --vs_hf_dtype=float32,bfloat16
    python bench.py --vs_hf=True --vs_hf_families=mixtral,qwen3_next --n_layer=4 --n_embd=256 --threads=1 --device=cpu

Each family of --vs_hf_families is the other way round: its tiny random Hugging Face model (hf/tiny.py, the one its
parity test builds, grown to n_layer layers of n_embd by hf.tiny.sized) is saved and loaded into our GPT as a
checkpoint is (GPT.from_pretrained), then raced the same way, its rows' variant the family's model_type.
Each variant is built with random weights and exported to its Hugging Face family (export.to_hf; a variant no
family carries, such as kda or mamba2, is skipped with a one-line note before anything is measured); both models are
then cast to each of vs_hf_dtype (weights and so the KV cache: each side keeps it in its weights' dtype) and three
decoders run whole generate calls in turn, the best of vs_hf_repeats kept for each: ours eager, ours with
compile_decoding() (the compile is a warm-up call, not timed) and transformers' generate. Tokens/s count the new
tokens of the batch over the whole call, prefill included, the same work on both sides. In float32 the tokens of
all three must be identical; in a 16-bit dtype the two sides round different sums differently, and a greedy
choice between near-equal logits can go either way, so the row says how many new tokens match HF's, and for each
row that parts from HF's, where, and how far apart the fp32 model's two best logits were there against the 16-bit
dtype's rounding step (`partings`).

What bounds a step: each row gives the bytes a decoding step reads (every weight it multiplies by, of an MoE's
experts only those its tokens picked, and the KV cache at the last step's length, in that dtype) and the time this
machine takes to read that many bytes, measured in the same run (a sum over a tensor of that size: from the caches
when it fits in them, as the weights then are); the
header gives the main-memory read bandwidth (a sum over 256 MB). A step near its read floor is bound by bytes; one
well above it, by compute or by fixed costs per step. --vs_hf_profile=True adds the top operators of a decoding
step (torch.profiler).
"""

import copy
import json
import math
import tempfile
import time

import torch
from torch import nn

from common.files import write_output
from common.progress import Progress, warnings_after
from export import hf_family, to_hf
from chapters import GPT

DECODERS = ('ours eager', 'ours compiled', 'HF generate')


def _sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize(device)


def _decoders(ours, fast, hf, idx, new_tokens):
    """name -> a call that returns the (B, T + new_tokens) tokens greedy decoding gives."""
    ones = torch.ones_like(idx)
    return {'ours eager': lambda: ours.generate(idx, new_tokens, temperature=0),
            'ours compiled': lambda: fast.generate(idx, new_tokens, temperature=0),
            'HF generate': lambda: hf.generate(idx, attention_mask=ones, max_new_tokens=new_tokens, do_sample=False,
                                               eos_token_id=None, pad_token_id=0)}


def step_bytes(model, batch, seq_len):
    """(weight bytes, KV cache bytes) one decoding step of `batch` sequences reads at seq_len positions, in the
    model's dtype: every weight a step multiplies by (a tied head reads the whole token table; an embedding table
    used only for lookups is a row per token: left out; with MoE all experts, an upper bound: unread_bytes) and
    the whole cache (a step's attention reads every slot of it, the masked ones too)."""
    weights = {id(p): p for m in model.modules() if not isinstance(m, nn.Embedding)  # learned positions are one too
               for p in m.parameters(recurse=False)}
    weight_bytes = sum(p.numel() * p.element_size() for p in weights.values())
    return weight_bytes, model.kv_cache_bytes(batch, seq_len, model.lm_head.weight.dtype)


def unread_bytes(model, idx, new_tokens):
    """The bytes of step_bytes' weights a decoding step of `model` need not read, on average over a greedy call's
    steps: the experts no token of the step picked (modules declaring unread_params), from the call's own routing
    (every decoder's, when their tokens are identical)."""
    layers = [m for m in model.modules() if hasattr(m, 'unread_params')]
    size, unread = model.lm_head.weight.element_size(), []

    def count(module, args, out):
        if args[0].numel() // args[0].size(-1) == idx.size(0):  # a step's one token a row, not the prompt
            unread.append(module.unread_params(*args) * size)  # (x, and the token ids of a router that reads them)
    hooks = [m.register_forward_hook(count) for m in layers]
    try:
        with torch.no_grad():
            model.generate(idx, new_tokens, temperature=0)
    finally:
        for h in hooks:
            h.remove()
    return round(sum(unread) * len(layers) / len(unread)) if unread else 0


def read_seconds(nbytes, device, repeats=20):
    """The best of `repeats` times this machine takes to read nbytes once: a sum over an fp32 tensor of that size
    (one that fits in the caches is read from them after the first pass, as a step's weights are)."""
    data = torch.ones(max(1, nbytes // 4), device=device)
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        data.sum()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def step_profile(model, idx, steps=50, rows=10):
    """The top operators (self CPU time) of `steps` decoding steps after a prefill, as torch.profiler's table, and
    the wall ms per step."""
    from torch.profiler import ProfilerActivity, profile
    stream = model.generate_stream(idx, steps + 1, temperature=0)
    next(stream)  # the prefill
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in stream:
            pass
        ms = 1000 * (time.perf_counter() - t0) / steps
    return prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=rows), ms


def _time_decoders(decoders, repeats, device):
    """The tokens of each decoder (a warm-up call: compiles, allocates) and the best of `repeats` interleaved calls;
    on a terminal, a line of the calls made and the time left."""
    line = Progress('generate calls', len(decoders) * (1 + repeats))
    with warnings_after(), torch.no_grad():  # a compile's warnings after the progress line, not through it
        tokens = {}
        for k, run in decoders.items():
            tokens[k] = run()
            line.update(len(tokens))
        best = dict.fromkeys(decoders, math.inf)
        for repeat in range(repeats):
            for i, (k, run) in enumerate(decoders.items()):
                _sync(device)
                t0 = time.perf_counter()
                run()
                _sync(device)
                best[k] = min(best[k], time.perf_counter() - t0)
                line.update(len(decoders) * (1 + repeat) + i + 1)
        line.close()
    return tokens, best


def _matches(tokens, prompt_len):
    """The new tokens of each decoder equal to HF's at the same place (after a first difference greedy decoding
    continues different texts, so it is also where the rows part)."""
    ref = tokens['HF generate'][:, prompt_len:].cpu()
    return {k: int((t[:, prompt_len:].cpu() == ref).sum()) for k, t in tokens.items()}


def partings(reference, tokens, hf_tokens, prompt_len, dtype):
    """Where each row of `tokens` first parts from HF's, and why it may: [{'row', 'new_token' (1-based), 'gap' (the
    fp32 reference's two best logits there, on the shared prefix), 'step' (the dtype's rounding step at that logit's
    magnitude), 'fp32_picks' ('ours', 'HF' or 'neither')}]. A gap under the step is a near-tie the dtype cannot
    resolve: both sides are right to within rounding, and greedy decoding continues different texts from there."""
    out = []
    for row in range(tokens.shape[0]):
        differ = (tokens[row, prompt_len:].cpu() != hf_tokens[row, prompt_len:].cpu()).nonzero()
        if not len(differ):
            continue
        t = prompt_len + int(differ[0])
        with torch.no_grad():
            logits = reference(tokens[row:row + 1, :t].to(next(reference.parameters()).device))[0][0, -1].float()
        top = logits.topk(2)
        pick = int(top.indices[0])
        step = torch.finfo(getattr(torch, dtype)).eps * 2.0 ** math.floor(math.log2(max(abs(float(top.values[0])),
                                                                                       1e-30)))
        out.append({'row': row, 'new_token': t - prompt_len + 1, 'gap': float(top.values[0] - top.values[1]),
                    'step': step, 'fp32_picks': 'ours' if pick == int(tokens[row, t]) else
                    'HF' if pick == int(hf_tokens[row, t]) else 'neither'})
    return out


def _row(name, hf, dtype, batch, prompt_len, new_tokens, ours, tokens, best, device, idx):
    weight_bytes, cache_bytes = step_bytes(ours, batch, prompt_len + new_tokens)
    weight_bytes -= unread_bytes(ours, idx, new_tokens)
    tps = {k: batch * new_tokens / t for k, t in best.items()}
    matching = _matches(tokens, prompt_len)
    return {'variant': name, 'hf_class': type(hf).__name__, 'dtype': dtype, 'batch': batch, **tps,
            'eager_vs_hf': tps['ours eager'] / tps['HF generate'],
            'compiled_vs_hf': tps['ours compiled'] / tps['HF generate'],
            'tokens_identical': min(matching.values()) == batch * new_tokens,
            'matching_tokens': matching, 'new_tokens_total': batch * new_tokens,
            'step_weight_bytes': weight_bytes, 'step_cache_bytes': cache_bytes,
            'step_bytes': weight_bytes + cache_bytes,
            'read_floor_ms': 1000 * read_seconds(weight_bytes + cache_bytes, device),
            'step_ms': {k: 1000 * t / new_tokens for k, t in best.items()}}


def _agreement(r):
    if r['tokens_identical']:
        return 'yes'
    m = r['matching_tokens']
    return (f"NO: eager {m['ours eager']}, compiled {m['ours compiled']} of {r['new_tokens_total']}"
            if r['dtype'] == 'float32' else f"{min(m['ours eager'], m['ours compiled'])}/{r['new_tokens_total']}")


def print_table(rows):
    print('| variant | HF class | dtype | batch | MB read/step | read floor ms | compiled ms/step | HF ms/step | '
          'ours eager tok/s | ours compiled tok/s | HF generate tok/s | eager / HF | compiled / HF | '
          'tokens as HF |')
    print('|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|')
    for r in rows:
        print(f"| {r['variant']} | {r['hf_class']} | {r['dtype']} | {r['batch']} | {r['step_bytes'] / 1e6:.1f} | "
              f"{r['read_floor_ms']:.2f} | {r['step_ms']['ours compiled']:.2f} | {r['step_ms']['HF generate']:.2f} | "
              f"{r['ours eager']:,.0f} | {r['ours compiled']:,.0f} | {r['HF generate']:,.0f} | "
              f"{r['eager_vs_hf']:.2f}x | {r['compiled_vs_hf']:.2f}x | {_agreement(r)} |")


def exportable(configs):
    """The (name, config) pairs a Hugging Face family carries, in order; a one-line note for each other, which
    is skipped (no family has its layers or flags: there is nothing to compare it with)."""
    out = []
    for name, cfg in configs:
        try:
            hf_family(cfg).write_config(cfg)  # a family's own refusals (an attn_scale Gemma cannot write) too
        except ValueError as e:
            print(f"note: skipping {name}: {e}", flush=True)
            continue
        out.append((name, cfg))
    return out


def exported(cfg, seed):
    """A random GPT of cfg and its export to its Hugging Face family (export.to_hf): the same weights, fp32."""
    torch.manual_seed(seed)
    ours = GPT(cfg).eval()
    return ours, to_hf(ours).eval()


def imported(family, seed, sizes):
    """hf.tiny's random model of family (its parity test's), sized up (hf.tiny.sized: n_layer, n_embd, block), and
    our GPT loaded from it as a checkpoint is (GPT.from_pretrained): the import is what is raced, not an export."""
    from hf.tiny import build
    hf = build(family, seed, **sizes)
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        ours = GPT.from_pretrained(path)
    return ours.eval(), hf.eval()


def compare_with_hf(configs, batches, prompt_len, new_tokens, repeats, device, seed, json_path='', profile=False,
                    dtypes=('float32',), families=(), sizes=None):
    """Print a Markdown table of tokens/s per variant, dtype and batch (ours eager, ours compiled, HF, the ratios to
    HF), the bytes a step reads against the time to read them here, and how many tokens match HF's; return its rows.
    configs: (name, GPTConfig) pairs, each exported to its family (one no family carries is skipped with a note
    before anything is measured); families: model_types of hf.HF_FAMILIES, each hf.tiny's model sized to sizes
    ({'n_layer', 'n_embd', 'block'}) and imported, its rows' variant the family."""
    configs = exportable(configs)
    if not configs and not families:
        print("no variant has a Hugging Face family to compare with: nothing measured", flush=True)
        return []
    import transformers
    transformers.logging.set_verbosity_error()  # generate's notes on random weights' generation config
    transformers.utils.logging.disable_progress_bar()  # save_pretrained's and the loader's bars, per family
    bandwidth = 2 ** 28 / read_seconds(2 ** 28, device, repeats=5)
    print(f"greedy decoding of {new_tokens} tokens after a {prompt_len}-token prompt, {device}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"best of {repeats} interleaved runs of whole generate calls; main-memory read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s (a sum over 256 MB)", flush=True)
    models = [(name, lambda cfg=cfg: exported(cfg, seed)) for name, cfg in configs] + \
        [(family, lambda family=family: imported(family, seed, sizes or {})) for family in families]
    rows = []
    for dtype in dtypes:
        for name, make in models:
            ours, hf = make()
            rows += race(name, ours.to(device), hf.to(device), dtype, batches, prompt_len, new_tokens, repeats,
                         device, seed, profile)
            del ours, hf
    print_table(rows)
    if json_path:
        write_output(json_path, json.dumps({'prompt': prompt_len, 'new_tokens': new_tokens,
                                            'threads': torch.get_num_threads(), 'read_bandwidth_bytes_per_s': bandwidth,
                                            'rows': rows}, indent=2), '--json')
    return rows


def race(name, ours, hf, dtype, batches, prompt_len, new_tokens, repeats, device, seed, profile=False):
    """The rows of one model pair (ours and HF's, the same fp32 weights) cast to dtype, at each batch size; each
    printed as it ends."""
    reference = copy.deepcopy(ours) if dtype != 'float32' else None  # where the 16-bit tokens part: why
    ours, hf = ours.to(getattr(torch, dtype)), hf.to(getattr(torch, dtype))  # both cast alike: the same rounding
    fast = copy.deepcopy(ours).compile_decoding()
    vocab = hf.get_input_embeddings().num_embeddings  # ours may pad its table past it
    rows = []
    for batch in batches:
        idx = torch.randint(vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed)).to(device)
        tokens, best = _time_decoders(_decoders(ours, fast, hf, idx, new_tokens), repeats, device)
        r = _row(name, hf, dtype, batch, prompt_len, new_tokens, ours, tokens, best, device, idx)
        rows.append(r)
        if reference is not None:
            r['partings'] = partings(reference, tokens['ours eager'], tokens['HF generate'], prompt_len, dtype)
        print(f"{name} {dtype} batch {batch}: " + ', '.join(f"{k} {r[k]:,.0f} tok/s" for k in DECODERS) +
              f"; {r['step_bytes'] / 1e6:.1f} MB a step, read in {r['read_floor_ms']:.2f} ms here; "
              f"tokens as HF: {_agreement(r)}", flush=True)  # a long run's figures as they come
        for part in r.get('partings', []):
            print(f"  row {part['row']} parts from HF's at new token {part['new_token']}: the fp32 model's two "
                  f"best logits there are {part['gap']:.4f} apart, {dtype}'s rounding step at their size "
                  f"{part['step']:.4f}; fp32 picks {part['fp32_picks']}'s token", flush=True)
        if profile:
            for k, model in (('ours eager', ours), ('ours compiled', fast)):
                table, ms = step_profile(model, idx)
                print(f"\n{name} {dtype} batch {batch}, {k}: {ms:.2f} ms per decoding step (under the "
                      f"profiler)\n{table}")
    return rows
