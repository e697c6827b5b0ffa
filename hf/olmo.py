"""OLMo 2 and OLMo 3: norms on the branches' outputs, QK-norm over all heads; OLMo 3's local layers with a RoPE
base of their own."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import (_LLAMA_LIKE, _decoder_names, _layer_types_read, _layer_types_write, _llama_like_read,
                     _llama_like_write, _made_of, _rope_kinds_read, _rope_kinds_write, _tiling)


def _olmo2_read(c):
    if getattr(c, 'attention_bias', False):
        raise ValueError("OLMo with attention_bias is not supported (its q, k, v and o have biases, its MLP none)")
    return {**_llama_like_read(c), 'norm_position': 'after', 'qk_norm': True, 'qk_norm_all_heads': True}


def _olmo2_write(cfg):
    return {**_llama_like_write(cfg), 'attention_bias': False}


def _olmo3_read(c):
    kinds = _layer_types_read(c)
    # _olmo2_read reads the rope_parameters of one type; OLMo 3's are per type, read here
    return {**_olmo2_read(c), 'layers': _tiling(kinds), 'sliding_window': c.sliding_window if 'L' in kinds
            else None, **_rope_kinds_read(c, kinds)}


def _olmo3_write(cfg):
    return {**_olmo2_write(cfg), **_rope_kinds_write(cfg, 'olmo3'), 'layer_types': _layer_types_write(cfg),
            'sliding_window': cfg.sliding_window or cfg.block_size}


# OLMo's norms are on the branches' outputs, where our 'after' blocks put ln_1 and ln_2
_OLMO_NAMES = _decoder_names([('ln_1', 'post_attention_layernorm'), ('ln_2', 'post_feedforward_layernorm')])

HF_FAMILIES['olmo2'] = HFFamily('olmo2', 'Olmo2ForCausalLM',
                                {**_LLAMA_LIKE, 'bias': (False,), 'norm_position': ('after',), 'qk_norm': (True,),
                                 'qk_norm_all_heads': (True,)},
                                _OLMO_NAMES, _olmo2_read, _olmo2_write)
HF_FAMILIES['olmo3'] = HFFamily('olmo3', 'Olmo3ForCausalLM',
                                {**_LLAMA_LIKE, 'bias': (False,), 'norm_position': ('after',), 'qk_norm': (True,),
                                 'qk_norm_all_heads': (True,), 'layers': _made_of('LG'), 'sliding_window': ANY,
                                 'rope_local_theta': ANY}, _OLMO_NAMES, _olmo3_read, _olmo3_write)
