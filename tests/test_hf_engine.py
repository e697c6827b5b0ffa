"""The engine of hf/ (hf/engine.py, hf/shared.py): the weights a family's table leaves unused, RoPE read
from a config, a damaged or unsafe checkpoint, and the family export chooses, or why none."""

import pytest
import torch

import common.checkpoints
from export import hf_family, to_hf
from hf import HF_FAMILIES, hf_to_ours
from hf.llama import _llama_read
from hf_tiny import BLOCK, GPT, M, ROPES, VOCAB, GPTConfig, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def test_export_tries_the_families_in_the_order_hf_py_had():
    """hf/__init__.py imports the family modules, each registering at its bottom: the order export tries them in
    (the first that carries every flag wins) is the one the single hf.py listed them in."""
    assert list(HF_FAMILIES) == [
        'gpt2', 'llama', 'mistral', 'qwen2', 'qwen3', 'gemma3_text', 'olmo2', 'olmo3', 'smollm3', 'mixtral',
        'qwen3_moe', 'deepseek_v3', 'deepseek_v2', 'gpt_oss', 'glm4_moe', 'minimax_m2', 'deepseek_v32', 'glm_moe_dsa',
        'qwen3_next', 'qwen3_5_text', 'kimi_linear', 'olmo_hybrid', 'nanochat', 'llama4_text', 'lfm2', 'nemotron_h',
        'gemma4_text', 'deepseek_v4', 'hy_v4', 'bailing_hybrid', 'glm5_next', 'minimax_m3_vl_text',
        'qwen4_exp_text']
    assert all(name == family.model_type for name, family in HF_FAMILIES.items())


def test_a_checkpoint_feature_we_lack_is_refused_not_dropped(tmp_path):
    """A Llama checkpoint with a q_norm weight we would not use: refused, naming it."""
    hf = transformers.LlamaForCausalLM(tiny(transformers.LlamaConfig))
    state = hf.state_dict()
    ours = GPT(GPTConfig(**_llama_read(hf.config)))
    state['model.layers.0.self_attn.q_norm.weight'] = torch.ones(8)
    _, unused = hf_to_ours(state, ours, HF_FAMILIES['llama'])
    assert unused == {'model.layers.0.self_attn.q_norm.weight'}


@pytest.mark.parametrize('rope', ['linear', 'dynamic', 'yarn', 'yarn-mscale', 'yarn-untruncated', 'llama3'])
@pytest.mark.parametrize('length', [12, 40, 100])
def test_rope_frequencies_equal_transformers(rope, length):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    hf_config = tiny(transformers.LlamaConfig, max_position_embeddings=24, rope_parameters=dict(ROPES[rope]))
    ours = GPTConfig(**{**_llama_read(hf_config), 'n_kv_head': 2})
    inv, factor = ours.rope_frequencies(8, ours.rope_theta, length)
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS[ROPES[rope]['rope_type']](hf_config, 'cpu', torch.tensor(length))
    torch.testing.assert_close(inv, hf_inv.float(), atol=0, rtol=1e-6)
    assert factor == pytest.approx(hf_factor, rel=1e-12)


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
        common.checkpoints.load_pretrained(str(hf_dir))
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith('error: cannot load'), lines
    assert fragment in lines[0] and str(hf_dir) in lines[0]
    assert not ran.exists()
    assert not recwarn.list, [str(w.message) for w in recwarn]  # a warning would print a line of its own


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
    (dict(n_layer=2, n_head=4, n_embd=32, mlp='relu2'), None, "mlp='relu2'"),  # nanochat's, with its other flags
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


MODERN_TINY = dict(n_layer=4, n_head=4, n_embd=32, vocab_size=VOCAB, block_size=BLOCK, norm='rms', mlp='swiglu',
                   n_kv_head=2, pos='rope')  # swap_flags('modern'): bias stays on


@pytest.mark.parametrize('flags, says', [
    # issue #49: the family that does carry the flag, and what else it needs, not two families that cannot
    (dict(index_topk=16), "index_topk=16 is carried by deepseek_v32 and glm_moe_dsa, which also need bias=False, "
                          "attn='mla', n_kv_head=None, q_lora_rank other than None"),
    (dict(layers='KSVG'), "none carries layers='KSVG'"),
    (dict(mtp_depth=2), 'none carries mtp_depth=2'),
    (dict(layers='KG'), "layers='KG' is carried by kimi_linear, which also needs bias=False, attn='mla', "
                        "n_kv_head=None, pos='none'"),
    # two flags one family carries together: named together, not each with the family that lacks the other
    (dict(layers='LG', sliding_window=8), "layers='LG', sliding_window=8 are carried by olmo3, which also needs "
                                          "bias=False, norm_position='after', qk_norm=True, qk_norm_all_heads=True"),
    # a flag left at its default that the nearest family needs turned on
    ({**GPT_OSS_FLAGS, 'swiglu_limit': None}, 'the nearest, gpt_oss, cannot carry swiglu_limit=None (it needs '
                                              'swiglu_limit other than None)'),
], ids=['index_topk', 'KSVG', 'mtp', 'kda', 'local-layers', 'gpt_oss-unclamped'])
def test_no_family_is_one_line_naming_what_carries_the_flag_and_what_else_it_needs(flags, says):
    with pytest.raises(ValueError) as e:
        hf_family(GPTConfig(**{**MODERN_TINY, **flags}))
    assert str(e.value) == 'no Hugging Face family can represent this model: ' + says
