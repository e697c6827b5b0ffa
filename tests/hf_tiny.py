"""What the tests of the Hugging Face families (tests/test_hf_*.py) share: tiny random checkpoints built here and
saved locally load with logits equal to transformers' (fp32, 1e-4), greedy decoding token-identical to
transformers' generate, and export back to the same class (check_parity). Each family's shapes exercise its
features (a window shorter than the test sequence, an original RoPE length shorter than it, head_dim different
from n_embd / n_head). Imported, it skips the module that imports it where transformers is missing."""

import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip('transformers')

from hf import HF_FAMILIES  # noqa: E402
import model as M  # noqa: E402,F401  (re-exported, as GPT and GPTConfig below)
from export import to_hf  # noqa: E402
from chapters import GPT, GPTConfig  # noqa: E402,F401  (the tests of the families import them from here)

VOCAB, BLOCK = 96, 64
PROMPT, NEW = 10, 30  # 40 positions: past every window and original length below, inside BLOCK

WINDOW = 8  # shorter than PROMPT + NEW


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


YARN_DEEPSEEK = {'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 4.0, 'original_max_position_embeddings': 16,
                 'mscale': 1.0, 'mscale_all_dim': 0.707}


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
        assert HF_FAMILIES[family].blocking(config) == [refused]
