"""
The Hugging Face families: which transformers architectures our GPT can be loaded from and exported to, and
how their configs and weight names map onto GPTConfig's flags and our parameter names. model.py is the model;
this package only translates, so adding a family is a change here alone: a module that fills in an HFFamily
(hf/engine.py says what each field means), registers it at its bottom, and is imported below at its place in
the order export tries the families. Entry points: GPT.from_pretrained (model.py, which calls from_pretrained
below) and export.to_hf.
"""

from .engine import ANY, HF_FAMILIES, HFFamily, from_pretrained, hf_to_ours, ours_to_hf, refusal  # noqa: F401

# the order export tries the families in: the first that carries every flag of a model is used (where two carry
# the same flags, as qwen3_next and qwen3_5_text do, the earlier), so a new family goes at the end
from . import gpt2, llama, gemma3, olmo, smollm3, llama_moe, deepseek, gpt_oss  # noqa: F401
from . import glm4_moe, minimax_m2, deepseek_v32, qwen3_next, kimi_linear, olmo_hybrid  # noqa: F401
from . import nanochat, llama4, lfm2, nemotron_h, gemma4, deepseek_v4, hy_v4, bailing_hybrid  # noqa: F401
from . import glm5_next, minimax_m3_vl, qwen4_exp  # noqa: F401
