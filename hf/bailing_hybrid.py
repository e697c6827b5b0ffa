"""BailingHybrid (Ling 3): Kimi Delta Attention layers ('K') with full-rank decay and output-gate projections
(kda_rank=0) and, by default, the safe gate (kda_lower_bound), every layer_group_size-th layer MLA with RoPE (its
rotated pairs reordered to our halves, as DeepSeek's) and a sigmoid gate per head on its output (mla_head_gate);
a dense SwiGLU on the first layers, then DeepSeek-V3's MoE. Its multi-token-prediction layers are not part of
transformers' model (nor of ours): a checkpoint's are left out of both."""

from .deepseek import _DEEPSEEK_NAMES
from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import _MOE, _ROPE, _SIZES, _dense_first, _llama_like_read, _llama_like_write, _made_of, _tiling

_LAYER_TYPES = {'linear_attention': 'K', 'full_attention': 'G'}


def _bailing_hybrid_read(c):
    if getattr(c, 'attention_bias', False):
        raise ValueError("bailing_hybrid checkpoints with attention_bias are not supported")
    n = c.num_hidden_layers
    unknown = set(c.layer_types[:n]) - set(_LAYER_TYPES)
    if unknown:
        raise ValueError(f"layer_types {sorted(unknown)} are not supported (only {', '.join(map(repr, _LAYER_TYPES))})")
    kinds = [_LAYER_TYPES[t] for t in c.layer_types[:n]]
    if 'G' in kinds and not c.qk_rope_head_dim:
        raise ValueError("qk_rope_head_dim=0 is not supported (bailing_hybrid's MLA layers rotate a shared key part)")
    # the Llama-style fields (silu checked, RoPE with its scaling read); MLA sets its own widths. lm_head is its
    # own matrix whatever tie_word_embeddings says: transformers ties nothing in this family
    flags = {**_llama_like_read(c), 'n_kv_head': None, 'head_dim': None, 'tie_embeddings': False, 'attn': 'mla',
             'kv_lora_rank': c.kv_lora_rank, 'q_lora_rank': c.q_lora_rank or None,
             'qk_nope_head_dim': c.qk_nope_head_dim, 'qk_rope_head_dim': c.qk_rope_head_dim,
             'v_head_dim': c.v_head_dim, 'mla_head_gate': True, 'layers': _tiling(kinds)}
    if 'K' in kinds:
        flags.update(linear_n_key_head=c.linear_num_heads, linear_key_dim=c.linear_head_dim,
                     linear_value_dim=c.linear_head_dim, linear_conv_kernel=c.linear_conv_kernel_dim, kda_rank=0,
                     kda_lower_bound=float(c.kda_lower_bound) if c.kda_safe_gate else None)
    first_sparse = _dense_first(c)
    if first_sparse < n:
        if not c.n_shared_experts:
            raise ValueError("n_shared_experts=0 is not supported (bailing_hybrid's MoE layers have shared experts)")
        groups = c.n_group or 1
        flags.update(mlp='moe', n_expert=c.num_local_experts, n_expert_active=c.num_experts_per_tok,
                     moe_hidden=c.moe_intermediate_size, n_shared_expert=c.n_shared_experts, router='sigmoid',
                     router_norm_topk=bool(c.norm_topk_prob), n_expert_group=groups,
                     topk_group=(c.topk_group or 1) if groups > 1 else 1, routed_scaling=float(c.routed_scaling_factor),
                     first_dense_layers=first_sparse)
    return flags


def _bailing_hybrid_write(cfg):
    dims, linear, moe, kinds = cfg.mla_dims, cfg.linear_dims, cfg.mlp == 'moe', cfg.layer_kinds
    if 'K' in kinds:
        if linear['k_dim'] != linear['v_dim'] or linear['k_heads'] != linear['v_heads']:
            raise ValueError(f"bailing_hybrid has one head count and width for keys and values: linear_n_key_head "
                             f"{linear['k_heads']} / linear_n_value_head {linear['v_heads']}, linear_key_dim "
                             f"{linear['k_dim']} / linear_value_dim {linear['v_dim']}")
        if cfg.kda_rank != 0:
            raise ValueError(f"bailing_hybrid projects the 'K' layers' decay and output gate at full rank: "
                             f"kda_rank must be 0, got {cfg.kda_rank!r}")
    out = {**_llama_like_write(cfg), 'num_key_value_heads': cfg.n_head, 'attention_bias': False,
           'kv_lora_rank': dims['latent'], 'q_lora_rank': dims['q_latent'] or None, 'qk_nope_head_dim': dims['nope'],
           'qk_rope_head_dim': dims['rope'], 'v_head_dim': dims['v'],
           # the 'K' layers' heads: its config derives them from head_dim and num_attention_heads, then keeps these
           'head_dim': linear['k_dim'], 'linear_head_dim': linear['k_dim'], 'linear_num_heads': linear['k_heads'],
           'short_conv_kernel_size': cfg.linear_conv_kernel, 'linear_conv_kernel_dim': cfg.linear_conv_kernel,
           'kda_safe_gate': cfg.kda_lower_bound is not None,
           'kda_lower_bound': -5.0 if cfg.kda_lower_bound is None else float(cfg.kda_lower_bound),
           'layer_types': [{'K': 'linear_attention', 'G': 'full_attention'}[k] for k in kinds],
           'mlp_layer_types': ['sparse' if moe and i >= cfg.first_dense_layers else 'dense'
                               for i in range(cfg.n_layer)],
           'num_local_experts': cfg.n_expert, 'num_experts_per_tok': cfg.n_expert_active,
           'moe_intermediate_size': cfg.expert_hidden, 'n_shared_experts': cfg.n_shared_expert,
           'routed_scaling_factor': float(cfg.routed_scaling), 'n_group': cfg.n_expert_group,
           'topk_group': cfg.topk_group, 'norm_topk_prob': cfg.router_norm_topk, 'num_mtp_layers': 0,
           'tie_word_embeddings': False,  # transformers ties nothing in this family: lm_head goes as its own tensor
           'pad_token_id': None}  # its default is past a smaller vocabulary
    return out


_BAILING_HYBRID_NAMES = _DEEPSEEK_NAMES + [
    # the MLA layers' gate per head; the 'K' layers' g_proj is their output gate (gate_b), another shape
    ('transformer.h.{i}.attn.c_gate.weight', 'model.layers.{i}.self_attn.g_proj.weight', None),
    ('transformer.h.{i}.attn.in_proj_qkv.weight', tuple(f'model.layers.{{i}}.self_attn.{n}_proj.weight' for n in 'qkv'),
     None),
    *[(f'transformer.h.{{i}}.attn.{ours}', f'model.layers.{{i}}.self_attn.{hf}', None) for ours, hf in (
        ('conv1d.weight', 'conv1d.weight'), ('in_proj_b.weight', 'b_proj.weight'),
        ('decay_b.weight', 'forget_gate.f_proj.weight'), ('dt_bias', 'forget_gate.dt_bias'),
        ('A_log', 'forget_gate.A_log'), ('gate_b.weight', 'g_proj.weight'), ('norm', 'o_norm.weight'))],
]
HF_FAMILIES['bailing_hybrid'] = HFFamily(
    'bailing_hybrid', 'BailingHybridForCausalLM',
    {**_SIZES, **_ROPE, **_MOE, 'norm': ('rms',), 'bias': (False,), 'pos': ('rope',), 'attn': ('mla',),
     'layers': _made_of('KG'), 'mlp': ('swiglu', 'moe'), 'mla_head_gate': (True,), 'kda_rank': (0, None),
     'kda_lower_bound': ANY, 'router': ('sigmoid',), 'router_norm_topk': ANY, 'n_shared_expert': lambda v: v >= 1,
     'n_expert_group': ANY, 'topk_group': ANY, 'routed_scaling': ANY, 'first_dense_layers': ANY,
     'moe_bias_update_rate': ANY,
     **{k: ANY for k in ('kv_lora_rank', 'q_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim',
                         'linear_n_key_head', 'linear_n_value_head', 'linear_key_dim', 'linear_value_dim',
                         'linear_conv_kernel', 'linear_chunk_size')}},
    _BAILING_HYBRID_NAMES, _bailing_hybrid_read, _bailing_hybrid_write)
