"""MiniMax-M3 (minimax_m3_vl), its text model: MiniMaxM3VLForCausalLM, transformers' causal LM over the text model
alone (model_type minimax_m3_vl_text; the vision tower is the vision-language class's, not this one's). GQA with
per-head QK-norm and partial RoPE, Gemma's (1 + w) norm gains everywhere (converted); dense layers
('full_attention') beside sparse ones ('minimax_m3_sparse': index_dense_layers) whose lightning indexer picks
blocks (index_block_size, index_block_pool='max', the most recent index_local_blocks always read, the unfinished
block scored: index_tail='score'), its scores each head's plain dot product of RMS-normed queries and keys, each
head picking for its K/V group (index_score='dot_per_group'); the first layers of mlp_layer_types dense, the rest
DeepSeek-V3's sigmoid router with the balancing bias (no groups), routed_scaling and shared experts; gpt-oss's
clamped SwiGLU on every MLP, dense and shared included (swiglu_form='gpt-oss_all').

transformers builds the RoPE from rope_parameters (partial_rotary_factor) and ignores the config's rotary_dim, as
we do on import; export writes both, in agreement."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import (_LLAMA_LIKE, _MOE, _decoder_names, _dense_first, _llama_like_read, _llama_like_write, _moe_read,
                     _moe_write, _rope_write, _tiling)

_ATTENTION_TYPES = {'full_attention': 'D', 'minimax_m3_sparse': 'I'}  # our index_dense_layers' letters


def _mlp_read(c):
    """The MLP flags: the dense first layers, the experts, the shared experts as a multiple of an expert's width."""
    if c.swiglu_alpha != 1.702:
        raise ValueError(f"swiglu_alpha={c.swiglu_alpha} is not supported (gpt-oss's clamped SwiGLU uses 1.702)")
    dense = _dense_first(c)
    if dense == c.num_hidden_layers:
        raise ValueError("minimax_m3_vl without MoE layers is not supported (its clamped SwiGLU is an MoE model's "
                         "flag)")
    shared, width = c.shared_intermediate_size, c.intermediate_size
    if not shared or shared % width:
        raise ValueError(f"shared_intermediate_size={shared} is not supported (a multiple >= 1 of the experts' "
                         f"intermediate_size={width}: that many shared experts)")
    flags = _moe_read(c, c.num_local_experts, width, router_norm_topk=True)
    flags.update(router='sigmoid', n_shared_expert=shared // width, routed_scaling=float(c.routed_scaling_factor),
                 first_dense_layers=dense, ffn_hidden=c.dense_intermediate_size, swiglu_limit=float(c.swiglu_limit),
                 swiglu_form='gpt-oss_all')
    return flags


def _indexer_read(c):
    """The sparse layers' indexer flags (none when every layer is dense)."""
    types = c.layer_types[:c.num_hidden_layers]
    unknown = set(types) - set(_ATTENTION_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only "
                         f"{', '.join(map(repr, _ATTENTION_TYPES))})")
    if 'minimax_m3_sparse' not in types:
        return {}
    if c.index_n_heads != c.num_key_value_heads:
        raise ValueError(f"index_n_heads={c.index_n_heads} with num_key_value_heads={c.num_key_value_heads} is not "
                         f"supported (one indexer head per K/V group: they must be equal)")
    pattern = _tiling([_ATTENTION_TYPES[t] for t in types])
    return dict(index_topk=c.index_topk_blocks * c.index_block_size, index_block_size=c.index_block_size,
                index_local_blocks=c.index_local_blocks, index_n_heads=c.index_n_heads,
                index_head_dim=c.index_head_dim, index_norm_eps=float(c.rms_norm_eps), index_score='dot_per_group',
                index_dense_layers=None if pattern == 'I' else pattern)


def _minimax_m3_read(c):
    return {**_llama_like_read(c, partial=True), 'qk_norm': True, **_mlp_read(c), **_indexer_read(c)}


def _minimax_m3_write(cfg):
    indexed = cfg.index_topk is not None
    if indexed and cfg.index_score != 'dot_per_group':
        raise ValueError(f"minimax_m3_vl's indexer scores per K/V group: index_score={cfg.index_score!r} needs "
                         f"'dot_per_group'")
    if indexed and cfg.index_block_size is None:
        raise ValueError("minimax_m3_vl's indexer picks blocks of keys: set index_block_size")
    if indexed and cfg.index_norm_eps != cfg.norm_eps:  # transformers' indexer norms take rms_norm_eps
        raise ValueError(f"minimax_m3_vl's indexer normalizes with the model's rms_norm_eps: index_norm_eps="
                         f"{cfg.index_norm_eps} must equal norm_eps={cfg.norm_eps}")
    n, block = cfg.n_layer, cfg.index_block_size or 1
    sparse = [indexed and not dense for dense in cfg.index_dense]
    return {**_llama_like_write(cfg), **_rope_write(cfg, partial=True), **_moe_write(cfg),
            'intermediate_size': cfg.expert_hidden, 'dense_intermediate_size': cfg.mlp_width,
            'shared_intermediate_size': cfg.n_shared_expert * cfg.expert_hidden, 'num_local_experts': cfg.n_expert,
            'routed_scaling_factor': float(cfg.routed_scaling), 'swiglu_limit': float(cfg.swiglu_limit),
            'swiglu_alpha': 1.702, 'rotary_dim': cfg.rope_dim,
            'mlp_layer_types': ['dense' if i < cfg.first_dense_layers else 'sparse' for i in range(n)],
            'layer_types': ['minimax_m3_sparse' if s else 'full_attention' for s in sparse],
            'index_n_heads': cfg.index_n_heads, 'index_head_dim': cfg.index_head_dim, 'index_block_size': block,
            'index_topk_blocks': (cfg.index_topk or block) // block, 'index_local_blocks': cfg.index_local_blocks,
            'bos_token_id': None, 'eos_token_id': None}  # its defaults are past a smaller vocabulary


_LAYER = 'model.layers.{i}.'
# Llama's embeddings, attention and per-head QK-norm, every norm's (1 + w) converted; its MLP rows are others'
_MINIMAX_M3_NAMES = [row for row in _decoder_names([('ln_1', 'input_layernorm'),
                                                    ('ln_2', 'post_attention_layernorm')], '1+w')
                     if '.mlp.' not in row[0]] + [
    # the indexer of the sparse layers
    ('transformer.h.{i}.attn.indexer.wq.weight', _LAYER + 'self_attn.indexer.q_proj.weight', None),
    ('transformer.h.{i}.attn.indexer.wk.weight', _LAYER + 'self_attn.indexer.k_proj.weight', None),
    ('transformer.h.{i}.attn.indexer.q_norm.weight', _LAYER + 'self_attn.indexer.q_norm.weight', '1+w'),
    ('transformer.h.{i}.attn.indexer.k_norm.weight', _LAYER + 'self_attn.indexer.k_norm.weight', '1+w'),
    # the dense MLP and the shared experts keep [gate | up] in one matrix, as ours
    ('transformer.h.{i}.mlp.c_fc.weight', _LAYER + 'mlp.gate_up_proj.weight', None),
    ('transformer.h.{i}.mlp.c_proj.weight', _LAYER + 'mlp.down_proj.weight', None),
    *[(f'transformer.h.{{i}}.mlp.{ours}', f'{_LAYER}mlp.{theirs}', None) for ours, theirs in (
        ('router.weight', 'gate.weight'), ('expert_bias', 'gate.e_score_correction_bias'),
        ('experts.c_fc', 'experts.gate_up_proj'), ('experts.c_proj', 'experts.down_proj'),
        ('shared.c_fc.weight', 'shared_experts.gate_up_proj.weight'),
        ('shared.c_proj.weight', 'shared_experts.down_proj.weight'))],
]

HF_FAMILIES['minimax_m3_vl_text'] = HFFamily(
    'minimax_m3_vl_text', 'MiniMaxM3VLForCausalLM',
    {**_LLAMA_LIKE, **_MOE, 'bias': (False,), 'qk_norm': (True,), 'rope_fraction': ANY, 'mlp': ('moe',),
     'router': ('sigmoid',), 'router_norm_topk': (True,), 'n_shared_expert': lambda v: v >= 1, 'routed_scaling': ANY,
     'first_dense_layers': ANY, 'moe_bias_update_rate': ANY, 'swiglu_limit': lambda v: v is not None,
     'swiglu_form': ('gpt-oss_all',),
     # the indexer (index_score and index_block_size: export checks them where there is one)
     'index_topk': ANY, 'index_n_heads': ANY, 'index_head_dim': ANY, 'index_stage': ('sparse',), 'index_loss_coef': ANY,
     'index_norm_eps': ANY, 'index_score': ANY, 'index_dense_layers': ANY, 'index_block_size': ANY,
     'index_local_blocks': ANY},
    _MINIMAX_M3_NAMES, _minimax_m3_read, _minimax_m3_write)
