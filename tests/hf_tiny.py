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
from hf.tiny import BLOCK, VOCAB, WINDOW, deepseek, randomized, randomized_experts, tiny  # noqa: E402,F401
import model as M  # noqa: E402,F401  (re-exported, as GPT and GPTConfig below)
from export import to_hf  # noqa: E402
from tiny_models import check_autocast_backward  # noqa: E402
from chapters import GPT, GPTConfig  # noqa: E402,F401  (the tests of the families import them from here)

PROMPT, NEW = 10, 30  # 40 positions: past every window and original length below, inside BLOCK


def check_parity(hf, path, seed=0, family=None):
    """Save hf, load it into our GPT and compare logits, greedy decoding and the export back (to the family
    export picks, or to `family`); then the imported model trains a step under bf16 and fp16 autocast."""
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
    for dtype in (torch.bfloat16, torch.float16):  # train.py's --dtype on a CPU (fp16: an older GPU's default)
        check_autocast_backward(ours, dtype)
    return ours


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
