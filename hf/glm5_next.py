"""GLM-5.3-Flash (glm5_next), its text model: Kimi Delta Attention layers ('K') with the safe gate
(kda_lower_bound) and MLA without positions ('G', pos='none', no rotated key part) whose lightning indexer picks
blocks (KPool: index_block_size, index_block_pool='learned', the unfinished block always read: index_tail='keep',
no block forced: index_local_blocks=0), layers sharing the previous layer's picks (index_share); a dense SwiGLU on
the first layers, then DeepSeek-V3's MoE, every SwiGLU clamped (swiglu_form='plain_all'); mHC on every layer,
the copies' last collapse their mean (hc_final='mean').

transformers has no causal-LM class for its text alone: its text generation class is the vision-language
Glm5NextForConditionalGeneration (lm_head over Glm5NextTextModel), so that is what is read and written. Import
takes its text model and lm_head and leaves the vision tower out; export writes the class with the smallest
vision tower its config allows, all zeros (a placeholder: the model reads no images)."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import _MOE, _SIZES, _dense_first, _made_of, _tiling

_LAYER_TYPES = {'linear_attention': 'K', 'indexed_attention': 'G'}
# the smallest vision tower Glm5NextVisionConfig builds, for export: nothing of it is ours
_PLACEHOLDER_VISION = dict(depth=1, hidden_size=8, num_heads=1, intermediate_size=8, out_hidden_size=8,
                           projection_intermediate_size=8, patch_size=2, image_size=4, spatial_merge_size=1,
                           temporal_patch_size=1)


def _text(c):
    """The text config: a Glm5NextConfig's text_config, or a Glm5NextTextConfig itself."""
    return c.text_config if getattr(c, 'text_config', None) is not None else c


def _index_share(t, kinds):
    """index_share from indexer_types: transformers hands a 'shared' layer the picks of the layer just before it,
    which must be an indexed layer with its own indexer; any other 'shared' layer it cannot run either."""
    shares = ['S' if kind == 'G' and t.indexer_types[i] == 'shared' else 'F' for i, kind in enumerate(kinds)]
    for i, s in enumerate(shares):
        if s == 'S' and (i == 0 or kinds[i - 1] != 'G' or shares[i - 1] != 'F'):
            raise ValueError(f"indexer_types marks layer {i} 'shared' but layer {i - 1} is no indexed layer with its "
                             f"own indexer (transformers reads the previous layer's picks): not supported")
    return _tiling(shares) if 'S' in shares else None


def _glm5_next_read(c):
    t = _text(c)
    n = t.num_hidden_layers
    if t.hidden_act != 'silu' or t.attention_bias:
        raise ValueError("glm5_next checkpoints with attention_bias or an activation other than silu are not supported")
    unknown = set(t.layer_types[:n]) - set(_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only {', '.join(map(repr, _LAYER_TYPES))})")
    if not t.index_kpool_always_select_tail and t.index_kpool > 1:
        raise ValueError("index_kpool_always_select_tail=False is not supported (pooled blocks always read the "
                         "unfinished last block: index_tail='keep')")
    if t.hc_mult < 2:
        raise ValueError(f"hc_mult={t.hc_mult} is not supported (hyper-connections of 2 copies or more)")
    dense = _dense_first(t)
    if dense == n:
        raise ValueError("glm5_next without MoE layers is not supported (its clamped SwiGLU is an MoE model's flag)")
    if not t.n_shared_experts:
        raise ValueError("n_shared_experts=0 is not supported (glm5_next's MoE layers have shared experts)")
    kinds = [_LAYER_TYPES[k] for k in t.layer_types[:n]]
    flags = dict(n_layer=n, n_head=t.num_attention_heads, n_embd=t.hidden_size, block_size=t.max_position_embeddings,
                 vocab_size=t.vocab_size, bias=False, norm='rms', norm_eps=t.rms_norm_eps, pos='none', attn='mla',
                 tie_embeddings=bool(c.tie_word_embeddings), ffn_hidden=t.intermediate_size, layers=_tiling(kinds),
                 kv_lora_rank=t.kv_lora_rank, q_lora_rank=t.q_lora_rank, qk_nope_head_dim=t.qk_nope_head_dim,
                 qk_rope_head_dim=0, v_head_dim=t.v_head_dim,
                 mla_norm_eps=None if t.rms_norm_eps == 1e-6 else float(t.rms_norm_eps),  # its latents' norms too
                 hc_mult=t.hc_mult, hc_kind='mhc', hc_sinkhorn_iters=t.hc_sinkhorn_iters, hc_eps=float(t.hc_eps),
                 hc_final='mean',
                 mlp='moe', n_expert=t.n_routed_experts, n_expert_active=t.num_experts_per_tok,
                 moe_hidden=t.moe_intermediate_size, n_shared_expert=t.n_shared_experts, router='sigmoid',
                 router_norm_topk=bool(t.norm_topk_prob), n_expert_group=t.n_group or 1,
                 topk_group=(t.topk_group or 1) if (t.n_group or 1) > 1 else 1,
                 routed_scaling=float(t.routed_scaling_factor), first_dense_layers=dense,
                 swiglu_limit=float(t.swiglu_limit), swiglu_form='plain_all')
    if 'G' in kinds:
        flags.update(index_topk=t.index_topk, index_n_heads=t.index_n_heads, index_head_dim=t.index_head_dim,
                     index_block_size=t.index_kpool, index_block_pool='learned', index_local_blocks=0,
                     index_tail='keep', index_share=_index_share(t, kinds))
    if 'K' in kinds:
        bound = t.linear_lower_bound
        flags.update(linear_n_key_head=t.linear_num_heads, linear_key_dim=t.linear_head_dim,
                     linear_value_dim=t.linear_head_dim, linear_conv_kernel=t.linear_conv_kernel_dim,
                     kda_lower_bound=None if bound is None else float(bound))
    return flags


def _glm5_next_write(cfg):
    dims, linear, kinds = cfg.mla_dims, cfg.linear_dims, cfg.layer_kinds
    if 'K' in kinds and (linear['k_dim'] != linear['v_dim'] or linear['k_heads'] != linear['v_heads']):
        raise ValueError(f"glm5_next has one head count and width for keys and values: linear_n_key_head "
                         f"{linear['k_heads']} / linear_n_value_head {linear['v_heads']}, linear_key_dim "
                         f"{linear['k_dim']} / linear_value_dim {linear['v_dim']}")
    latent_eps = 1e-6 if cfg.mla_norm_eps is None else cfg.mla_norm_eps
    if latent_eps != cfg.norm_eps:
        raise ValueError(f"glm5_next normalizes MLA's latents with rms_norm_eps: mla_norm_eps={latent_eps} must equal "
                         f"norm_eps={cfg.norm_eps}")
    shares = cfg.index_shares if cfg.index_topk is not None else [False] * cfg.n_layer
    for i, s in enumerate(shares):
        if s and (kinds[i - 1] != 'G' or shares[i - 1]):
            raise ValueError(f"index_share={cfg.index_share!r}: layer {i} shares picks but layer {i - 1} is no 'G' "
                             f"layer with its own indexer (glm5_next hands a sharing layer the previous layer's)")
    block = cfg.index_block_size or 1
    text = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_width,
                num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
                rms_norm_eps=cfg.norm_eps, hidden_act='silu', attention_dropout=cfg.dropout, attention_bias=False,
                max_position_embeddings=cfg.block_size, tie_word_embeddings=cfg.tie_embeddings,
                kv_lora_rank=dims['latent'], q_lora_rank=dims['q_latent'], qk_nope_head_dim=dims['nope'],
                qk_rope_head_dim=0, v_head_dim=dims['v'],
                layer_types=[{'K': 'linear_attention', 'G': 'indexed_attention'}[k] for k in kinds],
                indexer_types=['shared' if s else 'full' for s in shares],
                index_topk=cfg.index_topk or block, index_n_heads=cfg.index_n_heads, index_head_dim=cfg.index_head_dim,
                index_kpool=block, index_kpool_always_select_tail=True,
                linear_num_heads=linear['k_heads'], linear_head_dim=linear['k_dim'],
                linear_conv_kernel_dim=cfg.linear_conv_kernel, linear_lower_bound=cfg.kda_lower_bound,
                hc_mult=cfg.hc_mult, hc_eps=cfg.hc_eps, hc_sinkhorn_iters=cfg.hc_sinkhorn_iters,
                mlp_layer_types=['dense' if i < cfg.first_dense_layers else 'sparse' for i in range(cfg.n_layer)],
                n_routed_experts=cfg.n_expert, num_experts_per_tok=cfg.n_expert_active,
                moe_intermediate_size=cfg.expert_hidden, n_shared_experts=cfg.n_shared_expert,
                routed_scaling_factor=float(cfg.routed_scaling), n_group=cfg.n_expert_group,
                topk_group=cfg.topk_group, norm_topk_prob=cfg.router_norm_topk,
                swiglu_limit=float(cfg.swiglu_limit), router_aux_loss_coef=cfg.moe_aux_loss_coef,
                pad_token_id=None)  # its default is past a smaller vocabulary
    return dict(text_config=text, vision_config=dict(_PLACEHOLDER_VISION), tie_word_embeddings=cfg.tie_embeddings)


_LAYER = 'model.language_model.layers.{i}.'
_GLM5_NEXT_NAMES = [
    ('transformer.wte.weight', 'model.language_model.embed_tokens.weight', None),
    ('transformer.ln_f.weight', 'model.language_model.norm.weight', None),
    ('lm_head.weight', 'lm_head.weight', None),
    ('transformer.h.{i}.ln_1.weight', _LAYER + 'input_layernorm.weight', None),
    ('transformer.h.{i}.ln_2.weight', _LAYER + 'post_attention_layernorm.weight', None),
    *[(f'transformer.h.{{i}}.residual.{hc}.{p}', f'{_LAYER}{hc}.{p}', None)
      for hc in ('attn_hc', 'ffn_hc') for p in ('fn', 'base', 'scale')],
    # MLA: nothing rotates, so its rows go as they are
    *[(f'transformer.h.{{i}}.attn.{ours}', f'{_LAYER}self_attn.{theirs}', None) for ours, theirs in (
        ('q_a.weight', 'q_a_proj.weight'), ('q_a_norm.weight', 'q_a_layernorm.weight'),
        ('q_b.weight', 'q_b_proj.weight'), ('kv_a.weight', 'kv_a_proj_with_mqa.weight'),
        ('kv_norm.weight', 'kv_a_layernorm.weight'), ('kv_b.weight', 'kv_b_proj.weight'),
        ('c_proj.weight', 'o_proj.weight'),
        # its indexer, KPool's gate and position term
        ('indexer.wq.weight', 'indexer.wq_b.weight'), ('indexer.wk.weight', 'indexer.wk.weight'),
        ('indexer.k_norm.weight', 'indexer.k_norm.weight'), ('indexer.k_norm.bias', 'indexer.k_norm.bias'),
        ('indexer.weights.weight', 'indexer.weights_proj.weight'),
        ('indexer.pool_gate.weight', 'indexer.index_kpool_compress_gate'),
        ('indexer.pool_pos', 'indexer.index_kpool_compress_ape'),
        # Kimi Delta Attention
        ('conv1d.weight', 'conv1d.weight'), ('in_proj_b.weight', 'b_proj.weight'),
        ('decay_a.weight', 'forget_gate.f_a_proj.weight'), ('decay_b.weight', 'forget_gate.f_b_proj.weight'),
        ('dt_bias', 'forget_gate.dt_bias'), ('A_log', 'forget_gate.A_log'),
        ('gate_a.weight', 'g_a_proj.weight'), ('gate_b.weight', 'g_b_proj.weight'), ('norm', 'o_norm.weight'))],
    ('transformer.h.{i}.attn.in_proj_qkv.weight', tuple(f'{_LAYER}self_attn.{n}_proj.weight' for n in 'qkv'), None),
    # the dense MLP, the MoE (experts stacked [gate | up] as ours), its shared experts
    ('transformer.h.{i}.mlp.c_fc.weight', (_LAYER + 'mlp.gate_proj.weight', _LAYER + 'mlp.up_proj.weight'), None),
    ('transformer.h.{i}.mlp.c_proj.weight', _LAYER + 'mlp.down_proj.weight', None),
    *[(f'transformer.h.{{i}}.mlp.{ours}', f'{_LAYER}mlp.{theirs}', None) for ours, theirs in (
        ('router.weight', 'gate.weight'), ('expert_bias', 'gate.e_score_correction_bias'),
        ('experts.c_fc', 'experts.gate_up_proj'), ('experts.c_proj', 'experts.down_proj'),
        ('shared.c_proj.weight', 'shared_experts.down_proj.weight'))],
    ('transformer.h.{i}.mlp.shared.c_fc.weight', (_LAYER + 'mlp.shared_experts.gate_proj.weight',
                                                  _LAYER + 'mlp.shared_experts.up_proj.weight'), None),
]
HF_FAMILIES['glm5_next'] = HFFamily(
    'glm5_next', 'Glm5NextForConditionalGeneration',
    {**_SIZES, **_MOE, 'norm': ('rms',), 'bias': (False,), 'pos': ('none',), 'attn': ('mla',),
     'layers': _made_of('KG'), 'mlp': ('moe',), 'router': ('sigmoid',), 'router_norm_topk': ANY,
     'n_shared_expert': lambda v: v >= 1, 'n_expert_group': ANY, 'topk_group': ANY, 'routed_scaling': ANY,
     'first_dense_layers': ANY, 'moe_bias_update_rate': ANY, 'swiglu_limit': lambda v: v is not None,
     'swiglu_form': ('plain_all',), 'kv_lora_rank': ANY, 'q_lora_rank': lambda v: bool(v),
     'qk_nope_head_dim': ANY, 'qk_rope_head_dim': (0,), 'v_head_dim': ANY,
     'mla_norm_eps': ANY,
     'index_topk': lambda v: v is not None, 'index_n_heads': ANY, 'index_head_dim': ANY, 'index_stage': ('sparse',),
     'index_loss_coef': ANY, 'index_share': ANY, 'index_block_size': lambda v: v is not None,
     'index_block_pool': ('learned',), 'index_local_blocks': (0,), 'index_tail': ('keep',),
     'linear_n_key_head': ANY, 'linear_n_value_head': ANY, 'linear_key_dim': ANY, 'linear_value_dim': ANY,
     'linear_conv_kernel': ANY, 'linear_chunk_size': ANY, 'kda_rank': (None,), 'kda_lower_bound': ANY,
     'hc_mult': lambda v: v >= 2, 'hc_kind': ('mhc',), 'hc_sinkhorn_iters': ANY, 'hc_eps': ANY, 'hc_final': ('mean',)},
    _GLM5_NEXT_NAMES, _glm5_next_read, _glm5_next_write,
    auto_class='AutoModelForImageTextToText', left_out=('model.visual.',))
