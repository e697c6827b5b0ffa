"""DeepSeek-V4 (hf/deepseek_v4.py), both ways: its three kinds of layers (sliding, heavily compressed, compressed
sparse with its indexer), hash and learned routing."""
import math


import pytest
import torch

from export import hf_family, to_hf
from hf import HF_FAMILIES
from chapters.deepseek_v4 import hash_table
from hf_tiny import BLOCK, GPT, PROMPT, VOCAB, WINDOW, GPTConfig, check_parity, randomized, transformers
from hf.tiny import deepseek_v4

pytestmark = pytest.mark.usefixtures('single_thread')


def three_kinds(**overrides):
    """deepseek_v4() with a sliding, a heavily compressed (an entry per 8 tokens) and a compressed sparse layer (an
    entry per 4 tokens pooled over 8; its indexer of 8 heads of 12, their last 8 dims rotated, keeping 3 entries: fewer than the 10 of the test's 40 positions); the compressed layers' RoPE base 1000 with
    YaRN (stretched 4 times past 16 positions), the sliding layers' 10000."""
    args = dict(num_hidden_layers=3, layer_types=['sliding_attention', 'heavily_compressed_attention',
                                                  'compressed_sparse_attention'],
                mlp_layer_types=['hash_moe', 'moe', 'moe'],
                compress_rates={'compressed_sparse_attention': 4, 'heavily_compressed_attention': 8}, index_topk=3,
                index_n_heads=8, index_head_dim=12, rope_theta=10000.0, compress_rope_theta=1000.0,
                rope_parameters={'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 16})
    return deepseek_v4(**{**args, **overrides})


def randomized_v4(hf, seed):
    """randomized() (norm gains, sinks, the balancing bias, the hyper-connections' biases and scales away from their
    constants), every matrix 4 times its init, so the clamps, the sinks and the copies' mixing act, and what
    transformers' init leaves constant random too: the hash tables (zeros; k distinct experts per token id here) and
    the compressors' position biases (zeros)."""
    randomized(hf, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith('position_bias'):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() > 1:
                p.mul_(4.0)
        for name, b in hf.named_buffers():
            if name.endswith('tid2eid'):
                b.copy_(hash_table(b.size(0), hf.config.n_routed_experts, b.size(1), g))
    return hf


def parity(hf_config, tmp_path):
    """check_parity on a randomized_v4 model of hf_config, the logits closer than it asks (1.6e-6 at most here,
    logits up to 2.0): our model."""
    torch.manual_seed(0)
    hf = randomized_v4(transformers.DeepseekV4ForCausalLM(hf_config), 11)
    ours = check_parity(hf, tmp_path)
    idx = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    assert torch.equal(ours.transformer.h[0].mlp.tid2eid, hf.model.layers[0].mlp.gate.tid2eid)
    return ours


@pytest.mark.parametrize('scoring', ['sqrtsoftplus', 'sigmoid'])
def test_deepseek_v4_sliding_layers(scoring, tmp_path):
    cfg = parity(deepseek_v4(scoring_func=scoring), tmp_path).config
    assert (cfg.attn, cfg.q_rank, cfg.o_groups, cfg.o_lora_rank, cfg.rope_dim, cfg.head_size) == \
        ('shared_kv', 8, 2, 8, 8, 16)
    assert cfg.layer_kinds == ['L', 'L'] and cfg.sliding_window == WINDOW and cfg.attn_sinks
    assert cfg.router_score == (scoring if scoring == 'sqrtsoftplus' else None) and cfg.swiglu_form == 'plain'
    assert (cfg.hc_mult, cfg.hc_kind, cfg.hc_final) == (4, 'mhc', 'learned') and cfg.hash_moe_layers == 1
    # the cache keeps the one key-value head, its window of it: 16 numbers per token and layer
    assert GPT(cfg).kv_cache_bytes(1, PROMPT) == 2 * WINDOW * 16 * 4


@pytest.mark.parametrize('scoring', ['sqrtsoftplus', 'sigmoid'])
def test_deepseek_v4_three_kinds_of_layers(scoring, tmp_path):
    ours = parity(three_kinds(scoring_func=scoring), tmp_path)
    cfg = ours.config
    assert cfg.layer_kinds == ['L', 'H', 'I'] and (cfg.hca_rate, cfg.csa_rate, cfg.csa_topk) == (8, 4, 3)
    assert (cfg.csa_index_heads, cfg.csa_index_dim, cfg.hash_moe_layers) == (8, 12, 1)
    # the compressed layers' table is the model's, its YaRN without the attention factor; the sliding layers' own
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_length) == (1000.0, 'yarn', 4.0, 16)
    assert (cfg.rope_attention_factor, cfg.rope_local_theta) == (1.0, 10000.0)
    # per sequence, in numbers: the sliding layer its window of the one head; the HCA layer that, an entry per 8
    # tokens and 8 pending tokens' candidates and gates; the CSA layer that, its entries and its indexer's (12 wide),
    # 4 pending tokens' both halves and the last complete window's first halves
    L, hs, d = PROMPT, 16, 12
    sliding, hca = WINDOW * hs, WINDOW * hs + math.ceil(L / 8) * hs + 2 * 8 * hs
    csa = WINDOW * hs + math.ceil(L / 4) * (hs + d) + 6 * 4 * (hs + d)
    assert ours.kv_cache_bytes(1, L) == 4 * (sliding + hca + csa)


@torch.no_grad()
def test_each_randomized_part_moves_the_logits(tmp_path):
    """Put back at transformers' constant init, each part the parity test randomized changes the logits: the sinks,
    the balancing bias, the hyper-connections' biases and scales, the head's, the hash table, the compressors'
    position biases (the attention's and the indexer's); and the indexer's picks (all entries read instead)."""
    torch.manual_seed(0)
    hf = randomized_v4(transformers.DeepseekV4ForCausalLM(three_kinds()), 11)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    idx = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    expected = ours(idx)[0]
    for suffix, constant in (('attn.sinks', 0.0), ('mlp.expert_bias', 0.0), ('hc.base', 0.0), ('hc.scale', 1.0),
                             ('hc_base', 0.0), ('hc_scale', 1.0), ('mlp.tid2eid', 0),
                             ('attn.compress.position_bias', 0.0), ('indexer.compress.position_bias', 0.0)):
        state = ours.state_dict()
        changed = {k: torch.full_like(v, constant) for k, v in state.items() if k.endswith(suffix)}
        assert changed, suffix
        other = GPT(ours.config).eval()
        other.load_state_dict({**state, **changed})
        assert (other(idx)[0] - expected).abs().max() > 1e-3, suffix
    dense = GPT(GPTConfig(**{**vars(ours.config), 'csa_topk': 100})).eval()
    dense.load_state_dict(ours.state_dict())
    assert (dense(idx)[0] - expected).abs().max() > 1e-3, 'csa_topk'



def test_deepseek_v4s_own_layout_without_a_sliding_layer(tmp_path):
    """transformers' default layout has no sliding layer (compressed layers only, each keeping its window beside
    its entries): it loads, its logits and greedy tokens are transformers', and it exports back."""
    ours = parity(three_kinds(num_hidden_layers=2, layer_types=['heavily_compressed_attention',
                                                                'compressed_sparse_attention'],
                              mlp_layer_types=['hash_moe', 'moe']), tmp_path)
    assert ours.config.layer_kinds == ['H', 'I'] and ours.config.sliding_window == WINDOW

@pytest.mark.parametrize('overrides, named', [
    (dict(mlp_layer_types=['moe', 'hash_moe']), "only the first layers 'hash_moe'"),
])
def test_what_deepseek_v4_we_cannot_load_is_refused_in_one_line(overrides, named, tmp_path):
    transformers.DeepseekV4ForCausalLM(deepseek_v4(**overrides)).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as e:
        GPT.from_pretrained(str(tmp_path))
    assert named in str(e.value) and '\n' not in str(e.value)


V4_FLAGS = dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, head_dim=16, norm='rms', pos='rope',
                bias=False, attn='shared_kv', attn_sinks=True, q_rank=8, o_groups=2, o_lora_rank=8, rope_fraction=0.5,
                sliding_window=WINDOW, mlp='moe', n_expert=4, moe_hidden=16, n_shared_expert=1, router='sigmoid',
                router_score='sqrtsoftplus', swiglu_limit=10.0, swiglu_form='plain', hc_mult=4, hash_moe_layers=1)


# its three kinds of layers built here: the compressed layers' table YaRN-stretched, the sliding layers' their own
THREE_KINDS = dict(n_layer=3, layers='LHI', hca_rate=8, csa_rate=4, csa_topk=3, csa_index_heads=4, csa_index_dim=12,
                   rope_theta=1000.0, rope_local_theta=10000.0, rope_scaling='yarn', rope_factor=4.0,
                   rope_original_length=16, rope_attention_factor=1.0)


@pytest.mark.parametrize('flags, named', [
    (dict(), None),  # a model built here, not loaded: exported to deepseek_v4
    (THREE_KINDS, None),
    (dict(attn_sinks=False), 'attn_sinks=False'),
    (dict(q_rank=None), 'q_rank=None'),
    (dict(o_groups=1, o_lora_rank=None), 'o_lora_rank=None'),
    (dict(swiglu_form='gpt-oss'), "swiglu_form='gpt-oss'"),
    (dict(hc_kind='ihc'), "hc_kind='ihc'"),
])
def test_export_picks_deepseek_v4_or_names_what_it_cannot_carry(flags, named):
    """A model built here (not loaded) goes to deepseek_v4 with the same logits; one lacking a part transformers'
    always has is refused in one line naming it."""
    config = GPTConfig(**{**V4_FLAGS, **flags})
    if named is None:
        assert hf_family(config).model_type == 'deepseek_v4'
        torch.manual_seed(0)
        ours = GPT(config).eval()
        with torch.no_grad():
            for name, t in ours.named_buffers():  # the balancing bias away from zero
                if name.endswith('expert_bias'):
                    t.normal_()
            for name, p in ours.named_parameters():  # and the compressors' position biases
                if name.endswith('position_bias'):
                    p.normal_()
            idx = torch.randint(0, VOCAB, (2, 3 * WINDOW), generator=torch.Generator().manual_seed(3))
            torch.testing.assert_close(to_hf(ours)(idx).logits, ours(idx)[0], atol=1e-5, rtol=0)
        return
    assert HF_FAMILIES['deepseek_v4'].blocking(config) == [named]
    with pytest.raises(ValueError, match='no Hugging Face family can represent') as e:
        hf_family(config)
    assert '\n' not in str(e.value)


def test_export_refuses_rope_scaling_on_the_sliding_layers():
    """transformers' sliding layers rotate by their base alone: a model whose local layers share the scaled table (no
    rope_local_theta) is refused in one line."""
    config = GPTConfig(**{**V4_FLAGS, **THREE_KINDS, 'rope_local_theta': None})
    with pytest.raises(ValueError, match='sliding layers take no RoPE scaling') as e:
        to_hf(GPT(config))
    assert '\n' not in str(e.value)
