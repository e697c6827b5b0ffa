"""HY-V4 (hf/hy_v4.py), both ways: MLA with sinks and an output gate, a lightning indexer shared by the next
layer, dense first layers then experts whose SwiGLU alone is clamped, independent hyper-connections."""

import pytest
import torch

from export import to_hf
from hf.engine import _TRANSFORMS
from hf_tiny import (BLOCK, GPT, VOCAB, YARN_DEEPSEEK, GPTConfig, check_export_choice, check_parity, deepseek, randomized,
                     transformers)

pytestmark = pytest.mark.usefixtures('single_thread')


def hy_v4(**overrides):
    """A tiny HY-V4: DeepSeek-V3's tiny MLA (4 heads, latent 16, 4 rotated dims of 12) with a query bottleneck of
    16; an indexer of 16 heads of 8 (its last 4 dims rotated) keeping 6 tokens of the test's 40, the second of 3
    layers reusing the first's picks (with 8 heads, a key every head's ReLU zeroes, a tie, came at some top-k's edge
    in 2 of 6 inputs, where transformers' top-k keeps other tokens than ours; with 16, in none of 20); the first
    layer dense, then 4 experts of 16 (2 a token, in 2 groups), the routed experts' SwiGLU clamped at 0.1 (so it
    acts on these small weights); 4 copies of the stream; rms_norm_eps 1e-5 (not the latents' 1e-6, so the
    indexer's key norm shows it reads the model's); no padding token (its embedding row would be zero, and a zero
    query scores every key 0: a tie again)."""
    args = dict(q_lora_rank=16, index_topk=6, index_n_heads=16, index_head_dim=8, num_hidden_layers=3,
                mlp_layer_types=['dense', 'sparse', 'sparse'], indexer_types=['full', 'shared', 'full'], hc_mult=4,
                swiglu_limit=0.1, rms_norm_eps=1e-5, first_k_dense_replace=None, pad_token_id=None)
    return deepseek(transformers.HYV4Config, True, **{**args, **overrides})


def randomized_hy(hf, seed=8):
    """randomized() (norm gains, sinks, the balancing bias, the hyper-connections' biases and scales away from their
    constants) and every matrix 4 times its init, so the clamp, the sinks and the gates act."""
    randomized(hf, seed)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return hf


def parity(hf_config, tmp_path):
    """check_parity on a randomized_hy model, the logits closer than it asks (max error 1.8e-7 here, logits up to
    0.6): our model."""
    torch.manual_seed(0)
    hf = randomized_hy(transformers.HYV4ForCausalLM(hf_config))
    ours = check_parity(hf, tmp_path)
    idx = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-5, rtol=0)
    return ours


@pytest.mark.parametrize('rope', [None, YARN_DEEPSEEK], ids=['rope', 'yarn'])
def test_hy_v4_loads_decodes_and_exports_with_parity(rope, tmp_path):
    extra = {'rope_parameters': dict(rope)} if rope else {}
    cfg = parity(hy_v4(**extra), tmp_path).config
    assert (cfg.attn, cfg.q_lora_rank, cfg.attn_sinks, cfg.attn_gate) == ('mla', 16, True, True)
    assert (cfg.index_topk, cfg.index_n_heads, cfg.index_head_dim, cfg.index_share) == (6, 16, 8, 'FS')
    assert cfg.index_norm_eps == cfg.norm_eps == 1e-5
    assert (cfg.mlp, cfg.first_dense_layers, cfg.swiglu_limit, cfg.swiglu_form) == ('moe', 1, 0.1, 'plain_routed')
    assert (cfg.hc_mult, cfg.hc_kind, cfg.hc_post_eps, cfg.hc_final) == (4, 'ihc', True, 'learned')
    if rope:
        assert (cfg.rope_scaling, cfg.rope_factor, cfg.yarn_mscale_all_dim) == ('yarn', 4.0, 0.707)


@torch.no_grad()
def test_each_part_of_hy_v4_moves_the_logits(tmp_path):
    """Each part the parity test passes through changes the logits when taken away, so the parity shows it mapped:
    the sinks, the output gate, the spread weights' epsilon (a large one here), the clamp of the routed experts,
    the shared expert left unclamped, the indexer's picks, and the rows its attention and its indexer rotate in
    pairs reordered to our halves (read as halves, as transformers 5.24 read them, they move the logits)."""
    torch.manual_seed(0)
    hf = randomized_hy(transformers.HYV4ForCausalLM(hy_v4(hc_eps=0.1)))
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    idx = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    expected = ours(idx)[0]
    torch.testing.assert_close(expected, hf(idx).logits, atol=1e-5, rtol=0)
    state = ours.state_dict()

    def moved(flags=None, **changed):
        other = GPT(GPTConfig(**{**vars(ours.config), **(flags or {})})).eval()
        other.load_state_dict({k: v for k, v in {**state, **changed}.items() if k in other.state_dict()})
        return (other(idx)[0] - expected).abs().max().item()

    assert moved(**{k: torch.zeros_like(v) for k, v in state.items() if k.endswith('attn.sinks')}) > 1e-3
    assert moved(dict(attn_gate=False)) > 1e-3
    assert moved(dict(hc_post_eps=False)) > 1e-3
    assert moved(dict(swiglu_limit=100.0)) > 1e-3
    assert moved(dict(swiglu_form='plain')) > 1e-3
    assert moved(dict(index_topk=100)) > 1e-3

    def theirs(how, v):  # the rows in the checkpoint's order
        return _TRANSFORMS[how][1](v, ours.config)

    pairs_as_halves = {k: theirs('rope_q' if k.endswith('q_b.weight') else 'rope_kv', v) for k, v in state.items()
                       if k.endswith(('attn.q_b.weight', 'attn.kv_a.weight'))}
    assert len(pairs_as_halves) == 6 and moved(**pairs_as_halves) > 1e-3
    rolled_only = {k: theirs('hy_index_rows', v).unflatten(0, (-1, 8)).roll(4, 1).flatten(0, 1)
                   for k, v in state.items() if '.indexer.' in k and k.endswith(('wq.weight', 'wk.weight'))}
    assert rolled_only and moved(**rolled_only) > 1e-3


def test_a_dense_hy_v4_loads_and_exports(tmp_path):
    """Every layer dense (no experts, so no clamp): its flags drop the experts' and export takes it back."""
    cfg = parity(hy_v4(num_hidden_layers=2, mlp_layer_types=['dense', 'dense'], indexer_types=['full', 'full']),
                 tmp_path).config
    assert cfg.mlp == 'swiglu' and cfg.swiglu_limit is None and cfg.index_share is None


@pytest.mark.parametrize('overrides, named', [
    (dict(mlp_layer_types=['sparse', 'dense', 'sparse']), 'dense layers other than the first'),
    (dict(hc_mult=1), 'hc_mult=1 is not supported'),
    (dict(n_shared_experts=0), 'n_shared_experts=0 is not supported'),
])
def test_what_hy_v4_we_cannot_load_is_refused_in_one_line(overrides, named, tmp_path):
    transformers.HYV4ForCausalLM(hy_v4(**overrides)).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as e:
        GPT.from_pretrained(str(tmp_path))
    assert named in str(e.value) and '\n' not in str(e.value)


HY_FLAGS = dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, norm='rms', pos='rope', bias=False,
                attn='mla', q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                attn_sinks=True, attn_gate=True, index_topk=6, index_n_heads=8, index_head_dim=8, index_norm_eps=1e-5,
                mlp='moe', n_expert=4, n_expert_active=2, moe_hidden=16, n_shared_expert=1, router='sigmoid',
                first_dense_layers=1, swiglu_limit=1.0, swiglu_form='plain_routed', hc_mult=4, hc_kind='ihc',
                hc_post_eps=True)


@pytest.mark.parametrize('flags, named', [
    (dict(), None),  # a model built here, not loaded: exported to hy_v4
    (dict(hc_kind='mhc'), "hc_kind='mhc'"),
    (dict(hc_post_eps=False), 'hc_post_eps=False'),
    (dict(swiglu_form='plain'), "swiglu_form='plain'"),
    (dict(attn_gate=False), 'attn_gate=False'),
])
def test_export_picks_hy_v4_or_names_what_it_cannot_carry(flags, named):
    config = GPTConfig(**{**HY_FLAGS, **flags})
    check_export_choice(config, 'hy_v4', named)
    if named is not None:
        return
    torch.manual_seed(0)
    ours = GPT(config).eval()
    with torch.no_grad():
        for name, t in list(ours.named_parameters()) + list(ours.named_buffers()):  # sinks, biases off their init
            if name.endswith(('sinks', 'expert_bias', '.base', 'hc_base')):
                t.normal_()
        idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(to_hf(ours)(idx).logits, ours(idx)[0], atol=1e-5, rtol=0)


def test_export_refuses_an_indexer_norm_other_than_the_models():
    """transformers' indexer normalizes its keys with rms_norm_eps: a model whose index_norm_eps differs from its
    norm_eps is refused in one line."""
    with pytest.raises(ValueError, match='index_norm_eps=1e-06 must equal norm_eps=1e-05') as e:
        to_hf(GPT(GPTConfig(**{**HY_FLAGS, 'index_norm_eps': 1e-6})))
    assert '\n' not in str(e.value)
