"""DeepSeek-V4 (deepseek_v4): one shared key-value head (attn='shared_kv') with sinks, a query bottleneck and the
grouped low-rank output (chapters/deepseek_v4.py), a window on every layer, its three kinds of layers (sliding
'L'; heavily compressed 'H'; compressed sparse 'I', with its indexer), the two RoPE tables (the compressed
layers' is ours, rope_theta with its YaRN; the sliding layers' is rope_local_theta), the sqrt-softplus or sigmoid
router with its balancing bias, hash routing on the first layers and the clamped SwiGLU, mHC on every layer
(hyper_connections.py). Its rotated dims are the last of each head, in pairs; ours the first, in halves: the rows
that make each head (and the columns that read it) are reordered, the indexer's heads too."""

from types import SimpleNamespace

import torch

from .engine import _TRANSFORMS, ANY, HF_FAMILIES, HFFamily
from .shared import _MOE, _ROPE, _SIZES, _made_of, _rope_read, _rope_write, _tiling

_KINDS = {'sliding_attention': 'L', 'heavily_compressed_attention': 'H', 'compressed_sparse_attention': 'I'}


def _rope_kinds(c, kinds):
    """Our RoPE flags: with compressed layers, theirs (compress_rope_theta and its YaRN) as the model's tables and
    the sliding layers' base as rope_local_theta; without, the sliding layers' as the model's."""
    main, compress = (dict(c.rope_parameters[k]) for k in ('main', 'compress'))
    if main.get('rope_type', 'default') != 'default':
        raise ValueError(f"a sliding layers' rope_type {main['rope_type']!r} is not supported (only 'default')")
    fraction = float(main.get('partial_rotary_factor', 1.0))
    if not set(kinds) & {'H', 'I'}:
        return dict(pos='rope', rope_theta=float(main['rope_theta']), rope_fraction=fraction)
    if float(compress.get('partial_rotary_factor', 1.0)) != fraction:
        raise ValueError("rope_parameters 'main' and 'compress' with different partial_rotary_factor are not supported")
    flags = _rope_read(SimpleNamespace(rope_parameters=compress, max_position_embeddings=c.max_position_embeddings,
                                       model_type=c.model_type), partial=True)
    if 'L' in kinds:
        flags['rope_local_theta'] = float(main['rope_theta'])
    return flags


def _deepseek_v4_read(c):
    n = c.num_hidden_layers
    unknown = set(c.layer_types[:n]) - set(_KINDS)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported ({', '.join(map(repr, _KINDS))} are)")
    kinds = [_KINDS[t] for t in c.layer_types[:n]]
    mlp_types = list(c.mlp_layer_types[:n])
    hashed = mlp_types.count('hash_moe')
    if mlp_types != ['hash_moe'] * hashed + ['moe'] * (n - hashed):
        raise ValueError(f"mlp_layer_types {mlp_types} are not supported: only the first layers 'hash_moe', the rest "
                         f"'moe'")
    if c.hidden_act != 'silu' or c.attention_bias or c.mlp_bias:
        raise ValueError("DeepSeek-V4 checkpoints with biases or an activation other than silu are not supported")
    if c.scoring_func not in ('sqrtsoftplus', 'sigmoid'):
        raise ValueError(f"scoring_func {c.scoring_func!r} is not supported ('sqrtsoftplus', 'sigmoid')")
    if c.hc_mult < 2:
        raise ValueError(f"hc_mult={c.hc_mult} is not supported (hyper-connections of 2 copies or more)")
    compressed = {}
    if 'H' in kinds:
        compressed['hca_rate'] = c.compress_rates['heavily_compressed_attention']
    if 'I' in kinds:
        compressed.update(csa_rate=c.compress_rates['compressed_sparse_attention'], csa_topk=c.index_topk,
                          csa_index_heads=c.index_n_heads, csa_index_dim=c.index_head_dim)
    rope = _rope_kinds(c, kinds)  # YaRN's may set block_size
    return dict(n_layer=n, n_head=c.num_attention_heads, n_embd=c.hidden_size, head_dim=c.head_dim,
                vocab_size=c.vocab_size, block_size=rope.pop('block_size', c.max_position_embeddings), bias=False,
                norm='rms', norm_eps=c.rms_norm_eps, tie_embeddings=bool(c.tie_word_embeddings), **rope, layers=_tiling(kinds) if compressed else None, **compressed,
                attn='shared_kv', attn_sinks=True, q_rank=c.q_lora_rank, o_groups=c.o_groups,
                o_lora_rank=c.o_lora_rank, sliding_window=c.sliding_window,
                # one shared expert of moe_intermediate_size whatever n_shared_experts says (transformers' MLP)
                mlp='moe', n_expert=c.n_routed_experts, n_expert_active=c.num_experts_per_tok,
                moe_hidden=c.moe_intermediate_size, n_shared_expert=1, router='sigmoid',
                router_score='sqrtsoftplus' if c.scoring_func == 'sqrtsoftplus' else None, router_norm_topk=True,
                routed_scaling=float(c.routed_scaling_factor), swiglu_limit=float(c.swiglu_limit),
                swiglu_form='plain', hc_mult=c.hc_mult, hc_kind='mhc', hc_sinkhorn_iters=c.hc_sinkhorn_iters,
                hc_eps=float(c.hc_eps), hc_final='learned', hash_moe_layers=hashed)


def _deepseek_v4_rope_write(cfg):
    """rope_theta, compress_rope_theta and the nested rope_parameters: the sliding layers' plain, the compressed
    layers' ours (its scaling included)."""
    kinds = set(cfg.layer_kinds)
    if 'L' in kinds and cfg.rope_scaling and cfg.rope_local_theta is None:
        raise ValueError(f"deepseek_v4's sliding layers take no RoPE scaling; this model scales theirs too "
                         f"(rope_scaling={cfg.rope_scaling!r}, rope_local_theta=None)")
    main = cfg.rope_local_theta if 'L' in kinds and cfg.rope_local_theta is not None else cfg.rope_theta
    compress = _rope_write(cfg, partial=True)['rope_parameters']
    return dict(rope_theta=main, compress_rope_theta=cfg.rope_theta, partial_rotary_factor=cfg.rope_fraction,
                rope_parameters={'main': {'rope_type': 'default', 'rope_theta': main,
                                          'partial_rotary_factor': cfg.rope_fraction}, 'compress': compress})


def _deepseek_v4_write(cfg):
    n = cfg.n_layer
    types = {kind: name for name, kind in _KINDS.items()}
    return dict(layer_types=[types[k] for k in cfg.layer_kinds],
                compress_rates={'compressed_sparse_attention': cfg.csa_rate,
                                'heavily_compressed_attention': cfg.hca_rate},
                index_topk=cfg.csa_topk, index_n_heads=cfg.csa_index_heads, index_head_dim=cfg.csa_index_dim,
                **_deepseek_v4_rope_write(cfg),
                vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, moe_intermediate_size=cfg.expert_hidden,
                num_hidden_layers=n, num_attention_heads=cfg.n_head, num_key_value_heads=1, head_dim=cfg.head_size,
                q_lora_rank=cfg.q_rank, o_groups=cfg.o_groups, o_lora_rank=cfg.o_lora_rank,
                sliding_window=cfg.sliding_window,
                mlp_layer_types=['hash_moe' if i in cfg.hash_layers else 'moe' for i in range(n)],
                max_position_embeddings=cfg.block_size, n_routed_experts=cfg.n_expert,
                num_experts_per_tok=cfg.n_expert_active, n_shared_experts=1,
                scoring_func=cfg.router_score or 'sigmoid', norm_topk_prob=True,
                routed_scaling_factor=float(cfg.routed_scaling), swiglu_limit=float(cfg.swiglu_limit),
                hc_mult=cfg.hc_mult, hc_sinkhorn_iters=cfg.hc_sinkhorn_iters, hc_eps=cfg.hc_eps,
                rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings, attention_dropout=cfg.dropout,
                router_aux_loss_coef=cfg.moe_aux_loss_coef, pad_token_id=None)


def _head_order(config, width):
    """Our dims of a head `width` wide as theirs: the rotated pairs' first members, then their second members, then
    the rest."""
    nope = width - config.rope_dim
    return torch.cat((torch.arange(nope, width, 2), torch.arange(nope + 1, width, 2), torch.arange(nope)))


def _reorder_heads(tensor, config, dim, inverse, width=None):
    """Every head's dims along `dim` (heads of `width`, head_size by default, side by side) in our order, or
    (inverse) back in theirs."""
    width = width or config.head_size
    order = _head_order(config, width)
    order = order.argsort() if inverse else order
    return tensor.unflatten(dim, (-1, width)).index_select(dim + 1, order).flatten(dim, dim + 1)


_TRANSFORMS.update({  # the rows that make heads (q, the key-value head and its norm), the columns that read them;
    # the indexer's heads are csa_index_dim wide
    'v4_head_rows': (lambda t, c: _reorder_heads(t, c, 0, False), lambda t, c: _reorder_heads(t, c, 0, True)),
    'v4_head_cols': (lambda t, c: _reorder_heads(t, c, 1, False), lambda t, c: _reorder_heads(t, c, 1, True)),
    'v4_index_rows': (lambda t, c: _reorder_heads(t, c, 0, False, c.csa_index_dim),
                      lambda t, c: _reorder_heads(t, c, 0, True, c.csa_index_dim)),
    'v4_index_cols': (lambda t, c: _reorder_heads(t, c, 1, False, c.csa_index_dim),
                      lambda t, c: _reorder_heads(t, c, 1, True, c.csa_index_dim)),
})
_COMPRESSOR = 'self_attn.compressor.'
_COMPRESSOR_PARTS = (('c_kv.weight', 'kv_proj.weight', 'rows'), ('c_gate.weight', 'gate_proj.weight', 'rows'),
                     ('position_bias', 'position_bias', 'cols'), ('norm.weight', 'kv_norm.weight', 'rows'))
_LAYER = 'model.layers.{i}.'
_DEEPSEEK_V4_NAMES = [
    ('transformer.wte.weight', 'model.embed_tokens.weight', None),
    ('transformer.ln_f.weight', 'model.norm.weight', None),
    ('lm_head.weight', 'lm_head.weight', None),
    *[(f'transformer.hc_head.{p}', f'model.hc_head.{p}', None) for p in ('hc_fn', 'hc_base', 'hc_scale')],
    ('transformer.h.{i}.ln_1.weight', _LAYER + 'input_layernorm.weight', None),
    ('transformer.h.{i}.ln_2.weight', _LAYER + 'post_attention_layernorm.weight', None),
    *[(f'transformer.h.{{i}}.residual.{hc}.{p}', f'{_LAYER}{hc}.{p}', None)
      for hc in ('attn_hc', 'ffn_hc') for p in ('fn', 'base', 'scale')],
    *[(f'transformer.h.{{i}}.attn.{ours}', f'{_LAYER}self_attn.{theirs}', how) for ours, theirs, how in (
        ('q_a.weight', 'q_a_proj.weight', None), ('q_a_norm.weight', 'q_a_norm.weight', None),
        ('q_b.weight', 'q_b_proj.weight', 'v4_head_rows'), ('c_kv.weight', 'kv_proj.weight', 'v4_head_rows'),
        ('kv_norm.weight', 'kv_norm.weight', 'v4_head_rows'), ('sinks', 'sinks', None),
        ('c_group.weight', 'o_a_proj.weight', 'v4_head_cols'), ('c_proj.weight', 'o_b_proj.weight', None))],
    *[(f'transformer.h.{{i}}.attn.compress.{ours}', f'{_LAYER}{_COMPRESSOR}{theirs}', f'v4_head_{how}')
      for ours, theirs, how in _COMPRESSOR_PARTS],
    *[(f'transformer.h.{{i}}.attn.indexer.compress.{ours}', f'{_LAYER}{_COMPRESSOR}indexer.{theirs}', f'v4_index_{how}')
      for ours, theirs, how in _COMPRESSOR_PARTS],
    ('transformer.h.{i}.attn.indexer.wq.weight', _LAYER + _COMPRESSOR + 'indexer.q_b_proj.weight', 'v4_index_rows'),
    ('transformer.h.{i}.attn.indexer.weights.weight', _LAYER + _COMPRESSOR + 'indexer.scorer.weights_proj.weight',
     None),
    *[(f'transformer.h.{{i}}.mlp.{ours}', f'{_LAYER}mlp.{theirs}', None) for ours, theirs in (
        ('router.weight', 'gate.weight'), ('expert_bias', 'gate.e_score_correction_bias'), ('tid2eid', 'gate.tid2eid'),
        ('experts.c_fc', 'experts.gate_up_proj'), ('experts.c_proj', 'experts.down_proj'),
        ('shared.c_proj.weight', 'shared_experts.down_proj.weight'))],
    ('transformer.h.{i}.mlp.shared.c_fc.weight', (_LAYER + 'mlp.shared_experts.gate_proj.weight',
                                                  _LAYER + 'mlp.shared_experts.up_proj.weight'), None),
]
HF_FAMILIES['deepseek_v4'] = HFFamily(
    'deepseek_v4', 'DeepseekV4ForCausalLM',
    {**_SIZES, **_MOE, **_ROPE, 'norm': ('rms',), 'bias': (False,), 'pos': ('rope',), 'rope_fraction': ANY,
     'rope_local_theta': ANY, 'head_dim': ANY, 'attn': ('shared_kv',), 'attn_sinks': (True,),
     'q_rank': lambda v: bool(v), 'o_groups': ANY, 'o_lora_rank': lambda v: v is not None,
     'sliding_window': lambda v: v is not None, 'layers': _made_of('LHI'), 'hca_rate': ANY, 'csa_rate': ANY,
     'csa_topk': ANY, 'csa_index_heads': ANY, 'csa_index_dim': ANY, 'csa_index_loss_coef': ANY,
     'mlp': ('moe',), 'n_shared_expert': (1,), 'router': ('sigmoid',), 'router_score': ANY,
     'router_norm_topk': (True,), 'routed_scaling': ANY, 'moe_bias_update_rate': ANY,
     'swiglu_limit': lambda v: v is not None, 'swiglu_form': ('plain',), 'hc_mult': lambda v: v >= 2,
     'hc_sinkhorn_iters': ANY, 'hc_eps': ANY, 'hash_moe_layers': ANY},
    _DEEPSEEK_V4_NAMES, _deepseek_v4_read, _deepseek_v4_write)
