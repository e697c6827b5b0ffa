"""Llama, Mistral, Qwen2, Qwen3 (hf/llama.py), both ways."""

import pytest

from hf_tiny import GPT, LLAMA3, NEW, PROMPT, ROPES, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


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
