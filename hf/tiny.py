"""Tiny random Hugging Face checkpoints of every family we carry, the ones the parity tests (tests/test_hf_*.py)
build: to try import and export offline, without the Hub.

    python -m hf.tiny qwen3 tiny-qwen3      # then: python sample.py --init_from=tiny-qwen3 --start="Hello"

writes DIR with a tiny random model of FAMILY (a model_type of hf.HF_FAMILIES: python -m hf.tiny lists them) and a
character tokenizer of its 96 symbols (printable ASCII and the newline), so `sample.py --init_from=DIR` and
`GPT.from_pretrained(DIR)` load it with transformers' logits. Norm gains and biases are drawn away from 1 and 0, so
a wrong mapping of either shows."""

import os
import sys

import torch
import transformers

from hf import HF_FAMILIES
from hf.glm5_next import _PLACEHOLDER_VISION

VOCAB, BLOCK = 96, 64
WINDOW = 8  # a sliding window shorter than the tests' 40 positions
EOS = 5  # Qwen4-Exp's memories restart after it


def randomized(hf, seed):
    """Norm gains away from 1 and biases and buffers away from 0, so a wrong mapping of either shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(hf.named_parameters()) + list(hf.named_buffers()):
            if p.dim() == 1 and p.is_floating_point() and 'inv_freq' not in name:
                noise = torch.randn(p.shape, generator=g)
                p.copy_(0.1 * noise if name.endswith(('bias', 'correction_bias')) else 1.0 + 0.3 * noise)
    return hf.eval()


def tiny(config_class, **overrides):
    args = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=BLOCK, rms_norm_eps=1e-6, tie_word_embeddings=False,
                bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return config_class(**{**args, **overrides})


def randomized_experts(hf, seed):
    """randomized() and the experts' biases, which are (n_expert, width) and start at zero."""
    randomized(hf, seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith('_proj_bias'):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return hf


def deepseek(config_class, moe, **overrides):
    args = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=8,
                v_head_dim=6, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
                n_group=2, topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1 if moe else 2)
    return tiny(config_class, **{**args, **overrides})


def deepseek_v32(config_class=None, **overrides):
    """A tiny DeepSeek-V3.2: V3's MLA (a query bottleneck, which its indexer reads) and experts, and an indexer of
    16 heads keeping 6 tokens, well below the test's 40 positions. Built so that no two keys tie at the top-k's
    cut: there transformers keeps what torch.topk's kernel happens to leave, which changes with the row's length
    (its own logits at a position change when more tokens follow), and we the earliest keys. A key scores exactly
    0 when every head's ReLU is zero: with 8 heads some rows of bench.py's race (4 x 256) tied there, with 16 none.
    No pad token: transformers zeros its embedding row, which makes the first indexer's query zero and every key's
    score 0 (token 0 parted the race's tokens at 34 of 64)."""
    args = dict(q_lora_rank=16, index_topk=6, index_n_heads=16, index_head_dim=8, mlp_layer_types=None, n_group=2,
                topk_group=1, pad_token_id=None)
    return deepseek(config_class or transformers.DeepseekV32Config, True, **{**args, **overrides})


def qwen3_next(**overrides):
    """Qwen3-Next's shapes: head_dim 16 (not 32 / 4), a quarter of it rotated, two key heads of 8 for four value
    heads of 6 in the Gated DeltaNet layers."""
    args = dict(head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                linear_value_head_dim=6, linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
                layer_types=['linear_attention', 'linear_attention', 'full_attention'], num_hidden_layers=3,
                num_experts=0)
    return tiny(transformers.Qwen3NextConfig, **{**args, **overrides})


def qwen3_5_text(**overrides):
    """Qwen3.5's text config in qwen3_next's shapes (its own class has no MoE fields)."""
    config = qwen3_next(**overrides)
    return {k: v for k, v in config.to_dict().items() if k in transformers.Qwen3_5TextConfig.__dataclass_fields__
            or k == 'partial_rotary_factor'}


def kimi_linear(**overrides):
    """Kimi Linear's shapes: two Kimi Delta Attention layers (4 heads of 8) then MLA without positions, its shared
    key part of 4 dims unrotated; a dense first MLP then DeepSeek-V3's MoE (sigmoid router, groups, a shared
    expert, scaling)."""
    args = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
                linear_head_dim=8, linear_num_heads=4, linear_conv_kernel_dim=4, num_hidden_layers=3,
                layer_types=['linear_attention', 'linear_attention', 'full_attention'],
                mlp_layer_types=['dense', 'sparse', 'sparse'], num_local_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=16, n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5)
    return tiny(transformers.KimiLinearConfig, **{**args, **overrides})


def nemotron_h(**overrides):
    """Nemotron-H's layers, each one part: Mamba-2 ('linear_attention': 8 heads of 6, a state of 5, B and C in 2
    groups, chunks of 7 that do not divide the test's lengths), an MLP alone, attention without RoPE."""
    args = dict(layers_block_type=['linear_attention', 'mlp', 'linear_attention', 'full_attention', 'mlp'],
                num_hidden_layers=5, head_dim=16, mamba_num_heads=8, mamba_head_dim=6, ssm_state_size=5, n_groups=2,
                conv_kernel=4, chunk_size=7, layer_norm_epsilon=1e-6)
    return tiny(transformers.NemotronHConfig, **{**args, **overrides})


def gemma4_text(**overrides):
    """A tiny Gemma 4: local layers of 4 heads of 8 (2 K/V heads), global ones of 16 wide heads, K = V with 1 K/V head,
    proportional RoPE; the last 2 of 5 layers share K/V, per-layer embeddings 8 wide."""
    rope = {'sliding_attention': {'rope_type': 'default', 'rope_theta': 100.0},
            'full_attention': {'rope_type': 'proportional', 'partial_rotary_factor': 0.25, 'rope_theta': 10000.0}}
    args = dict(num_hidden_layers=5, head_dim=8, global_head_dim=16, num_global_key_value_heads=1,
                attention_k_eq_v=True, layer_types=['sliding_attention', 'full_attention'] * 2 + ['full_attention'],
                sliding_window=WINDOW, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0, rope_parameters=rope,
                initializer_range=0.2, tie_word_embeddings=True)
    return tiny(transformers.Gemma4TextConfig, **{**args, **overrides})


def deepseek_v4(**overrides):
    """A tiny DeepSeek-V4 of sliding layers: 4 query heads of 16 over one key-value head, half of each rotated
    (its last 8 dims, in pairs), a query bottleneck of 8, the output in 2 groups of 8, a window shorter than the
    test's 40 positions; 4 experts of 16, 2 a token, one shared expert, the SwiGLU clamped at 1 (so it acts);
    4 copies of the stream; the first layer's experts chosen by the token id (hash routing), the second's learned."""
    args = dict(intermediate_size=16, num_key_value_heads=1, head_dim=16, q_lora_rank=8, o_groups=2, o_lora_rank=8,
                sliding_window=WINDOW, partial_rotary_factor=0.5, layer_types=['sliding_attention'] * 2,
                mlp_layer_types=['hash_moe', 'moe'], n_routed_experts=4, num_experts_per_tok=2, swiglu_limit=1.0,
                routed_scaling_factor=1.5)
    return tiny(transformers.DeepseekV4Config, **{**args, **overrides})


def bailing_hybrid(**overrides):
    """Ling 3's shapes: two Kimi Delta Attention layers (4 heads of 8, full-rank decay and gate) then MLA with
    RoPE on a shared key part of 4 and a gate per head (layer_group_size 3); a dense first MLP then DeepSeek-V3's
    MoE (sigmoid router, groups, a shared expert, scaling). Weights drawn 5x wider than its init (0.1), so the
    logits are of order 1 and a part mapped wrong shows far beyond the tolerance."""
    args = dict(num_key_value_heads=4, head_dim=8, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4,
                qk_nope_head_dim=8, v_head_dim=6, short_conv_kernel_size=4, num_hidden_layers=3, layer_group_size=3,
                first_k_dense_replace=1, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, initializer_range=0.1)
    return tiny(transformers.BailingHybridConfig, **{**args, **overrides})


def glm5_next(**overrides):
    """GLM-5.3-Flash's shapes: Kimi Delta Attention (4 heads of 8, the safe gate) and MLA without positions (a
    query bottleneck) whose indexer picks 2 of the finished blocks of 4 keys (KPool, index_topk 8) beside the
    unfinished one; a dense first MLP then DeepSeek-V3's MoE; every SwiGLU clamped at 1, low enough to bite; mHC
    over 3 copies; rms_norm_eps its default, 1e-5 (MLA's latent norms take it too). Weights drawn 5x wider than its init, so the logits are of order 1."""
    args = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=8, qk_rope_head_dim=0, qk_nope_head_dim=8,
                v_head_dim=6, num_hidden_layers=4, mlp_layer_types=['dense', 'sparse', 'sparse', 'sparse'],
                layer_types=['linear_attention', 'indexed_attention', 'linear_attention', 'indexed_attention'],
                linear_head_dim=8, linear_num_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=16, n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                index_topk=8, index_kpool=4, index_n_heads=8, index_head_dim=8, hc_mult=3, swiglu_limit=1.0,
                rms_norm_eps=1e-5, initializer_range=0.1)
    text = tiny(transformers.Glm5NextTextConfig, **{**args, **overrides}).to_dict()
    return transformers.Glm5NextConfig(text_config=text, vision_config=dict(_PLACEHOLDER_VISION))


def qwen4_exp(**overrides):
    """Qwen4-Exp's shapes, tiny: Gated DeltaNet (2 key heads serving 4 value heads of 8) and gated attention (4
    heads of 8, half of each rotated) whose QSA indexer (16 heads of 16) reads 4 of the finished blocks of 2 keys
    beside the unfinished one; the MoE (4 experts, 2 a token, a gated shared expert) on every layer; 3 copies of
    the stream through a rank-8 gated residual; PLE n-gram memories (bigrams and trigrams, 2 heads each, prime
    tables from 101) on layers 1 and 3 (one-indexed: the first gates the copies as they are made); eos 5.
    Weights drawn 5x wider than its init, so the logits are of order 1. 16 indexer heads, so that no two blocks
    tie at a score of 0 (every head's ReLU'd dot negative): transformers' topk breaks such ties as torch's kernel
    happens to, ours the earliest first (with 4 heads a tie at the cut of 4 blocks showed, 0.05 apart)."""
    args = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, max_position_embeddings=BLOCK, rms_norm_eps=1e-6, tie_word_embeddings=False,
                bos_token_id=0, pad_token_id=0, eos_token_id=EOS, initializer_range=0.1,
                layer_types=['linear_attention', 'indexed_attention', 'linear_attention', 'indexed_attention'],
                rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 0.5},
                linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                shared_expert_intermediate_size=16, hc_count=3, hc_lowrank=8, ple_layer_ids=[1, 3], ple_embed_dim=16,
                ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=101, indexer_n_heads=16, indexer_kv_heads=1,
                indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=2)
    return transformers.Qwen4ExpTextConfig(**{**args, **overrides})



def qwen3_5_config():
    return transformers.Qwen3_5TextConfig(**qwen3_5_text(
        layer_types=['linear_attention', 'full_attention', 'linear_attention']))


# a family's config where the generic tiny() of its config class is not enough (its parity test's); the rest tiny()
CONFIGS = {
    'deepseek_v3': lambda: deepseek(transformers.DeepseekV3Config, True),
    'deepseek_v2': lambda: deepseek(transformers.DeepseekV2Config, True),
    'deepseek_v32': deepseek_v32, 'glm_moe_dsa': lambda: deepseek_v32(transformers.GlmMoeDsaConfig),
    'qwen3_next': qwen3_next, 'qwen3_5_text': qwen3_5_config, 'kimi_linear': kimi_linear, 'nemotron_h': nemotron_h,
    'gemma4_text': gemma4_text, 'deepseek_v4': deepseek_v4, 'bailing_hybrid': bailing_hybrid,
    'glm5_next': glm5_next, 'qwen4_exp_text': qwen4_exp,
}


# the widths a family's config gives in units of its hidden size (a tiny builder's choices, at most its 32):
# sized() scales them with the hidden size; a wider one is the config class's own full-size default, kept
WIDTHS = ('hidden_size', 'intermediate_size', 'moe_intermediate_size', 'shared_expert_intermediate_size', 'head_dim',
          'global_head_dim', 'kv_lora_rank', 'q_lora_rank', 'qk_rope_head_dim', 'qk_nope_head_dim', 'qk_head_dim',
          'v_head_dim', 'linear_key_head_dim', 'linear_value_head_dim', 'linear_head_dim', 'mamba_head_dim',
          'index_head_dim', 'indexer_head_dim', 'hidden_size_per_layer_input', 'ple_embed_dim', 'hc_lowrank',
          'o_lora_rank')


def _longer(values, n, mlp):
    """A per-layer list for n layers: layer indices 0..k-1 become 0..n-1, an MLP kind list keeps its last kind (the
    dense ones lead), any other (attention kinds) repeats its pattern."""
    if values == list(range(len(values))):
        return list(range(n))
    return values + values[-1:] * (n - len(values)) if mlp else [values[i % len(values)] for i in range(n)]


def sized(config, n_layer=None, n_embd=None, block=None):
    """config (as a family's tiny builder gives it) grown to n_layer layers (its per-layer lists lengthened) and a
    hidden size of n_embd (a multiple of 32: every width its builder chose scaled alike, so heads and ranks keep
    their ratios) and `block` positions; None keeps that size. A config with a text_config is sized there."""
    d = config.to_dict()
    text = d['text_config'] if isinstance(d.get('text_config'), dict) else d
    names = {k: config.attribute_map.get(k, k) for k in ('hidden_size', 'num_hidden_layers', 'max_position_embeddings')}
    base_layers = getattr(getattr(config, 'text_config', config), 'num_hidden_layers')  # Nemotron-H's: its pattern's
    if n_embd:
        hidden = text[names['hidden_size']]
        for key in WIDTHS:
            key = names.get(key, key)
            if isinstance(text.get(key), int) and 0 < text[key] <= hidden:
                text[key] = text[key] * n_embd // hidden
    if n_layer and n_layer > base_layers:
        for key, value in text.items():
            if isinstance(value, list) and len(value) == base_layers:
                text[key] = _longer(value, n_layer, 'mlp' in key)
        if names['num_hidden_layers'] in text:
            text[names['num_hidden_layers']] = n_layer
    if block:
        text[names['max_position_embeddings']] = block
    return type(config).from_dict(d)


def build(family, seed=0, n_layer=None, n_embd=None, block=None):
    """A tiny random transformers model of family (a model_type of HF_FAMILIES), in eval mode; n_layer, n_embd,
    block: sized() to them (the race of bench.py --vs_hf_families)."""
    config = CONFIGS[family]() if family in CONFIGS else tiny(type(transformers.AutoConfig.for_model(family)))
    if n_layer or n_embd or block:
        config = sized(config, n_layer, n_embd, block)
    torch.manual_seed(seed)
    return randomized_experts(getattr(transformers, HF_FAMILIES[family].hf_class)(config), seed)


def char_tokenizer():
    """One token per symbol: the 96 ids, the newline and printable ASCII."""
    from common.tokenizer import char_tokenizer as chars
    return chars(['\n'] + [chr(c) for c in range(32, 127)])


def main(argv):
    from common.errors import die
    if len(argv) != 2:
        die(f"usage: python -m hf.tiny FAMILY DIR; families: {', '.join(HF_FAMILIES)}")
    family, path = argv
    if family not in HF_FAMILIES:
        die(f"unknown family {family!r}; families: {', '.join(HF_FAMILIES)}")
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        die(f"'{path}' exists and is not an empty directory: give a new DIR")
    model = build(family)
    model.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    print(f"wrote a tiny random {type(model).__name__} ({family}) to {path}: "
          f"python sample.py --init_from={path} --start=\"Hello\"")


if __name__ == '__main__':
    main(sys.argv[1:])
