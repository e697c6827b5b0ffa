"""
Score a model on lm-evaluation-harness tasks (HellaSwag, ARC, ...) through the harness's own LM interface.

    python eval.py --out_dir=out-shakespeare-modern --tasks=hellaswag --limit=200
    python eval.py --init_from=gpt2 --tasks=hellaswag,arc_easy --output=gpt2.json
    python eval.py --out_dir=DIR --tasks=my_task --include_path=my_tasks/   # task YAMLs of your own

Needs lm-eval (pip install lm-eval); nothing else in nanoswap does. The model is a train.py checkpoint
(--out_dir) or a Hugging Face model (--init_from, through GPT.from_pretrained), with its own tokenizer: its
dataset's meta.json, the pretrained model's, else GPT-2's BPE. Log-likelihoods are computed in batches,
generation goes through our cached decoding; the scores equal the harness's `hf` backend on export.py's
directory of the same weights. --output writes the harness's results dict (results[task]['acc,none'], ...).
Settings are the globals below; a config file, then --key=value, override them (configurator.py).
"""

import json
import os
import sys
from typing import Optional

# ----------------------------------------------------------------------------- settings
# (read by configure() when eval.py runs; train.py imports the functions below alone)
out_dir = ''  # a train.py out_dir: its ckpt.pt is scored
init_from = ''  # or a GPT-2 / Llama name or directory (an export.py directory too)
tokenizer = ''  # '': the model's own (its dataset's, a directory's, else GPT-2's BPE); 'gpt2' or a HF tokenizer
tasks = 'hellaswag'  # comma-separated harness task names
include_path = ''  # a folder of task YAML files of your own
limit: Optional[int] = None  # items per task; None: all
num_fewshot: Optional[int] = None  # None: each task's default
batch_size = 16  # sequences per forward pass
device = 'auto'  # 'auto' (cuda, mps, cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' (bf16, else fp16 on CUDA; fp32 elsewhere), 'float32', 'bfloat16', 'float16'
threads = 0  # torch's intra-op threads; 0: on a CPU its usable cores (OMP_NUM_THREADS if set), else torch's default
output = ''  # a .json path for the harness's results dict

_INSTALL = "lm-evaluation-harness is not installed: pip install lm-eval"


class TaskError(Exception):
    """A task that cannot be scored (its data, its YAML, a setting against it), said in one line: eval.py exits
    with it; a training run's eval_task may log it and go on."""


def require_harness():
    """lm_eval, or one line saying how to install it."""
    try:
        import lm_eval
    except ImportError:
        from common.errors import die
        die(_INSTALL)
    return lm_eval


def end_of_text(tokenizer):
    """The id that separates documents (and starts an empty context): GPT-2's <|endoftext|>, else the BOS a
    Hugging Face tokenizer puts first, else 0 (a character vocabulary has no such token)."""
    for text in ('<|endoftext|>', ''):
        ids = probe_encode(tokenizer, text)
        if ids is not None and len(ids) == 1:
            return ids[0]
    return 0


def probe_encode(tokenizer, text):
    """text's ids, or None where the tokenizer cannot encode it (a character vocabulary without '<' or '|'):
    a question asked of the tokenizer, so its one-line error for a user's text is not printed."""
    import contextlib
    import io
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return tokenizer.encode(text)
    except SystemExit:
        return None


def harness_lm(model, tokenizer, device, dtype='float32', batch_size=16):
    """Our GPT as an lm_eval LM (a TemplateLM: the harness encodes contexts and continuations as for its own
    models); tokenizer: a common.Tokenizer."""
    require_harness()
    from lm_eval.api.model import TemplateLM
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    eot = end_of_text(tokenizer)
    block_size = model.config.block_size
    vocab_limit = min(tokenizer.vocab_size, model.config.vocab_size)

    class NanoLM(TemplateLM):
        @property
        def eot_token_id(self):
            return eot

        @property
        def max_length(self):
            return block_size

        def tok_encode(self, string, add_special_tokens=None, **kwargs):
            return tokenizer.encode(string)

        def tok_decode(self, ids, **kwargs):
            return tokenizer.decode(ids)

        def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
            return loglikelihoods(model, [(ctx, cont) for _, ctx, cont in requests], device, dtype, batch_size)

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            """A whole text's log-likelihood in windows of block_size tokens, each predicting tokens the
            previous did not (perplexity tasks: wikitext, ...)."""
            windows, owner = [], []
            for k, req in enumerate(requests):
                for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                        self.tok_encode(req.args[0]), prefix_token=eot, max_seq_len=block_size, context_len=1)):
                    windows.append((None, ctx, cont))
                    owner.append(k)
            totals = [0.0] * len(requests)
            for k, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows)):
                totals[k] += logprob
            return totals

        def generate_until(self, requests, disable_tqdm=False):
            return [continuation(model, tokenizer, self.tok_encode(context), kwargs, eot, vocab_limit, device, dtype)
                    for context, kwargs in (req.args for req in requests)]

    return NanoLM()


def loglikelihoods(model, requests, device, dtype='float32', batch_size=16):
    """(sum of the continuation's log-probabilities, whether it is the greedy one) per (context ids, continuation
    ids), the longest first in batches of batch_size, each padded on the right (causal: padding changes nothing)."""
    import torch
    import torch.nn.functional as F

    from common.hardware import autocast
    block_size = model.config.block_size
    # the model's window: the last block_size + 1 tokens, the last of which only a target
    longest = max((len(cont) for _, cont in requests), default=0)
    if longest > block_size:
        raise TaskError(f"a continuation of {longest} tokens is longer than the model's block_size "
                        f"({block_size}), so it cannot be scored; shorten the task's choices or use a model "
                        f"with a longer block_size")
    rows = [(ctx + cont)[-(block_size + 1):][:-1] for ctx, cont in requests]
    order = sorted(range(len(requests)), key=lambda i: -len(rows[i]))
    out = [None] * len(requests)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            width = max(len(rows[i]) for i in batch)
            x = torch.zeros(len(batch), width, dtype=torch.long)
            for j, i in enumerate(batch):
                x[j, :len(rows[i])] = torch.tensor(rows[i])
            with autocast(device, dtype):
                logits, _ = model(x.to(device))
            logprobs = F.log_softmax(logits.float(), dim=-1).cpu()
            for j, i in enumerate(batch):
                cont = requests[i][1]
                n = len(rows[i])
                scores = logprobs[j, n - len(cont):n]
                target = torch.tensor(cont)
                out[i] = (scores.gather(1, target[:, None]).sum().item(), bool((scores.argmax(-1) == target).all()))
    return out


def continuation(model, tokenizer, context, kwargs, eot, vocab_limit, device, dtype='float32'):
    """A generation request's text after context (ids), decoded with the KV cache until a stop string of kwargs
    (greedy unless the task samples), cut before the stop string."""
    import torch

    from common.hardware import autocast
    until = kwargs.get('until') or []
    until = [until] if isinstance(until, str) else list(until)
    until.append(tokenizer.decode([eot]))
    max_new = int(kwargs.get('max_gen_toks', 256))
    temperature = float(kwargs.get('temperature', 0.0)) if kwargs.get('do_sample') else 0.0
    prompt = context[-max(1, model.config.block_size - max_new):]
    idx = torch.tensor([prompt], dtype=torch.long, device=device)
    new, text = [], ''
    model.eval()
    with torch.no_grad(), autocast(device, dtype):
        for token in model.generate_stream(idx, max_new, temperature, use_cache=True, vocab_limit=vocab_limit):
            new.append(token.item())
            text = tokenizer.decode(new)
            if any(s and s in text for s in until):
                break
    for s in until:
        if s:
            text = text.split(s)[0]
    return text


def task_manager(include_path='', names=()):
    """The harness's task index, with the task YAMLs under include_path (one line when it does not exist). Its
    thousands of own tasks take seconds to index: only the local ones when they hold every task named."""
    from common.errors import die
    if include_path and not os.path.isdir(include_path):
        die(f"include_path '{include_path}' is not a directory (it should hold task YAML files)")
    require_harness()
    from lm_eval.tasks import TaskManager
    if include_path and names:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if set(names) <= set(local.all_tasks):
            return local
    return TaskManager(include_path=include_path or None)


def check_tasks(manager, names):
    """One line for a task name the harness does not know, with the closest it does."""
    import difflib

    from common.errors import die
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            broken = unparsable_yaml(manager.include_path)
            if broken:  # the harness skips a YAML it cannot parse: the task it defines goes missing
                die(f"unknown task {name!r}: task YAML {broken}")
            close = difflib.get_close_matches(name, known, n=3)
            die(f"unknown task {name!r}" + (f"; did you mean {', '.join(map(repr, close))}?" if close else
                                            "; see lm-eval --tasks list, or give its YAML's folder as --include_path"))


def unparsable_yaml(include_path):
    """"'PATH' does not parse: WHY" for the first task YAML under include_path that is not YAML, else None."""
    import yaml

    class Loader(yaml.SafeLoader):  # the harness's own tag for a Python function: any value parses
        pass
    Loader.add_constructor('!function', lambda loader, node: None)
    for root, _, files in sorted(os.walk(include_path)) if include_path else ():
        for name in sorted(f for f in files if f.endswith(('.yaml', '.yml'))):
            path = os.path.join(root, name)
            try:
                with open(path, encoding='utf-8') as f:
                    yaml.load(f, Loader=Loader)
            except (yaml.YAMLError, OSError, UnicodeDecodeError) as e:
                why = ' '.join(line.strip() for line in str(e).splitlines() if line.strip())
                return f"'{path}' does not parse: {why[:300]}"
    return None


def run_tasks(lm, names, manager, limit=None, num_fewshot=None, log_samples=False, seeds=True):
    """The harness's results dict of these tasks on lm (an LM: ours or the harness's own); seeds=False leaves
    the global random generators alone (a training run's dropout and resume go on as without it)."""
    import logging

    from lm_eval import simple_evaluate
    check_tasks(manager, names)
    for name in ('lm_eval', 'lm-eval'):  # its per-task progress lines would bury a training run's log
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        loaded = manager.load(list(names))
        check_items(loaded['tasks'], limit)
        # the tasks built once (a group's own scores need its name)
        tasks = list(names) if loaded['groups'] else list(loaded['tasks'].values())
        return simple_evaluate(model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit,
                               task_manager=manager, log_samples=log_samples,
                               **({} if seeds else dict(random_seed=None, numpy_random_seed=None,
                                                        torch_random_seed=None)))
    except TaskError as e:
        raise TaskError(f"task {', '.join(names)}: {e}") from e
    except Exception as e:  # the harness reading a task's data and items: a user's file, said in one line
        raise TaskError(f"task {', '.join(names)} cannot be scored: {task_failure(e, num_fewshot)}") from e


def check_items(tasks, limit=None):
    """Every scored item of a multiple-choice task has choices and a label among them: the harness checks the
    first item only, and a later label out of range scores as a wrong answer."""
    import itertools
    for task in tasks.values():
        if task.get_config('output_type') != 'multiple_choice':
            continue
        for number, doc in enumerate(itertools.islice(task.eval_docs, limit), 1):
            choices = task.doc_to_choice(doc)
            targets = task.doc_to_target(doc)
            for target in targets if isinstance(targets, list) else [targets]:
                if not choices or not (target in choices if isinstance(target, str) else 0 <= target < len(choices)):
                    raise TaskError(f"item {number} has the label {target!r}, not one of its {len(choices)} choices "
                                    f"(0 to {len(choices) - 1})" if choices else f"item {number} has no choices")


def task_failure(error, num_fewshot=None):
    """What the harness's exception means for the task's author, in one line."""
    from common.errors import first_line
    while error.__cause__ is not None and 'error occurred while generating' in str(error):
        error = error.__cause__  # datasets wraps the reader's own error (a malformed jsonl line, ...)
    text = f"{type(error).__name__}: {first_line(error)}"
    if isinstance(error, IndexError):
        return f"{text} (an item's label outside its choices, or an item without choices?)"
    if 'larger than population' in str(error):
        return f"num_fewshot={num_fewshot} asks for more examples than the task's split for them holds"
    if isinstance(error, FileNotFoundError):
        return f"{text} (a data_files path: relative ones are read from the working directory)"
    return text


def scores(results, task):
    """{metric: value} of one task in a results dict, without the filter suffix and the standard errors:
    {'acc': 0.3, 'acc_norm': 0.31}."""
    return {k.split(',')[0]: v for k, v in results['results'][task].items()
            if ',' in k and '_stderr' not in k and isinstance(v, (int, float))}


if __name__ == '__main__':
    from configurator import configure, settings_of
    settings = configure(settings_of(globals()), sys.argv[1:], prog='eval.py', doc=__doc__)
    globals().update(settings)

    def usage_error(message):  # said before torch loads
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    if out_dir and init_from:
        usage_error(f"give a checkpoint (--out_dir={out_dir}) or a pretrained model (--init_from={init_from}), "
                    f"not both")
    if not out_dir and not init_from:
        usage_error("give the model to score: --out_dir=DIR (a train.py checkpoint) or --init_from=NAME_OR_DIR")
    names = [t.strip() for t in tasks.split(',') if t.strip()]
    if not names:
        usage_error("tasks must name at least one task, e.g. --tasks=hellaswag")
    if include_path and not os.path.isdir(include_path):
        usage_error(f"include_path '{include_path}' is not a directory (it should hold task YAML files)")
    if limit is not None and limit < 1:
        usage_error(f"limit must be at least 1 (or None for every item), got {limit}")
    if num_fewshot is not None and num_fewshot < 0:
        usage_error(f"num_fewshot must be >= 0 (or None for the task's default), got {num_fewshot}")
    if batch_size < 1:
        usage_error(f"batch_size must be at least 1, got {batch_size}")
    if threads < 0:
        usage_error(f"threads must be >= 0 (0: the usable cores on a CPU, else torch's default), got {threads}")
    if output:  # said now, not after the whole evaluation
        from common.files import output_refusal
        refusal = output_refusal(output)
        if refusal:
            usage_error(f"cannot write --output={output}: {refusal}")
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        usage_error(_INSTALL)

    from common.checkpoints import load_checkpoint, load_pretrained, model_from_checkpoint  # noqa: E402
    from common.errors import catch_interrupts, die  # noqa: E402
    from common.files import write_output  # noqa: E402
    from common.hardware import pick_device, pick_dtype  # noqa: E402
    from common.threads import use_threads  # noqa: E402
    from common.tokenizer import load_tokenizer  # noqa: E402
    catch_interrupts()
    device = pick_device(device)
    dtype = pick_dtype(device, dtype)
    use_threads(threads, device)
    manager = task_manager(include_path, names)
    check_tasks(manager, names)  # before the model loads: a typo should not cost it
    meta_path = None
    if out_dir:
        ckpt_path = os.path.join(out_dir, 'ckpt.pt')
        checkpoint = load_checkpoint(ckpt_path)
        model = model_from_checkpoint(checkpoint, ckpt_path)
        dataset = (checkpoint.get('config') or {}).get('dataset')
        if dataset:
            meta_path = os.path.join('data', dataset, 'meta.json')
            if not os.path.exists(meta_path) and not tokenizer:  # GPT-2's BPE would score another vocabulary
                die(f"no '{meta_path}' here, the vocabulary of the checkpoint's dataset {dataset!r}: run eval.py "
                    f"from the repository's root, or name the tokenizer with --tokenizer")
    else:
        model = load_pretrained(init_from)
    tok = load_tokenizer(meta_path, pretrained=init_from or None, name=tokenizer)
    if tok.guessed:
        print(f"note: encoding with {tok.source}", file=sys.stderr)
    if tok.vocab_size > model.config.vocab_size:
        die(f"the tokenizer ({tok.source}) has {tok.vocab_size} tokens, more than the model's vocab_size "
            f"{model.config.vocab_size}" + (": leave --tokenizer empty for the model's own" if tokenizer else ""))
    model.to(device)
    try:
        results = run_tasks(harness_lm(model, tok, device, dtype, batch_size), names, manager, limit, num_fewshot)
    except TaskError as e:
        die(str(e))
    from lm_eval.utils import handle_non_serializable, make_table
    print(make_table(results))
    if output:
        write_output(output, json.dumps(results, indent=1, default=handle_non_serializable) + '\n')
        print(f"wrote {output}")
