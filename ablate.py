"""
Train a grid of block variants on the same data, batches and seeds; report losses, speed, size and length
extrapolation side by side (out_dir: results.md, results.json, val_loss_vs_iter.png, val_loss_vs_time.png).

    python ablate.py config/ablate_shakespeare_char.py
    python ablate.py config/ablate_shakespeare_char.py --grid=default,kv --n_kv_heads=1,2,4 --seeds=3
    python ablate.py config/ablate_shakespeare_char.py --grid=moe --seeds=3 --parallel=2
    python ablate.py --grid=custom --custom="{'vanilla': {}, 'tiny_rope': {'pos': 'rope', 'rope_theta': 500.0}}"

Each variant x seed (1337, 1338, ...) is a run `python train.py <train_config> <settings> <train_args> --seed=<seed>
--out_dir=<out_dir>/runs/<variant>/seed<seed>` in run_dir ('': this repo), logged to train.log there; a variant's
settings are train.py settings, model flags or others (learning_rate in the stability group). A finished run holds
done.json and is skipped next time (one made with other arguments is kept, and the new one trains beside it);
the report is rewritten from every finished run made with this invocation's train_config and train_args (runs
made with others are left out, and named). train_config must be the vanilla
GPT-2 block; the swaps come from model.SWAPS.
Grid groups: default (vanilla, vanilla + each swap, modern), leave_one_out (modern minus each swap),
norm_position (pre- and post-norm; on modern also sandwich and after), mlp (relu, gelu, swiglu, geglu on vanilla), kv (modern with each of
n_kv_heads), moe (modern dense, MoE at equal active parameters with the softmax router and aux loss, with a shared
expert, with the sigmoid router and bias balancing, without balancing, and a dense model of the MoE's total
size), attention (MHA, GQA, MQA and MLA with GQA's and MQA's cache sizes), long_context (vanilla and modern: for
the length table), stability (modern with and without qk_norm at each of learning_rates), local_global (all
global, 'LG', 'LLLG', all local, with a window of a quarter of block_size), sinks (local and 'LG' with and without
attention sinks), gate (modern with and without the attention output gate), nope (modern, a NoPE layer in four,
half and a quarter of each head rotated), hybrid (modern, Qwen3-Next's 3 Gated DeltaNet layers to 1 global ('DDDG'),
all Gated DeltaNet, the DeltaNet's heads narrowed to attention's parameters), sparse (modern, and DeepSeek Sparse
Attention reading a quarter and an eighth of block_size, with and without the indexer's KL loss), mtp (modern, and
multi-token prediction 1 and 2 tokens further), optimizer (modern with AdamW at each of
adamw_lrs and Muon at each of muon_lrs), schedule (cosine and WSD), recipe_mlp (modern with SwiGLU, GELU, ReLU²),
zero_init (modern with and without zero-initialized projections, tied and untied head), custom (a dict). Other learning rates: --train_args='--learning_rate=...'.
extrapolation: the methods of the length table: the val loss of each RoPE run's ckpt.pt (on val.bin or the val
shards) at 1x, 2x, 4x and 8x its block_size, with plain RoPE, linear, dynamic NTK, YaRN (each stretched to the
length) or a sliding window of block_size; learned positions give 1x only.
parallel: runs at once; devices: a device per slot (cuda:0,cuda:1,...); on the CPU the threads are shared out.
Several ablate.py (one per node) can share an out_dir: each run is claimed, so no two train the same one.
"""

import ast
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import deque
from dataclasses import fields

from configurator import configure, script_defaults, settings_of

out_dir = 'out-ablate'
train_config = 'config/shakespeare_vanilla_cpu.py'  # the base recipe of every run
seeds = 1
grid = 'default'
n_kv_heads = ''  # for the kv group, e.g. '1,2,4'
learning_rates = '1e-3,3e-3,1e-2,3e-2'  # for the stability group
adamw_lrs = '3e-4,1e-3,3e-3'  # for the optimizer group: AdamW's peak rates
muon_lrs = '0.005,0.01,0.02,0.04'  # for the optimizer group: Muon's (AdamW keeps the recipe's for the rest)
target = ''  # a variant whose final val loss the "reaches" column times each variant to; '' the reference
custom = ''  # e.g. "{'tiny_rope': {'pos': 'rope', 'rope_theta': 500.0}}"
train_args = ''  # passed to every train.py run, e.g. '--max_iters=20 --eval_interval=10'
recall_widths = '32,64,128'  # the recall group's n_embd (n_head = n_embd // 32: heads 32 wide)
recall_lengths = '32,64,128'  # the recall group's seq_len L: the dataset data/recall_<L> (num_pairs L / 8)
recall_pairs = ''  # the recall group's pair counts at every L, e.g. '4,8' ('' is L / 8); others read data/recall_<L>_p<P>
recall_archs = 'global,DDDG,D,L,mla'  # the recall group's architectures: global, mla, or a layers pattern (KKKG, S, ...)
extrapolation = 'plain'  # methods of the length table: plain, linear, dynamic, yarn, window; '' for none
extrapolation_iters = 20  # batches per length and method
parallel = 1  # runs at once
devices = ''  # e.g. 'cuda:0,cuda:1': the device of each parallel slot; '' keeps the recipe's
report_only = False  # write the report from the runs finished so far, training none (e.g. after an interrupt)
python = ''  # '' is this interpreter
run_dir = ''
settings = configure(settings_of(globals()), sys.argv[1:], prog='ablate.py', doc=__doc__)
globals().update(settings)
METHODS = ('plain', 'linear', 'dynamic', 'yarn', 'window')


def check(ok, message):
    if not ok:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


# settings that are wrong whatever the machine: said before torch loads
check(seeds >= 1 and extrapolation_iters >= 1 and parallel >= 1, f"seeds, extrapolation_iters and parallel must be at "
      f"least 1, got {seeds}, {extrapolation_iters} and {parallel}")
check(not python or shutil.which(python), f"python '{python}' is not an executable (give a path or a command on PATH, "
      f"or '' for this one)")
check(not os.path.exists(out_dir) or os.path.isdir(out_dir), f"out_dir '{out_dir}' is a file, not a directory")
unknown_methods = [m.strip() for m in extrapolation.split(',') if m.strip() and m.strip() not in METHODS]
check(not unknown_methods, f"unknown extrapolation method(s) {', '.join(map(repr, unknown_methods))}; methods are "
      f"{', '.join(METHODS)}")

# the heavy imports only now: --help and a mistyped setting answer before torch loads
import numpy as np  # noqa: E402
import torch  # noqa: E402

from common.checkpoints import build_model, load_checkpoint, model_from_checkpoint  # noqa: E402
from common.data import masked_accuracy, read_examples  # noqa: E402
from common.errors import die  # noqa: E402
from common.files import output_refusal, tmp_path, write_json, write_output  # noqa: E402
from common.hardware import pick_device  # noqa: E402
from probes import probe, summarize as summarize_probe  # noqa: E402
from stats import welch  # noqa: E402
from model import GPT, SWAPS, GPTConfig, swap_flags  # noqa: E402

REPO = os.path.dirname(os.path.abspath(__file__))
TRAIN_PY = os.path.join(REPO, 'train.py')
EXTRAPOLATION_SEED = 4242  # one set of batches per length, the same for every variant
MULTIPLES = (1, 2, 4, 8)
SUMMARY_VERSION = 4  # done.json figures older than this are recomputed from the run's files
PROBE_ROWS, PROBE_SKIP = 16, 4  # the probes' rows, and the first queries left out of the sink share
PROBE_FIGURES = ('sink_share', 'sink_share_max', 'equal_share', 'massive_ratio')
CLAIM_STALE_S = 600  # a claim whose owner stopped refreshing it this long ago is free
REPORT_FILES = ('results.md', 'results.json', 'val_loss_vs_iter.png', 'val_loss_vs_time.png', 'accuracy_vs_width.png')


# ----------------------------------------------------------------------------- the grid

def parse_custom(text, known):
    try:
        variants = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        die(f"custom is not a Python literal ({type(e).__name__}): {text!r}")
    if not isinstance(variants, dict) or not variants or not all(
            isinstance(k, str) and isinstance(v, dict) for k, v in variants.items()):
        die(f"custom must be a non-empty dict of name -> flag dict, e.g. \"{{'rope': {{'pos': 'rope'}}}}\"; "
            f"got {text!r}")
    for name, flags in variants.items():
        unknown = [k for k in flags if k not in known]
        if unknown:
            die(f"custom variant {name!r}: unknown flag(s) {', '.join(map(repr, unknown))}; a variant sets train.py "
                f"settings (model flags such as norm, mlp, pos, or others such as learning_rate)")
    return variants


def int_list(text, name):
    if not re.fullmatch(r'\s*\d+(\s*,\s*\d+)*\s*', text):
        die(f"{name} must be comma-separated integers, e.g. --{name}=1,2,4; got {text!r}")
    return [int(v) for v in text.split(',')]


def float_list(text, name):
    try:
        values = [float(v) for v in text.split(',')]
    except ValueError:
        values = []
    if not values or not all(v > 0 for v in values):
        die(f"{name} must be comma-separated positive numbers, e.g. --{name}=1e-3,1e-2; got {text!r}")
    return values


def base_recipe(cwd):
    """train.py's settings for train_config and train_args, read as train.py would in run_dir."""
    try:
        argv = [train_config] + shlex.split(train_args)
    except ValueError as e:
        die(f"train_args {train_args!r}: {e}")
    here = os.getcwd()
    os.chdir(cwd)  # recipes exec() the files they build on by relative path
    try:
        return configure(script_defaults(TRAIN_PY), argv, prog='train.py')
    finally:
        os.chdir(here)


def group_members(group, base):
    """[(name, settings)] of one grid group, built on the base recipe."""
    swaps = {name: swap_flags([name], base) for name in SWAPS}
    modern = swap_flags('modern', base)
    if group == 'default':
        return [('vanilla', {})] + [(f'vanilla+{s}', f) for s, f in swaps.items()] + [('modern', modern)]
    if group == 'leave_one_out':
        return [('modern', modern)] + [(f'modern-{s}', {**modern, **swap_flags([s], base, modern=False)})
                                       for s in swaps]
    if group == 'norm_position':
        return [('vanilla', {}), ('vanilla+postnorm', {'norm_position': 'post'}),
                ('modern', modern), ('modern+postnorm', {**modern, 'norm_position': 'post'}),
                ('modern+sandwich', {**modern, 'norm_position': 'sandwich'}),
                ('modern+after', {**modern, 'norm_position': 'after'})]
    window = {'sliding_window': max(1, base['block_size'] // 4)}  # a quarter of the context, as Gemma 3's ratio
    if group == 'local_global':  # all global, gpt-oss's 1:1, OLMo 3's 3:1, all local
        return [('modern', modern)] + [(f'layers={p}', {**modern, 'layers': p, **window}) for p in ('LG', 'LLLG', 'L')]
    if group == 'sinks':  # the first-token sink and what removes it: the output gate, learned sinks (probed)
        return [('modern', modern), ('modern+gate', {**modern, 'attn_gate': True}),
                ('modern+sinks', {**modern, 'attn_sinks': True}),
                ('modern+gate+sinks', {**modern, 'attn_gate': True, 'attn_sinks': True})] + [
            # windowed attention with and without sinks (StreamingLLM, gpt-oss)
            (f'layers={p}{s}', {**modern, 'layers': p, **window, **({'attn_sinks': True} if s else {})})
            for p in ('L', 'LG') for s in ('', '+sinks')]
    if group == 'recall':
        return recall_members(base)
    if group == 'length_generalization':  # on data/copy: trained at strings of 1..16, evaluated at 16, 32, 64
        trained, longest = copy_inputs()
        copy = {**modern, 'dataset': 'copy', 'block_size': trained}
        # learned positions get a table as long as the longest evaluation: its rows past `trained` never train
        return [('learned', {**copy, 'pos': 'learned', 'block_size': longest}), ('rope', copy),
                ('nope', {**copy, 'layers': 'N'}), ('layers=GGGN', {**copy, 'layers': 'GGGN'}),
                ('rope_fraction=0.25', {**copy, 'rope_fraction': 0.25})]
    if group == 'gate':
        return [('modern', modern), ('modern+gate', {**modern, 'attn_gate': True})]
    if group == 'nope':  # where positions are: every layer rotates all dims, a NoPE layer in four, part of each head
        return [('modern', modern), ('layers=GGGN', {**modern, 'layers': 'GGGN'})] + [
            (f'rope_fraction={f:g}', {**modern, 'rope_fraction': f}) for f in (0.5, 0.25)]
    if group == 'hybrid':  # constant-memory layers in the block, 3:1 with full attention (Qwen3-Next, Kimi Linear,
        # Nemotron-H, LFM2's share) and alone, at about the modern block's parameters: Gated DeltaNet by its widths,
        # Kimi Delta Attention, Mamba-2 and the gated short convolution by their MLP's width
        return [('modern', modern)] + [(f'layers={p}', pattern_flags(base, modern, p))
                                       for kind in 'DKSV' for p in (kind * 3 + 'G', kind)]
    if group == 'chunked':  # Llama 4's three chunked layers and a NoPE one, against windows of the chunk's size
        sizes = sorted({max(1, base['block_size'] // 4), max(1, base['block_size'] // 2)})
        return [('modern', modern), ('layers=GGGN', {**modern, 'layers': 'GGGN'})] + [
            (f'layers={p}+{kind}={c}', {**modern, 'layers': p, kind: c}) for c in sizes
            for p, kind in (('CCCN', 'attention_chunk_size'), ('LLLN', 'sliding_window'))]
    if group == 'sparse':  # DeepSeek Sparse Attention: each query reads a quarter or an eighth of block_size, the
        # indexer trained by its KL loss or not at all
        rotated = GPTConfig(**{**model_args(base), **modern}).rope_dim
        dsa = lambda k, coef: {**modern, 'index_topk': k, 'index_loss_coef': coef, 'index_head_dim': max(32, rotated)}
        return [('modern', modern)] + [(f"dsa_topk={k}{'' if coef else '_no_kl'}", dsa(k, coef))
                                       for k in (max(1, base['block_size'] // 4), max(1, base['block_size'] // 8))
                                       for coef in (1.0, 0.0)]
    if group == 'mtp':  # DeepSeek-V3's multi-token prediction, one and two tokens further
        return [('modern', modern)] + [(f'mtp_depth={d}', {**modern, 'mtp_depth': d}) for d in (1, 2)]
    if group == 'kv_sharing':  # Gemma 4's cache savings: the last quarter and half of the layers sharing K/V, K = V
        shared = sorted({max(1, base['n_layer'] // 4), max(1, base['n_layer'] // 2)} - {base['n_layer']})
        return [('modern', modern)] + [(f'kv_shared_layers={n}', {**modern, 'kv_shared_layers': n}) for n in shared] + [
            ('modern+attn_k_eq_v', {**modern, 'attn_k_eq_v': True})]
    if group == 'per_layer_embeddings':  # Gemma 4's per-layer tables, against the dense block given the same
        # total parameters (the tables' rows cost lookups, not FLOPs) and the same FLOPs per token
        ple = {**modern, 'per_layer_embd': max(1, base['n_embd'] // 4)}
        args = {**model_args(base), 'vocab_size': base_vocab(base)}
        with_ple = GPT(GPTConfig(**{**args, **ple}))
        params, flops = with_ple.get_num_params(), with_ple.flops_per_token()
        equal_params = widened(args, modern, params, lambda m: m.get_num_params())
        equal_flops = widened(args, modern, flops, lambda m: m.flops_per_token())
        return [('modern', modern), (f"per_layer_embd={ple['per_layer_embd']}", ple),
                (f"equal_params_ffn={equal_params['ffn_hidden']}", equal_params),
                (f"equal_flops_ffn={equal_flops['ffn_hidden']}", equal_flops)]
    if group == 'mlp':
        return [(f'mlp={m}', {'mlp': m}) for m in ('relu', 'gelu', 'swiglu', 'geglu')]
    if group == 'kv':
        return [(f'kv={k}', {**modern, 'n_kv_head': k}) for k in int_list(n_kv_heads, 'n_kv_heads')]
    if group == 'moe':
        # 8 experts of half the dense width, 2 per token: the dense model's active parameters
        routed = {**modern, 'mlp': 'moe', 'n_expert': 8, 'n_expert_active': 2}
        moe = {**routed, 'moe_aux_loss_coef': 0.01}
        total = 8 * GPTConfig(**{**model_args(base), **moe}).expert_hidden  # the MoE's MLP parameters, dense
        return [('modern', modern), ('moe', moe), ('moe+shared', {**moe, 'n_shared_expert': 1}),
                ('moe-sigmoid', {**routed, 'router': 'sigmoid'}), ('moe-noaux', routed),
                ('dense-as-total', {**modern, 'ffn_hidden': total})]
    if group == 'attention':
        # MLA with the cache of GQA (n_head/2 K/V heads) and of MQA (one): latent + rotated key = that width
        return [('mha', {**modern, 'n_kv_head': None}), ('modern', modern), ('mqa', {**modern, 'n_kv_head': 1}),
                ('mla-gqa-cache', mla_flags(base, modern, gqa_cache=True)),
                ('mla-mqa-cache', mla_flags(base, modern, gqa_cache=False))]
    if group == 'long_context':
        return [('vanilla', {}), ('modern', modern)]
    if group == 'stability':
        return [(f"{name} lr={lr:g}", {**flags, 'learning_rate': lr, 'min_lr': lr / 10})
                for lr in float_list(learning_rates, 'learning_rates')
                for name, flags in (('modern', modern), ('modern+qk_norm', {**modern, 'qk_norm': True}))]
    if group == 'optimizer':  # the min_lr floor stays a tenth of each peak
        lr = lambda r: {'learning_rate': r, 'min_lr': r / 10}
        return [(f'adamw lr={r:g}', {**modern, **lr(r)}) for r in float_list(adamw_lrs, 'adamw_lrs')] + \
               [(f'muon lr={r:g}', {**modern, 'optimizer': 'muon', 'muon_lr': r})
                for r in float_list(muon_lrs, 'muon_lrs')]
    if group == 'schedule':
        return [('modern', modern), ('modern+wsd', {**modern, 'lr_schedule': 'wsd'})]
    if group == 'recipe_mlp':  # the modern block's MLP; the plain ones 1.5x the gated width: equal parameters
        gated = GPTConfig(**{**model_args(base), **modern}).mlp_width  # 8/3 d rounded up to multiple_of
        return [('modern mlp=swiglu', modern)] + [(f'modern mlp={m}', {**modern, 'mlp': m, 'ffn_hidden': 3 * gated // 2})
                                                  for m in ('gelu', 'relu2')]
    if group == 'zero_init':  # a tied head is the embedding and keeps its init: untied shows the head's part too
        untied = {**modern, 'tie_embeddings': False}
        return [('modern', modern), ('modern+zero_init', {**modern, 'zero_init': True}),
                ('modern untied', untied), ('modern untied+zero_init', {**untied, 'zero_init': True})]
    if group == 'custom':
        return list(parse_custom(custom, base).items())
    die(f"unknown grid group {group!r}; groups are default, leave_one_out, norm_position, mlp, kv, moe, attention, "
        f"long_context, stability, local_global, sinks, gate, nope, hybrid, chunked, sparse, mtp, kv_sharing, "
        f"per_layer_embeddings, optimizer, schedule, recipe_mlp, zero_init, recall, length_generalization, custom")


def data_meta(cwd, dataset):
    """data/<dataset>/meta.json under cwd, {} when there is none."""
    meta_path = os.path.join(cwd, 'data', dataset, 'meta.json')
    return read_json(meta_path) if os.path.exists(meta_path) else {}


def base_vocab(base):
    """The base recipe's vocabulary as train.py will set it: its dataset's meta.json, else GPT-2's 50304."""
    return base.get('vocab_size') or data_meta(run_dir or REPO, base['dataset']).get('vocab_size') or 50304


def widened(args, flags, target, measure):
    """flags with the MLP's hidden width (ffn_hidden) raised until measure(model) is nearest target: a unit priced
    on the model itself, so any MLP and layer kind count right."""
    hidden = GPTConfig(**{**args, **flags}).mlp_width
    now, one_more = (measure(GPT(GPTConfig(**{**args, **flags, 'ffn_hidden': h}))) for h in (hidden, hidden + 1))
    return {**flags, 'ffn_hidden': hidden + round((target - now) / (one_more - now))}


def deltanet_widths(base, modern):
    """Gated DeltaNet's q, k, v, gate and output at 3/5 of a head each: the parameters of GQA's q, k + v (half
    the heads) and output, 3 head widths."""
    width = max(1, round(0.6 * GPTConfig(**{**model_args(base), **modern}).head_size))
    return {'linear_key_dim': width, 'linear_value_dim': width}


def mla_flags(base, modern, gqa_cache):
    """MLA whose cache (latent + rotated key) is the width of GQA's (n_head/2 K/V heads) or MQA's (one)."""
    cfg = GPTConfig(**{**model_args(base), **modern})
    rope = max(2, cfg.head_size // 2)
    heads = cfg.kv_heads if gqa_cache else 1
    return {**modern, 'n_kv_head': None, 'attn': 'mla', 'qk_rope_head_dim': rope,
            'kv_lora_rank': 2 * heads * cfg.head_size - rope}


def pattern_flags(base, modern, pattern, window=None):
    """modern with these layers at about its parameters: Gated DeltaNet by its widths, Kimi Delta Attention, Mamba-2
    and the short convolution by their MLP's width; local layers a window (default a quarter of block_size)."""
    flags = {**modern, 'layers': pattern}
    if 'D' in pattern:
        flags.update(deltanet_widths(base, modern))
    if 'L' in pattern:
        flags['sliding_window'] = window or max(1, base['block_size'] // 4)
    if set(pattern) & set('KSV'):
        args = {**model_args(base), 'vocab_size': base_vocab(base)}
        params = GPT(GPTConfig(**{**args, **modern})).get_num_params()
        flags = widened(args, flags, params, lambda m: m.get_num_params())
    return flags


def recall_members(base):
    """Zoology's figure: every architecture at every width, sequence length L and pair count, each (L, pairs) its
    own dataset. A variant is named '<arch>_d=<width>_L=<L>', with '_P=<pairs>' where pairs is not L / 8."""
    archs = [a.strip() for a in recall_archs.split(',') if a.strip()]
    letters = 'GLNDCVS-K'
    bad = [a for a in archs if a not in ('global', 'mla') and not (set(a) <= set(letters))]
    if bad or not archs:
        die(f"recall_archs must be a comma-separated list of global, mla or layers patterns of {letters!r} "
            f"(e.g. global,DDDG,KKKG); got {recall_archs!r}")
    members = []
    for length in int_list(recall_lengths, 'recall_lengths'):
        for pairs in int_list(recall_pairs, 'recall_pairs') if recall_pairs.strip() else [default_pairs(length)]:
            dataset = recall_dataset(length, pairs)
            tag = '' if pairs == default_pairs(length) else f' P={pairs}'
            for width in int_list(recall_widths, 'recall_widths'):
                sizes = {'block_size': length - 1, 'n_embd': width, 'n_head': max(1, width // 32)}
                sized = {**base, **sizes}
                modern = {**sizes, **swap_flags('modern', sized)}
                for name in archs:
                    flags = (modern if name == 'global' else mla_flags(sized, modern, gqa_cache=True) if name == 'mla'
                             else pattern_flags(sized, modern, name, window=max(1, length // 4)))
                    members.append((f'{name} d={width} L={length}{tag}', {'dataset': dataset, **flags}))
    return members


def default_pairs(length):
    return max(1, length // 8)


def recall_dataset(length, pairs):
    """data/recall_<length> (pairs L / 8) or data/recall_<length>_p<pairs>, checked to hold examples of that length
    and pair count: else one line naming the command that makes it."""
    if pairs < 1 or 4 * pairs > length:
        die(f"recall_pairs: {pairs} pairs do not fit examples of {length} tokens (recall_lengths): a pair and its "
            f"query take 4 tokens, so 1 to {length // 4} pairs")
    name = f'recall_{length}' if pairs == default_pairs(length) else f'recall_{length}_p{pairs}'
    meta = data_meta(run_dir or REPO, name)
    if meta.get('example_length') != length or meta.get('settings', {}).get('num_pairs', pairs) != pairs:
        die(f"the recall group needs data/{name} (examples of {length} tokens, {pairs} pairs); make it with: python "
            f"data/recall/prepare.py --seq_len {length} --num_pairs {pairs} --vocab_size 64 --out_dir data/{name}")
    return name


def copy_inputs():
    """(the training inputs' length, the longest evaluation split's) of data/copy, in tokens."""
    splits = data_meta(run_dir or REPO, 'copy').get('splits') or {}
    if 'train' not in splits:
        die("the length_generalization group needs data/copy; make it with: python data/copy/prepare.py")
    return splits['train']['example_length'] - 1, max(s['example_length'] for s in splits.values()) - 1


def model_args(base):
    return {f.name: base[f.name] for f in fields(GPTConfig) if f.name != 'vocab_size'}


def build_grid(base):
    """{name: settings} in grid order; a settings set already present (e.g. mlp=gelu is vanilla) runs once."""
    variants, names_by_key = {}, {}
    in_train_args = {a[2:].partition('=')[0] for a in shlex.split(train_args) if a.startswith('--')}
    for group in [g.strip() for g in grid.split(',') if g.strip()] or die("grid is empty"):
        for name, flags in group_members(group, base):
            name = re.sub(r'[^A-Za-z0-9._+=-]', '_', name).strip('.') or '_'  # a directory name
            # a flag at the base recipe's value changes nothing
            key = repr(sorted((k, v) for k, v in flags.items() if base.get(k, ...) != v))
            if key in names_by_key:
                if names_by_key[key] != name:
                    print(f"{name} has the flags of {names_by_key[key]}: it runs once, as {names_by_key[key]}")
                continue
            if name in variants:
                die(f"variant name {name!r} stands for two different flag sets")
            both = sorted(in_train_args & set(flags))
            if both:  # train_args come last and would win, under the variant's name
                die(f"train_args set {', '.join(both)}, which variant {name!r} sets itself; leave it to the variants")
            variants[name], names_by_key[key] = flags, name
    return variants


# ----------------------------------------------------------------------------- one run

def flag_args(flags):
    return [f'--{k}={v!r}' for k, v in flags.items()]  # repr: read back as the same literal


def run_args(flags, seed):
    """train.py's arguments but out_dir: what makes two runs the same. seed last, so train_args cannot move it."""
    return [train_config] + flag_args(flags) + shlex.split(train_args) + [f'--seed={seed}', '--wandb_log=False']


def run_path(out, name, flags, seed):
    """runs/<variant>/seed<seed>; a run finished there with other arguments (another train_args) is kept,
    and this one goes beside it, named by a hash of its arguments."""
    path = os.path.join(out, 'runs', name, f'seed{seed}')
    done = os.path.join(path, 'done.json')
    if os.path.exists(done) and read_json(done)['args'] != run_args(flags, seed):
        digest = hashlib.sha1(json.dumps(run_args(flags, seed)).encode()).hexdigest()[:8]
        path = f'{path}-{digest}'
    return path


def made_here(done):
    """Whether a finished run was made with this invocation's train_config and train_args."""
    base = [a for a in done['args'] if a not in flag_args(done['flags'])]
    return base == run_args({}, done['seed'])


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        die(f"cannot read '{path}' ({type(e).__name__}): delete it to rerun that run")


def summarize_run(path, cwd):
    """The figures of a finished run, from its log.jsonl and checkpoint."""
    with open(os.path.join(path, 'log.jsonl')) as f:
        records = [r for r in map(json.loads, filter(str.strip, f)) if not r.get('eval_only')]
    last = records[-1]
    ms = [r['ms_per_iter'] for r in records[1:] if r['ms_per_iter'] is not None]  # the first eval has none
    ms_per_iter = statistics.mean(ms) if ms else None
    tokens_per_iter = last['tokens'] / last['iter'] if last['iter'] else None
    diverged = os.path.join(path, 'diverged.json')
    figures = {'final_val_loss': last['val_loss'], 'best_val_loss': min(r['val_loss'] for r in records),
               'curve': [[r['iter'], r['val_loss'], r['elapsed_s']] for r in records], 'ms_per_iter': ms_per_iter,
               'tokens_per_s': tokens_per_iter / ms_per_iter * 1000 if ms_per_iter and tokens_per_iter else None,
               'load_max_over_mean': statistics.mean(last['moe']['max_over_mean']) if 'moe' in last else None,
               'diverged_at': read_json(diverged)['iter'] if os.path.exists(diverged) else None,
               'parameters': None, 'active_parameters': None, 'kv_bytes_per_token': None,
               'task': task_scores(last), 'accuracy': last.get('accuracy'), 'lengths': last.get('lengths'),
               'best_accuracy': max((r['accuracy'] for r in records if r.get('accuracy') is not None), default=None),
               'probe': None}
    ckpt_path = os.path.join(path, 'ckpt.pt')
    if os.path.exists(ckpt_path):  # not when val loss never improved with always_save_checkpoint=False
        checkpoint = load_checkpoint(ckpt_path)
        model = model_from_checkpoint(checkpoint, ckpt_path)
        block = model.config.block_size
        figures.update(parameters=model.get_num_params(), active_parameters=model.get_num_params(active=True),
                       kv_bytes_per_token=model.kv_cache_bytes(1, block, torch.float32) / block,
                       probe=probe_run(model, probe_tokens(cwd, checkpoint['config']['dataset'], block)))
    return figures


def probe_tokens(cwd, dataset, block_size):
    """The tokens the probes read, the same for every variant: a task's first PROBE_ROWS val examples (inputs),
    or PROBE_ROWS windows of block_size of the val text at offsets drawn from EXTRAPOLATION_SEED; None without
    the data."""
    data_dir = os.path.join(cwd, 'data', dataset)
    meta_path = os.path.join(data_dir, 'meta.json')
    meta = read_json(meta_path) if os.path.exists(meta_path) else {}
    if 'example_length' in meta:
        if not os.path.isfile(os.path.join(data_dir, 'val_mask.bin')):
            return None
        length = meta['splits']['val']['example_length']
        inputs, _ = read_examples(data_dir, 'val', range(min(PROBE_ROWS, meta['splits']['val']['examples'])), length)
        return torch.from_numpy(inputs)
    files = [f for f in val_files(cwd, dataset) if os.path.isfile(f)]
    data = np.memmap(files[0], dtype=np.uint16, mode='r') if files else []
    if len(data) <= block_size:
        return None
    offsets = torch.randint(len(data) - block_size, (PROBE_ROWS,), generator=torch.Generator().manual_seed(
        EXTRAPOLATION_SEED)).tolist()
    return torch.from_numpy(np.stack([data[i:i + block_size] for i in offsets]).astype(np.int64))


def probe_run(model, tokens):
    """The probes' summary (sink share, massive activations), the equal-attention share of the same queries,
    and the per-layer report; None without tokens."""
    if tokens is None or tokens.size(1) <= PROBE_SKIP:
        return None
    report = probe(model, tokens, skip=PROBE_SKIP)
    equal = statistics.mean(1 / (t + 1) for t in range(PROBE_SKIP, tokens.size(1)))
    return {**summarize_probe(report), 'equal_share': equal, 'layers': report}


def task_scores(record):
    """The downstream task's headline metric a run logged at this evaluation (train.py's eval_task), as
    {'hellaswag acc_norm': 0.29}: acc_norm where the task has it, else acc, else its first metric."""
    out = {}
    for name, metrics in (record.get('task') or {}).items():
        metric = next((m for m in ('acc_norm', 'acc') if m in metrics), next(iter(metrics), None))
        if metric is not None:
            out[f'{name} {metric}'] = metrics[metric]
    return out


def method_args(method, trained, multiple):
    """The runtime flags that evaluate a model trained at `trained` tokens at multiple x that length."""
    length = multiple * trained
    return {'plain': {}, 'linear': {'rope_scaling': 'linear', 'rope_factor': float(multiple)},
            # factor 1: the base grows with the length itself, (L / trained)^(d / (d - 2))
            'dynamic': {'rope_scaling': 'dynamic', 'rope_factor': 1.0},
            'yarn': {'rope_scaling': 'yarn', 'rope_factor': float(multiple)},
            'window': {'sliding_window': trained}}[method] | {'block_size': length} | (
                {'rope_original_length': trained} if method in ('linear', 'dynamic', 'yarn') else {})  # a scaling's


def val_files(cwd, dataset):
    """The val split's token files: val.bin, or the shards meta.json lists (data/fineweb_edu/prepare.py)."""
    data_dir = os.path.join(cwd, 'data', dataset)
    meta_path = os.path.join(data_dir, 'meta.json')
    meta = read_json(meta_path) if os.path.exists(meta_path) else {}
    shards = meta.get('shards') if isinstance(meta, dict) else None
    names = [entry[0] for entry in shards.get('val', [])] if isinstance(shards, dict) else ['val.bin']
    return [os.path.join(data_dir, name) for name in names]


def is_task(cwd, dataset):
    """Whether data/<dataset> holds whole examples (a task: recall, copy), not running text."""
    return 'example_length' in data_meta(cwd, dataset)


def lengths_missing(path, methods):
    """The (method, multiple) losses of a run not yet in its extrapolation.json."""
    cache_path = os.path.join(path, 'extrapolation.json')
    cache = read_json(cache_path) if os.path.exists(cache_path) else {}
    return [(m, k) for m in methods for k in MULTIPLES if f'{m}@{k}x@{extrapolation_iters}' not in cache]


@torch.no_grad()
def extrapolation_losses(path, cwd, methods):
    """({method: {'1x': loss, ...}}, why): mean val loss of the run's checkpoint on fixed batches of each length,
    each method applied to the trained weights; None where it cannot run, and why when the val data is missing.
    Cached in the run's extrapolation.json."""
    cache_path = os.path.join(path, 'extrapolation.json')
    cache = read_json(cache_path) if os.path.exists(cache_path) else {}
    missing = lengths_missing(path, methods)
    ckpt_path = os.path.join(path, 'ckpt.pt')
    why = ''
    if missing and os.path.exists(ckpt_path):
        checkpoint = load_checkpoint(ckpt_path)
        dataset = checkpoint['config']['dataset']
        files = val_files(cwd, dataset)
        absent = [f for f in files if not os.path.isfile(f)] or ([] if files else ['(meta.json lists no val shard)'])
        if is_task(cwd, dataset):  # windows across whole examples score nothing: the task's lengths table does
            cache.update({f'{method}@{multiple}x@{extrapolation_iters}': None for method, multiple in missing})
            write_json(cache_path, cache)
        elif absent:  # nothing cached: the losses are computed once the data is back
            why = f"no val data at {absent[0]}"
        else:
            shards = [np.memmap(f, dtype=np.uint16, mode='r') for f in files]
            for method, multiple in missing:
                cache[f'{method}@{multiple}x@{extrapolation_iters}'] = length_loss(checkpoint, ckpt_path, shards,
                                                                                   method, multiple)
            write_json(cache_path, cache)
    return {m: {f'{k}x': cache.get(f'{m}@{k}x@{extrapolation_iters}') for k in MULTIPLES} for m in methods}, why


def length_loss(checkpoint, ckpt_path, shards, method, multiple):
    """The checkpoint's mean loss at multiple x its block_size with one method, or None where it cannot run."""
    trained, batch_size = checkpoint['model_args'], checkpoint['config']['batch_size']
    T = multiple * trained['block_size']
    rope = trained.get('pos') == 'rope'
    # each shard's windows one after another, one draw over them all (as train.py's get_batch); with one
    # val.bin, the draws it always had
    ends = np.cumsum([max(0, len(data) - T) for data in shards])
    if not ((multiple == 1 or rope) and (method == 'plain' or (rope and multiple > 1)) and ends[-1]):
        return None
    args = {**trained, **method_args(method, trained['block_size'], multiple)}
    if not rope:
        args = {k: v for k, v in args.items() if k not in ('rope_original_length',)}
    device = pick_device('auto')  # this machine's: the run's may have been another node's cuda:3
    model = build_model(args, checkpoint['model'], f"checkpoint '{ckpt_path}'").to(device).eval()
    generator, total = torch.Generator().manual_seed(EXTRAPOLATION_SEED + multiple), 0.0
    for _ in range(extrapolation_iters):
        rows = []
        for i in torch.randint(int(ends[-1]), (batch_size,), generator=generator).tolist():
            k = int(np.searchsorted(ends, i, side='right'))
            offset = i - (int(ends[k - 1]) if k else 0)
            rows.append(torch.from_numpy(shards[k][offset:offset + T + 1].astype(np.int64)))
        xy = torch.stack(rows).to(device)
        total += model(xy[:, :-1], xy[:, 1:].contiguous())[1].item()
    return total / extrapolation_iters


SCALINGS = ('linear', 'dynamic', 'yarn')


def task_lengths(path, cwd, methods):
    """{scaling: {split: {'loss', 'accuracy'}} or None} of a RoPE run's ckpt.pt on a task dataset's evaluation
    splits (data/copy's val, val_2x, val_4x), each scaling of methods applied to the trained weights; train.py
    logged the plain ones. Cached in the run's lengths.json."""
    cache_path = os.path.join(path, 'lengths.json')
    cache = read_json(cache_path) if os.path.exists(cache_path) else {}
    keys = {m: f'{m}@{extrapolation_iters}' for m in methods if m in SCALINGS}
    found = task_checkpoint(path, cwd) if any(k not in cache for k in keys.values()) else None
    if found:
        checkpoint, data_dir, meta = found
        for method in [m for m, k in keys.items() if k not in cache]:
            cache[keys[method]] = {s: task_split_figures(checkpoint, os.path.join(path, 'ckpt.pt'), data_dir, meta,
                                                         method, s) for s in meta['eval_splits']}
        write_json(cache_path, cache)
    return {m: cache.get(k) for m, k in keys.items()}


def task_checkpoint(path, cwd):
    """(checkpoint, data_dir, meta) of a RoPE run on a task dataset with its evaluation splits here, else None."""
    ckpt_path = os.path.join(path, 'ckpt.pt')
    if not os.path.exists(ckpt_path):
        return None
    checkpoint = load_checkpoint(ckpt_path)
    data_dir = os.path.join(cwd, 'data', checkpoint['config']['dataset'])
    meta_path = os.path.join(data_dir, 'meta.json')
    meta = read_json(meta_path) if os.path.exists(meta_path) else {}
    splits = meta.get('eval_splits') if 'example_length' in meta else None
    if checkpoint['model_args'].get('pos') != 'rope' or not splits or not all(
            os.path.isfile(os.path.join(data_dir, f'{s}_mask.bin')) for s in splits):
        return None
    return checkpoint, data_dir, meta


@torch.no_grad()
def task_split_figures(checkpoint, ckpt_path, data_dir, meta, method, split):
    """{'loss', 'accuracy'} over the scored targets of the split's first extrapolation_iters batches of examples,
    the trained model scaled from its training examples' length to the split's."""
    trained, length = meta['splits']['train']['example_length'] - 1, meta['splits'][split]['example_length']
    args = {**checkpoint['model_args'], **method_args(method, trained, (length - 1) / trained),
            'block_size': max(length - 1, checkpoint['model_args']['block_size'])}
    device = pick_device('auto')
    model = build_model(args, checkpoint['model'], f"checkpoint '{ckpt_path}'").to(device).eval()
    batch_size = checkpoint['config']['batch_size']
    n = min(meta['splits'][split]['examples'], extrapolation_iters * batch_size)
    loss_sum, right, scored = 0.0, 0, 0
    for start in range(0, n, batch_size):
        rows = range(start, min(n, start + batch_size))
        x, y = (torch.from_numpy(a).to(device) for a in read_examples(data_dir, split, rows, length))
        logits, loss = model(x, y)
        hits, count = (int(v) for v in masked_accuracy(logits, y))
        loss_sum, right, scored = loss_sum + loss.item() * count, right + hits, scored + count
    return {'loss': loss_sum / scored, 'accuracy': right / scored}


def finished(path, cwd):
    """The run's done.json, its figures brought up to date."""
    done = read_json(os.path.join(path, 'done.json'))
    if done.get('version') != SUMMARY_VERSION:
        done.update(summarize_run(path, cwd), version=SUMMARY_VERSION)
        write_json(os.path.join(path, 'done.json'), done)
    return done


# ----------------------------------------------------------------------------- claims: one trainer per run

def claim(path):
    """Claim a run for this process (a file beside its directory, written whole before it appears), or say
    who holds it. A claim whose owner died (on this host), or stopped refreshing it (any host), is taken over
    by one process only: the first to rename it aside."""
    claim_path, me = path + '.claim', {'host': socket.gethostname(), 'pid': os.getpid()}
    mine = f'{claim_path}.{me["host"]}.{me["pid"]}'
    with open(mine, 'w') as f:
        json.dump(me, f)
    try:
        for _ in range(2):
            try:
                os.link(mine, claim_path)  # atomic: fails if a claim is there, never shows it half-written
                return None
            except FileExistsError:
                pass
            try:
                with open(claim_path) as f:
                    owner = json.load(f)
                age = time.time() - os.path.getmtime(claim_path)
            except (OSError, ValueError):  # gone meanwhile, or damaged: look again
                owner, age = {}, CLAIM_STALE_S + 1
            alive = owner.get('host') == me['host'] and _alive(owner.get('pid'))
            if not (owner.get('host') == me['host'] and not alive or age > CLAIM_STALE_S):
                return f"{owner.get('host')}:{owner.get('pid')}"
            try:  # stale: of all the processes that see it so, the one whose rename succeeds removes it
                os.rename(claim_path, f'{mine}.stale')
                os.remove(f'{mine}.stale')
            except FileNotFoundError:
                pass
        return 'another process'
    finally:
        os.remove(mine)


def take(path):
    """Claim a run to train it: None, or why it is not ours to train ('finished', or who is training it)."""
    done = os.path.join(path, 'done.json')
    if os.path.exists(done):
        return 'finished'
    holder = claim(path)
    if holder:
        return f'being trained by {holder}'
    # ours now; but a train.py may still run there, or another process may have finished the run between the look
    # above and the claim (start() would delete it)
    why = ('being trained by a train.py still running there' if trainer_inside(path) else
           'finished' if os.path.exists(done) else None)
    if why:
        release(path)
    return why


def trainer_inside(path):
    """Whether a train.py holds the run directory's lock (an orphan of a process that died without taking its
    runs with it, on a system where they do not die together)."""
    import fcntl
    try:
        fd = os.open(os.path.join(path, '.lock'), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def refresh(path):
    """Tell other nodes this run's claim is alive (its mtime); False if it was taken over meanwhile."""
    try:
        os.utime(path + '.claim')
        return True
    except FileNotFoundError:
        return False


def _alive(pid):
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


def release(path):
    try:
        os.remove(path + '.claim')
    except FileNotFoundError:
        pass


def _die_with_parent():
    """In a child: be killed when ablate.py dies, even by kill -9, so no orphan trains on (Linux)."""
    try:
        import ctypes
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start(flags, seed, path, cwd, device):
    """Start train.py for one run in a fresh directory; (process, log file)."""
    shutil.rmtree(path, ignore_errors=True)  # a half-finished run restarts from scratch (we hold its claim)
    os.makedirs(path)
    env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
    if parallel > 1 and not (device or '').startswith('cuda'):  # runs share the CPU's cores
        env['OMP_NUM_THREADS'] = str(max(1, (os.cpu_count() or 1) // parallel))
    log = open(os.path.join(path, 'train.log'), 'w')
    cmd = [python or sys.executable, TRAIN_PY, *run_args(flags, seed), f'--out_dir={path}']
    cmd += [f'--device={device}'] if device else []
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            preexec_fn=_die_with_parent if sys.platform.startswith('linux') else None)
    return proc, log


def finish(job, proc, log, duration, cwd):
    """'' when the run finished (done.json written; a diverged run counts), else why it failed."""
    log.close()
    try:
        return _finish(job, proc, duration, cwd)
    except FileNotFoundError as e:  # its folder was deleted while it ran: that run alone failed
        return f"(exit {proc.returncode}): its folder went away while it ran ('{e.filename}' is missing)"


def _finish(job, proc, duration, cwd):
    name, flags, seed, path = job
    log_path = os.path.join(path, 'train.log')
    diverged = proc.returncode == 1 and os.path.exists(os.path.join(path, 'diverged.json'))
    if (proc.returncode != 0 and not diverged) or not os.path.exists(os.path.join(path, 'log.jsonl')):
        with open(log_path, errors='replace') as f:
            lines = [line.strip() for line in f if line.strip()]
        why = ([line for line in lines if line.startswith('error:')] or lines or ['(no output)'])[-1][:300]
        return f"(exit {proc.returncode}): {why}; see {log_path}"
    write_json(os.path.join(path, 'done.json'), {'variant': name, 'flags': flags, 'seed': seed,
                                                  'args': run_args(flags, seed), 'duration_s': round(duration, 1),
                                                  **summarize_run(path, cwd), 'version': SUMMARY_VERSION})
    return ''


# ----------------------------------------------------------------------------- the report

def fmt(value, spec='.4f'):
    return 'n/a' if value is None else format(value, spec)


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return 'n/a'
    if len(values) == 1:  # no spread to give
        return f"{values[0]:.4f} (1 seed)"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def mean_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def aggregate(runs):
    """A variant's means over seeds; its curve over the iterations every seed logged."""
    iters = sorted(set.intersection(*({c[0] for c in r['curve']} for r in runs)))
    curves = [{c[0]: c for c in r['curve']} for r in runs]
    return {'flags': runs[0]['flags'], 'seeds': [r['seed'] for r in runs], 'parameters': runs[0]['parameters'],
            'active_parameters': runs[0]['active_parameters'],
            **{k: mean_or_none(r[k] for r in runs) for k in ('final_val_loss', 'best_val_loss', 'ms_per_iter',
                                                              'tokens_per_s', 'kv_bytes_per_token',
                                                              'load_max_over_mean')},
            **{k: mean_or_none(r.get(k) for r in runs) for k in ('accuracy', 'best_accuracy')},
            'lengths': mean_lengths([r.get('lengths') or {} for r in runs]),
            'probe': {k: mean_or_none((r.get('probe') or {}).get(k) for r in runs) for k in PROBE_FIGURES},
            'scaled_lengths': {m: mean_lengths([(r.get('scaled_lengths') or {}).get(m) or {} for r in runs])
                               for m in methods_asked() if m in SCALINGS},
            'diverged_at': [r['diverged_at'] for r in runs],
            'task': {k: mean_or_none((r.get('task') or {}).get(k) for r in runs)
                     for k in dict.fromkeys(k for r in runs for k in (r.get('task') or {}))},
            'extrapolation': {m: {x: mean_or_none((r.get('extrapolation') or {}).get(m, {}).get(x) for r in runs)
                                  for x in (f'{k}x' for k in MULTIPLES)} for m in methods_asked()},
            'curve': [[i, statistics.mean(c[i][1] for c in curves), statistics.mean(c[i][2] for c in curves)]
                      for i in iters]}


def mean_lengths(per_run):
    """{split: {'loss', 'accuracy'}} of several runs, each figure's mean over the runs that have it."""
    splits = dict.fromkeys(s for lengths in per_run for s in lengths)
    return {s: {k: mean_or_none((lengths.get(s) or {}).get(k) for lengths in per_run) for k in ('loss', 'accuracy')}
            for s in splits}


def seed_values(runs, name, key):
    return [r[key] for r in runs if r['variant'] == name and r.get(key) is not None]


def delta(agg, reference, key, n_seeds):
    """'+0.0123 (p 0.004)' against the reference's mean, '≈' marking a p >= 0.05; '(1 seed)': nothing to test."""
    if agg[key] is None or reference[key] is None:
        return 'n/a'
    text, test = f"{agg[key] - reference[key]:+.4f}", agg['welch'][key]
    if agg is reference:
        return text
    if test is None:
        return f"{text} ({n_seeds} seed{'s' if n_seeds > 1 else ''}: untested)"
    return f"{text} (p {test['p']:.2g}{' ≈' if test['p'] >= 0.05 else ''})"


def split_accuracies(runs, name, split):
    """Each seed's plain accuracy of a variant at an evaluation split ('val': train.py's val accuracy)."""
    return [a for a in ((r.get('accuracy') if split == 'val' else ((r.get('lengths') or {}).get(split) or {}).get(
        'accuracy')) for r in runs if r['variant'] == name) if a is not None]


def lengths_table(variants, runs, reference):
    """A task's accuracy (loss) at each evaluation length (train.py's eval_splits, its last evaluation), each plain
    accuracy with Welch's p against the reference's at the same length."""
    splits = list(dict.fromkeys(s for agg in variants.values() for s in agg['lengths']))
    if not splits:
        return []
    lines = ['', "Accuracy (loss) at each evaluation length: plain, each run's last evaluation by train.py (p: Welch's "
                 f"test of its accuracy over seeds against {reference}'s at the same length; ≈: p >= 0.05); a RoPE "
                 f"scaling, its ckpt.pt stretched from the training length to the split's ({extrapolation_iters} "
                 "batches of the split's first examples); n/a: the positions cannot go there.", '',
             '| variant | positions | val (1x) | ' + ' | '.join(splits) + ' |', '|' + ' --- |' * (3 + len(splits))]

    def tested(name, split, figures):
        test = welch(split_accuracies(runs, name, split), split_accuracies(runs, reference, split)) \
            if name != reference else None
        return accuracy_cell(figures) + (f" p {test['p']:.2g}{' ≈' if test['p'] >= 0.05 else ''}" if test else '')

    for name, agg in variants.items():
        val = {'accuracy': agg['accuracy'], 'loss': agg['final_val_loss']}
        lines.append(f"| {name} | plain | {tested(name, 'val', val)} | "
                     + ' | '.join(tested(name, s, agg['lengths'].get(s)) for s in splits) + ' |')
        for method, figures in agg['scaled_lengths'].items():
            if figures:
                lines.append(f"| {name} | {method} | {accuracy_cell(figures.get('val'))} | "
                             + ' | '.join(accuracy_cell(figures.get(s)) for s in splits) + ' |')
    return lines


def recall_points(variants):
    """{name: (architecture, (L, pairs), width)} of the recall group's variants ('<arch>_d=<width>_L=<L>[_P=<pairs>]',
    pairs L / 8 where the name has none)."""
    points = {}
    for name in variants:
        match = re.fullmatch(r'(.+)_d=(\d+)_L=(\d+)(?:_P=(\d+))?', name)
        if match:
            length = int(match[3])
            points[name] = (match[1], (length, int(match[4] or default_pairs(length))), int(match[2]))
    return points


def task_label(task):
    """'L=32' where the pair count is L's default (L / 8), else 'L=32 P=8'."""
    length, pairs = task
    return f'L={length}' + ('' if pairs == default_pairs(length) else f' P={pairs}')


def recall_table(variants, runs):
    """Zoology's figure as a table: each architecture's recall accuracy at every (L, pairs, width), tested against
    all global attention of the same shape, the architecture that solves it."""
    points = recall_points(variants)
    if not points:
        return []
    shapes = sorted({(task, width) for _, task, width in points.values()})
    lines = ['', "Recall accuracy (val, the last evaluation; mean ± std over seeds) at each sequence length L (P: pairs "
                 "where not L / 8) and width d; p: Welch's test against global attention at the same L, P and d (≈: "
                 "p >= 0.05, noise could explain it). Chance is 1/num_pairs among the values of an example.", '',
             '| architecture | ' + ' | '.join(f'{task_label(task)} d={width}' for task, width in shapes) + ' |',
             '|' + ' --- |' * (1 + len(shapes))]
    names = {point: name for name, point in points.items()}
    for arch in dict.fromkeys(a for a, _, _ in points.values()):
        cells = []
        for task, width in shapes:
            accuracies = seed_values(runs, names.get((arch, task, width)), 'accuracy')
            if not accuracies:
                cells.append('-')
                continue
            cell = f"{statistics.mean(accuracies):.3f}" + (
                f" ± {statistics.stdev(accuracies):.3f}" if len(accuracies) > 1 else ' (1 seed)')
            reference = names.get(('global', task, width))
            test = welch(accuracies, seed_values(runs, reference, 'accuracy')) if arch != 'global' else None
            cells.append(cell + (f" (p {test['p']:.2g}{' ≈' if test['p'] >= 0.05 else ''})" if test else ''))
        lines.append(f"| {arch} | " + ' | '.join(cells) + ' |')
    return lines


def plot_recall(variants, runs, path):
    """accuracy_vs_width.png: a panel per sequence length and pair count, a line per architecture (mean, ± std)."""
    points = recall_points(variants)
    tasks = sorted({task for _, task, _ in points.values()})
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        # past matplotlib's 10 colours the lines repeat one: a marker per decade tells them apart
        for i, arch in enumerate(dict.fromkeys(a for a, _, _ in points.values())):
            at = sorted((w, seed_values(runs, n, 'accuracy')) for n, (a, t, w) in points.items()
                        if a == arch and t == task and seed_values(runs, n, 'accuracy'))
            if at:
                ax.errorbar([w for w, _ in at], [statistics.mean(v) for _, v in at], marker='osD^v'[i // 10 % 5], capsize=3,
                            yerr=[statistics.stdev(v) if len(v) > 1 else 0 for _, v in at], label=arch)
        title = f'L={task[0]}, {task[1]} pairs'
        ax.set(xscale='log', xlabel='width (n_embd)', ylabel='recall accuracy', title=title, ylim=(0, 1.05))
        ax.set_xticks(sorted({w for _, t, w in points.values() if t == task}))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the widths run are labelled
        ax.grid(alpha=0.3)
        ax.legend(fontsize='small', loc='center left', bbox_to_anchor=(1, 0.5))
    save_figure(fig, path)


def accuracy_cell(figures):
    if not figures or figures.get('accuracy') is None:
        return 'n/a'
    return f"{figures['accuracy']:.3f} ({figures['loss']:.3f})"


def probes_table(variants):
    """The probes of each variant's ckpt.pt: the attention sink and massive activations."""
    probed = {n: agg['probe'] for n, agg in variants.items() if agg['probe']['sink_share'] is not None
              or agg['probe']['massive_ratio'] is not None}
    if not probed:
        return []
    lines = ['', f"Probes (probes.py) of each run's ckpt.pt on {PROBE_ROWS} fixed val rows: sink share, the attention "
                 f"a query gives the first position (mean over softmax layers and heads, and the largest head), over "
                 f"queries past the first {PROBE_SKIP}; equal attention would give it 1/(t+1), whose mean over the "
                 f"same queries is the 'equal' column: a share far above it is a sink. Massive ratio: the largest "
                 f"|activation| in the residual stream over its median, the largest over layers (n/a sink share: no "
                 f"softmax layer).", '',
             '| variant | sink share (mean) | sink share (max) | equal | massive ratio |', '|' + ' --- |' * 5]
    for name, figures in probed.items():
        lines.append('| ' + ' | '.join([name] + [fmt(figures[k], '.3f') for k in PROBE_FIGURES if k != 'massive_ratio']
                                       + [fmt(figures['massive_ratio'], '.1f')]) + ' |')
    return lines


def methods_asked():
    return [m.strip() for m in extrapolation.split(',') if m.strip()]


def plot_title(xlabel):
    """The variants are the grid's flags on the base recipe (a vanilla one, even when every variant is modern)."""
    return f"val loss vs {xlabel}: grid {grid}, each variant's flags on {os.path.basename(train_config)}"


def plot(variants, x_index, xlabel, path):
    import matplotlib
    matplotlib.use('Agg')  # files only: no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, agg in variants.items():
        ax.plot([c[x_index] for c in agg['curve']], [c[1] for c in agg['curve']], marker='.', label=name)
    ax.set(xlabel=xlabel, ylabel='val loss (mean over seeds)', title=plot_title(xlabel))
    ax.grid(alpha=0.3)
    # the loss at iteration 0 (ln vocab) would squash the differences that matter: start the axis below it
    later = [c[1] for agg in variants.values() for c in agg['curve'][1:] if c[1] == c[1] and c[1] < 1e3]
    if later:
        ax.set_ylim(min(later) - 0.05, min(max(later), 2 * min(later)) + 0.05)
    ax.legend(fontsize='small')
    save_figure(fig, path)


def save_figure(fig, path):
    import matplotlib.pyplot as plt
    fig.tight_layout()
    tmp = tmp_path(path)  # written aside and switched in: a reader never sees half a picture
    try:
        fig.savefig(tmp, format='png', dpi=120)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.lexists(tmp):
            os.remove(tmp)


def check_report_files(out):
    """One line and exit if a report file may not be written in out (one is a checkpoint, a hard link, a
    directory): outputs never replace those."""
    for name in REPORT_FILES:
        refusal = output_refusal(os.path.join(out, name))
        if refusal:
            die(f"cannot write the report's {name} in out_dir '{out}': {refusal}", code=1)


def shell_quote(arg):
    return arg if re.fullmatch(r'[\w@%+=:,./-]+', arg) else '"' + re.sub(r'(["\\$`])', r'\\\1', arg) + '"'


def measure_lengths(runs, roots, cwd):
    """Each run's length table (its cached losses, the missing ones computed now with progress and an ETA: minutes
    on a CPU); {run: why} for the runs whose val data is gone."""
    todo = [root for root in roots if os.path.exists(os.path.join(root, 'ckpt.pt')) and
            lengths_missing(root, methods_asked())]
    if todo:
        print(f"length table: measuring {len(todo)} run(s) at {', '.join(f'{k}x' for k in MULTIPLES)} block_size "
              f"({', '.join(methods_asked())}; {extrapolation_iters} batches each)", flush=True)
    durations, no_data = [], {}
    for run, root in zip(runs, roots):
        t0 = time.time()
        run['extrapolation'], why = extrapolation_losses(root, cwd, methods_asked())
        run['scaled_lengths'] = task_lengths(root, cwd, methods_asked())
        if why:
            no_data[f"{run['variant']} seed {run['seed']}"] = why
        if root in todo:
            durations.append(time.time() - t0)
            left = len(todo) - len(durations)
            eta = f", ETA {fmt_duration(statistics.mean(durations) * left)}" if left else ''
            print(f"length table [{len(durations)}/{len(todo)}] {run['variant']} seed {run['seed']} done in "
                  f"{fmt_duration(durations[-1])}{eta}", flush=True)
    return no_data


def write_report(out, order, failed, cwd, n_layer):
    """Write results.md, results.json and the plots from every finished run (its done.json, read now: runs other
    processes finished are in); the set of the runs' directories it holds."""
    check_report_files(out)  # before the minutes of the length table
    runs, roots, other = [], [], []
    for root, _, files in sorted(os.walk(os.path.join(out, 'runs'))):
        if 'done.json' in files:
            done = read_json(os.path.join(root, 'done.json'))
            if not made_here(done):
                other.append(f"{done['variant']} seed {done['seed']}")
                continue
            runs.append(finished(root, cwd))
            roots.append(root)
    no_data = measure_lengths(runs, roots, cwd)
    reported = {os.path.abspath(root) for root in roots}
    # this grid's order first, then variants of earlier invocations
    runs.sort(key=lambda r: (order.index(r['variant']) if r['variant'] in order else len(order), r['variant'],
                             r['seed']))
    names = dict.fromkeys(r['variant'] for r in runs)
    variants = {n: aggregate([r for r in runs if r['variant'] == n]) for n in names}
    reference = 'vanilla' if 'vanilla' in variants else next(iter(variants), None)
    for name, agg in variants.items():  # each difference to the reference over seeds, tested against noise
        agg['welch'] = {k: welch(*(seed_values(runs, n, k) for n in (name, reference))) if name != reference else None
                        for k in ('final_val_loss', 'accuracy')}
    command = ' '.join(['python ablate.py'] + [shell_quote(a) for a in sys.argv[1:]])
    write_output(os.path.join(out, 'results.json'), json.dumps({'command': command, 'settings': dict(settings),
                                                                'variants': variants, 'runs': runs}, indent=1),
                 'results.json')
    # steps to a loss: the first evaluation where the variant's mean curve is at the target's final loss
    goal = target if target in variants else reference
    goal_loss = variants[goal]['final_val_loss'] if goal else None
    reaches = {n: next((c[0] for c in agg['curve'] if goal_loss is not None and c[1] <= goal_loss), None)
               for n, agg in variants.items()}
    # a downstream task's metric is a column when runs logged one (train.py's eval_task)
    tasks = list(dict.fromkeys(k for agg in variants.values() for k in agg['task']))
    accuracy = any(agg['accuracy'] is not None for agg in variants.values())  # a task dataset's runs
    lines = [f"Base recipe `{train_config}`{f' with `{train_args}`' if train_args else ''}, seeds "
             f"{', '.join(str(1337 + s) for s in range(seeds))}; command: `{command}`", '',
             f'| variant | flags | parameters | active | final val loss | best val loss | Δ final vs {reference} '
             f'| reaches {goal} at iter | ms/iter | tokens/s | KV cache bytes/token | load max/mean | diverged at |'
             + ''.join(f' {t} |' for t in tasks)
             + (f' val accuracy | Δ accuracy vs {reference} |' if accuracy else ''),
             '|' + ' --- |' * (13 + len(tasks) + 2 * accuracy)]
    for name, agg in variants.items():
        seeds_runs = [r for r in runs if r['variant'] == name]
        flags = ', '.join(f'{k}={v}' for k, v in agg['flags'].items()).replace('|', '\\|') or '(base recipe)'
        diverged = ', '.join(str(d) for d in agg['diverged_at'] if d is not None) or '-'
        lines.append('| ' + ' | '.join([
            name, flags, fmt(agg['parameters'], ','), fmt(agg['active_parameters'], ','),
            mean_std([r['final_val_loss'] for r in seeds_runs]), mean_std([r['best_val_loss'] for r in seeds_runs]),
            delta(agg, variants[reference], 'final_val_loss', len(seeds_runs)),
            'not reached' if reaches[name] is None else str(reaches[name]), fmt(agg['ms_per_iter'], '.1f'),
            fmt(agg['tokens_per_s'], ',.0f'), fmt(agg['kv_bytes_per_token'], ',.0f'),
            fmt(agg['load_max_over_mean'], '.2f'), diverged] + [fmt(agg['task'].get(t)) for t in tasks]
            + ([mean_std([r['accuracy'] for r in seeds_runs]), delta(agg, variants[reference], 'accuracy',
                                                                     len(seeds_runs))] if accuracy else [])) + ' |')
    lines += ['', f"p: Welch's two-sided t-test over seeds against {reference} (stats.welch); ≈: p >= 0.05, a "
                  f"difference noise could explain; the per-seed figures are in results.json's runs."]
    lines += ['', "ms/iter and tokens/s come from runs trained one after another (or `parallel` at once) on this "
                  "machine: another job's load during one run slows it alone, so compare them across variants with "
                  "care; bench.py times variants side by side, its steps taken in turn."]
    if 'layers=LLLG' in variants:
        lines += ['', "layers=LLLG is 3 local layers to 1 global (OLMo 3's ratio), not Gemma 3's 5:1 'LLLLLG'" + (
            f", which tiled over this {n_layer}-layer model would be {('LLLLLG' * n_layer)[:n_layer]!r}: LLLG stands "
            f"in for it" if n_layer < 6 else "; add that with --grid=custom") + '.']
    if methods_asked():
        lines += ['', f"Val loss at multiples of the trained block_size (each run's ckpt.pt, {extrapolation_iters} "
                      f"batches per length; n/a: learned positions cannot go past 1x). 1× is not the final val loss "
                      f"above: it is the loss of ckpt.pt (the best val loss's checkpoint unless "
                      f"always_save_checkpoint=True) on {extrapolation_iters} batches of the length table's own seed, "
                      f"the same for every variant, where the val loss columns are train.py's eval_iters batches; "
                      f"the two differ by that sampling (and by which checkpoint).", '',
                  '| variant | method | ' + ' | '.join(f'{k}×' for k in MULTIPLES) + ' |',
                  '|' + ' --- |' * (2 + len(MULTIPLES))]
        for name, agg in variants.items():
            for method, losses in agg['extrapolation'].items():
                if any(v is not None for v in losses.values()):
                    lines.append(f"| {name} | {method} | " + ' | '.join(fmt(v) for v in losses.values()) + ' |')
        if no_data:
            lines += ['', f"Not in the length table (rerun once the data is back): "
                          f"{', '.join(f'{run} ({why})' for run, why in no_data.items())}"]
    lines += lengths_table(variants, runs, reference) + recall_table(variants, runs) + probes_table(variants)
    if target and target not in variants:
        lines += ['', f"target {target!r} has no finished runs here: the reaches column uses {goal!r}"]
    if other:
        lines += ['', f"Not in this report, made with another train_config or train_args: {', '.join(other)}"]
    if failed:
        lines += ['', f"Failed in the last invocation (see their train.log): {', '.join(failed)}"]
    write_output(os.path.join(out, 'results.md'), '\n'.join(lines) + '\n', 'results.md')
    if variants:
        plot(variants, 0, 'iteration', os.path.join(out, 'val_loss_vs_iter.png'))
        plot(variants, 2, 'time (s)', os.path.join(out, 'val_loss_vs_time.png'))
    if recall_points(variants):
        plot_recall(variants, runs, os.path.join(out, 'accuracy_vs_width.png'))
    print(f"report: {os.path.join(out, 'results.md')} ({len(runs)} finished runs of {len(variants)} variants)")
    return reported


# ----------------------------------------------------------------------------- main

def fmt_duration(seconds):
    return f'{seconds:.0f} s' if seconds < 90 else f'{seconds / 60:.0f} min'


def main():
    cwd, out = os.path.abspath(run_dir or REPO), os.path.abspath(out_dir)
    if not os.path.isfile(os.path.join(cwd, train_config)):
        die(f"train_config '{train_config}' not found in run_dir '{cwd}'")
    base = base_recipe(cwd)
    variants = build_grid(base)
    if os.path.isdir(out):  # said before the runs, not after hours of training
        check_report_files(out)
    slots = [d.strip() for d in devices.split(',') if d.strip()] or [None]
    jobs = deque((name, flags, 1337 + s, run_path(out, name, flags, 1337 + s))
                 for name, flags in variants.items() for s in range(seeds))
    total, running, durations, failed, busy = len(jobs), {}, [], [], []
    counter, last_refresh = 0, time.time()
    if report_only:
        jobs.clear()
    try:
        while jobs or running:
            while jobs and len(running) < parallel:
                job = jobs.popleft()
                counter += 1
                name, flags, seed, path = job
                label = f"[{counter}/{total}] {name} seed {seed}"
                os.makedirs(os.path.dirname(path), exist_ok=True)
                why = take(path)
                if why:
                    print(f"{label} skipped ({why})", flush=True)
                    if why != 'finished':
                        busy.append((f'{name} seed {seed}', path))
                    continue
                in_use = [r[3] for r in running.values()]
                device = min(slots, key=in_use.count)  # the least busy (None: the recipe's own)
                proc, log = start(flags, seed, path, cwd, device)
                running[proc] = (job, log, time.time(), device, label)
                print(f"{label} started{f' on {device}' if device else ''}", flush=True)
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                job, log, t0, device, label = running.pop(proc)
                why = finish(job, proc, log, time.time() - t0, cwd)
                release(job[3])
                if why:
                    failed.append(f'{job[0]} seed {job[2]}')
                else:
                    durations.append(time.time() - t0)  # failures are quick: they would shrink the ETA
                left = len(jobs) + len(running)
                eta = f", ETA {fmt_duration(statistics.mean(durations) * left / parallel)}" if left and durations else ''
                print(f"{label} " + (f"FAILED {why}" if why else f"done in {fmt_duration(durations[-1])}") + eta,
                      flush=True)
            if time.time() - last_refresh > 60:  # keep the claims fresh for other nodes
                last_refresh = time.time()
                for job, *_ in running.values():
                    refresh(job[3])
    finally:
        for proc, (job, log, *_) in running.items():  # interrupted: stop the runs, keep what finished
            proc.terminate()
            proc.wait()
            log.close()
            release(job[3])
    reported = write_report(out, list(variants), failed, cwd, base['n_layer'])
    busy = [name for name, path in busy if os.path.abspath(path) not in reported]  # unless finished meanwhile
    if busy:
        print(f"{len(busy)} run(s) were being trained elsewhere and are not in the report yet: {', '.join(busy)}")
    if failed:
        die(f"{len(failed)} run(s) failed: {', '.join(failed)} (their train.log is in {out}/runs/<variant>/seed<seed>)",
            code=1)


if __name__ == '__main__':
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill`: stop the runs as Ctrl-C does
    try:
        main()
    except KeyboardInterrupt:
        die("interrupted: finished runs are kept; the same command resumes", code=130)
