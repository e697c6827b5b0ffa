"""DeepSeek-V3.2 and GLM-5 (hf/deepseek_v32.py), both ways."""

import pytest
import torch

from chapters import sparse_attention
from export import hf_family
from hf import HF_FAMILIES
from hf_tiny import GPT, M, VOCAB, YARN_DEEPSEEK, GPTConfig, check_parity, randomized, transformers
from hf.tiny import build, deepseek_v32

pytestmark = pytest.mark.usefixtures('single_thread')


@pytest.mark.parametrize('rope', [None, YARN_DEEPSEEK], ids=['rope', 'yarn'])
def test_deepseek_v32_sparse_attention(rope, tmp_path):
    """Logits, greedy tokens and the export back. Where keys tie at the top-k's cut (a score of 0: each head's
    ReLU zero) we keep the earliest tokens, torch.topk in transformers any of them: the tiny model has none."""
    extra = {'rope_parameters': dict(rope)} if rope else {}
    torch.manual_seed(0)
    hf = randomized(transformers.DeepseekV32ForCausalLM(deepseek_v32(**extra)), 8)
    ours = check_parity(hf, tmp_path)
    cfg = ours.config
    assert (cfg.index_topk, cfg.index_n_heads, cfg.index_head_dim, cfg.q_lora_rank) == (6, 16, 8, 16)
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
        assert HF_FAMILIES['deepseek_v32'].blocking(config) == [named]
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
    assert [type(b.attn.indexer) for b in ours.transformer.h] == [sparse_attention.LightningIndexer, sparse_attention.SharedIndex,
                                                                 sparse_attention.LightningIndexer]
    assert hf_family(ours.config).model_type == 'glm_moe_dsa'  # sharing: GLM's, not DeepSeek-V3.2's


@pytest.mark.parametrize('family', ['deepseek_v32', 'glm_moe_dsa'])
def test_the_races_models_give_transformers_logits_with_no_tie_at_the_top_k(family, monkeypatch, tmp_path):
    """bench.py's race (--vs_hf_families at 4 x 256) imports hf.tiny's models: our logits are transformers' at
    every position, token 0 in each sequence. Where keys tie at the top-k's cut the two sides keep different ones
    (torch.topk's kernel there, whose pick changes with the row's length; the earliest here), so the models are
    built without ties: no pad token, whose embedding row transformers zeros (the first indexer's query is then
    zero and every key scores 0: the race's tokens parted at 34 of 64), and 16 indexer heads (with 8, a key whose
    every head's ReLU is zero tied at the cut in some rows)."""
    hf = build(family, 1337, n_layer=4, n_embd=256)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    scores, real = [], sparse_attention.LightningIndexer.scores
    monkeypatch.setattr(sparse_attention.LightningIndexer, 'scores',
                        lambda self, *args: scores.append(real(self, *args)) or scores[-1])
    idx = torch.randint(0, VOCAB, (32, 72), generator=torch.Generator().manual_seed(0))
    idx[:, 36] = 0  # the id tiny() names the pad token
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)
    k, T = ours.config.index_topk, idx.size(1)
    for s in scores:  # each row with more than k keys: its k-th score above the next
        best = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float('-inf')).topk(k + 1).values[:, k:]
        assert (best[..., k - 1] > best[..., k]).all()
