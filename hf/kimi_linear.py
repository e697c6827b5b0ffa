"""Kimi Linear: Kimi Delta Attention layers ('K') and MLA without positions ('G', pos='none'), DeepSeek-V3's MoE."""

from .deepseek import _DEEPSEEK_NAMES
from .engine import _TRANSFORMS, ANY, HF_FAMILIES, HFFamily
from .shared import _MOE, _SIZES, _dense_first, _made_of, _tiling


_KIMI_LAYER_TYPES = {'linear_attention': 'K', 'full_attention': 'G'}


def _kimi_linear_read(c):
    if c.hidden_act != 'silu' or getattr(c, 'attention_bias', False):
        raise ValueError("Kimi Linear checkpoints with attention_bias or an activation other than silu are not supported")
    n = c.num_hidden_layers
    unknown = set(c.layer_types[:n]) - set(_KIMI_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only "
                         f"{', '.join(map(repr, _KIMI_LAYER_TYPES))})")
    kinds = [_KIMI_LAYER_TYPES[t] for t in c.layer_types[:n]]
    flags = dict(n_layer=n, n_head=c.num_attention_heads, n_embd=c.hidden_size, block_size=c.max_position_embeddings,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.rms_norm_eps, mlp='swiglu',
                 ffn_hidden=c.intermediate_size, tie_embeddings=bool(c.tie_word_embeddings), pos='none', attn='mla',
                 kv_lora_rank=c.kv_lora_rank, q_lora_rank=c.q_lora_rank or None, qk_nope_head_dim=c.qk_nope_head_dim,
                 qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim, layers=_tiling(kinds))
    if 'K' in kinds:
        flags.update(linear_n_key_head=c.linear_num_heads, linear_key_dim=c.linear_head_dim,
                     linear_value_dim=c.linear_head_dim, linear_conv_kernel=c.linear_conv_kernel_dim)
    first_sparse = _dense_first(c)
    if first_sparse < n:
        groups = c.num_expert_group or 1
        flags.update(mlp='moe', n_expert=c.num_experts, n_expert_active=c.num_experts_per_token,
                     moe_hidden=c.moe_intermediate_size, n_shared_expert=c.num_shared_experts, router='sigmoid',
                     router_norm_topk=bool(c.moe_renormalize), n_expert_group=groups,
                     topk_group=(c.topk_group or 1) if groups > 1 else 1, routed_scaling=float(c.routed_scaling_factor),
                     first_dense_layers=first_sparse)
    return flags


def _kimi_linear_write(cfg):
    dims, linear, moe = cfg.mla_dims, cfg.linear_dims, cfg.mlp == 'moe'
    if linear['k_dim'] != linear['v_dim']:
        raise ValueError(f"kimi_linear has one head width for keys and values: linear_key_dim ({linear['k_dim']}) "
                         f"!= linear_value_dim ({linear['v_dim']})")
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_width,
                num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
                rms_norm_eps=cfg.norm_eps, hidden_act='silu', attention_dropout=cfg.dropout, attention_bias=False,
                tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.block_size,
                kv_lora_rank=dims['latent'], q_lora_rank=dims['q_latent'] or None, qk_nope_head_dim=dims['nope'],
                qk_rope_head_dim=dims['rope'], v_head_dim=dims['v'],
                layer_types=[{'K': 'linear_attention', 'G': 'full_attention'}[k] for k in cfg.layer_kinds],
                linear_num_heads=linear['k_heads'], linear_head_dim=linear['k_dim'],
                linear_conv_kernel_dim=cfg.linear_conv_kernel,
                mlp_layer_types=['sparse' if moe and i >= cfg.first_dense_layers else 'dense' for i in range(cfg.n_layer)],
                num_local_experts=cfg.n_expert, num_experts_per_tok=cfg.n_expert_active,
                moe_intermediate_size=cfg.expert_hidden, n_shared_experts=cfg.n_shared_expert,
                routed_scaling_factor=float(cfg.routed_scaling), n_group=cfg.n_expert_group, topk_group=cfg.topk_group,
                norm_topk_prob=cfg.router_norm_topk, pad_token_id=None)  # its default is past a smaller vocabulary


_TRANSFORMS['A_log (1, 1, H, 1)'] = (lambda t, c: t.reshape(-1), lambda t, c: t.view(1, 1, -1, 1))
_KIMI_LINEAR_NAMES = [(ours, hf, None) for ours, hf, _ in _DEEPSEEK_NAMES] + [  # nothing rotates: rows as they are
    ('transformer.h.{i}.attn.in_proj_qkv.weight', tuple(f'model.layers.{{i}}.self_attn.{n}_proj.weight' for n in 'qkv'),
     None),
    *[(f'transformer.h.{{i}}.attn.{ours}', f'model.layers.{{i}}.self_attn.{hf}', how) for ours, hf, how in (
        ('conv1d.weight', 'conv1d.weight', None), ('in_proj_b.weight', 'b_proj.weight', None),
        ('decay_a.weight', 'forget_gate.f_a_proj.weight', None), ('decay_b.weight', 'forget_gate.f_b_proj.weight', None),
        ('dt_bias', 'forget_gate.dt_bias', None), ('A_log', 'forget_gate.A_log', 'A_log (1, 1, H, 1)'),
        ('gate_a.weight', 'g_a_proj.weight', None), ('gate_b.weight', 'g_b_proj.weight', None),
        ('norm', 'o_norm.weight', None))],
]
HF_FAMILIES['kimi_linear'] = HFFamily(
    'kimi_linear', 'KimiLinearForCausalLM',
    {**_SIZES, **_MOE, 'norm': ('rms',), 'bias': (False,), 'pos': ('none',), 'attn': ('mla',), 'layers': _made_of('KG'),
     'mlp': ('swiglu', 'moe'), 'router': ('sigmoid',), 'router_norm_topk': ANY, 'n_shared_expert': lambda v: v >= 1,
     'n_expert_group': ANY, 'topk_group': ANY, 'routed_scaling': ANY, 'first_dense_layers': ANY,
     'moe_bias_update_rate': ANY,
     **{k: ANY for k in ('kv_lora_rank', 'q_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim',
                         'linear_n_key_head', 'linear_key_dim', 'linear_value_dim', 'linear_conv_kernel',
                         'linear_chunk_size')}},
    _KIMI_LINEAR_NAMES, _kimi_linear_read, _kimi_linear_write)
