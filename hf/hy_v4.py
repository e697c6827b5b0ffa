"""HY-V4 (hy_v4, Tencent Hunyuan): DeepSeek-V3.2's block (MLA with a query bottleneck, a lightning indexer, later
layers reusing an earlier indexer's top-k as GLM-5's do: index_share) with sinks and an output gate on its latent
attention (attn_sinks, attn_gate), the first layers dense and the rest experts with a sigmoid router, whose routed
experts clamp their SwiGLU as DeepSeek-V4's (swiglu_form='plain_routed': the shared expert is not clamped), and
independent hyper-connections (hc_kind='ihc', the epsilon on the spread weights too: hc_post_eps) with a learned
head. Its attention rotates pairs, as DeepSeek-V3's (the rows reordered to our halves, as there); its indexer
rotates pairs in the last dims of each head, ours halves in the first: the rows that make them are reordered.
(transformers 5.24 rotated halves in both, unlike the published checkpoints; 5.25 rotates pairs.)"""

from types import SimpleNamespace

import torch

from .deepseek import _DEEPSEEK_NAMES, _deepseek_read, _deepseek_write
from .deepseek_v32 import _DSA
from .engine import _TRANSFORMS, ANY, HF_FAMILIES, HFFamily
from .shared import _dense_first, _tiling


def _hy_v4_read(c):
    n = c.num_hidden_layers
    if set(c.layer_types[:n]) != {'indexed_attention'}:
        raise ValueError(f"layer_types {sorted(set(c.layer_types[:n]))} are not supported (only 'indexed_attention')")
    shares = list(c.indexer_types[:n])
    if set(shares) - {'full', 'shared'} or shares[0] != 'full':
        raise ValueError(f"indexer_types {shares} are not supported: 'full' or 'shared', the first 'full'")
    if not c.q_lora_rank:
        raise ValueError(f"q_lora_rank={c.q_lora_rank} is not supported (the indexer reads the query bottleneck)")
    if c.hc_mult < 2:
        raise ValueError(f"hc_mult={c.hc_mult} is not supported (hyper-connections of 2 copies or more)")
    dense = _dense_first(c)
    moe = dense < n
    if moe and c.swiglu_limit <= 0:
        raise ValueError(f"swiglu_limit={c.swiglu_limit} is not supported (its config calls a limit at or below 0 no "
                         f"clamp; its experts clamp at it all the same)")
    if moe and not c.n_shared_experts:
        raise ValueError("n_shared_experts=0 is not supported (HY-V4's MoE always adds its shared expert)")
    # DeepSeek-V3's reading of the MLA and the experts, pairs rotated as there
    v3 = SimpleNamespace(**{**c.to_dict(), 'model_type': 'deepseek_v3', 'first_k_dense_replace': dense,
                            'rope_interleave': True})
    flags = {**_deepseek_read(v3), 'attn_sinks': True, 'attn_gate': True,
             'index_topk': c.index_topk, 'index_n_heads': c.index_n_heads, 'index_head_dim': c.index_head_dim,
             'index_norm_eps': float(c.rms_norm_eps),
             'index_share': _tiling(['S' if s == 'shared' else 'F' for s in shares]) if 'shared' in shares else None,
             'hc_mult': c.hc_mult, 'hc_kind': 'ihc', 'hc_eps': float(c.hc_eps),
             'hc_post_scale': float(c.hc_magnitude), 'hc_post_eps': True, 'hc_final': 'learned'}
    if moe:
        flags.update(swiglu_limit=float(c.swiglu_limit), swiglu_form='plain_routed')
    return flags


def _hy_v4_write(cfg):
    n, moe = cfg.n_layer, cfg.mlp == 'moe'
    if cfg.index_norm_eps != cfg.norm_eps:  # transformers' indexer normalizes its keys with rms_norm_eps
        raise ValueError(f"hy_v4's indexer normalizes its keys with the model's rms_norm_eps: index_norm_eps="
                         f"{cfg.index_norm_eps} must equal norm_eps={cfg.norm_eps}")
    out = _deepseek_write(cfg)
    del out['first_k_dense_replace']  # HY-V4 reads mlp_layer_types
    dense = cfg.first_dense_layers if moe else n
    return {**out, 'mlp_layer_types': ['dense'] * dense + ['sparse'] * (n - dense),
            'layer_types': ['indexed_attention'] * n,
            'indexer_types': ['shared' if s else 'full' for s in cfg.index_shares],
            'index_topk': cfg.index_topk, 'index_n_heads': cfg.index_n_heads, 'index_head_dim': cfg.index_head_dim,
            'hc_mult': cfg.hc_mult, 'hc_magnitude': cfg.hc_post_scale, 'hc_eps': cfg.hc_eps,
            **({'swiglu_limit': float(cfg.swiglu_limit)} if moe else {}),
            'attention_bias': False, 'pad_token_id': None}


def _index_rows(tensor, config, inverse):
    """The indexer's heads (index_head_dim rows each) of theirs, [passed | rotated in pairs], as ours, [rotated in
    halves | passed], or (inverse) back: the same dot products, its queries and its key reordered alike."""
    width, rotated = config.index_head_dim, config.rope_dim
    passed = width - rotated
    order = torch.cat((torch.arange(passed, width, 2), torch.arange(passed + 1, width, 2), torch.arange(passed)))
    heads = tensor.unflatten(0, (-1, width))
    return heads[:, order.argsort() if inverse else order].flatten(0, 1)


_TRANSFORMS['hy_index_rows'] = (lambda t, c: _index_rows(t, c, False), lambda t, c: _index_rows(t, c, True))

_LAYER = 'model.layers.{i}.'
_HY_V4_NAMES = _DEEPSEEK_NAMES + [
    ('transformer.h.{i}.attn.c_gate.weight', _LAYER + 'self_attn.gate_proj.weight', None),
    ('transformer.h.{i}.attn.sinks', _LAYER + 'self_attn.sinks', None),
    *[(f'transformer.h.{{i}}.attn.indexer.{ours}', f'{_LAYER}self_attn.indexer.{theirs}', how)
      for ours, theirs, how in (('wq.weight', 'wq_b.weight', 'hy_index_rows'),
                                ('wk.weight', 'wk.weight', 'hy_index_rows'),
                                ('k_norm.weight', 'k_norm.weight', 'hy_index_rows'),
                                ('k_norm.bias', 'k_norm.bias', 'hy_index_rows'),
                                ('weights.weight', 'weights_proj.weight', None))],
    *[(f'transformer.h.{{i}}.residual.{hc}.{p}', f'{_LAYER}{hc}.{p}', None)
      for hc in ('attn_hc', 'ffn_hc') for p in ('fn', 'base', 'scale')],
    *[(f'transformer.hc_head.{p}', f'model.hc_head.{p}', None) for p in ('hc_fn', 'hc_base', 'hc_scale')],
]
HF_FAMILIES['hy_v4'] = HFFamily(
    'hy_v4', 'HYV4ForCausalLM',
    {**HF_FAMILIES['deepseek_v3'].carries, **_DSA, 'q_lora_rank': lambda v: bool(v), 'index_share': ANY,
     'index_norm_eps': ANY, 'attn_sinks': (True,), 'attn_gate': (True,), 'n_shared_expert': lambda v: v >= 1,
     'swiglu_limit': lambda v: v is not None, 'swiglu_form': ('plain_routed',), 'hc_mult': lambda v: v >= 2,
     'hc_kind': ('ihc',), 'hc_eps': ANY, 'hc_post_scale': ANY, 'hc_post_eps': (True,)},
    _HY_V4_NAMES, _hy_v4_read, _hy_v4_write, moe_only=('swiglu_limit', 'swiglu_form'))
