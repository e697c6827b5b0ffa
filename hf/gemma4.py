"""Gemma 4 (text): K/V sharing, K = V, global layers' own shapes and proportional RoPE, per-layer embeddings."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .gemma3 import _gemma_refusals
from .shared import _MOE, _SIZES, _decoder_names, _layer_types_read, _layer_types_write, _made_of, _tiling


def _gemma4_rope_read(c, kinds):
    """The full layers' base and proportional share, the sliding layers' base."""
    full, local = dict(c.rope_parameters['full_attention']), dict(c.rope_parameters['sliding_attention'])
    if full.get('rope_type', 'default') not in ('default', 'proportional') or full.get('factor', 1.0) != 1.0 or (
            full.get('rope_type', 'default') == 'default' and full.get('partial_rotary_factor', 1.0) != 1.0):
        raise ValueError(f"rope_parameters['full_attention'] {full} is not supported (only 'default', or "
                         f"'proportional' without a factor)")
    if local.get('rope_type', 'default') != 'default' or local.get('partial_rotary_factor', 1.0) != 1.0:
        raise ValueError(f"rope_parameters['sliding_attention'] {local} is not supported (only 'default')")
    flags = dict(pos='rope', rope_theta=float(full['rope_theta']))
    if 'L' in kinds:
        flags['rope_local_theta'] = float(local['rope_theta'])
    if full.get('rope_type') == 'proportional' and 'G' in kinds:
        flags['rope_proportion'] = float(full.get('partial_rotary_factor', 1.0))
    return flags


def _gemma4_text_read(c):
    _gemma_refusals(c, 'Gemma 4')
    if c.use_double_wide_mlp and c.num_kv_shared_layers:
        raise ValueError("Gemma 4 with use_double_wide_mlp is not supported (the K/V-sharing layers' MLPs twice as "
                         "wide as the others)")
    if c.hidden_size_per_layer_input and c.vocab_size_per_layer_input != c.vocab_size:
        raise ValueError(f"vocab_size_per_layer_input={c.vocab_size_per_layer_input} other than vocab_size="
                         f"{c.vocab_size} is not supported")
    kinds = _layer_types_read(c)
    # the heads' shapes are per layer: the model's are the local layers' (or, without any, the global ones')
    shapes = c.per_layer_config[kinds.index('L') if 'L' in kinds else 0]
    head_dim, n_kv_head = shapes.head_dim, shapes.num_key_value_heads
    flags = dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                 n_kv_head=n_kv_head, block_size=c.max_position_embeddings,
                 head_dim=None if head_dim == c.hidden_size // c.num_attention_heads else head_dim,
                 vocab_size=c.vocab_size, bias=False, norm='rms', norm_eps=c.rms_norm_eps,
                 norm_position='sandwich', mlp='geglu', ffn_hidden=c.intermediate_size,
                 tie_embeddings=bool(c.tie_word_embeddings), embed_scale=True, qk_norm=True, v_norm=True,
                 attn_scale=1.0, logit_softcap=c.final_logit_softcapping, layers=_tiling(kinds),
                 sliding_window=c.sliding_window if 'L' in kinds else None, layer_scalar=True,
                 attn_k_eq_v=bool(c.attention_k_eq_v) and 'G' in kinds, kv_shared_layers=c.num_kv_shared_layers,
                 per_layer_embd=c.hidden_size_per_layer_input or 0, **_gemma4_rope_read(c, kinds))
    if c.enable_moe_block:  # experts beside the dense MLP in every layer
        flags.update(mlp='moe', n_expert=c.num_experts, n_expert_active=c.top_k_experts,
                     moe_hidden=c.moe_intermediate_size, moe_dense_mlp=True, moe_activation='gelu')
    if 'G' in kinds:  # the global layers' shapes where they differ
        full = c.per_layer_config[kinds.index('G')]
        flags['global_head_dim'] = None if full.head_dim == head_dim else full.head_dim
        flags['global_n_kv_head'] = None if full.num_key_value_heads == n_kv_head else full.num_key_value_heads
    return flags


def _gemma4_text_write(cfg):
    # transformers gives the global layers their own K/V heads only with attention_k_eq_v
    if cfg.global_n_kv_head is not None and not cfg.attn_k_eq_v:
        raise ValueError(f"gemma4_text carries global_n_kv_head={cfg.global_n_kv_head} only with attn_k_eq_v=True")
    moe = cfg.mlp == 'moe'
    if moe and not (cfg.moe_dense_mlp and cfg.moe_activation == 'gelu'):
        raise ValueError(f"gemma4_text's experts sit beside a dense GEGLU MLP: mlp='moe' needs moe_dense_mlp=True and "
                         f"moe_activation='gelu', got {cfg.moe_dense_mlp}, {cfg.moe_activation!r}")
    experts = dict(num_experts=cfg.n_expert, top_k_experts=cfg.n_expert_active,
                   moe_intermediate_size=cfg.expert_hidden) if moe else {}
    full = {'rope_type': 'default', 'rope_theta': cfg.rope_theta}
    local = {'rope_type': 'default', 'rope_theta': cfg.rope_local_theta or cfg.rope_theta}
    if cfg.rope_proportion is not None:
        full = {'rope_type': 'proportional', 'partial_rotary_factor': cfg.rope_proportion, 'rope_theta': cfg.rope_theta}
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_width,
                num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
                head_dim=cfg.head_size, global_head_dim=cfg.global_head_dim or cfg.head_size,
                num_global_key_value_heads=cfg.global_n_kv_head, rms_norm_eps=cfg.norm_eps,
                hidden_activation='gelu_pytorch_tanh', attention_dropout=cfg.dropout,
                tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.block_size,
                final_logit_softcapping=cfg.logit_softcap, layer_types=_layer_types_write(cfg),
                sliding_window=cfg.sliding_window or cfg.block_size, attention_bias=False,
                attention_k_eq_v=cfg.attn_k_eq_v, num_kv_shared_layers=cfg.kv_shared_layers,
                hidden_size_per_layer_input=cfg.per_layer_embd, vocab_size_per_layer_input=cfg.vocab_size,
                enable_moe_block=moe, **experts,
                rope_parameters={'full_attention': full, 'sliding_attention': local})


def _gemma4_unpack(hf_state, cfg):
    """A layer that shares K/V has a q_proj alone, one with K = V no v_proj: their missing K/V projections as empty
    tensors (no rows), so every layer's c_attn is the rows of its q, k and v."""
    out = dict(hf_state)
    for i in range(cfg.n_layer):
        q = out.get(f'model.layers.{i}.self_attn.q_proj.weight')
        for name in (f'model.layers.{i}.self_attn.{n}_proj.weight' for n in 'kv'):
            if q is not None and name not in out:
                out[name] = q.new_zeros(0, q.size(1))
    return out


def _gemma4_pack(hf_state, cfg):
    return {k: v for k, v in hf_state.items() if v.numel() or not k.endswith(('k_proj.weight', 'v_proj.weight'))}


_GEMMA4_LAYER = 'model.layers.{i}.'
_GEMMA4_NAMES = _decoder_names([('ln_1', 'input_layernorm'), ('ln_1_out', 'post_attention_layernorm'),
                                ('ln_2', 'pre_feedforward_layernorm'), ('ln_2_out', 'post_feedforward_layernorm')]) + [
    ('transformer.h.{i}.layer_scalar', _GEMMA4_LAYER + 'layer_scalar', None),
    ('transformer.h.{i}.per_layer.c_fc.weight', _GEMMA4_LAYER + 'per_layer_input_gate.weight', None),
    ('transformer.h.{i}.per_layer.c_proj.weight', _GEMMA4_LAYER + 'per_layer_projection.weight', None),
    ('transformer.h.{i}.per_layer.ln.weight', _GEMMA4_LAYER + 'post_per_layer_input_norm.weight', None),
    ('transformer.wte_per_layer.weight', 'model.embed_tokens_per_layer.weight', None),
    ('transformer.per_layer_proj.weight', 'model.per_layer_model_projection.weight', None),
    ('transformer.per_layer_norm.weight', 'model.per_layer_projection_norm.weight', None),
    # the MoE block: the dense MLP beside the experts, each branch's norms, the router
    ('transformer.h.{i}.mlp.ln.weight', _GEMMA4_LAYER + 'pre_feedforward_layernorm.weight', None),
    ('transformer.h.{i}.mlp.dense.c_fc.weight', tuple(f'{_GEMMA4_LAYER}mlp.{n}_proj.weight' for n in ('gate', 'up')),
     None),
    ('transformer.h.{i}.mlp.dense.c_proj.weight', _GEMMA4_LAYER + 'mlp.down_proj.weight', None),
    ('transformer.h.{i}.mlp.ln_dense_out.weight', _GEMMA4_LAYER + 'post_feedforward_layernorm_1.weight', None),
    ('transformer.h.{i}.mlp.ln_experts.weight', _GEMMA4_LAYER + 'pre_feedforward_layernorm_2.weight', None),
    ('transformer.h.{i}.mlp.ln_experts_out.weight', _GEMMA4_LAYER + 'post_feedforward_layernorm_2.weight', None),
    ('transformer.h.{i}.mlp.router.weight', _GEMMA4_LAYER + 'router.proj.weight', None),
    ('transformer.h.{i}.mlp.router_scale', _GEMMA4_LAYER + 'router.scale', None),
    ('transformer.h.{i}.mlp.expert_scale', _GEMMA4_LAYER + 'router.per_expert_scale', None),
    ('transformer.h.{i}.mlp.experts.c_fc', _GEMMA4_LAYER + 'experts.gate_up_proj', None),
    ('transformer.h.{i}.mlp.experts.c_proj', _GEMMA4_LAYER + 'experts.down_proj', None),
]
HF_FAMILIES['gemma4_text'] = HFFamily(
    'gemma4_text', 'Gemma4ForCausalLM',
    {**_SIZES, **_MOE, 'rope_theta': ANY, 'norm': ('rms',), 'mlp': ('geglu', 'moe'), 'moe_dense_mlp': ANY,
     'moe_activation': ANY, 'pos': ('rope',), 'n_kv_head': ANY,
     'head_dim': ANY, 'bias': (False,), 'norm_position': ('sandwich',), 'embed_scale': (True,), 'qk_norm': (True,),
     'v_norm': (True,), 'attn_scale': (1.0,), 'logit_softcap': ANY, 'layers': _made_of('LG'), 'sliding_window': ANY,
     'rope_local_theta': ANY, 'layer_scalar': (True,),
     **{k: ANY for k in ('rope_proportion', 'global_head_dim', 'global_n_kv_head', 'attn_k_eq_v', 'kv_shared_layers',
                         'per_layer_embd')}},
    _GEMMA4_NAMES, _gemma4_text_read, _gemma4_text_write, _gemma4_unpack, _gemma4_pack)
