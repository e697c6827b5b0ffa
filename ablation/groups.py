"""The grid's groups as data: GROUPS maps each group's name to what builds its members, [(name, flags)] on the base
recipe; the helpers before it read the groups' settings and size a variant (MLA's cache, a layer kind's widths) to
the modern block's."""

import ast
import math
import re
from dataclasses import fields

from ablation.files import REPO, data_meta
from common.errors import die
from chapters import GPT, SWAPS, GPTConfig, swap_flags
from model import LAYER_KINDS


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
    """Every list of counts here (layers, widths, lengths, pairs, KV heads) is of positive integers: 0 would
    otherwise read as 'not set' further on and quietly run the recipe's own value."""
    values = [int(v) for v in text.split(',')] if re.fullmatch(r'\s*\d+(\s*,\s*\d+)*\s*', text) else []
    if not values or min(values) < 1:
        die(f"{name} must be comma-separated positive integers, e.g. --{name}=1,2,4; got {text!r}")
    return values


def float_list(text, name):
    """Every list of rates here is of positive finite numbers: 'inf' parses as a float, and every run at it fails."""
    try:
        values = [float(v) for v in text.split(',')]
    except ValueError:
        values = []
    if not values or not all(0 < v < math.inf for v in values):
        die(f"{name} must be comma-separated positive numbers, e.g. --{name}=1e-3,1e-2; got {text!r}")
    return values


def model_args(base):
    return {f.name: base[f.name] for f in fields(GPTConfig) if f.name != 'vocab_size'}


def base_vocab(base, settings):
    """The base recipe's vocabulary as train.py will set it: its dataset's meta.json, else GPT-2's 50304."""
    return base.get('vocab_size') or data_meta(settings['run_dir'] or REPO, base['dataset']).get('vocab_size') or 50304


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


def kind_needs(pattern, recipe, window=None):
    """What the layer kinds of a pattern need set, as the registry says (LayerKind.needs: a shared key-value head,
    a window's or a chunk's size...), the sizes that follow the sequence at `window` tokens, else a quarter of
    block_size."""
    window = window or max(1, recipe['block_size'] // 4)
    needs = {}
    for letter in dict.fromkeys(pattern):
        if LAYER_KINDS[letter].needs:
            needs.update(LAYER_KINDS[letter].needs(recipe, window))
    return needs


def pattern_flags(base, modern, pattern, settings, window=None):
    """modern with these layers at about its parameters: Gated DeltaNet by its widths, Kimi Delta Attention, Mamba-2
    and the short convolution by their MLP's width; what a kind needs besides (a local layer's window, a chunked
    one's chunk: the registry's quarter of block_size, or `window`)."""
    flags = {**modern, 'layers': pattern}
    if 'D' in pattern:
        flags.update(deltanet_widths(base, modern))
    flags.update(kind_needs(pattern, {**base, **flags}, window))
    if set(pattern) & set('KSV'):
        args = {**model_args(base), 'vocab_size': base_vocab(base, settings)}
        params = GPT(GPTConfig(**{**args, **modern})).get_num_params()
        flags = widened(args, flags, params, lambda m: m.get_num_params())
    return flags


def recall_members(base, settings):
    """Zoology's figure: every architecture at every width, sequence length L and pair count, each (L, pairs) its
    own dataset, and Zoology's protocol where asked: at each depth (recall_depths) and learning rate (recall_lrs).
    A variant is named '<arch>_d=<width>_L=<L>', with '_P=<pairs>' where pairs is not L / 8, '_n=<layers>' and
    '_lr=<rate>' where those are swept."""
    recall_archs, recall_pairs = settings['recall_archs'], settings['recall_pairs']
    depths = int_list(settings['recall_depths'], 'recall_depths') if settings['recall_depths'].strip() else [None]
    rates = float_list(settings['recall_lrs'], 'recall_lrs') if settings['recall_lrs'].strip() else [None]
    archs = [a.strip() for a in recall_archs.split(',') if a.strip()]
    letters = ''.join(LAYER_KINDS)
    bad = [a for a in archs if a not in RECALL_NAMED and not (set(a) <= set(letters))]
    if bad or not archs:
        die(f"recall_archs must be a comma-separated list of {', '.join(RECALL_NAMED)} or layers patterns of "
            f"{letters!r} (e.g. global,DDDG,KKKG); got {recall_archs!r}")
    widths = int_list(settings['recall_widths'], 'recall_widths')
    for width in widths:
        if width % max(1, width // 32):
            die(f"recall_widths: n_embd {width} does not split into heads 32 wide (n_head = n_embd // 32 = "
                f"{width // 32} must divide it): give widths that it divides, e.g. 32,64,128")
    members = []
    for length in int_list(settings['recall_lengths'], 'recall_lengths'):
        for pairs in int_list(recall_pairs, 'recall_pairs') if recall_pairs.strip() else [default_pairs(length)]:
            dataset = recall_dataset(length, pairs, settings)
            tag = '' if pairs == default_pairs(length) else f' P={pairs}'
            for width, depth in ((w, d) for w in widths for d in depths):
                sizes = {'block_size': length - 1, 'n_embd': width, 'n_head': max(1, width // 32),
                         **({'n_layer': depth} if depth else {})}
                sized = {**base, **sizes}
                modern = {**sizes, **swap_flags('modern', sized)}
                for name in archs:
                    flags = RECALL_NAMED[name](sized, modern) if name in RECALL_NAMED else pattern_flags(
                        sized, modern, pattern_at_depth(name, sized['n_layer']), settings, window=max(1, length // 4))
                    for rate in rates:
                        label = f"{name} d={width} L={length}{tag}{f' n={depth}' if depth else ''}" + \
                            (f' lr={rate:g}' if rate else '')
                        members.append((label, {'dataset': dataset, **flags, **rate_flags(base, rate)}))
    return members


# the recall group's architectures by name (others are layers patterns), each (sized recipe, its modern flags) ->
# flags: the indexers read a quarter of the sequence, single tokens or as four blocks (MiniMax-M3's max scoring);
# v4: DeepSeek-V4's attention (compressed_flags)
RECALL_NAMED = {
    'global': lambda sized, modern: modern,
    'mla': lambda sized, modern: mla_flags(sized, modern, gqa_cache=True),
    'dsa': lambda sized, modern: indexed_flags(sized, modern, max(1, (sized['block_size'] + 1) // 4)),
    'blocks': lambda sized, modern: indexed_flags(sized, modern, max(1, (sized['block_size'] + 1) // 4),
                                                  block=max(1, (sized['block_size'] + 1) // 16)),
    'v4': lambda sized, modern: compressed_flags(modern, sized['block_size'] + 1),
}


def pattern_at_depth(pattern, depth):
    """A layers pattern at a depth: as it is where it fits (the model tiles it), else each of its kinds once in
    order, so that the 3:1 hybrid 'DDDG' at 2 layers is its 1:1 form 'DG' (a pattern is at most n_layer long)."""
    if len(pattern) <= depth:
        return pattern
    kinds = ''.join(dict.fromkeys(pattern))
    if len(kinds) > depth:
        die(f"recall_depths: {depth} layers cannot hold the {len(kinds)} kinds of recall_archs pattern {pattern!r}; "
            f"give depths of at least {len(kinds)} or a pattern of fewer kinds")
    return kinds


def rate_flags(base, rate):
    """A learning rate of the sweep, its floor at the recipe's ratio (min_lr / learning_rate); {} for the recipe's."""
    return {'learning_rate': rate, 'min_lr': rate * base['min_lr'] / base['learning_rate']} if rate else {}


def default_pairs(length):
    return max(1, length // 8)


def recall_dataset(length, pairs, settings):
    """data/recall_<length> (pairs L / 8) or data/recall_<length>_p<pairs>, checked to hold examples of that length
    and pair count: else one line naming the command that makes it."""
    if pairs < 1 or 4 * pairs > length:
        die(f"recall_pairs: {pairs} pairs do not fit examples of {length} tokens (recall_lengths): a pair and its "
            f"query take 4 tokens, so 1 to {length // 4} pairs")
    name = f'recall_{length}' if pairs == default_pairs(length) else f'recall_{length}_p{pairs}'
    meta = data_meta(settings['run_dir'] or REPO, name)
    if meta.get('example_length') != length or meta.get('settings', {}).get('num_pairs', pairs) != pairs:
        die(f"the recall group needs data/{name} (examples of {length} tokens, {pairs} pairs); make it with: python "
            f"data/recall/prepare.py --seq_len {length} --num_pairs {pairs} --vocab_size 64 --out_dir data/{name}")
    return name


def copy_inputs(settings):
    """(the training inputs' length, the longest evaluation split's) of data/copy, in tokens."""
    splits = data_meta(settings['run_dir'] or REPO, 'copy').get('splits') or {}
    if 'train' not in splits:
        die("the length_generalization group needs data/copy; make it with: python data/copy/prepare.py")
    return splits['train']['example_length'] - 1, max(s['example_length'] for s in splits.values()) - 1


# ----------------------------------------------------------------------------- the groups: builders and their table
# Each builder takes (base, modern, settings): the base recipe, the flags of every swap on it, ablate.py's settings;
# it returns [(name, flags)].

def quarter_window(base):
    """A window of a quarter of the context, as Gemma 3's ratio (what a local layer needs, by the registry)."""
    return kind_needs('L', base)


def default_members(base, modern, settings):
    swaps = {name: swap_flags([name], base) for name in SWAPS}
    return [('vanilla', {})] + [(f'vanilla+{s}', f) for s, f in swaps.items()] + [('modern', modern)]


def leave_one_out_members(base, modern, settings):
    return [('modern', modern)] + [(f'modern-{s}', {**modern, **swap_flags([s], base, modern=False)}) for s in SWAPS]


def norm_position_members(base, modern, settings):
    return [('vanilla', {}), ('vanilla+postnorm', {'norm_position': 'post'}),
            ('modern', modern), ('modern+postnorm', {**modern, 'norm_position': 'post'}),
            ('modern+sandwich', {**modern, 'norm_position': 'sandwich'}),
            ('modern+after', {**modern, 'norm_position': 'after'})]


def routed_flags(modern):
    """modern with 8 experts of half the dense width, 2 per token: the dense model's active parameters."""
    return {**modern, 'mlp': 'moe', 'n_expert': 8, 'n_expert_active': 2}


def moe_members(base, modern, settings):
    routed = routed_flags(modern)
    moe = {**routed, 'moe_aux_loss_coef': 0.01}
    total = 8 * GPTConfig(**{**model_args(base), **moe}).expert_hidden  # the MoE's MLP parameters, dense
    return [('modern', modern), ('moe', moe), ('moe+shared', {**moe, 'n_shared_expert': 1}),
            ('moe-sigmoid', {**routed, 'router': 'sigmoid'}), ('moe-noaux', routed),
            ('dense-as-total', {**modern, 'ffn_hidden': total})]


def router_members(base, modern, settings):
    # the moe group's experts with each router's score: softmax (balanced by the auxiliary loss), DeepSeek-V3's
    # sigmoid and DeepSeek-V4's sqrt-softplus (both balanced by the bias), then V4's hash routing on the first layer
    routed = routed_flags(modern)
    sqrt = {**routed, 'router': 'sigmoid', 'router_score': 'sqrtsoftplus'}
    return [('softmax', {**routed, 'moe_aux_loss_coef': 0.01}), ('sigmoid', {**routed, 'router': 'sigmoid'}),
            ('sqrtsoftplus', sqrt), ('sqrtsoftplus+hash', {**sqrt, 'hash_moe_layers': 1})]


def compressed_flags(modern, length, layers='LHLI'):
    """DeepSeek-V4's attention at modern's width for sequences of `length`: one shared key-value head with sinks,
    every layer a window of a quarter of the sequence; 'H' layers pool a window's worth of tokens into each entry,
    'I' layers every 4 (over 8), the indexer reading a quarter of the entries (V4's 128 and 4 beside its 128-token
    window)."""
    window = max(1, length // 4)
    return {**modern, 'n_kv_head': None, 'attn': 'shared_kv', 'attn_sinks': True, 'layers': layers,
            'sliding_window': window, **({'hca_rate': window} if 'H' in layers else {}),
            **({'csa_rate': 4, 'csa_topk': max(1, length // 16)} if 'I' in layers else {})}


def compressed_members(base, modern, settings):
    # V4's attention (windows with HCA and CSA layers, and windows alone) against dense GQA and MLA at GQA's cache
    return [('modern', modern), ('mla', mla_flags(base, modern, gqa_cache=True)),
            ('v4-window', compressed_flags(modern, base['block_size'], 'L')),
            ('v4', compressed_flags(modern, base['block_size']))]


def attention_members(base, modern, settings):
    # MLA with the cache of GQA (n_head/2 K/V heads) and of MQA (one): latent + rotated key = that width
    return [('mha', {**modern, 'n_kv_head': None}), ('modern', modern), ('mqa', {**modern, 'n_kv_head': 1}),
            ('mla-gqa-cache', mla_flags(base, modern, gqa_cache=True)),
            ('mla-mqa-cache', mla_flags(base, modern, gqa_cache=False))]


def stability_members(base, modern, settings):
    return [(f"{name} lr={lr:g}", {**flags, 'learning_rate': lr, 'min_lr': lr / 10})
            for lr in float_list(settings['learning_rates'], 'learning_rates')
            for name, flags in (('modern', modern), ('modern+qk_norm', {**modern, 'qk_norm': True}))]


def local_global_members(base, modern, settings):
    # all global, gpt-oss's 1:1, OLMo 3's 3:1, all local
    return [('modern', modern)] + [(f'layers={p}', {**modern, 'layers': p, **quarter_window(base)})
                                   for p in ('LG', 'LLLG', 'L')]


def sinks_members(base, modern, settings):
    # the first-token sink and what removes it: the output gate, learned sinks (probed)
    return [('modern', modern), ('modern+gate', {**modern, 'attn_gate': True}),
            ('modern+sinks', {**modern, 'attn_sinks': True}),
            ('modern+gate+sinks', {**modern, 'attn_gate': True, 'attn_sinks': True})] + [
        # windowed attention with and without sinks (StreamingLLM, gpt-oss)
        (f'layers={p}{s}', {**modern, 'layers': p, **quarter_window(base), **({'attn_sinks': True} if s else {})})
        for p in ('L', 'LG') for s in ('', '+sinks')]


def nope_members(base, modern, settings):
    # where positions are: every layer rotates all dims, a NoPE layer in four, part of each head
    return [('modern', modern), ('layers=GGGN', {**modern, 'layers': 'GGGN'})] + [
        (f'rope_fraction={f:g}', {**modern, 'rope_fraction': f}) for f in (0.5, 0.25)]


def hybrid_members(base, modern, settings):
    # constant-memory layers in the block, 3:1 with full attention (Qwen3-Next, Kimi Linear, Nemotron-H, LFM2's
    # share) and alone, at about the modern block's parameters: Gated DeltaNet by its widths, Kimi Delta
    # Attention, Mamba-2 and the gated short convolution by their MLP's width
    return [('modern', modern)] + [(f'layers={p}', pattern_flags(base, modern, p, settings))
                                   for kind in 'DKSV' for p in (kind * 3 + 'G', kind)]


def chunked_members(base, modern, settings):
    # Llama 4's three chunked layers and a NoPE one, against windows of the chunk's size
    sizes = sorted({max(1, base['block_size'] // 4), max(1, base['block_size'] // 2)})
    return [('modern', modern), ('layers=GGGN', {**modern, 'layers': 'GGGN'})] + [
        (f'layers={p}+{kind}={c}', {**modern, 'layers': p, kind: c}) for c in sizes
        for p, kind in (('CCCN', 'attention_chunk_size'), ('LLLN', 'sliding_window'))]


def indexed_flags(base, modern, topk, coef=1.0, block=None, pool='max'):
    """modern with DeepSeek's lightning indexer picking topk keys per query (its KL loss weighted coef): single
    tokens, or blocks of `block` keys, scored as MiniMax-M3 does ('max' of its tokens' scores, the query's own
    block always read) or by one pooled key each ('mean': Qwen4-Exp's QSA, 'learned': GLM-5.3-Flash's KPool, the
    unfinished block always read, as both do)."""
    rotated = GPTConfig(**{**model_args(base), **modern}).rope_dim
    flags = {**modern, 'index_topk': topk, 'index_loss_coef': coef, 'index_head_dim': max(32, rotated)}
    if block:
        flags.update(index_block_size=block, index_block_pool=pool,
                     **({} if pool == 'max' else {'index_tail': 'keep', 'index_local_blocks': 0}))
    return flags


def sparse_members(base, modern, settings):
    # DeepSeek Sparse Attention: each query reads a quarter or an eighth of block_size, the indexer trained by its
    # KL loss or not at all
    return [('modern', modern)] + [(f"dsa_topk={k}{'' if coef else '_no_kl'}", indexed_flags(base, modern, k, coef))
                                   for k in (max(1, base['block_size'] // 4), max(1, base['block_size'] // 8))
                                   for coef in (1.0, 0.0)]


def block_sparse_members(base, modern, settings):
    # dense, token selection (DSA) and block selection reading the same quarter of block_size, as four blocks, by
    # each family's scoring; --extrapolation=plain adds the val loss at 1x to 8x block_size
    topk = max(1, base['block_size'] // 4)
    block = max(1, topk // 4)
    return [('modern', modern), (f'dsa_topk={topk}', indexed_flags(base, modern, topk))] + [
        (f'blocks={block}_{pool}', indexed_flags(base, modern, topk, block=block, pool=pool))
        for pool in ('max', 'mean', 'learned')]


def kv_sharing_members(base, modern, settings):
    # Gemma 4's cache savings: the last quarter and half of the layers sharing K/V, K = V
    shared = sorted({max(1, base['n_layer'] // 4), max(1, base['n_layer'] // 2)} - {base['n_layer']})
    return [('modern', modern)] + [(f'kv_shared_layers={n}', {**modern, 'kv_shared_layers': n}) for n in shared] + [
        ('modern+attn_k_eq_v', {**modern, 'attn_k_eq_v': True})]


def per_layer_embeddings_members(base, modern, settings):
    # Gemma 4's per-layer tables, against the dense block given the same total parameters (the tables' rows cost
    # lookups, not FLOPs) and the same FLOPs per token
    ple = {**modern, 'per_layer_embd': max(1, base['n_embd'] // 4)}
    args = {**model_args(base), 'vocab_size': base_vocab(base, settings)}
    with_ple = GPT(GPTConfig(**{**args, **ple}))
    params, flops = with_ple.get_num_params(), with_ple.flops_per_token()
    equal_params = widened(args, modern, params, lambda m: m.get_num_params())
    equal_flops = widened(args, modern, flops, lambda m: m.flops_per_token())
    return [('modern', modern), (f"per_layer_embd={ple['per_layer_embd']}", ple),
            (f"equal_params_ffn={equal_params['ffn_hidden']}", equal_params),
            (f"equal_flops_ffn={equal_flops['ffn_hidden']}", equal_flops)]


def optimizer_members(base, modern, settings):
    # the min_lr floor stays a tenth of each peak
    lr = lambda r: {'learning_rate': r, 'min_lr': r / 10}
    return [(f'adamw lr={r:g}', {**modern, **lr(r)}) for r in float_list(settings['adamw_lrs'], 'adamw_lrs')] + \
           [(f'muon lr={r:g}', {**modern, 'optimizer': 'muon', 'muon_lr': r})
            for r in float_list(settings['muon_lrs'], 'muon_lrs')]


def recipe_mlp_members(base, modern, settings):
    # the modern block's MLP; the plain ones 1.5x the gated width: equal parameters
    gated = GPTConfig(**{**model_args(base), **modern}).mlp_width  # 8/3 d rounded up to multiple_of
    return [('modern mlp=swiglu', modern)] + [(f'modern mlp={m}', {**modern, 'mlp': m, 'ffn_hidden': 3 * gated // 2})
                                              for m in ('gelu', 'relu2')]


def zero_init_members(base, modern, settings):
    # a tied head is the embedding and keeps its init: untied shows the head's part too
    untied = {**modern, 'tie_embeddings': False}
    return [('modern', modern), ('modern+zero_init', {**modern, 'zero_init': True}),
            ('modern untied', untied), ('modern untied+zero_init', {**untied, 'zero_init': True})]


def length_generalization_members(base, modern, settings):
    # on data/copy: trained at strings of 1..16, evaluated at 16, 32, 64
    trained, longest = copy_inputs(settings)
    copy = {**modern, 'dataset': 'copy', 'block_size': trained}
    # learned positions get a table as long as the longest evaluation: its rows past `trained` never train
    return [('learned', {**copy, 'pos': 'learned', 'block_size': longest}), ('rope', copy),
            ('nope', {**copy, 'layers': 'N'}), ('layers=GGGN', {**copy, 'layers': 'GGGN'}),
            ('rope_fraction=0.25', {**copy, 'rope_fraction': 0.25})]


def hyper_connections_members(base, modern, settings):
    # modern + Muon with four copies of the stream (mHC, and independent), against one copy at the mHC model's
    # parameters and at its FLOPs (an MLP widened to each)
    muon = {'optimizer': 'muon'}
    args = {**model_args(base), 'vocab_size': base_vocab(base, settings)}
    model = GPT(GPTConfig(**{**args, **modern, 'hc_mult': 4}))
    equal_params = widened(args, modern, model.get_num_params(), lambda m: m.get_num_params())
    equal_flops = widened(args, modern, model.flops_per_token(), lambda m: m.flops_per_token())
    mhc = {**modern, **muon, 'hc_mult': 4}
    return [('modern+muon', {**modern, **muon}), ('mhc_n=4', mhc), ('ihc_n=4', {**mhc, 'hc_kind': 'ihc'}),
            (f"equal_params_ffn={equal_params['ffn_hidden']}", {**equal_params, **muon}),
            (f"equal_flops_ffn={equal_flops['ffn_hidden']}", {**equal_flops, **muon})]


def speedrun_members(base, modern, settings):
    # modern + Muon, each of the speedrun's switches alone on top of it, and all of them stacked
    muon = {**modern, 'optimizer': 'muon'}
    n = base['n_layer']
    # value embeddings on the first and the last layer: one layer is both (a miniseries' depth 1)
    switches = {'value_embeds': {'value_embed_layers': '0,-1' if n > 1 else '0'}, 'x0_lambdas': {'x0_lambdas': True},
                'unet': {'unet_skips': True}, 'smear': {'smear': True}, 'backout': {'backout_layer': max(0, n // 2)},
                'bigram': {'bigram_vocab': 4096}, 'xsa': {'xsa_layers': ','.join(map(str, range(n)))},
                'key_offset': {'key_offset': True}, 'sigmoid_cap': {'sigmoid_softcap': True},
                'mtp_shared': {'mtp_shared': 2}, 'engram': {'engram_layers': '1'}}
    stacked = {k: v for flags in switches.values() for k, v in flags.items()}
    return [('modern+muon', muon)] + [(f'+{name}', {**muon, **flags}) for name, flags in switches.items()] + \
        [('+all', {**muon, **stacked})]


# group name -> what builds its members; the order is the one an unknown group's error lists. The comment above
# each entry is what ablate.py --help says of the group (read from this source: --help answers before torch loads)
GROUPS = {
    # vanilla, vanilla + each swap, modern
    'default': default_members,
    # modern minus each swap
    'leave_one_out': leave_one_out_members,
    # pre- and post-norm; on modern also sandwich and after
    'norm_position': norm_position_members,
    # relu, gelu, swiglu, geglu on vanilla
    'mlp': lambda base, modern, settings: [(f'mlp={m}', {'mlp': m}) for m in ('relu', 'gelu', 'swiglu', 'geglu')],
    # modern with each of n_kv_heads
    'kv': lambda base, modern, settings: [(f'kv={k}', {**modern, 'n_kv_head': k})
                                          for k in int_list(settings['n_kv_heads'], 'n_kv_heads')],
    # modern dense, MoE at equal active parameters with the softmax router and aux loss, with a shared expert, with
    # the sigmoid router and bias balancing, without balancing, and a dense model of the MoE's total size
    'moe': moe_members,
    # the moe group's experts scored by softmax, sigmoid and DeepSeek-V4's sqrt-softplus, then V4's hash routing
    'router': router_members,
    # modern, MLA at GQA's cache, and DeepSeek-V4's attention: windows alone, and with HCA and CSA layers
    'compressed': compressed_members,
    # MHA, GQA, MQA and MLA with GQA's and MQA's cache sizes
    'attention': attention_members,
    # vanilla and modern: for the length table
    'long_context': lambda base, modern, settings: [('vanilla', {}), ('modern', modern)],
    # modern with and without qk_norm at each of learning_rates
    'stability': stability_members,
    # all global, 'LG', 'LLLG', all local, with a window of a quarter of block_size
    'local_global': local_global_members,
    # modern with the attention output gate and learned sinks; local and 'LG' with and without sinks
    'sinks': sinks_members,
    # modern with and without the attention output gate
    'gate': lambda base, modern, settings: [('modern', modern), ('modern+gate', {**modern, 'attn_gate': True})],
    # modern, a NoPE layer in four, half and a quarter of each head rotated
    'nope': nope_members,
    # modern; 3 constant-memory layers to 1 global and all of them, for Gated DeltaNet, Kimi Delta Attention,
    # Mamba-2 and the gated short convolution, at about modern's parameters
    'hybrid': hybrid_members,
    # modern, a NoPE layer in four, and Llama 4's three chunked layers to a NoPE one against windows of the chunk's
    # size, a quarter and half of block_size
    'chunked': chunked_members,
    # modern, and DeepSeek Sparse Attention reading a quarter and an eighth of block_size, with and without the
    # indexer's KL loss
    'sparse': sparse_members,
    # modern, token selection (DSA), and block selection by max, mean and learned pooling, each reading a quarter
    # of block_size
    'block_sparse': block_sparse_members,
    # modern, and DeepSeek-V3's multi-token prediction one and two tokens further
    'mtp': lambda base, modern, settings: [('modern', modern)] + [(f'mtp_depth={d}', {**modern, 'mtp_depth': d})
                                                                  for d in (1, 2)],
    # Gemma 4's cache savings: the last quarter and half of the layers sharing K/V, and K = V
    'kv_sharing': kv_sharing_members,
    # Gemma 4's per-layer embeddings, against dense MLPs widened to the same parameters and to the same FLOPs
    'per_layer_embeddings': per_layer_embeddings_members,
    # modern with AdamW at each of adamw_lrs and Muon at each of muon_lrs
    'optimizer': optimizer_members,
    # cosine and WSD
    'schedule': lambda base, modern, settings: [('modern', modern), ('modern+wsd', {**modern, 'lr_schedule': 'wsd'})],
    # modern with SwiGLU, GELU, ReLU², the plain ones 1.5x wider: equal parameters
    'recipe_mlp': recipe_mlp_members,
    # modern with and without zero-initialized projections, tied and untied head
    'zero_init': zero_init_members,
    # Zoology's associative recall: recall_archs at each of recall_widths, recall_lengths, recall_pairs,
    # recall_depths and recall_lrs, on data/recall_<L>
    'recall': lambda base, modern, settings: recall_members(base, settings),
    # on data/copy: learned positions, RoPE, NoPE, a NoPE layer in four, a quarter of each head rotated
    'length_generalization': length_generalization_members,
    # modern + Muon with four copies of the stream, mHC and independent, against one copy widened to their
    # parameters and to their FLOPs
    'hyper_connections': hyper_connections_members,
    # modern + Muon, each of the speedrun's switches alone on it, and all of them stacked
    'speedrun': speedrun_members,
    # a dict of name -> flags, --custom
    'custom': lambda base, modern, settings: list(parse_custom(settings['custom'], base).items()),
}


def group_members(group, base, settings):
    """[(name, flags)] of one grid group, built on the base recipe."""
    modern = swap_flags('modern', base)
    if group not in GROUPS:
        die(f"unknown grid group {group!r}; groups are {', '.join(GROUPS)}")
    return GROUPS[group](base, modern, settings)
