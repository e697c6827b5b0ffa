"""Qwen4-Exp (hf/qwen4_exp.py), its text model, both ways: transformers' Qwen4ExpForCausalLM (lm_head over
Qwen4ExpTextModel) against ours on a tiny random checkpoint built here: logits, greedy decoding through our cache,
the export back, each mapped part moving the logits, and what is refused."""

import pytest
import torch

from export import to_hf
from hf_tiny import (BLOCK, GPT, HF_FAMILIES, NEW, PROMPT, VOCAB, GPTConfig, check_export_choice, check_parity,
                     randomized, transformers)
from hf.tiny import EOS, qwen4_exp

pytestmark = pytest.mark.usefixtures('single_thread')

def build(config, seed=10):
    """The model, 1-d weights off their init (randomized: every (1 + w) gain, A_log, dt_bias) and the PLE
    convolutions (zeros at init) drawn, so a wrong mapping of any shows."""
    torch.manual_seed(0)
    hf = randomized(transformers.Qwen4ExpForCausalLM(config), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith('ple.conv1d.weight'):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return hf


def tokens(seed=1, length=PROMPT + NEW):
    """Two sequences with the eos among them (the n-grams restart after it)."""
    idx = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))
    idx[0, [3, 17, 18]] = EOS
    idx[1, length // 2 + 3] = EOS
    return idx


def test_qwen4_exp_text_model_both_ways(tmp_path):
    """Logits within 1e-5 of transformers' in fp32, greedy tokens through our cache equal to its generate, the
    export back to Qwen4ExpForCausalLM with the same logits (check_parity); and the flags it maps to."""
    hf = build(qwen4_exp())
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert cfg.layers == 'DG' and cfg.mlp == 'moe' and cfg.n_shared_expert == 1 and cfg.shared_expert_gate
    assert (cfg.hc_mult, cfg.hc_kind, cfg.hc_rank, cfg.hc_final) == (3, 'gated', 8, 'learned')
    assert (cfg.index_block_size, cfg.index_topk, cfg.index_block_pool, cfg.index_tail) == (2, 8, 'mean', 'keep')
    assert (cfg.index_q_norm, cfg.index_k_norm, cfg.index_head_weights) == (True, 'rms', False)
    assert (cfg.engram_layers, cfg.engram_eos, cfg.engram_rows, cfg.engram_dim) == ('0,2', EOS, 101, 16)
    assert cfg.rope_fraction == 0.5 and cfg.qk_norm and cfg.attn_gate
    idx = tokens()
    with torch.no_grad():
        diff = (ours(idx)[0] - hf(idx).logits).abs().max().item()
    print(f"qwen4_exp_text fp32 logits max abs diff: {diff:.2e}")
    assert diff < 1e-5


@torch.no_grad()
def test_each_part_of_qwen4_exp_moves_the_logits(tmp_path):
    """Each part the parity passes through changes the logits when undone, so the parity shows it mapped: the
    gated residual's spread scale, its per-copy norm gains, the last collapse's weights; QSA's picks (every key read
    instead), its query norm, its key norm, its unweighted heads; the n-gram memory and its eos restarts; the
    shared expert's gate; the (1 + w) gains."""
    hf = build(qwen4_exp())
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    idx = tokens(length=40)
    expected = ours(idx)[0]
    torch.testing.assert_close(expected, hf(idx).logits, atol=1e-5, rtol=0)
    state = ours.state_dict()

    def moved(flags=None, **changed):
        other = GPT(GPTConfig(**{**vars(ours.config), **(flags or {})})).eval()
        other.load_state_dict({k: v for k, v in {**state, **changed}.items() if k in other.state_dict()}, strict=False)
        return (other(idx)[0] - expected).abs().max().item()

    assert moved(dict(hc_post_scale=1.0)) > 1e-3
    assert moved(**{k: v.view(3, -1)[:1].expand(3, -1).flatten() for k, v in state.items()
                    if k.endswith('attn_hc.norm.weight')}) > 1e-3  # every copy the first copy's gains
    assert moved(**{k: torch.zeros_like(v) for k, v in state.items() if k.startswith('transformer.hc_head.up')}) > 1e-3
    assert moved(dict(index_topk=64)) > 1e-3
    assert moved(dict(index_q_norm=False)) > 1e-3
    assert moved(dict(index_k_norm='layernorm')) > 1e-3
    assert moved(dict(index_head_weights=True), **{f'transformer.h.{i}.attn.indexer.weights.weight':
                                                   torch.randn(16, 32) for i in (1, 3)}) > 1e-3
    assert moved(**{k: torch.zeros_like(v) for k, v in state.items() if k.startswith('transformer.engram_tables')}) \
        > 1e-3
    assert moved(dict(engram_eos=None)) > 1e-3
    assert moved(**{k: torch.zeros_like(v) for k, v in state.items() if k.endswith('shared_gate.weight')}) > 1e-3
    assert moved(**{k: v - 1 for k, v in state.items() if k.endswith('q_norm.weight')}) > 1e-3


@pytest.mark.parametrize('overrides, named', [
    (dict(output_gate_type='sigmoid'), "output_gate_type='sigmoid' is not supported"),
    (dict(seed=7), 'seed=7 is not supported'),
    (dict(attention_bias=True), 'attention_bias is not supported'),
    (dict(shared_expert_intermediate_size=24), 'shared_expert_intermediate_size=24 must be a positive multiple'),
])
def test_what_qwen4_exp_we_cannot_load_is_refused_in_one_line(overrides, named):
    with pytest.raises(ValueError) as e:
        HF_FAMILIES['qwen4_exp_text'].read_config(qwen4_exp(**overrides))
    assert named in str(e.value) and '\n' not in str(e.value)


QWEN4_FLAGS = dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, head_dim=8, n_kv_head=2,
                   norm='rms', mlp='moe', pos='rope', bias=False, layers='DG', qk_norm=True, attn_gate=True,
                   rope_fraction=0.5, n_expert=4, n_expert_active=2, moe_hidden=16, n_shared_expert=1,
                   router='softmax', shared_expert_gate=True, linear_n_key_head=2, linear_n_value_head=4,
                   linear_key_dim=8, linear_value_dim=8, hc_mult=3, hc_kind='gated', hc_rank=8, index_topk=4,
                   index_block_size=2, index_n_heads=16, index_head_dim=8, index_block_pool='mean', index_tail='keep',
                   index_local_blocks=0, index_q_norm=True, index_k_norm='rms', index_head_weights=False,
                   engram_layers='0', engram_ngram=3, engram_heads=2, engram_dim=16, engram_rows=101,
                   engram_eos=EOS, norm_eps=1e-6)


@pytest.mark.parametrize('flags, named', [
    (dict(), None),  # a model built here, not loaded: exported to qwen4_exp_text
    (dict(index_head_weights=True), 'index_head_weights=True'),
    (dict(hc_post_scale=1.5), 'hc_post_scale=1.5'),
])
def test_export_picks_qwen4_exp_or_names_what_it_cannot_carry(flags, named):
    config = GPTConfig(**{**QWEN4_FLAGS, **flags})
    check_export_choice(config, 'qwen4_exp_text', named)
    if named is not None:
        return
    torch.manual_seed(0)
    ours = GPT(config).eval()
    with torch.no_grad():
        for name, t in ours.named_parameters():  # off their init: gains, convolutions
            if t.dim() == 1 or name.endswith('engram.conv.weight'):
                t.add_(0.3 * torch.randn_like(t))
        idx = tokens(seed=3, length=24)
        hf = to_hf(ours)
        assert hf.config.eos_token_id == EOS
        torch.testing.assert_close(hf(idx).logits, ours(idx)[0], atol=1e-5, rtol=0)
