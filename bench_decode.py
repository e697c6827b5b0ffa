"""
Greedy decoding against Hugging Face generate on the same weights, for bench.py --vs_hf=True (its settings
give the variants, the prompt, the new tokens and the device):

    python bench.py --vs_hf=True --variants=vanilla,modern --threads=2 --device=cpu

Each variant is built with random weights and exported to its Hugging Face family (export.to_hf); three
decoders then run whole generate calls in turn, the best of vs_hf_repeats kept for each: ours eager, ours
with compile_decoding() (the compile is a warm-up call, not timed) and transformers' generate. Tokens/s count
the new tokens of the batch over the whole call, prefill included, the same work on both sides; the tokens of
all three must be identical. --vs_hf_profile=True adds the top operators of a decoding step (torch.profiler).
"""

import copy
import json
import math
import time

import torch

from common import write_output
from export import to_hf
from model import GPT


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


def compare_with_hf(configs, batches, prompt_len, new_tokens, repeats, device, seed, json_path='', profile=False):
    """Print a Markdown table of tokens/s per variant and batch (ours eager, ours compiled, HF, the ratios to HF)
    and whether the tokens are identical; return its rows."""
    import transformers
    transformers.logging.set_verbosity_error()  # generate's notes on random weights' generation config
    print(f"greedy decoding of {new_tokens} tokens after a {prompt_len}-token prompt, {device}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"best of {repeats} interleaved runs of whole generate calls", flush=True)
    rows = []
    for name, cfg in configs:
        torch.manual_seed(seed)
        ours = GPT(cfg).to(device).eval()
        hf = to_hf(ours).to(device).eval()
        fast = copy.deepcopy(ours).compile_decoding()
        for batch in batches:
            idx = torch.randint(cfg.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
            idx = idx.to(device)
            decoders = _decoders(ours, fast, hf, idx, new_tokens)
            with torch.no_grad():
                tokens = {k: run() for k, run in decoders.items()}  # warm-up: compiles, allocates
                best = dict.fromkeys(decoders, math.inf)
                for _ in range(repeats):
                    for k, run in decoders.items():
                        _sync(device)
                        t0 = time.perf_counter()
                        run()
                        _sync(device)
                        best[k] = min(best[k], time.perf_counter() - t0)
            tps = {k: batch * new_tokens / t for k, t in best.items()}
            same = all(torch.equal(t.cpu(), tokens['HF generate'].cpu()) for t in tokens.values())
            rows.append({'variant': name, 'hf_class': type(hf).__name__, 'batch': batch, **tps,
                         'eager_vs_hf': tps['ours eager'] / tps['HF generate'],
                         'compiled_vs_hf': tps['ours compiled'] / tps['HF generate'], 'tokens_identical': same})
            print(f"{name} batch {batch}: " + ', '.join(f"{k} {v:,.0f} tok/s" for k, v in tps.items()) +
                  f"; tokens identical: {same}", flush=True)  # a long run's figures as they come
            if profile:
                for k, model in (('ours eager', ours), ('ours compiled', fast)):
                    table, ms = step_profile(model, idx)
                    print(f"\n{name} batch {batch}, {k}: {ms:.2f} ms per decoding step (under the profiler)\n{table}")
    print('| variant | HF class | batch | ours eager tok/s | ours compiled tok/s | HF generate tok/s | eager / HF | '
          'compiled / HF | tokens identical |')
    print('|---|---|---:|---:|---:|---:|---:|---:|---|')
    for r in rows:
        print(f"| {r['variant']} | {r['hf_class']} | {r['batch']} | {r['ours eager']:,.0f} | "
              f"{r['ours compiled']:,.0f} | {r['HF generate']:,.0f} | {r['eager_vs_hf']:.2f}x | "
              f"{r['compiled_vs_hf']:.2f}x | {'yes' if r['tokens_identical'] else 'NO'} |")
    if json_path:
        write_output(json_path, json.dumps({'prompt': prompt_len, 'new_tokens': new_tokens,
                                            'threads': torch.get_num_threads(), 'rows': rows}, indent=2), '--json')
    return rows
