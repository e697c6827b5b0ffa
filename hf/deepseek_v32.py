"""DeepSeek-V3.2 and GLM-5 (glm_moe_dsa): DeepSeek-V3's block with a lightning indexer (DeepSeek Sparse
Attention, index_topk); GLM-5's layers may share an earlier indexer's top-k."""

from types import SimpleNamespace

from .deepseek import _DEEPSEEK_NAMES, _deepseek_read, _deepseek_write, _rope_rows
from .engine import _TRANSFORMS, ANY, HF_FAMILIES, HFFamily
from .shared import _dense_first, _tiling


# ----- DeepSeek-V3.2: DeepSeek-V3 with a lightning indexer in every layer (DeepSeek Sparse Attention, index_topk)

def _deepseek_v32_read(c):
    # DeepSeek-V3's config under V3.2's names: its experts are V3's (sigmoid router, groups)
    v3 = SimpleNamespace(**{**c.to_dict(), 'model_type': 'deepseek_v3', 'first_k_dense_replace': _dense_first(c)})
    return {**_deepseek_read(v3), 'index_topk': c.index_topk, 'index_n_heads': c.index_n_heads,
            'index_head_dim': c.index_head_dim}


def _deepseek_v32_write(cfg):
    return {**_deepseek_write(cfg), 'index_topk': cfg.index_topk, 'index_n_heads': cfg.index_n_heads,
            'index_head_dim': cfg.index_head_dim}


# the indexer's rotated dims are its first ones, turned in halves as ours (its attention's rotate pairs: rope_q)
_INDEXER_NAMES = [(f'transformer.h.{{i}}.attn.indexer.{ours}', f'model.layers.{{i}}.self_attn.indexer.{theirs}', None)
                  for ours, theirs in (('wq.weight', 'wq_b.weight'), ('wk.weight', 'wk.weight'),
                                       ('k_norm.weight', 'k_norm.weight'), ('k_norm.bias', 'k_norm.bias'),
                                       ('weights.weight', 'weights_proj.weight'))]
# what a model with indexers may hold: the stage that reads the top-k, and what only training reads
_DSA = {'index_topk': lambda v: v is not None, 'index_n_heads': ANY, 'index_head_dim': ANY,
        'index_stage': ('sparse',), 'index_loss_coef': ANY}
HF_FAMILIES['deepseek_v32'] = HFFamily(
    'deepseek_v32', 'DeepseekV32ForCausalLM',
    {**HF_FAMILIES['deepseek_v3'].carries, **_DSA, 'q_lora_rank': lambda v: bool(v)},
    _DEEPSEEK_NAMES + _INDEXER_NAMES, _deepseek_v32_read, _deepseek_v32_write)


# ----- GLM-5 (glm_moe_dsa): DeepSeek-V3.2's block, layers sharing an earlier indexer's top-k (IndexCache:
# index_share), the indexer's rotated dims in pairs as its attention's

def _glm_moe_dsa_read(c):
    shares = ['S' if t == 'shared' else 'F' for t in c.indexer_types[:c.num_hidden_layers]]
    return {**_deepseek_v32_read(c), 'index_share': _tiling(shares) if 'S' in shares else None}


def _glm_moe_dsa_write(cfg):
    return {**_deepseek_v32_write(cfg), 'indexer_types': ['shared' if s else 'full' for s in cfg.index_shares]}


def _index_q_rope_rows(config):
    return [h * config.index_head_dim for h in range(config.index_n_heads)]


_TRANSFORMS.update({  # the indexer's first rope_dim rows of each query head and of its key (and the key's norm)
    'rope_index_q': (lambda t, c: _rope_rows(t, c, _index_q_rope_rows, False),
                     lambda t, c: _rope_rows(t, c, _index_q_rope_rows, True)),
    'rope_index_k': (lambda t, c: _rope_rows(t, c, lambda config: [0], False),
                     lambda t, c: _rope_rows(t, c, lambda config: [0], True)),
})
_GLM_INDEXER_HOW = {'wq.weight': 'rope_index_q', 'wk.weight': 'rope_index_k', 'k_norm.weight': 'rope_index_k',
                    'k_norm.bias': 'rope_index_k'}
HF_FAMILIES['glm_moe_dsa'] = HFFamily(
    'glm_moe_dsa', 'GlmMoeDsaForCausalLM', {**HF_FAMILIES['deepseek_v32'].carries, 'index_share': ANY},
    _DEEPSEEK_NAMES + [(ours, theirs, _GLM_INDEXER_HOW.get(ours.split('indexer.')[1]))
                       for ours, theirs, _ in _INDEXER_NAMES],
    _glm_moe_dsa_read, _glm_moe_dsa_write)
