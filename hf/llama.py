"""Llama, Mistral, Qwen2, Qwen3: the Llama-style block (RMSNorm, SwiGLU, RoPE, GQA) and its variants' biases,
sliding window and QK-norm."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import _LLAMA_LIKE, _LLAMA_NAMES, _llama_like_read, _llama_like_write


def _qwen_window(c):
    """Qwen2/3 slide only when use_sliding_window, on layers from max_window_layers on: all or none for us."""
    if not getattr(c, 'use_sliding_window', False):
        return None
    if c.max_window_layers != 0 and c.max_window_layers < c.num_hidden_layers:
        raise ValueError(f"sliding windows on some layers only (max_window_layers={c.max_window_layers}) "
                         f"are not supported")
    return c.sliding_window if c.max_window_layers == 0 else None


def _llama_read(c):
    attention_bias, mlp_bias = getattr(c, 'attention_bias', False), getattr(c, 'mlp_bias', False)
    if attention_bias != mlp_bias:
        raise ValueError("attention_bias != mlp_bias is not supported")
    return {**_llama_like_read(c), 'bias': bool(attention_bias)}


def _llama_write(cfg):
    return {**_llama_like_write(cfg), 'attention_bias': cfg.bias, 'mlp_bias': cfg.bias}


def _mistral_read(c):
    return {**_llama_like_read(c), 'sliding_window': c.sliding_window}


def _mistral_write(cfg):
    return {**_llama_like_write(cfg), 'sliding_window': cfg.sliding_window}


def _qwen_write(cfg):
    return {**_llama_like_write(cfg), 'use_sliding_window': cfg.sliding_window is not None,
            'sliding_window': cfg.sliding_window, 'max_window_layers': 0}


def _qwen2_read(c):  # q, k and v always have biases, o none
    return {**_llama_like_read(c), 'qkv_bias': True, 'sliding_window': _qwen_window(c)}


def _qwen3_write(cfg):
    return {**_qwen_write(cfg), 'attention_bias': False}


def _qwen3_read(c):
    if getattr(c, 'attention_bias', False):
        raise ValueError("Qwen3 with attention_bias is not supported")
    return {**_llama_like_read(c), 'qk_norm': True, 'sliding_window': _qwen_window(c)}


HF_FAMILIES['llama'] = HFFamily('llama', 'LlamaForCausalLM', {**_LLAMA_LIKE, 'bias': ANY}, _LLAMA_NAMES, _llama_read,
                                _llama_write)
HF_FAMILIES['mistral'] = HFFamily('mistral', 'MistralForCausalLM',
                                  {**_LLAMA_LIKE, 'bias': (False,), 'sliding_window': ANY},
                                  _LLAMA_NAMES, _mistral_read, _mistral_write)
HF_FAMILIES['qwen2'] = HFFamily('qwen2', 'Qwen2ForCausalLM',
                                {**_LLAMA_LIKE, 'bias': (False,), 'qkv_bias': (True,), 'sliding_window': ANY},
                                _LLAMA_NAMES, _qwen2_read, _qwen_write)
HF_FAMILIES['qwen3'] = HFFamily('qwen3', 'Qwen3ForCausalLM',
                                {**_LLAMA_LIKE, 'bias': (False,), 'qk_norm': (True,), 'sliding_window': ANY},
                                _LLAMA_NAMES, _qwen3_read, _qwen3_write)
