"""Tests for chapters/engram.py: the hashed n-gram tables and one memory layer against transformers' Qwen4-Exp
modules on the same weights, the prime table sizes, a model with the memory (causal, decoding without the cache past
block_size through the cache, which keeps the last tokens and the convolution's inputs), FLOPs as torch counts them, parameters written out,
training moves every part, export and bad settings refused in one line."""
from types import SimpleNamespace

import pytest
import torch

from chapters import engram
from tiny_models import BLOCK, N_EMBD, VOCAB, build, check_causal, counted_training_flops, reference_greedy, \
    tiny_config, train_steps

pytestmark = pytest.mark.usefixtures('single_thread')

MODERN = dict(n_layer=3, norm='rms', mlp='swiglu', pos='rope', n_kv_head=2, bias=False)
MEMORY = dict(engram_layers='0,-1', engram_ngram=3, engram_heads=2, engram_dim=16, engram_rows=101)


def randomized(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def qwen4_exp_config(**extra):
    """What Qwen4-Exp's n-gram modules read of their config (its own validation wants hyper-connections: hc_count
    1 is the plain stream, which only these modules alone can be built with)."""
    return SimpleNamespace(**{**dict(vocab_size=VOCAB, eos_token_id=VOCAB, ngram_size=3, heads_per_ngram=2, seed=1234,
                                     ngram_vocab_size_base=101, make_ngram_vocab_size_divisible_by=128,
                                     hidden_size=N_EMBD, hc_count=1, ple_embed_dim=16, ple_conv_kernel_size=4,
                                     rms_norm_eps=1e-5), **extra})


@torch.no_grad()
def test_the_tables_hash_as_qwen4_exps_n_gram_embedding():
    """Each memory layer's rows are Qwen4-Exp's for a sequence without its eos (ours stands the id vocab_size before
    the first token, as an eos of vocab_size does there): the same multipliers, primes and offsets."""
    pytest.importorskip('transformers')
    from transformers.models.qwen4_exp import modeling_qwen4_exp as Q
    config = tiny_config(**MODERN, **MEMORY)
    idx = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    for index in (0, 1):
        ours = randomized(engram.EngramTable(config, index), 2)
        theirs = Q.Qwen4ExpTextNGramEmbedding(qwen4_exp_config(), 16, layer_idx=0, ple_layer_index=index)
        assert theirs.head_vocab_sizes == ours.sizes.tolist() and ours.sizes.tolist() == \
            engram.primes_from(101, 4 * index, 4)
        theirs.ngram_embedding.weight[:ours.num_embeddings] = ours.weight
        assert torch.equal(ours(idx), theirs(idx, None))


@torch.no_grad()
def test_a_memory_layer_is_qwen4_exps_on_the_same_weights():
    """Gate from the normalized key and stream, signed square root, sigmoid; the causal dilated depthwise
    convolution of the normalized gated value through SiLU added: Qwen4-Exp's PLE layer (its norms' gains are
    1 + w)."""
    pytest.importorskip('transformers')
    from transformers.models.qwen4_exp import modeling_qwen4_exp as Q
    config = tiny_config(**MODERN, **MEMORY)
    table, ours = randomized(engram.EngramTable(config, 0), 3), randomized(engram.EngramBranch(config), 4)
    theirs = Q.Qwen4ExpTextPLELayer(qwen4_exp_config(), layer_idx=0, ple_layer_index=0)
    theirs.ple_embedding.ngram_embedding.weight[:table.num_embeddings] = table.weight
    for name in ('key_proj', 'value_proj'):
        getattr(theirs, name).weight.copy_(getattr(ours, name).weight)
    for name in ('norm_key', 'norm_query', 'norm_conv'):
        getattr(theirs, name).weight.copy_(getattr(ours, name).weight - 1)
    theirs.conv1d.weight.copy_(ours.conv.weight)
    x = torch.randn(2, 11, N_EMBD, generator=torch.Generator().manual_seed(5))
    idx = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(ours(x, table(idx)) - x, theirs(x, idx, None), rtol=0, atol=1e-5)


@torch.no_grad()
def test_with_engram_eos_the_tables_restart_after_each_eos_as_qwen4_exps():
    """engram_eos: that id before the first token, and every n-gram restarted after an eos (the tokens before it
    replaced by the eos): Qwen4-Exp's rows for sequences with its eos in them, eos runs and an eos first included."""
    pytest.importorskip('transformers')
    from transformers.models.qwen4_exp import modeling_qwen4_exp as Q
    config = tiny_config(**MODERN, **MEMORY, engram_eos=5)
    idx = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(11))
    idx[0, [0, 4, 5, 9]] = 5
    idx[1, [1, 11]] = 5
    for index in (0, 1):
        ours = randomized(engram.EngramTable(config, index), 12)
        theirs = Q.Qwen4ExpTextNGramEmbedding(qwen4_exp_config(eos_token_id=5), 16, layer_idx=0,
                                              ple_layer_index=index)
        theirs.ngram_embedding.weight[:ours.num_embeddings] = ours.weight
        assert torch.equal(ours(idx), theirs(idx, None))
        plain = engram.EngramTable(tiny_config(**MODERN, **MEMORY), index)
        assert not torch.equal(plain.ids(idx), ours.ids(idx))  # the switch changes the rows read


@torch.no_grad()
def test_a_memory_layer_gates_each_copy_of_a_hyper_connected_stream_as_qwen4_exps():
    """With hc_mult copies: a key per copy (key_proj n*d wide), grouped norms with each copy's own gains, the value
    shared, the convolution over all copies' channels: Qwen4-Exp's PLE layer with hc_count 3."""
    pytest.importorskip('transformers')
    from transformers.models.qwen4_exp import modeling_qwen4_exp as Q
    config = tiny_config(**MODERN, **MEMORY, hc_mult=3, hc_kind='gated')
    table, ours = randomized(engram.EngramTable(config, 0), 13), randomized(engram.EngramBranch(config), 14)
    assert ours.key_proj.weight.shape == (3 * N_EMBD, 16) and ours.conv.weight.shape == (3 * N_EMBD, 1, 4)
    theirs = Q.Qwen4ExpTextPLELayer(qwen4_exp_config(hc_count=3), layer_idx=0, ple_layer_index=0)
    theirs.ple_embedding.ngram_embedding.weight[:table.num_embeddings] = table.weight
    for name in ('key_proj', 'value_proj'):
        getattr(theirs, name).weight.copy_(getattr(ours, name).weight)
    for name in ('norm_key', 'norm_query', 'norm_conv'):
        getattr(theirs, name).weight.copy_(getattr(ours, name).weight - 1)
    theirs.conv1d.weight.copy_(ours.conv.weight)
    x = torch.randn(2, 11, 3, N_EMBD, generator=torch.Generator().manual_seed(15))
    idx = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(16))
    expected = theirs(x.flatten(2), idx, None).view_as(x)
    torch.testing.assert_close(ours(x, table(idx)) - x, expected, rtol=0, atol=1e-5)


@torch.no_grad()
def test_a_model_with_the_memory_on_copies_and_an_eos_decodes_through_the_cache():
    """A memory at layer 0 and the last, on gated copies (made before the memory adds to them), with engram_eos
    in the prompt and the continuation: cached decoding is full forwards', and the cache keeps each layer's
    convolution inputs for every copy."""
    flags = dict(**MODERN, **MEMORY, hc_mult=3, hc_kind='gated', engram_eos=3)
    model = randomized(build(**flags), 17)
    for p in model.parameters():
        p.mul_(0.5)
    check_causal(model)
    prompt = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(18))
    prompt[:, 2] = 3
    cached = model.generate(prompt, 2 * BLOCK, temperature=0)
    assert torch.equal(cached, reference_greedy(model, prompt, 2 * BLOCK))
    reach = (model.config.engram_conv - 1) * model.config.engram_ngram
    assert model.transformer.h[0].engram.conv.weight.size(0) == 3 * N_EMBD
    assert model.kv_cache_bytes(1, 10) - build(**{k: v for k, v in flags.items() if not k.startswith('engram')}) \
        .kv_cache_bytes(1, 10) == 2 * 8 + 2 * reach * 3 * N_EMBD * 4


@torch.no_grad()
def test_a_model_with_the_memory_decodes_through_the_cache_as_full_forwards():
    """The cache keeps the last engram_ngram - 1 tokens and each memory layer's convolution's last inputs: cached
    decoding and the compiled step are full forwards' past block_size, and the states are in the cache's bytes."""
    model = randomized(build(**MODERN, **MEMORY), 7)
    check_causal(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(8))
    cached = model.generate(prompt, 2 * BLOCK, temperature=0)
    assert torch.equal(cached, model.generate(prompt, 2 * BLOCK, temperature=0, use_cache=False))
    assert torch.equal(cached, reference_greedy(model, prompt, 2 * BLOCK))
    c = model.config
    reach = (c.engram_conv - 1) * c.engram_ngram
    states = 2 * ((c.engram_ngram - 1) * 8 + 2 * reach * c.n_embd * 4)  # two sequences: ids, two layers' inputs
    assert model.kv_cache_bytes(2, 10) == build(**MODERN).kv_cache_bytes(2, 10) + states
    model.compile_decoding(backend='aot_eager')
    assert torch.equal(model.generate(prompt, 2 * BLOCK, temperature=0), cached)


def test_flops_parameters_and_training(monkeypatch):
    """The projections are Linears (FLOPs), the tables lookups (parameters, no FLOPs), the convolution's products
    elementwise (neither counts them); training moves every part."""
    model, plain = build(**MODERN, **MEMORY), build(**MODERN)
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(9))
    assert model.flops_per_token(seq_len=12) * 2 * 12 == counted_training_flops(model, idx, monkeypatch)
    projections = 2 * 16 * N_EMBD
    assert model.flops_per_token(12) == plain.flops_per_token(12) + 2 * 6 * projections
    tables = sum(engram.primes_from(101, 0, 8)) * 4  # two layers of 4 heads, rows 16 / 4 wide
    branch = projections + 3 * N_EMBD + N_EMBD * 4  # projections, three norms' gains, the kernel of 4 per channel
    assert model.get_num_params() == plain.get_num_params() + tables + 2 * branch
    model = build(**MODERN, **MEMORY)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if 'engram' in name}
    assert len(before) == 2 + 2 * 6
    losses = train_steps(model, seed=10)
    assert losses[-1] < losses[0] - 0.5
    params = dict(model.named_parameters())
    assert [name for name, p in before.items() if torch.equal(p, params[name])] == []


def test_a_memory_model_of_no_family_is_refused_naming_qwen4_exp():
    """Only qwen4_exp_text carries the memory (with its copies, MoE and QSA): export names it and what else it needs."""
    pytest.importorskip('transformers')
    from export import hf_family
    with pytest.raises(ValueError) as e:
        hf_family(tiny_config(**MODERN, **MEMORY))
    message = str(e.value)
    assert "engram_layers='0,-1'" in message and 'carried by qwen4_exp_text' in message and '\n' not in message


@pytest.mark.parametrize('overrides, message', [
    (dict(engram_layers='3'), "engram_layers must be None or layer numbers in [-3, 2]"),
    (dict(engram_heads=3), "engram_heads=3 shape the n-gram memory: set engram_layers"),
    (dict(engram_layers='1', engram_ngram=1), "engram_ngram must be an int >= 2, got 1"),
    (dict(engram_layers='1', engram_heads=3), "engram_dim=32 must be a multiple of (engram_ngram-1)*engram_heads=6"),
    (dict(engram_layers='1', engram_rows=1), "engram_rows must be an int >= 2"),
    (dict(engram_layers='1', engram_conv=0), "engram_conv must be an int >= 1"),
    (dict(engram_layers='1', norm_position='post'), "norm_position='post' normalizes"),
    (dict(engram_layers='1', engram_eos=VOCAB), "engram_eos must be None or a token id in [0, vocab_size-1="),
    (dict(engram_eos=1), "engram_eos=1 shape the n-gram memory: set engram_layers"),
])
def test_bad_settings_are_one_line(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**{**MODERN, **overrides})
    assert message in str(e.value) and '\n' not in str(e.value)
