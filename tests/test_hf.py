"""The Hugging Face families of hf.py, both ways: tiny random checkpoints built here and saved locally load
with logits equal to transformers' (fp32, 1e-4), greedy decoding token-identical to transformers' generate, and
export back to the same class. Each family's shapes exercise its features (a window shorter than the test
sequence, an original RoPE length shorter than it, head_dim different from n_embd / n_head)."""

import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip('transformers')

from common.checkpoints import (load_checkpoint, load_pretrained, model_from_checkpoint, new_checkpoint,  # noqa: E402
                                save_checkpoint)
import hf as H  # noqa: E402
import model as M  # noqa: E402
from export import hf_family, to_hf  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

VOCAB, BLOCK = 96, 64
PROMPT, NEW = 10, 30  # 40 positions: past every window and original length below, inside BLOCK


pytestmark = pytest.mark.usefixtures('single_thread')


def randomized(hf, seed):
    """Norm gains away from 1 and biases and buffers away from 0, so a wrong mapping of either shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(hf.named_parameters()) + list(hf.named_buffers()):
            if p.dim() == 1 and p.is_floating_point() and 'inv_freq' not in name:
                noise = torch.randn(p.shape, generator=g)
                p.copy_(0.1 * noise if name.endswith(('bias', 'correction_bias')) else 1.0 + 0.3 * noise)
    return hf.eval()


def check_parity(hf, path, seed=0, family=None):
    """Save hf, load it into our GPT and compare logits, greedy decoding and the export back (to the family
    export picks, or to `family`)."""
    hf.save_pretrained(path)
    ours = GPT.from_pretrained(str(path)).eval()
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, VOCAB, (2, PROMPT + NEW), generator=g)
    with torch.no_grad():
        expected = hf(idx).logits
        torch.testing.assert_close(ours(idx)[0], expected, atol=1e-4, rtol=0)
        prompt = idx[:, :PROMPT]
        hf_tokens = hf.generate(prompt, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0,
                                attention_mask=torch.ones_like(prompt))
        assert torch.equal(ours.generate(prompt, NEW, temperature=0.0), hf_tokens)
        back = to_hf(ours, family=family)
        assert type(back) is type(hf)
        torch.testing.assert_close(back(idx).logits, expected, atol=1e-4, rtol=0)
    return ours


def tiny(config_class, **overrides):
    args = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=BLOCK, rms_norm_eps=1e-6, tie_word_embeddings=False,
                bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return config_class(**{**args, **overrides})


LLAMA3 = {'rope_type': 'llama3', 'rope_theta': 500000.0, 'factor': 8.0, 'low_freq_factor': 1.0,
          'high_freq_factor': 4.0, 'original_max_position_embeddings': 16}
ROPES = {
    'llama3': LLAMA3,
    'linear': {'rope_type': 'linear', 'rope_theta': 10000.0, 'factor': 2.0},
    'dynamic': {'rope_type': 'dynamic', 'rope_theta': 10000.0, 'factor': 4.0},
    'yarn': {'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 4.0, 'original_max_position_embeddings': 16},
    'yarn-mscale': {'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 4.0, 'original_max_position_embeddings': 16,
                    'mscale': 1.0, 'mscale_all_dim': 0.5, 'beta_fast': 16.0, 'beta_slow': 2.0},
    # gpt-oss's: the band's edges (0.55 and 1.63 of head_dim 8's 4 frequencies here) not rounded to whole ones
    'yarn-untruncated': {'rope_type': 'yarn', 'rope_theta': 150000.0, 'factor': 4.0, 'beta_fast': 0.5,
                         'beta_slow': 0.02, 'truncate': False, 'original_max_position_embeddings': 16},
}


@pytest.mark.parametrize('rope', ROPES)
def test_llama_with_rope_scaling(rope, tmp_path):
    # 'dynamic' stretches past max_position_embeddings: there, a length the test sequence passes
    length = {'max_position_embeddings': 16} if rope == 'dynamic' else {}
    hf = randomized(transformers.LlamaForCausalLM(tiny(transformers.LlamaConfig, head_dim=12, **length,
                                                       rope_parameters=dict(ROPES[rope]))), 1)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.rope_scaling == ROPES[rope]['rope_type'] and cfg.head_dim == 12 and cfg.n_embd == 32
    if rope != 'linear':  # which stretches every position alike
        assert cfg.rope_length == 16 and cfg.rope_length < PROMPT + NEW


def test_mistral_sliding_window(tmp_path):
    hf = randomized(transformers.MistralForCausalLM(tiny(transformers.MistralConfig, sliding_window=7)), 2)
    ours = check_parity(hf, tmp_path)
    assert ours.config.sliding_window == 7
    assert ours.kv_cache_bytes(1, PROMPT + NEW) == ours.kv_cache_bytes(1, 7)  # the cache keeps the window only


def test_qwen2_qkv_bias_and_window(tmp_path):
    hf = randomized(transformers.Qwen2ForCausalLM(tiny(transformers.Qwen2Config, use_sliding_window=True,
                                                       sliding_window=9, max_window_layers=0,
                                                       rope_parameters=dict(ROPES['yarn']))), 3)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.qkv_bias, cfg.bias, cfg.sliding_window, cfg.rope_scaling) == (True, False, 9, 'yarn')
    assert ours.transformer.h[0].attn.c_proj.bias is None


def test_qwen3_qk_norm_and_head_dim(tmp_path):
    hf = randomized(transformers.Qwen3ForCausalLM(tiny(transformers.Qwen3Config, head_dim=16, tie_word_embeddings=True,
                                                       rope_parameters=dict(LLAMA3))), 4)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.qk_norm and cfg.head_dim == 16 and cfg.tie_embeddings and cfg.rope_scaling == 'llama3'


def test_qwen3_window_on_some_layers_only_is_refused(tmp_path):
    hf = transformers.Qwen3ForCausalLM(tiny(transformers.Qwen3Config, num_hidden_layers=3, use_sliding_window=True,
                                            sliding_window=8, max_window_layers=1))
    hf.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match='max_window_layers'):
        GPT.from_pretrained(str(tmp_path))


def test_a_checkpoint_feature_we_lack_is_refused_not_dropped(tmp_path):
    """A Llama checkpoint with a q_norm weight we would not use: refused, naming it."""
    hf = transformers.LlamaForCausalLM(tiny(transformers.LlamaConfig))
    state = hf.state_dict()
    ours = GPT(GPTConfig(**H._llama_read(hf.config)))
    state['model.layers.0.self_attn.q_norm.weight'] = torch.ones(8)
    _, unused = H.hf_to_ours(state, ours, H.HF_FAMILIES['llama'])
    assert unused == {'model.layers.0.self_attn.q_norm.weight'}


@pytest.mark.parametrize('rope', ['linear', 'dynamic', 'yarn', 'yarn-mscale', 'yarn-untruncated', 'llama3'])
@pytest.mark.parametrize('length', [12, 40, 100])
def test_rope_frequencies_equal_transformers(rope, length):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    hf_config = tiny(transformers.LlamaConfig, max_position_embeddings=24, rope_parameters=dict(ROPES[rope]))
    ours = GPTConfig(**{**H._llama_read(hf_config), 'n_kv_head': 2})
    inv, factor = M.rope_frequencies(ours, 8, length)
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS[ROPES[rope]['rope_type']](hf_config, 'cpu', torch.tensor(length))
    torch.testing.assert_close(inv, hf_inv.float(), atol=0, rtol=1e-6)
    assert factor == pytest.approx(hf_factor, rel=1e-12)


def test_mixtral_experts_and_window(tmp_path):
    hf = randomized(transformers.MixtralForCausalLM(tiny(transformers.MixtralConfig, num_local_experts=4,
                                                         num_experts_per_tok=2, sliding_window=11)), 5)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.mlp, cfg.n_expert, cfg.n_expert_active, cfg.moe_hidden, cfg.router) == ('moe', 4, 2, 48, 'softmax')
    assert ours.get_num_params(active=True) < ours.get_num_params()


@pytest.mark.parametrize('norm_topk', [False, True])
def test_qwen3_moe_with_a_dense_first_layer(norm_topk, tmp_path):
    hf = randomized(transformers.Qwen3MoeForCausalLM(tiny(
        transformers.Qwen3MoeConfig, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, head_dim=16,
        norm_topk_prob=norm_topk, mlp_only_layers=[0], rope_parameters=dict(ROPES['yarn']))), 6)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.first_dense_layers, cfg.router_norm_topk, cfg.qk_norm, cfg.moe_hidden) == (1, norm_topk, True, 24)
    assert type(ours.transformer.h[0].mlp) is M.GatedMLP and type(ours.transformer.h[1].mlp) is M.MoE


def deepseek(config_class, moe, **overrides):
    args = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=8,
                v_head_dim=6, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
                n_group=2, topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1 if moe else 2)
    return tiny(config_class, **{**args, **overrides})


YARN_DEEPSEEK = {'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 4.0, 'original_max_position_embeddings': 16,
                 'mscale': 1.0, 'mscale_all_dim': 0.707}


@pytest.mark.parametrize('moe,q_lora,rope', [(False, None, None), (False, 24, YARN_DEEPSEEK), (True, 24, None),
                                             (True, None, YARN_DEEPSEEK)],
                         ids=['dense', 'dense-qlora-yarn', 'moe-qlora', 'moe-yarn'])
def test_deepseek_v3_latent_attention_and_experts(moe, q_lora, rope, tmp_path):
    extra = {'rope_parameters': dict(rope)} if rope else {}
    hf = randomized(transformers.DeepseekV3ForCausalLM(deepseek(transformers.DeepseekV3Config, moe, q_lora_rank=q_lora,
                                                                **extra)), 7)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.attn == 'mla' and cfg.mla_dims == {'latent': 16, 'q_latent': q_lora or 0, 'nope': 8, 'rope': 4, 'v': 6}
    assert cfg.mlp == ('moe' if moe else 'swiglu')
    if moe:
        assert (cfg.router, cfg.n_expert_group, cfg.n_shared_expert, cfg.first_dense_layers) == ('sigmoid', 2, 1, 1)
        bias = ours.transformer.h[1].mlp.expert_bias
        assert torch.equal(bias, hf.model.layers[1].mlp.gate.e_score_correction_bias) and bias.abs().sum() > 0
    # the cache holds the latent and the shared rotated key only: (16 + 4) numbers per token and layer
    assert ours.kv_cache_bytes(1, 10) == 2 * 10 * (16 + 4) * 4


@pytest.mark.parametrize('topk_method', ['greedy', 'group_limited_greedy'])
def test_deepseek_v2_softmax_experts(topk_method, tmp_path):
    hf = randomized(transformers.DeepseekV2ForCausalLM(deepseek(transformers.DeepseekV2Config, True,
                                                                topk_method=topk_method, routed_scaling_factor=1.5)), 8)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.router, cfg.router_norm_topk, cfg.routed_scaling) == ('softmax', False, 1.5)
    assert cfg.n_expert_group == (2 if topk_method == 'group_limited_greedy' else 1)


# ----- layers of several kinds: Gemma 3 (text), OLMo 2, OLMo 3, SmolLM3

WINDOW = 8  # shorter than PROMPT + NEW


def test_gemma3_text_sandwich_norms_and_local_layers(tmp_path):
    """(1 + w) norms before and after each branch, the embedding scale, per-head QK-norm, a query scale of
    its own, GEGLU, the logit soft-cap; local layers with their own RoPE base, linear scaling on the global."""
    rope = {'sliding_attention': {'rope_type': 'default', 'rope_theta': 10.0},
            'full_attention': {'rope_type': 'linear', 'factor': 4.0, 'rope_theta': 1000.0}}
    hf = randomized(transformers.Gemma3ForCausalLM(tiny(
        transformers.Gemma3TextConfig, num_hidden_layers=3, head_dim=12, query_pre_attn_scalar=20,
        layer_types=['sliding_attention', 'sliding_attention', 'full_attention'], sliding_window=WINDOW,
        final_logit_softcapping=3.0, rope_parameters=rope, initializer_range=0.2, tie_word_embeddings=True)), 9)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layers, cfg.sliding_window, cfg.norm_position, cfg.mlp) == ('LLG', WINDOW, 'sandwich', 'geglu')
    assert (cfg.rope_local_theta, cfg.rope_theta, cfg.rope_scaling, cfg.rope_factor) == (10.0, 1000.0, 'linear', 4.0)
    assert cfg.attn_scale == 20 ** -0.5 and cfg.logit_softcap == 3.0 and cfg.embed_scale and cfg.qk_norm
    torch.testing.assert_close(ours.transformer.h[0].ln_1_out.weight,
                               1 + hf.model.layers[0].post_attention_layernorm.weight, atol=0, rtol=0)
    # the local layers cache their window only: 2 (k, v) * 2 kv heads * 12 dims * 4 bytes per position
    assert ours.kv_cache_bytes(1, PROMPT + NEW) == 2 * 2 * 12 * 4 * (WINDOW + WINDOW + PROMPT + NEW)


@pytest.mark.parametrize('change,match', [
    ({'rope_parameters': {'sliding_attention': {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 10.0},
                          'full_attention': {'rope_type': 'default', 'rope_theta': 1000.0}}}, 'sliding_attention'),
    ({'attention_bias': True}, 'attention_bias'),
    ({'hidden_activation': 'gelu'}, 'hidden_activation'),
], ids=['scaled-local-rope', 'attention-bias', 'erf-gelu'])
def test_gemma3_text_features_we_lack_are_refused(change, match):
    c = tiny(transformers.Gemma3TextConfig, layer_types=['sliding_attention', 'full_attention'], **change)
    with pytest.raises(ValueError, match=match) as e:
        H.HF_FAMILIES['gemma3_text'].read_config(c)
    assert '\n' not in str(e.value)


def test_olmo2_norms_after_branches_and_qk_norm_over_all_heads(tmp_path):
    hf = randomized(transformers.Olmo2ForCausalLM(tiny(transformers.Olmo2Config, initializer_range=0.2)), 10)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.norm_position, cfg.qk_norm, cfg.qk_norm_all_heads, cfg.layers) == ('after', True, True, None)
    assert ours.transformer.h[0].attn.k_norm.weight.shape == (2 * 8,)  # n_kv_head * head_dim


def test_olmo3_local_layers_with_a_rope_base_per_kind(tmp_path):
    rope = {'sliding_attention': {'rope_type': 'default', 'rope_theta': 10.0},
            'full_attention': dict(ROPES['yarn'], rope_theta=1000.0)}
    hf = randomized(transformers.Olmo3ForCausalLM(tiny(
        transformers.Olmo3Config, num_hidden_layers=4, sliding_window=WINDOW, rope_parameters=rope,
        layer_types=['sliding_attention'] * 3 + ['full_attention'], initializer_range=0.2)), 11)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layers, cfg.sliding_window, cfg.norm_position, cfg.qk_norm_all_heads) == ('LLLG', WINDOW, 'after', True)
    assert (cfg.rope_local_theta, cfg.rope_theta, cfg.rope_scaling) == (10.0, 1000.0, 'yarn')


def test_olmo_attention_bias_is_refused():
    with pytest.raises(ValueError, match='attention_bias'):
        H.HF_FAMILIES['olmo3'].read_config(tiny(transformers.Olmo3Config, attention_bias=True))


def test_smollm3_layers_without_rope(tmp_path):
    hf = randomized(transformers.SmolLM3ForCausalLM(tiny(
        transformers.SmolLM3Config, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0], attention_bias=True,
        mlp_bias=True, tie_word_embeddings=True, initializer_range=0.2)), 12)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layers, cfg.bias, cfg.tie_embeddings, cfg.sliding_window) == ('GGGN', True, True, None)


def test_smollm3_sliding_layers_are_refused():
    c = tiny(transformers.SmolLM3Config, num_hidden_layers=4, use_sliding_window=True, sliding_window=WINDOW)
    with pytest.raises(ValueError, match='use_sliding_window'):
        H.HF_FAMILIES['smollm3'].read_config(c)


def test_export_picks_the_family_of_the_layer_kinds():
    """A Llama block with NoPE layers goes to SmolLM3; OLMo's with local layers to OLMo 3, without to OLMo 2;
    local layers mixed with NoPE ones, or a Gemma query scale with no integer scalar, are refused."""
    from export import hf_family
    llama = dict(n_layer=4, n_head=4, n_embd=32, vocab_size=VOCAB, block_size=BLOCK, bias=False, norm='rms',
                 mlp='swiglu', pos='rope')
    olmo = dict(llama, norm_position='after', qk_norm=True, qk_norm_all_heads=True)
    gemma = dict(llama, mlp='geglu', norm_position='sandwich', embed_scale=True, qk_norm=True)
    assert hf_family(GPTConfig(**llama, layers='GGGN')).model_type == 'smollm3'
    assert hf_family(GPTConfig(**olmo)).model_type == 'olmo2'
    assert hf_family(GPTConfig(**olmo, layers='LLLG', sliding_window=8)).model_type == 'olmo3'
    assert hf_family(GPTConfig(**gemma, layers='LLLG', sliding_window=8)).model_type == 'gemma3_text'
    with pytest.raises(ValueError, match="layers='LN'"):
        hf_family(GPTConfig(**gemma, layers='LN', sliding_window=8))
    with pytest.raises(ValueError, match='query_pre_attn_scalar'):
        to_hf(GPT(GPTConfig(**gemma, attn_scale=0.3)))


def randomized_experts(hf, seed):
    """randomized() and the experts' biases, which are (n_expert, width) and start at zero."""
    randomized(hf, seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith('_proj_bias'):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return hf


def test_gpt_oss_sinks_local_layers_and_clamped_experts(tmp_path):
    torch.manual_seed(0)  # the same random model every run: an MoE's top-k may not stand on a near-tie
    # swiglu_limit 1 so the clamps bite; yarn without truncation on every layer, local and global
    hf = randomized_experts(transformers.GptOssForCausalLM(tiny(
        transformers.GptOssConfig, head_dim=8, num_local_experts=4, num_experts_per_tok=2, swiglu_limit=1.0,
        sliding_window=8, layer_types=['sliding_attention', 'full_attention'], initializer_range=0.2,
        rope_parameters=dict(ROPES['yarn-untruncated']))), 9)
    assert hf.model.layers[0].self_attn.sinks.std() > 0.1 and hf.model.layers[0].mlp.router.bias.abs().sum() > 0
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layers, cfg.sliding_window, cfg.attn_sinks, cfg.bias, cfg.yarn_truncate) == ('LG', 8, True, True, False)
    assert (cfg.mlp, cfg.router, cfg.router_norm_topk, cfg.moe_bias, cfg.swiglu_limit) == \
        ('moe', 'softmax', True, True, 1.0)
    # the interleaved [gate, up] columns became our [gate | up] rows
    up = hf.model.layers[1].mlp.experts.gate_up_proj[2][:, 1::2]
    assert torch.equal(ours.transformer.h[1].mlp.experts.c_fc[2][48:], up.t())
    per_position = ours.kv_cache_bytes(1, 1) // 2  # of one layer
    assert ours.kv_cache_bytes(1, PROMPT + NEW) == per_position * (PROMPT + NEW + 8)  # the local layer keeps 8


def test_glm4_moe_partial_rope_and_grouped_sigmoid_experts(tmp_path):
    torch.manual_seed(0)
    hf = randomized(transformers.Glm4MoeForCausalLM(tiny(
        transformers.Glm4MoeConfig, head_dim=12, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        use_qk_norm=True, attention_bias=True, initializer_range=0.2)), 10)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.rope_fraction, cfg.rope_dim, cfg.qkv_bias, cfg.bias, cfg.qk_norm, cfg.qk_norm_all_heads) == \
        (0.5, 6, True, False, True, False)
    assert (cfg.router, cfg.n_expert_group, cfg.topk_group, cfg.routed_scaling, cfg.n_shared_expert,
            cfg.first_dense_layers, cfg.moe_hidden, cfg.ffn_hidden) == ('sigmoid', 2, 1, 2.5, 1, 1, 16, 48)
    bias = ours.transformer.h[1].mlp.expert_bias
    assert torch.equal(bias, hf.model.layers[1].mlp.gate.e_score_correction_bias) and bias.abs().sum() > 0
    assert ours.transformer.h[0].attn.c_proj.bias is None  # GLM's o_proj has none


def test_minimax_m2_qk_norm_over_all_heads_and_partial_yarn(tmp_path):
    torch.manual_seed(0)
    hf = randomized(transformers.MiniMaxM2ForCausalLM(tiny(
        transformers.MiniMaxM2Config, head_dim=12, rotary_dim=6, num_local_experts=4, num_experts_per_tok=2,
        initializer_range=0.2, rope_parameters=dict(ROPES['yarn']))), 11)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.rope_fraction, cfg.rope_scaling, cfg.qk_norm, cfg.qk_norm_all_heads) == (0.5, 'yarn', True, True)
    assert (cfg.router, cfg.router_norm_topk, cfg.n_shared_expert, cfg.moe_hidden) == ('sigmoid', True, 0, 48)
    assert ours.transformer.h[0].attn.q_norm.weight.shape == (4 * 12,)
    bias = ours.transformer.h[1].mlp.expert_bias
    assert torch.equal(bias, hf.model.layers[1].mlp.e_score_correction_bias) and bias.abs().sum() > 0


GPT_OSS_FLAGS = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, block_size=BLOCK, bias=True, norm='rms',
                     pos='rope', mlp='moe', n_expert=4, attn_sinks=True, moe_bias=True, swiglu_limit=7.0,
                     layers='LG', sliding_window=8)
SIGMOID_FLAGS = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, block_size=BLOCK, bias=False, norm='rms',
                     pos='rope', mlp='moe', n_expert=4, router='sigmoid', rope_fraction=0.5)


@pytest.mark.parametrize('flags,family,refused', [
    (GPT_OSS_FLAGS, 'gpt_oss', None),
    ({**GPT_OSS_FLAGS, 'layers': 'LN'}, None, "layers='LN'"),  # gpt-oss rotates every layer
    ({**GPT_OSS_FLAGS, 'swiglu_limit': None}, None, 'swiglu_limit=None'),  # its experts always clamp
    ({**GPT_OSS_FLAGS, 'moe_bias': False}, None, 'moe_bias=False'),
    ({**SIGMOID_FLAGS, 'n_shared_expert': 1, 'qk_norm': True}, 'glm4_moe', None),
    ({**SIGMOID_FLAGS, 'qk_norm': True, 'qk_norm_all_heads': True}, 'minimax_m2', None),
    ({**SIGMOID_FLAGS, 'qk_norm': True}, None, 'n_shared_expert=0'),  # GLM always has a shared expert
    ({**GPT_OSS_FLAGS, 'zero_init': True}, 'gpt_oss', None),  # only the init: every family carries it
    (dict(n_layer=2, n_head=4, n_embd=32, mlp='relu2'), None, "mlp='relu2'"),  # no family has ReLU²
], ids=['gpt_oss', 'gpt_oss-nope', 'gpt_oss-unclamped', 'gpt_oss-no-biases', 'glm4_moe', 'minimax_m2',
        'glm4_moe-no-shared', 'zero_init', 'relu2'])
def test_export_picks_the_2025_families_or_refuses(flags, family, refused):
    from export import hf_family
    config = GPTConfig(**flags)
    if refused is None:
        assert hf_family(config).model_type == family
    else:
        with pytest.raises(ValueError, match=refused) as e:
            hf_family(config)
        assert '\n' not in str(e.value)


def test_gpt_oss_other_swiglu_alpha_is_refused():
    config = tiny(transformers.GptOssConfig, head_dim=8, num_local_experts=4, num_experts_per_tok=2, swiglu_alpha=1.5)
    with pytest.raises(ValueError, match='swiglu_alpha=1.5') as e:
        H.HF_FAMILIES['gpt_oss'].read_config(config)
    assert '\n' not in str(e.value)


def qwen3_next(**overrides):
    """Qwen3-Next's shapes: head_dim 16 (not 32 / 4), a quarter of it rotated, two key heads of 8 for four value
    heads of 6 in the Gated DeltaNet layers."""
    args = dict(head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                linear_value_head_dim=6, linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
                layer_types=['linear_attention', 'linear_attention', 'full_attention'], num_hidden_layers=3,
                num_experts=0)
    return tiny(transformers.Qwen3NextConfig, **{**args, **overrides})


@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_qwen3_next_deltanet_layers_gated_attention_and_shared_expert(moe, tmp_path):
    extra = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                 mlp_only_layers=[0], norm_topk_prob=True) if moe else {}
    torch.manual_seed(0)
    hf = randomized(transformers.Qwen3NextForCausalLM(qwen3_next(**extra)), seed=8)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layers == 'DDG' and cfg.attn_gate and cfg.qk_norm and cfg.rope_dim == 4
    assert cfg.linear_dims == {'k_heads': 2, 'v_heads': 4, 'k_dim': 8, 'v_dim': 6}
    if moe:
        assert cfg.mlp == 'moe' and cfg.first_dense_layers == 1 and cfg.n_shared_expert == 1 and cfg.shared_expert_gate


def qwen3_5_text(**overrides):
    """Qwen3.5's text config in qwen3_next's shapes (its own class has no MoE fields)."""
    config = qwen3_next(**overrides)
    return {k: v for k, v in config.to_dict().items() if k in transformers.Qwen3_5TextConfig.__dataclass_fields__
            or k == 'partial_rotary_factor'}


def tiny_qwen3_5():
    """A tiny Qwen3_5ForCausalLM: the family whose flags Qwen3-Next (tried first) carries too."""
    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(
        **qwen3_5_text(layer_types=['linear_attention', 'full_attention', 'linear_attention']))
    return randomized(transformers.Qwen3_5ForCausalLM(config), seed=9)


def test_qwen3_5_text_deltanet_layers_in_separate_projections(tmp_path):
    ours = check_parity(tiny_qwen3_5(), tmp_path)  # back to Qwen3.5, though Qwen3-Next could carry it too
    assert ours.config.layer_kinds == ['D', 'G', 'D'] and ours.config.mlp == 'swiglu' and ours.config.linear_dims['v_heads'] == 4
    assert type(to_hf(ours, family='qwen3_next')) is transformers.Qwen3NextForCausalLM
    # a model built here with the same flags has no family of its own: the first that can carry it
    assert type(to_hf(GPT(ours.config))) is transformers.Qwen3NextForCausalLM


def test_a_qwen3_5_checkpoint_exports_back_to_qwen3_5(tmp_path):
    """The family a model was loaded from survives a checkpoint (train.py's saves write
    common.checkpoints.new_checkpoint)."""
    tiny_qwen3_5().save_pretrained(tmp_path / 'hf')
    ckpt = str(tmp_path / 'ckpt.pt')
    save_checkpoint(new_checkpoint(GPT.from_pretrained(str(tmp_path / 'hf'))), ckpt)
    restored = model_from_checkpoint(load_checkpoint(ckpt), ckpt)
    assert type(to_hf(restored)) is transformers.Qwen3_5ForCausalLM


def test_a_qwen3_5_vision_language_checkpoint_loads_its_text_model(tmp_path):
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32)
    torch.manual_seed(0)
    full = randomized(transformers.Qwen3_5ForConditionalGeneration(
        transformers.Qwen3_5Config(text_config=qwen3_5_text(), vision_config=vision)), seed=10)
    full.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    assert ours.config.layers == 'DDG'
    idx = torch.randint(0, VOCAB, (2, PROMPT + NEW), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], full(idx).logits, atol=1e-4, rtol=0)
    assert type(to_hf(ours)) is transformers.Qwen3_5ForCausalLM  # its text model's class


@pytest.mark.parametrize('change, match', [
    (dict(attention_bias=True), 'attention_bias'),
    (dict(num_experts=4, mlp_only_layers=[1]), 'mlp_only_layers'),
    (dict(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24), 'shared_expert_intermediate_size'),
], ids=['attention_bias', 'dense-later-layer', 'shared-not-a-multiple'])
def test_qwen3_next_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        H.HF_FAMILIES['qwen3_next'].read_config(qwen3_next(**change))


class RunsCode:
    """Unpickled, it would create the file at `path`: proof that loading ran the pickle's code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


@pytest.mark.parametrize('weights, fragment', [
    ('pickle', 'nothing in it was run'),
    ('garbage', 'nothing in it was run'),
    ('truncated', 'damaged (truncated or not a torch file)'),
])
def test_unsafe_or_damaged_bin_weights_are_one_line(weights, fragment, tmp_path, capsys, recwarn):
    """A pytorch_model.bin that weights_only loading refuses (a pickle of code, or bytes that are no torch file)
    is one line, and the pickle's code never runs."""
    import pickle
    hf_dir, ran = tmp_path / 'hf', tmp_path / 'code-ran'
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=16,
                                                         vocab_size=VOCAB)).save_pretrained(hf_dir)
    (hf_dir / 'model.safetensors').unlink()
    bin_path = hf_dir / 'pytorch_model.bin'
    if weights == 'pickle':
        bin_path.write_bytes(pickle.dumps({'transformer.wte.weight': RunsCode(str(ran))}))
    elif weights == 'garbage':
        bin_path.write_bytes(b'not a torch file at all')
    else:
        torch.save({'transformer.wte.weight': torch.zeros(VOCAB, 16)}, bin_path)
        bin_path.write_bytes(bin_path.read_bytes()[:200])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        load_pretrained(str(hf_dir))
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith('error: cannot load'), lines
    assert fragment in lines[0] and str(hf_dir) in lines[0]
    assert not ran.exists()
    assert not recwarn.list, [str(w.message) for w in recwarn]  # a warning would print a line of its own


def nanochat(**overrides):
    return tiny(transformers.NanoChatConfig, **{'hidden_act': 'relu2', 'final_logit_softcapping': 3.0, **overrides})


@pytest.mark.parametrize('overrides', [{}, dict(tie_word_embeddings=True, final_logit_softcapping=None,
                                                num_key_value_heads=4, rope_parameters=ROPES['linear'])],
                         ids=['untied-softcap-gqa', 'tied-mha-linear-rope'])
def test_nanochat_weightless_norms_and_its_rope_turned_back(overrides, tmp_path):
    torch.manual_seed(0)
    ours = check_parity(randomized(transformers.NanoChatForCausalLM(nanochat(**overrides)), seed=12), tmp_path)
    assert ours.config.norm_gain is False and ours.config.embed_norm and ours.config.mlp == 'relu2'
    assert not [n for n, _ in ours.named_parameters() if 'ln_' in n or 'norm' in n]  # no norm weight anywhere
    assert type(to_hf(GPT(ours.config))) is transformers.NanoChatForCausalLM  # the only family carrying it


def test_nanochats_rope_conversion_is_needed(tmp_path):
    """Without turning the rotation back, the logits differ: the conversion is what makes them equal."""
    torch.manual_seed(0)
    hf = randomized(transformers.NanoChatForCausalLM(nanochat()), seed=12)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    state = {k: v.clone() for k, v in ours.state_dict().items()}
    for i in range(ours.config.n_layer):
        name = f'transformer.h.{i}.attn.c_attn.weight'
        state[name] = H._rope_turned_back(state[name], ours.config)  # undone: nanochat's rows as they are
    ours.load_state_dict(state)
    idx = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max() > 1e-3


@pytest.mark.parametrize('change, match', [(dict(hidden_act='silu'), 'hidden_act'),
                                           (dict(attention_bias=True), 'attention_bias')])
def test_nanochat_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        H.HF_FAMILIES['nanochat'].read_config(nanochat(**change))


def llama4_text(**overrides):
    """Four layers: three chunked RoPE layers (chunks of 8, so the 40 test positions cross four), then one
    without RoPE whose temperature grows every 4 positions; experts on every second layer."""
    args = dict(intermediate_size=16, intermediate_size_mlp=48, num_hidden_layers=4, head_dim=8,
                attention_chunk_size=8, floor_scale=4, attn_scale=0.5, interleave_moe_layer_step=2, num_local_experts=4)
    return tiny(transformers.Llama4TextConfig, **{**args, **overrides})


@pytest.mark.parametrize('overrides', [
    {},
    # all layers MoE with two experts a token, full RoPE layers (no chunks), no QK-norm or temperature, llama3 RoPE
    dict(interleave_moe_layer_step=1, num_experts_per_tok=2, attention_chunk_size=None, use_qk_norm=False,
         attn_temperature_tuning=False, rope_parameters=LLAMA3),
    dict(moe_layers=[], no_rope_layer_interval=2),  # dense: every layer intermediate_size_mlp wide; 'CN'
], ids=['scout-like', 'maverick-like-moe-every-layer', 'dense-CN'])
def test_llama4_text_chunked_and_nope_layers_and_its_experts(overrides, tmp_path):
    torch.manual_seed(0)
    ours = check_parity(randomized_experts(randomized(transformers.Llama4ForCausalLM(llama4_text(**overrides)), 13), 14),
                        tmp_path)
    if not overrides:
        cfg = ours.config
        assert cfg.layers == 'CCCN' and cfg.attention_chunk_size == 8 and cfg.nope_temperature == 0.5
        assert cfg.rope_qk_norm and cfg.moe_every == 2 and cfg.moe_scale_input and cfg.n_expert_active == 1
        assert [type(b.mlp).__name__ for b in ours.transformer.h] == ['GatedMLP', 'MoE', 'GatedMLP', 'MoE']
        assert ours.kv_cache_bytes(1, 64) == (3 * 8 + 64) * 2 * 2 * 8 * 4  # chunked layers keep one chunk
        assert type(to_hf(GPT(cfg))) is transformers.Llama4ForCausalLM  # built here: the only family carrying it


@pytest.mark.parametrize('change, match', [
    (dict(attention_bias=True), 'attention_bias'),
    (dict(moe_layers=[0, 3]), 'moe_layers'),
    (dict(layer_types=['chunked_attention'] * 4), 'without RoPE'),
], ids=['attention_bias', 'moe-not-every-kth', 'chunked-nope'])
def test_llama4_text_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        H.HF_FAMILIES['llama4_text'].read_config(llama4_text(**change))


def test_llama4_text_export_refuses_a_moved_expert_bias(tmp_path):
    torch.manual_seed(0)
    transformers.Llama4ForCausalLM(llama4_text()).save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path))
    with torch.no_grad():
        ours.transformer.h[1].mlp.expert_bias[0] = 0.5
    with pytest.raises(ValueError, match="layer 1's expert_bias is not zero"):
        to_hf(ours)
# ----- LFM2: gated short convolutions ('V') among attention layers


def lfm2(**overrides):
    """LFM2's shapes: conv layers around a full-attention one, head_dim 16 (not 32 / 4), a kernel of 4, and the
    MLP width LFM2 derives from intermediate_size (2/3 of 72, rounded up to a multiple of 16: 48)."""
    args = dict(head_dim=16, layer_types=['conv', 'full_attention', 'conv'], num_hidden_layers=3, conv_L_cache=4,
                intermediate_size=72, block_multiple_of=16, norm_eps=1e-6)
    return tiny(transformers.Lfm2Config, **{**args, **overrides})


def test_lfm2_short_conv_and_attention_layers(tmp_path):
    torch.manual_seed(0)
    hf = randomized(transformers.Lfm2ForCausalLM(lfm2()), seed=12)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layer_kinds == ['V', 'G', 'V'] and cfg.short_conv_kernel == 4 and cfg.qk_norm and cfg.head_size == 16
    assert cfg.mlp_width == hf.model.layers[0].feed_forward.w1.out_features == 48


@pytest.mark.parametrize('change, match', [
    (dict(conv_bias=True), 'conv_bias'),
    (dict(layer_types=['conv', 'sliding_attention', 'conv']), 'sliding_attention'),
], ids=['conv_bias', 'unknown-layer-type'])
def test_lfm2_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match) as e:
        H.HF_FAMILIES['lfm2'].read_config(lfm2(**change))
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('flags, refused', [
    (dict(layers='VG', pos='rope', norm='rms', mlp='swiglu', bias=False, qk_norm=True), None),
    (dict(layers='VG', pos='rope', norm='rms', mlp='swiglu', bias=False), 'qk_norm=False'),  # LFM2's attention has it
    (dict(layers='VG', pos='rope', norm='rms', mlp='swiglu', bias=True, qk_norm=True), 'bias=True'),
    (dict(layers='VD', pos='rope', norm='rms', mlp='swiglu', bias=False, qk_norm=True), "layers='VD'"),
], ids=['lfm2', 'no-qk-norm', 'biases', 'with-deltanet'])
def test_export_takes_short_conv_layers_to_lfm2_or_refuses(flags, refused):
    check_export_choice(GPTConfig(n_layer=2, n_head=4, n_embd=32, **flags), 'lfm2', refused)


def check_export_choice(config, family, refused):
    """Export picks `family` for config (refused None), or refuses it in one line while `family` names the one
    flag `refused` that keeps it out."""
    from export import hf_family
    if refused is None:
        assert hf_family(config).model_type == family
    else:
        with pytest.raises(ValueError, match='no Hugging Face family can represent') as e:
            hf_family(config)
        assert '\n' not in str(e.value)
        assert H.HF_FAMILIES[family].blocking(config) == [refused]


# ----- Nemotron-H: layers of one part (Mamba-2, attention without RoPE, a squared-ReLU MLP)

def nemotron_h(**overrides):
    """Nemotron-H's layers, each one part: Mamba-2 ('linear_attention': 8 heads of 6, a state of 5, B and C in 2
    groups, chunks of 7 that do not divide the test's lengths), an MLP alone, attention without RoPE."""
    args = dict(layers_block_type=['linear_attention', 'mlp', 'linear_attention', 'full_attention', 'mlp'],
                num_hidden_layers=5, head_dim=16, mamba_num_heads=8, mamba_head_dim=6, ssm_state_size=5, n_groups=2,
                conv_kernel=4, chunk_size=7, layer_norm_epsilon=1e-6)
    return tiny(transformers.NemotronHConfig, **{**args, **overrides})


def test_nemotron_h_mamba2_attention_and_mlp_layers(tmp_path):
    torch.manual_seed(0)
    hf = randomized(transformers.NemotronHForCausalLM(nemotron_h()), seed=13)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layer_kinds == ['S', '-', 'S', 'N', '-'] and not cfg.mlp_with_mixer and cfg.mlp == 'relu2'
    assert cfg.ssm_dims == {'heads': 8, 'head_dim': 6, 'state': 5, 'groups': 2} and cfg.ssm_chunk_size == 7
    assert ours.transformer.h[1].attn.cache_states() == {} and ours.transformer.h[0].mlp is None


def test_nemotron_h_time_steps_below_its_floor_are_raised_to_it(tmp_path):
    """transformers' chunked form (its forward) raises time steps below time_step_min to it: Mamba-2 layers whose
    dt_bias makes every step ~5e-5 give its logits only with ssm_dt_min (its recurrent form, in its generate,
    does not raise them: its own two forms disagree there, so greedy decoding is not compared)."""
    torch.manual_seed(0)
    hf = randomized(transformers.NemotronHForCausalLM(nemotron_h(time_step_min=0.5)), seed=14)
    with torch.no_grad():
        for i in (0, 2):
            hf.model.layers[i].mixer.dt_bias.fill_(-10.0)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    assert ours.config.ssm_dt_min == 0.5
    idx = torch.randint(0, VOCAB, (2, PROMPT + NEW), generator=torch.Generator().manual_seed(15))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize('change, match', [
    (dict(layers_block_type=['linear_attention', 'moe']), "'moe'"),
    (dict(mlp_hidden_act='silu'), 'mlp_hidden_act'),
    (dict(use_bias=True), 'use_bias'),
    (dict(use_conv_bias=False), 'use_conv_bias'),
], ids=['moe-layers', 'silu-mlp', 'biases', 'no-conv-bias'])
def test_nemotron_h_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match) as e:
        H.HF_FAMILIES['nemotron_h'].read_config(nemotron_h(**change))
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('flags, refused', [
    (dict(layers='S-S-N-', mlp_with_mixer=False, ssm_dt_min=1e-3), None),
    (dict(layers='S-S-N-', mlp_with_mixer=False), 'ssm_dt_min=0.0'),  # transformers' init takes its log
    (dict(layers='S-S-N-', ssm_dt_min=1e-3), 'mlp_with_mixer=True'),  # a Nemotron-H layer is one part
    (dict(layers='S-S-G-', mlp_with_mixer=False, ssm_dt_min=1e-3), "layers='S-S-G-'"),  # its attention has no RoPE
], ids=['nemotron_h', 'no-floor', 'two-part-layers', 'rope-attention'])
def test_export_takes_mamba2_layers_to_nemotron_h_or_refuses(flags, refused):
    check_export_choice(GPTConfig(n_layer=6, n_head=4, n_embd=32, pos='rope', norm='rms', mlp='relu2', bias=False,
                                  **flags), 'nemotron_h', refused)


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


@pytest.mark.parametrize('moe', [True, False], ids=['moe', 'dense'])
def test_kimi_linear_delta_attention_and_mla_without_positions(moe, tmp_path):
    """MoE: the shared key part 4 wide; dense: none at all (qk_rope_head_dim=0) and a query bottleneck."""
    extra = {} if moe else dict(mlp_layer_types=['dense'] * 3, qk_rope_head_dim=0, q_lora_rank=8)
    torch.manual_seed(0)
    hf = randomized(transformers.KimiLinearForCausalLM(kimi_linear(**extra)), seed=10)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layers == 'KKG' and cfg.pos == 'none' and cfg.attn == 'mla' and cfg.mla_dims['rope'] == (4 if moe else 0)
    assert cfg.linear_dims == {'k_heads': 4, 'v_heads': 4, 'k_dim': 8, 'v_dim': 8}
    if moe:
        assert cfg.mlp == 'moe' and cfg.first_dense_layers == 1 and cfg.router == 'sigmoid' and cfg.n_expert_group == 2
    else:
        assert cfg.mlp == 'swiglu' and cfg.mla_dims['q_latent'] == 8


@pytest.mark.parametrize('flags, named', [
    (dict(pos='rope'), "pos='rope'"),  # Kimi Linear has no positions
    (dict(attn='mha'), "attn='mha'"),  # its full layers are MLA
    (dict(linear_value_dim=6), 'linear_value_dim (6)'),  # one head width for keys and values
])
def test_a_kda_model_kimi_linear_cannot_carry_is_refused_in_one_line(flags, named):
    config = GPTConfig(**{**dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, layers='KG',
                                 pos='none', attn='mla', norm='rms', mlp='swiglu', bias=False), **flags})
    with pytest.raises(ValueError) as e:
        to_hf(GPT(config), family='kimi_linear')
    assert named in str(e.value) and '\n' not in str(e.value)


def olmo_hybrid(**overrides):
    """OLMo hybrid's shapes: two Gated DeltaNet layers (two key heads of 8 for four value heads of 6, beta in
    [0, 2]) then an attention layer (GQA, QK-norm over all heads, norms after the branches)."""
    args = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                layer_types=['linear_attention', 'linear_attention', 'full_attention'], num_hidden_layers=3)
    return tiny(transformers.OlmoHybridConfig, **{**args, **overrides})


@pytest.mark.parametrize('rope', [True, False], ids=['rope', 'nope'])
def test_olmo_hybrid_deltanet_with_negative_eigenvalues_and_norms_by_kind(rope, tmp_path):
    """With RoPE on the attention layers, or none at all (its released checkpoints)."""
    extra = {} if rope else dict(rope_theta=None)
    torch.manual_seed(0)
    hf = randomized(transformers.OlmoHybridForCausalLM(olmo_hybrid(**extra)), seed=11)
    assert (hf.model.rotary_emb is not None) == rope
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layers == 'DDG' and cfg.linear_neg_eigval and cfg.pos == ('rope' if rope else 'none')
    assert [block.norm_position for block in ours.transformer.h] == ['pre', 'pre', 'after']


@pytest.mark.parametrize('flags, named', [
    (dict(linear_norm_position=None), "linear_norm_position=None"),  # its DeltaNet blocks are pre-norm
    (dict(linear_norm_eps=None), 'linear_norm_eps=None'),  # and their output norm's epsilon FLA's 1e-5
    (dict(layers='D'), "layers='D'"),  # it needs an attention layer
])
def test_a_deltanet_model_olmo_hybrid_cannot_carry_is_refused_in_one_line(flags, named):
    config = GPTConfig(**{**dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, layers='DG',
                                 pos='rope', norm='rms', mlp='swiglu', bias=False, norm_position='after', qk_norm=True,
                                 qk_norm_all_heads=True, linear_norm_eps=1e-5, linear_norm_position='pre'), **flags})
    assert not H.HF_FAMILIES['olmo_hybrid'].blocking(GPTConfig(**{**config.__dict__, **dict(
        layers='DG', linear_norm_position='pre', linear_norm_eps=1e-5)}))
    with pytest.raises(ValueError) as e:
        to_hf(GPT(config), family='olmo_hybrid')
    assert named in str(e.value) and '\n' not in str(e.value)
# ----- DeepSeek Sparse Attention: DeepSeek-V3.2


def deepseek_v32(config_class=None, **overrides):
    """A tiny DeepSeek-V3.2: V3's MLA (a query bottleneck, which its indexer reads) and experts, and an indexer of
    8 heads keeping 6 tokens, well below the test's 40 positions."""
    args = dict(q_lora_rank=16, index_topk=6, index_n_heads=8, index_head_dim=8, mlp_layer_types=None, n_group=2,
                topk_group=1)
    return deepseek(config_class or transformers.DeepseekV32Config, True, **{**args, **overrides})


@pytest.mark.parametrize('rope', [None, YARN_DEEPSEEK], ids=['rope', 'yarn'])
def test_deepseek_v32_sparse_attention(rope, tmp_path):
    """Logits, greedy tokens and the export back. Where every score of a query is 0 (each head's ReLU zero) the
    top-k is a tie: we keep the earliest tokens, torch.topk in transformers any of them; this seed has none."""
    extra = {'rope_parameters': dict(rope)} if rope else {}
    torch.manual_seed(0)
    hf = randomized(transformers.DeepseekV32ForCausalLM(deepseek_v32(**extra)), 8)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.index_topk, cfg.index_n_heads, cfg.index_head_dim, cfg.q_lora_rank) == (6, 8, 8, 16)
    assert all(block.attn.indexer is not None for block in ours.transformer.h)
    # the selection matters: the same weights read densely give other logits
    dense = GPT(GPTConfig(**{**vars(cfg), 'index_topk': None, 'index_n_heads': 4, 'index_head_dim': 32})).eval()
    dense.load_state_dict({k: v for k, v in ours.state_dict().items() if '.indexer.' not in k})
    idx = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert not torch.allclose(dense(idx)[0], ours(idx)[0], atol=1e-2)
    # the cache keeps the latent, the rotated key and the indexer's key: (16 + 4 + 8) numbers per token and layer
    assert ours.kv_cache_bytes(1, 10) == 2 * 10 * (16 + 4 + 8) * 4


def test_deepseek_v32_without_its_query_bottleneck_or_in_the_dense_stage_is_refused():
    for flags, named in ((dict(q_lora_rank=None), 'q_lora_rank=None'), (dict(index_stage='dense'), "index_stage='dense'")):
        config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, attn='mla', pos='rope', norm='rms',
                           mlp='swiglu', bias=False, index_topk=4, index_head_dim=8, **{'q_lora_rank': 16, **flags})
        assert H.HF_FAMILIES['deepseek_v32'].blocking(config) == [named]
        with pytest.raises(ValueError, match='no Hugging Face family can represent'):
            hf_family(config)


def test_glm_moe_dsa_shared_top_k_and_pairwise_indexer_rope(tmp_path):
    """GLM-5: the second and third layer of each three reuse the first's top-k (IndexCache), the indexer rotates
    pairs (reordered to our halves)."""
    torch.manual_seed(0)
    hf = randomized(transformers.GlmMoeDsaForCausalLM(deepseek_v32(
        transformers.GlmMoeDsaConfig, num_hidden_layers=3, indexer_types=['full', 'shared', 'full'])), 9)
    ours = check_parity(hf, tmp_path)
    assert ours.config.index_share == 'FS' and ours.config.index_topk == 6  # tiled: F S F
    assert [type(b.attn.indexer) for b in ours.transformer.h] == [M.LightningIndexer, M.SharedIndex, M.LightningIndexer]
    assert hf_family(ours.config).model_type == 'glm_moe_dsa'  # sharing: GLM's, not DeepSeek-V3.2's


@pytest.mark.parametrize('flags, refused', [(dict(kv_shared_layers=2), 'kv_shared_layers=2'),
                                             (dict(attn_k_eq_v=True), 'attn_k_eq_v=True'),
                                             (dict(per_layer_embd=8), 'per_layer_embd=8'),
                                             (dict(v_norm=True), 'v_norm=True'),
                                             (dict(layer_scalar=True), 'layer_scalar=True'),
                                             (dict(global_head_dim=16, rope_local_theta=10.0), 'global_head_dim=16')])
def test_export_refuses_gemma4_flags_on_a_gemma3_block(flags, refused):
    """Gemma 3's block with one of Gemma 4's flags: gemma3_text cannot carry them and gemma4_text needs the rest of
    its block (value norm, layer scalar, softmax scale 1), so export refuses each in one line naming the flag."""
    check_export_choice(GPTConfig(n_layer=4, n_head=4, n_embd=32, vocab_size=VOCAB, block_size=BLOCK, bias=False,
                                  norm='rms', mlp='geglu', pos='rope', norm_position='sandwich', embed_scale=True,
                                  qk_norm=True, layers='LG', sliding_window=8, **flags), 'gemma3_text', refused)


@pytest.mark.parametrize('proportion, head_dim', [(0.25, 16), (0.25, 512), (0.5, 12), (1.0, 8)])
def test_proportional_rope_frequencies_are_transformers(proportion, head_dim):
    """rope_proportion's frequencies, laid out as transformers' 'proportional' RoPE for Gemma 4's global layers."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = transformers.Gemma4TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=head_dim,
        num_hidden_layers=2, layer_types=['sliding_attention', 'full_attention'], vocab_size=VOCAB,
        rope_parameters={'sliding_attention': {'rope_type': 'default', 'rope_theta': 10_000.0},
                         'full_attention': {'rope_type': 'proportional', 'partial_rotary_factor': proportion,
                                            'rope_theta': 1e6}})
    theirs, _ = ROPE_INIT_FUNCTIONS['proportional'](config, None, layer_type='full_attention')
    torch.testing.assert_close(M.proportional_frequencies(proportion, 1e6, head_dim), theirs, atol=0, rtol=0)


# ----- Gemma 4 (text)

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


def test_gemma4_text_dense_block(tmp_path):
    """Gemma 4's dense block: sandwich norms (x * w), QK-norm and the value norm, K = V on the global layers with
    their own head width and K/V heads, proportional RoPE, the last layers sharing K/V, per-layer embeddings, the
    layer scalar: same logits, same greedy tokens, exported back."""
    hf = randomized(transformers.Gemma4ForCausalLM(gemma4_text()), 20)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.layer_kinds, cfg.kv_shared_layers, cfg.per_layer_embd) == (['L', 'G', 'L', 'G', 'G'], 2, 8)
    assert (cfg.global_head_dim, cfg.global_n_kv_head, cfg.rope_proportion, cfg.attn_k_eq_v) == (16, 1, 0.25, True)
    assert [M.kv_source(cfg, i) for i in range(5)] == [None, None, None, 1, 1]  # the last global one unshared
    # the cache: two local layers' windows of 2 K/V heads of 8, one global layer's 1 head of 16 (k and v, fp32)
    assert ours.kv_cache_bytes(1, PROMPT + NEW) == 2 * 4 * (2 * WINDOW * 2 * 8 + (PROMPT + NEW) * 16)


def test_gemma4_text_without_its_options(tmp_path):
    """Gemma 4's large dense shape: no per-layer embeddings, no sharing, K and V apart, plain RoPE on global layers of
    the local layers' shapes."""
    rope = {'sliding_attention': {'rope_type': 'default', 'rope_theta': 100.0},
            'full_attention': {'rope_type': 'default', 'rope_theta': 10000.0}}
    hf = randomized(transformers.Gemma4ForCausalLM(gemma4_text(
        num_hidden_layers=3, layer_types=['sliding_attention', 'sliding_attention', 'full_attention'],
        global_head_dim=8, num_global_key_value_heads=None, attention_k_eq_v=False, num_kv_shared_layers=0,
        hidden_size_per_layer_input=0, rope_parameters=rope)), 21)
    cfg = check_parity(hf, tmp_path).config
    assert (cfg.per_layer_embd, cfg.kv_shared_layers, cfg.attn_k_eq_v, cfg.global_head_dim, cfg.rope_proportion) == (
        0, 0, False, None, None)


@pytest.mark.parametrize('change, match', [
    (dict(use_double_wide_mlp=True), 'use_double_wide_mlp'),
    (dict(vocab_size_per_layer_input=50), 'vocab_size_per_layer_input=50'),
    (dict(hidden_activation='gelu'), 'hidden_activation'),
    (dict(use_bidirectional_attention='all'), 'use_bidirectional_attention'),
], ids=['double-wide-mlp', 'per-layer-vocab', 'erf-gelu', 'bidirectional'])
def test_gemma4_text_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match) as e:
        H.HF_FAMILIES['gemma4_text'].read_config(gemma4_text(**change))
    assert '\n' not in str(e.value)


def test_gemma4_text_global_kv_heads_without_k_eq_v_are_refused_on_export():
    """transformers reads num_global_key_value_heads only with attention_k_eq_v: export says so in one line."""
    flags = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, block_size=BLOCK, bias=False, norm='rms',
                 mlp='geglu', pos='rope', norm_position='sandwich', embed_scale=True, qk_norm=True, v_norm=True,
                 attn_scale=1.0, layer_scalar=True, layers='LG', sliding_window=8, rope_local_theta=10.0)
    from export import hf_family
    assert hf_family(GPTConfig(**flags, global_n_kv_head=1, attn_k_eq_v=True)).model_type == 'gemma4_text'
    with pytest.raises(ValueError, match='global_n_kv_head=1 only with attn_k_eq_v=True') as e:
        to_hf(GPT(GPTConfig(**flags, global_n_kv_head=1)))
    assert '\n' not in str(e.value)


def test_gemma4_text_moe_block(tmp_path):
    """Gemma 4's MoE block: in every layer a dense GEGLU MLP beside GEGLU experts, each branch normalized on both
    sides, routed from the stream itself (a weightless norm, a learned scale, softmax top-k renormalized, a scale per
    expert): same logits, same greedy tokens, exported back."""
    hf = randomized(transformers.Gemma4ForCausalLM(gemma4_text(
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)), 22)
    cfg = check_parity(hf, tmp_path).config
    assert (cfg.mlp, cfg.n_expert, cfg.n_expert_active, cfg.expert_hidden, cfg.moe_dense_mlp, cfg.mlp_width) == (
        'moe', 4, 2, 16, True, 48)
