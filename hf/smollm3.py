"""SmolLM3: the Llama block with layers without RoPE ('N')."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .llama import _llama_read, _llama_write
from .shared import _LLAMA_LIKE, _LLAMA_NAMES, _made_of, _tiling


def _smollm3_read(c):
    if 'sliding_attention' in c.layer_types[:c.num_hidden_layers]:
        raise ValueError("SmolLM3 with sliding layers (use_sliding_window) is not supported: its windows are on "
                         "the layers without RoPE, and our local layers rotate")
    kinds = ['G' if rope else 'N' for rope in c.no_rope_layers[:c.num_hidden_layers]]  # 1: RoPE, 0: none
    return {**_llama_read(c), 'layers': _tiling(kinds)}


def _smollm3_write(cfg):
    return {**_llama_write(cfg), 'no_rope_layers': [int(k != 'N') for k in cfg.layer_kinds],
            'use_sliding_window': False, 'layer_types': ['full_attention'] * cfg.n_layer,
            'pad_token_id': None}  # its default (128004) is past a smaller vocabulary, which transformers refuses


HF_FAMILIES['smollm3'] = HFFamily('smollm3', 'SmolLM3ForCausalLM',
                                  {**_LLAMA_LIKE, 'bias': ANY, 'layers': _made_of('GN')},
                                  _LLAMA_NAMES, _smollm3_read, _smollm3_write)
