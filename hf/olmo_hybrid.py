"""OLMo hybrid: Gated DeltaNet layers ('D', pre-norm, beta in [0, 2]) and OLMo 3's attention layers ('G', norms
after each branch, QK-norm over all heads), with RoPE or none (its released checkpoints)."""

from types import SimpleNamespace

from .engine import ANY, HF_FAMILIES, GPTConfig, HFFamily
from .qwen3_next import _LAYER_TYPES
from .shared import _SIZES, _decoder_names, _llama_like_read, _llama_like_write, _tiling


def _olmo_hybrid_read(c):
    if c.hidden_act != 'silu' or c.attention_bias:
        raise ValueError("OLMo hybrid checkpoints with attention_bias or an activation other than silu are not supported")
    unknown = set(c.layer_types[:c.num_hidden_layers]) - set(_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only {', '.join(map(repr, _LAYER_TYPES))})")
    nope = (getattr(c, 'rope_parameters', None) or {}).get('rope_theta') is None  # no rotary embedding at all
    flags = _llama_like_read(SimpleNamespace(**{**c.to_dict(), 'rope_parameters': None}) if nope else c)
    if nope:
        flags.update(pos='none', rope_theta=GPTConfig.rope_theta)
    kinds = [_LAYER_TYPES[t] for t in c.layer_types[:c.num_hidden_layers]]
    return {**flags, 'layers': _tiling(kinds), 'norm_position': 'after', 'qk_norm': True, 'qk_norm_all_heads': True,
            'linear_n_key_head': c.linear_num_key_heads, 'linear_n_value_head': c.linear_num_value_heads,
            'linear_key_dim': c.linear_key_head_dim, 'linear_value_dim': c.linear_value_head_dim,
            'linear_conv_kernel': c.linear_conv_kernel_dim, 'linear_neg_eigval': bool(c.linear_allow_neg_eigval),
            'linear_norm_eps': 1e-5, 'linear_norm_position': 'pre'}  # its DeltaNet's norm: FLA's epsilon


def _olmo_hybrid_write(cfg):
    dims = cfg.linear_dims
    out = {**_llama_like_write(cfg), 'attention_bias': False, 'pad_token_id': None,
           'layer_types': [{'D': 'linear_attention', 'G': 'full_attention'}[k] for k in cfg.layer_kinds],
           'linear_num_key_heads': dims['k_heads'], 'linear_num_value_heads': dims['v_heads'],
           'linear_key_head_dim': dims['k_dim'], 'linear_value_head_dim': dims['v_dim'],
           'linear_conv_kernel_dim': cfg.linear_conv_kernel, 'linear_allow_neg_eigval': cfg.linear_neg_eigval}
    if cfg.pos == 'none':
        out.update(rope_parameters=None, rope_theta=None)  # no rotary embedding
    return out


def _olmo_hybrid_norms(cfg):
    """(layer, its HF norm, the name our ln_1 or ln_2 row reads) per layer: a DeltaNet block's norms are before
    each branch (input_layernorm, post_attention_layernorm), an attention block's after (post_attention_layernorm,
    post_feedforward_layernorm): the same HF name is ln_1 in one kind and ln_2 in the other."""
    for i, kind in enumerate(cfg.layer_kinds):
        pre = f'model.layers.{i}.'
        names = ('input_layernorm', 'post_attention_layernorm') if kind == 'D' else \
            ('post_attention_layernorm', 'post_feedforward_layernorm')
        for hf_name, ours in zip(names, ('ln_1', 'ln_2')):
            yield pre + hf_name + '.weight', pre + ours + '.weight'


def _olmo_hybrid_unpack(hf_state, cfg):
    out = dict(hf_state)
    out.update({ours: hf_state[hf_name] for hf_name, ours in _olmo_hybrid_norms(cfg)})
    for hf_name, _ in _olmo_hybrid_norms(cfg):
        del out[hf_name]
    return out


def _olmo_hybrid_pack(hf_state, cfg):
    out = dict(hf_state)
    out.update({hf_name: out.pop(ours) for hf_name, ours in _olmo_hybrid_norms(cfg)})
    return out


# the norms under the names unpack gives them (model.layers.{i}.ln_1.weight, ...)
_OLMO_HYBRID_NAMES = _decoder_names([('ln_1', 'ln_1'), ('ln_2', 'ln_2')]) + [
    ('transformer.h.{i}.attn.in_proj_qkv.weight', tuple(f'model.layers.{{i}}.linear_attn.{n}_proj.weight' for n in 'qkv'),
     None),
    *[(f'transformer.h.{{i}}.attn.{ours}', f'model.layers.{{i}}.linear_attn.{hf}', None) for ours, hf in (
        ('in_proj_z.weight', 'g_proj.weight'), ('in_proj_b.weight', 'b_proj.weight'),
        ('in_proj_a.weight', 'a_proj.weight'), ('conv1d.weight', 'conv1d.weight'), ('A_log', 'A_log'),
        ('dt_bias', 'dt_bias'), ('norm', 'o_norm.weight'), ('c_proj.weight', 'o_proj.weight'))],
]
HF_FAMILIES['olmo_hybrid'] = HFFamily(
    'olmo_hybrid', 'OlmoHybridForCausalLM',
    {**_SIZES, 'rope_theta': ANY, 'norm': ('rms',), 'mlp': ('swiglu',), 'pos': ('rope', 'none'), 'n_kv_head': ANY,
     'bias': (False,), 'norm_position': ('after',), 'qk_norm': (True,), 'qk_norm_all_heads': (True,),
     'layers': lambda v: v is not None and set(v) == set('DG'), 'linear_norm_position': ('pre',),
     'linear_norm_eps': (1e-5,), 'linear_neg_eigval': ANY,
     **{k: ANY for k in ('linear_n_key_head', 'linear_n_value_head', 'linear_key_dim', 'linear_value_dim',
                         'linear_conv_kernel', 'linear_chunk_size')}},
    _OLMO_HYBRID_NAMES, _olmo_hybrid_read, _olmo_hybrid_write, _olmo_hybrid_unpack, _olmo_hybrid_pack)
