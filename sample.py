"""
Sample from a model trained by train.py, or from a pretrained GPT-2 / Llama.

    python sample.py --out_dir=out-shakespeare-modern
    python sample.py --init_from=gpt2 --start=FILE:prompt.txt --num_samples=3 --max_new_tokens=100

All samples are generated together as one batch; a single sample is streamed as it is generated.
Settings are the globals below; a config file, then --key=value, override them (configurator.py).
The model flags that change no weight (model.RUNTIME_FLAGS) may differ from the trained model's: a longer
context with a RoPE scaling or a sliding window, e.g. --block_size=1024 --rope_scaling=yarn --rope_factor=4.
"""

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Optional

from configurator import configure, init_from_problem, model_flags, settings_of

# ----------------------------------------------------------------------------- settings
init_from = 'resume'  # 'resume' (out_dir/ckpt.pt), or a GPT-2 / Llama name or directory
# '': the model's own (its dataset's, a directory's, else GPT-2's BPE); 'gpt2' (tiktoken's BPE), or a Hugging Face
# tokenizer name or directory, for a model saved without one
tokenizer = ''
out_dir = 'out'
start = '\n'  # the prompt, or 'FILE:path' to read it from a file
num_samples = 10
max_new_tokens = 500
temperature = 0.8  # 0: greedy
top_k: Optional[int] = None  # keep only the k likeliest tokens; None: all
top_p = 1.0  # keep the fewest likeliest tokens whose probabilities reach top_p
seed = 1337
device = 'auto'  # 'auto' (cuda, mps, cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' (bf16, else fp16 on CUDA; fp32 elsewhere), 'float32', 'bfloat16', 'float16'
compile = False  # compile the decoding step: a minute or more at start; pays on long decodings (docs/sampling.md)
use_cache = True  # False: recompute the whole context every step (the reference path)
speculative = False  # greedy only (temperature 0): a model with MTP modules drafts with them, verifies in one forward
threads = 0  # torch's intra-op threads; 0: on a CPU its usable cores (OMP_NUM_THREADS if set), else torch's default
# the model flags a trained model can run with other values of (the ones given replace the model's)
globals().update({k: v for k, v in model_flags(runtime_only=True).items() if k != 'dropout'})
settings = configure(settings_of(globals()), sys.argv[1:], prog='sample.py', doc=__doc__,
                     from_model=model_flags(runtime_only=True))
globals().update(settings)

if init_from_problem(init_from, modes=('resume',)):  # a typo of a name: said before torch loads
    print(f"error: {init_from_problem(init_from, modes=('resume',))}", file=sys.stderr)
    sys.exit(2)

# the heavy imports only now: --help and a mistyped setting answer before torch loads
import torch  # noqa: E402

from common.checkpoints import load_checkpoint, load_pretrained, model_from_checkpoint  # noqa: E402
from common.errors import catch_interrupts, die  # noqa: E402
from common.hardware import DTYPES, autocast, pick_device, pick_dtype  # noqa: E402
from common.progress import Progress, progress, warnings_after  # noqa: E402
from common.threads import use_threads  # noqa: E402
from common.tokenizer import load_tokenizer  # noqa: E402
SEPARATOR = '---------------'
# a task dataset's prompts are its own symbols, not text: an example of one for each task, and what it asks
TASK_PROMPTS = {'recall': ('k1 v2 k1', "a key, its value and the key again: the model answers the value"),
                'copy': ('abc|', "a string and the separator: the model copies the string")}
catch_interrupts()  # Ctrl-C or kill: one line, exit 130 or 143
# -----------------------------------------------------------------------------


def task_of(meta_path):
    """The synthetic task (recall, copy) whose examples a dataset's meta.json describes, else None."""
    if meta_path is None:
        return None
    with open(meta_path) as f:  # load_tokenizer has read it whole already
        meta = json.load(f)
    return meta.get('dataset') if 'example_length' in meta else None


def task_prompt(task):
    example, what = TASK_PROMPTS.get(task, ('...', "its own symbols, as in its examples"))
    return f'--start="{example}" ({what})'


# settings first: a typo should not cost a model load
if not 0 <= temperature < math.inf:  # 1e999 reads as inf
    die(f"temperature must be >= 0 and finite (0 is greedy), got {temperature}")
if top_k is not None and top_k < 1:
    die(f"top_k must be at least 1 (or None for no limit), got {top_k}")
if not 0 < top_p <= 1:
    die(f"top_p must be in (0, 1] (1 keeps every token), got {top_p}")
if max_new_tokens < 0:
    die(f"max_new_tokens must be >= 0, got {max_new_tokens}")
if num_samples < 1:
    die(f"num_samples must be at least 1, got {num_samples}")
if speculative and temperature != 0:
    die(f"speculative=True decodes greedily: set --temperature=0 (got {temperature})")
if speculative and compile:  # its forwards verify several tokens at once, eagerly
    die("compile=True compiles generate's one-token decoding step, which speculative decoding never runs (it "
        "verifies several tokens a forward): leave --compile off with --speculative=True")
if not 0 <= seed < 2 ** 64:
    die(f"seed must be in [0, 2**64), got {seed}")
if threads < 0:
    die(f"threads must be >= 0 (0: the usable cores on a CPU, else torch's default), got {threads}")
device = pick_device(device)
dtype = pick_dtype(device, dtype)
threads_used = use_threads(threads, device)  # torch's default, every core, waits on other work on a busy machine
if start.startswith('FILE:'):
    prompt_path = start[len('FILE:'):]
    try:
        with open(prompt_path, encoding='utf-8') as f:
            start = f.read()
    except FileNotFoundError:
        die(f"prompt file '{prompt_path}' not found")
    except (OSError, UnicodeDecodeError) as e:
        die(f"cannot read prompt file '{prompt_path}': {e}")

# the checkpoint names its dataset, whose meta.json maps token ids to text; without one, GPT-2's BPE
meta_path = None
if init_from == 'resume':
    # the config that trains into this out_dir, if there is one, is the best advice when it is empty
    made_by = [str(p) for p in sorted(Path('config').glob('*.py'))
               if f"out_dir = '{os.path.normpath(out_dir)}'" in p.read_text()]
    hint = (f"create it with: python train.py {made_by[0]}" if made_by else
            "train a model first, e.g. python train.py config/shakespeare_modern.py, then sample it with "
            "--out_dir=out-shakespeare-modern")
    if not os.path.isdir(out_dir):
        die(f"out_dir '{out_dir}' does not exist; {hint}")
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    checkpoint = load_checkpoint(ckpt_path, hint=hint)
    config = checkpoint.get('config')
    dataset = config.get('dataset') if isinstance(config, dict) else None
    if dataset:
        meta_path = os.path.join('data', dataset, 'meta.json')
        if not os.path.exists(meta_path):  # e.g. run from outside the repo: say why the text may be garbage
            print(f"note: no '{meta_path}' here; decoding with GPT-2's BPE", file=sys.stderr)
            meta_path = None
# the model before the tokenizer: a broken config.json is the first thing to say, whatever the tokenizer
model = (model_from_checkpoint(checkpoint, ckpt_path, settings) if init_from == 'resume'
         else load_pretrained(init_from, settings))
encode, decode, tokenizer_vocab, source, guessed = load_tokenizer(
    meta_path, pretrained=None if init_from == 'resume' else init_from, name=tokenizer)
task = task_of(meta_path) if not tokenizer else None
if task and start == '\n':  # the default prompt is text; a task's vocabulary has none (a newline is no symbol of it)
    die(f"the default prompt (a newline) is no symbol of '{meta_path}': the model was trained on the {task} task, "
        f"whose prompts are its symbols; give one, e.g. {task_prompt(task)}")
prompt = encode(start)
if not prompt:
    die("the prompt must have at least one token to continue from; give a non-empty --start "
        "(the default is a newline)" if not start else
        f"{source} encodes --start={start!r} to no tokens: the prompt needs the {task} task's symbols, e.g. "
        f"{task_prompt(task)}" if task else
        f"{source} encodes --start={start!r} to no tokens: it is not this model's tokenizer; give one with "
        f"--tokenizer=NAME_OR_DIR (a Hugging Face tokenizer, or 'gpt2')")
if max(prompt) >= model.config.vocab_size:
    die(f"the prompt encodes to token id {max(prompt)} but the model knows only {model.config.vocab_size} "
        f"tokens: {source} is not its tokenizer; give its own with --tokenizer=NAME_OR_DIR (a Hugging Face "
        f"tokenizer, or 'gpt2')")
if guessed:
    print(f"note: encoding with {source}", file=sys.stderr)
# a vocabulary padded past the tokenizer's (GPT-2's 50257 -> 50304) has ids that decode to nothing
vocab_limit = min(tokenizer_vocab, model.config.vocab_size)
model.eval()
model.to(device)
if speculative:
    from chapters.mtp import generate_speculative, speculation_problem, speculative_cache_bytes
    if speculation_problem(model):
        die(speculation_problem(model))
idx = torch.tensor([prompt] * num_samples, dtype=torch.long, device=device)
if compile:  # generate's decoding step, one static-shape graph (the prefill stays eager)
    model.compile_decoding()
    if use_cache and max_new_tokens:  # compiled now, by a short generation of this batch (before the seed, so the
        # samples are eager's): the tokens/s reported below is then the steady speed, not the compilation's minute
        print("compiling the decoding step ...", end=' ', file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        with warnings_after(), torch.no_grad(), autocast(device, dtype):  # the line whole, a warning after it
            model.generate(idx, 3, temperature, top_k, top_p, use_cache, vocab_limit)
            print(f"compiled in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
elif max_new_tokens:  # a first forward pays one-time costs (lazy imports, the allocator's first blocks) that would
    # read as a slow decoding: 2 tokens from the prompt's last, untimed, before the seed (the samples stay the same)
    with torch.no_grad(), autocast(device, dtype):
        model.generate(idx[:, -1:], 2, temperature, top_k, top_p, use_cache, vocab_limit)
if len(prompt) + max_new_tokens > model.config.block_size:
    print(f"note: the prompt and max_new_tokens ({len(prompt)} + {max_new_tokens}) outgrow block_size "
          f"{model.config.block_size}: when the context is full its oldest half is dropped, so from there the text "
          f"differs from the same model's under transformers (docs/hf.md)", file=sys.stderr, flush=True)
torch.manual_seed(seed)
torch.cuda.manual_seed(seed)
t0 = time.perf_counter()
drafts = None  # speculative decoding's counts
with torch.no_grad(), autocast(device, dtype):
    if speculative:  # the tokens of greedy decoding, each round's at once
        line = Progress('generating', max_new_tokens, ' tokens')  # on a terminal: the tokens every sample has
        out, drafts = generate_speculative(model, idx, max_new_tokens, vocab_limit, report=line.update)
        line.close()
        for row in out.tolist():
            print(decode(row))
            print(SEPARATOR)
    elif num_samples == 1:
        print(decode(prompt), end='', flush=True)
        pending = []  # tokens not yet printed: decoding only these keeps each step's work constant
        for token in model.generate_stream(idx, max_new_tokens, temperature, top_k, top_p, use_cache, vocab_limit):
            pending.append(token.item())
            text = decode(pending)
            # a character split across tokens decodes to a trailing U+FFFD until its last byte arrives (at most
            # 4 bytes: past that it is a lone byte that will not complete)
            if not text.endswith('\ufffd') or len(pending) > 4:
                sys.stdout.write(text)
                sys.stdout.flush()
                pending = []
        print(decode(pending))
        print(SEPARATOR)
    else:  # a step at a time, the tokens so far and the time left on a terminal
        steps = model.generate_stream(idx, max_new_tokens, temperature, top_k, top_p, use_cache, vocab_limit)
        out = torch.cat([idx] + list(progress(steps, max_new_tokens, 'generating', ' tokens')), dim=1)
        for row in out.tolist():
            print(decode(row))
            print(SEPARATOR)
seconds = time.perf_counter() - t0
tokens = num_samples * max_new_tokens
cache = 'none (use_cache=False)'
if use_cache or speculative:  # generate allocates none for 0 new tokens; its dtype is autocast's, else the weights'
    n_bytes = 0 if not max_new_tokens else speculative_cache_bytes(model, num_samples, DTYPES[dtype]) if speculative \
        else model.kv_cache_bytes(num_samples, len(prompt) + max_new_tokens, DTYPES[dtype])
    # speculative decoding takes rejected drafts back out of its cache: it keeps one whatever use_cache says
    cache = f'{n_bytes} bytes' + ('' if use_cache else ' (speculative decoding keeps one: use_cache=False does not '
                                                       'apply to it)')
print(f"generated {tokens} tokens in {seconds:.2f} s, {tokens / max(seconds, 1e-9):.1f} tokens/s, KV cache {cache}"
      + f"; {threads_used}", file=sys.stderr)
if drafts:
    print(f"speculative: {drafts['accepted']} of {drafts['drafted']} drafted tokens accepted "
          f"({drafts['accepted'] / max(drafts['drafted'], 1):.0%}), {drafts['rounds']} forwards for {tokens // num_samples} "
          f"tokens a sample", file=sys.stderr)
