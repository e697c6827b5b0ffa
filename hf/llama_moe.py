"""Mixtral and Qwen3-MoE: experts in the Llama-style block (Mistral's and Qwen3's), a softmax router."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .llama import _mistral_read, _mistral_write, _qwen3_read, _qwen3_write
from .shared import _LLAMA_LIKE, _LLAMA_NAMES, _MOE, _moe_read, _moe_write


def _mixtral_read(c):
    return {**_mistral_read(c), **_moe_read(c, c.num_local_experts, c.intermediate_size, router_norm_topk=True)}


def _mixtral_write(cfg):
    return {**_mistral_write(cfg), **_moe_write(cfg), 'num_local_experts': cfg.n_expert,
            'intermediate_size': cfg.expert_hidden}


def _qwen3_moe_read(c):
    dense = list(getattr(c, 'mlp_only_layers', None) or [])
    if c.decoder_sparse_step != 1 or dense != list(range(len(dense))):
        raise ValueError(f"dense layers other than the first ones (decoder_sparse_step={c.decoder_sparse_step}, "
                         f"mlp_only_layers={dense}) are not supported")
    return {**_qwen3_read(c), **_moe_read(c, c.num_experts, c.moe_intermediate_size,
                                          router_norm_topk=bool(c.norm_topk_prob), first_dense_layers=len(dense))}


def _qwen3_moe_write(cfg):
    return {**_qwen3_write(cfg), **_moe_write(cfg), 'num_experts': cfg.n_expert, 'moe_intermediate_size': cfg.expert_hidden,
            'norm_topk_prob': cfg.router_norm_topk, 'decoder_sparse_step': 1,
            'mlp_only_layers': list(range(cfg.first_dense_layers))}


HF_FAMILIES['mixtral'] = HFFamily('mixtral', 'MixtralForCausalLM',
                                  {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'mlp': ('moe',), 'sliding_window': ANY},
                                  _LLAMA_NAMES, _mixtral_read, _mixtral_write)
HF_FAMILIES['qwen3_moe'] = HFFamily('qwen3_moe', 'Qwen3MoeForCausalLM',
                                    {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'qk_norm': (True,), 'mlp': ('moe',),
                                     'sliding_window': ANY, 'router_norm_topk': ANY, 'first_dense_layers': ANY},
                                    _LLAMA_NAMES, _qwen3_moe_read, _qwen3_moe_write)
