"""Qwen4-Exp (qwen4_exp_text), its text model: Qwen3.5's Gated DeltaNet layers ('D', Qwen3-Next's mapping) and gated
full attention whose QSA indexer picks blocks ('G': block_sparse's index_block_pool='mean', index_tail='keep', with
sparse_attention's index_q_norm, index_k_norm='rms', index_head_weights=False); Qwen3-Next's MoE with its gated
shared expert on every layer; the gated residual over hc_count copies (hyper_connections' hc_kind='gated', whose
grouped norms are the blocks' only norms and whose last collapse is the final norm); on the PLE layers an n-gram
memory gating each copy (engram's, with engram_eos). Every norm's gain is 1 + w (the DeltaNet output norm's aside).

transformers' causal-LM class for it is Qwen4ExpForCausalLM over Qwen4ExpTextModel, read and written here (the
vision-language Qwen4ExpConfig checkpoints are not: their model_type is refused by name)."""

from types import SimpleNamespace

import torch

from chapters.engram import hash_multipliers, primes_from
from chapters.engram import SEED as ENGRAM_SEED
from chapters.speedrun import layers_of
from .engine import ANY, HF_FAMILIES, HFFamily
from .qwen3_next import (_QWEN3_NEXT_NAMES, _qwen3_5_join_q, _qwen3_5_split_q, _qwen3_next_read,
                         _qwen3_next_write, _split_rows)

_LAYER_TYPES = {'linear_attention': 'D', 'indexed_attention': 'G'}
_QSA = ('indexer_n_heads', 'indexer_kv_heads', 'indexer_head_dim', 'indexer_budget', 'indexer_compress_ratio')
_ROWS_DIVISOR = 128  # what export pads each n-gram table to (make_ngram_vocab_size_divisible_by's default)


def _eos(c):
    eos = c.eos_token_id
    return eos[0] if isinstance(eos, (list, tuple)) else eos


def _refuse(c):
    """One line naming what of a Qwen4-Exp config we cannot run."""
    gate = c.output_gate_type or c.hidden_act
    if gate != 'silu':
        raise ValueError(f"output_gate_type={gate!r} is not supported (the Gated DeltaNet output gate is silu only)")
    if 'indexed_attention' in c.layer_types[:c.num_hidden_layers] and any(getattr(c, k) is None for k in _QSA):
        raise ValueError(f"indexed_attention layers without the QSA settings ({', '.join(_QSA)}) are not supported")
    if c.ple_layer_ids and c.seed != ENGRAM_SEED:
        raise ValueError(f"seed={c.seed} is not supported (the n-gram hashes' multipliers come from seed "
                         f"{ENGRAM_SEED})")


def _qwen4_exp_read(c):
    _refuse(c)
    n = c.num_hidden_layers
    kinds = [_LAYER_TYPES[t] for t in c.layer_types[:n]]
    # Qwen3-Next's reading of the attention, DeltaNet and MoE fields: every layer sparse, no dense MLP
    as_next = SimpleNamespace(**{**c.to_dict(), 'intermediate_size': None, 'mlp_only_layers': [],
                                 'decoder_sparse_step': 1, 'layer_types': [
                                     {'D': 'linear_attention', 'G': 'full_attention'}[k] for k in kinds]})
    flags = _qwen3_next_read(as_next)
    flags.update(hc_mult=c.hc_count, hc_kind='gated', hc_rank=c.hc_lowrank)
    if 'G' in kinds:
        flags.update(index_topk=c.indexer_budget, index_block_size=c.indexer_compress_ratio,
                     index_n_heads=c.indexer_n_heads, index_head_dim=c.indexer_head_dim, index_block_pool='mean',
                     index_tail='keep', index_local_blocks=0, index_q_norm=True, index_k_norm='rms',
                     index_head_weights=False, index_norm_eps=float(c.rms_norm_eps))
    if c.ple_layer_ids:  # one-indexed layer ids
        flags.update(engram_layers=','.join(str(i - 1) for i in c.ple_layer_ids), engram_ngram=c.ngram_size,
                     engram_heads=c.heads_per_ngram, engram_rows=c.ngram_vocab_size_base,
                     engram_dim=None if c.ple_embed_dim == c.hidden_size else c.ple_embed_dim,
                     engram_conv=c.ple_conv_kernel_size, engram_eos=_eos(c))
    return flags


def _qwen4_exp_write(cfg):
    kinds = cfg.layer_kinds
    if 'G' in kinds and (cfg.index_topk is None or cfg.index_block_size is None):
        raise ValueError("qwen4_exp_text's attention layers pick blocks with QSA: set index_topk and index_block_size")
    if 'G' in kinds and cfg.index_norm_eps != cfg.norm_eps:
        raise ValueError(f"qwen4_exp_text normalizes QSA's queries and keys with rms_norm_eps: index_norm_eps="
                         f"{cfg.index_norm_eps} must equal norm_eps={cfg.norm_eps}")
    if cfg.engram_layers is not None and cfg.engram_eos is None:
        raise ValueError("qwen4_exp_text's n-gram memory restarts at its eos: set engram_eos")
    out = {k: v for k, v in _qwen3_next_write(cfg).items()
           if k not in ('intermediate_size', 'decoder_sparse_step', 'mlp_only_layers')}
    out.update(layer_types=[{'D': 'linear_attention', 'G': 'indexed_attention'}[k] for k in kinds],
               hc_count=cfg.hc_mult, hc_lowrank=cfg.hc_rank or cfg.n_embd, output_gate_type='silu')
    if 'G' in kinds:
        out.update(indexer_n_heads=cfg.index_n_heads, indexer_kv_heads=1, indexer_head_dim=cfg.index_head_dim,
                   indexer_budget=cfg.index_topk, indexer_compress_ratio=cfg.index_block_size)
    layers = _memory_layers(cfg)
    if layers:
        out.update(ple_layer_ids=[i + 1 for i in layers], ple_embed_dim=cfg.engram_width, ngram_size=cfg.engram_ngram,
                   heads_per_ngram=cfg.engram_heads, ngram_vocab_size_base=cfg.engram_rows, seed=ENGRAM_SEED,
                   ple_conv_kernel_size=cfg.engram_conv, make_ngram_vocab_size_divisible_by=_ROWS_DIVISOR,
                   eos_token_id=cfg.engram_eos)
    return out


def _memory_layers(cfg):
    return sorted(layers_of(cfg.engram_layers, cfg))


def _table_rows(cfg, index):
    heads = (cfg.engram_ngram - 1) * cfg.engram_heads
    return sum(primes_from(cfg.engram_rows, index * heads, heads))


def _hash_buffers(cfg, index):
    """The index-th memory layer's hash as Qwen4-Exp's buffers hold it: multipliers, primes, offsets."""
    heads = (cfg.engram_ngram - 1) * cfg.engram_heads
    sizes = primes_from(cfg.engram_rows, index * heads, heads)
    return {'layer_multipliers': hash_multipliers(cfg.vocab_size, cfg.engram_ngram, index),
            'ngram_heads_vocab_sizes': sizes, 'ngram_heads_offsets': [sum(sizes[:h]) for h in range(heads)]}


def _check_hashes(hf_state, pre, cfg, index):
    """The hash buffers a checkpoint carries must be the ones ours computes (they are derived, not learned)."""
    for name, ours in _hash_buffers(cfg, index).items():
        theirs = hf_state.pop(pre + name, None)
        if theirs is not None and theirs.tolist() != ours:
            raise ValueError(f"{pre}{name} is not the n-gram hash this model computes: not supported")


def _unpack(hf_state, cfg):
    """q_proj split per head into [q | gate] (Qwen3.5's), index_qk_proj into the indexer's query and key rows,
    each n-gram table cut to its rows (the padding left out), the hash buffers checked and dropped."""
    out = _qwen3_5_split_q(hf_state, cfg)
    for i, kind in enumerate(cfg.layer_kinds):
        packed = f'model.layers.{i}.self_attn.indexer.index_qk_proj.weight'
        if kind == 'G' and packed in out:
            at = packed.rsplit('index_qk_proj', 1)[0]
            rows = [(at + 'index_q_proj.weight', cfg.index_n_heads * cfg.index_head_dim),
                    (at + 'index_k_proj.weight', cfg.index_head_dim)]
            out.update(_split_rows(out.pop(packed), 1, rows))
    for index, i in enumerate(_memory_layers(cfg)):
        pre = f'model.layers.{i}.ple.ple_embedding.'
        _check_hashes(out, pre, cfg, index)
        if pre + 'ngram_embedding.weight' in out:
            out[pre + 'ngram_embedding.weight'] = out[pre + 'ngram_embedding.weight'][:_table_rows(cfg, index)]
    return out


def _pack(hf_state, cfg):
    out = _qwen3_5_join_q(hf_state, cfg)
    for i, kind in enumerate(cfg.layer_kinds):
        at = f'model.layers.{i}.self_attn.indexer.'
        if kind == 'G':
            out[at + 'index_qk_proj.weight'] = torch.cat([out.pop(at + 'index_q_proj.weight'),
                                                          out.pop(at + 'index_k_proj.weight')])
    for index, i in enumerate(_memory_layers(cfg)):
        pre = f'model.layers.{i}.ple.ple_embedding.'
        table = out[pre + 'ngram_embedding.weight']
        pad = -table.size(0) % _ROWS_DIVISOR  # zero rows no hash reaches, as the checkpoints pad
        out[pre + 'ngram_embedding.weight'] = torch.cat([table, table.new_zeros(pad, table.size(1))])
        out.update({pre + k: torch.tensor(v) for k, v in _hash_buffers(cfg, index).items()})
    return out


_LAYER = 'model.layers.{i}.'
_CONNECTIONS = [('attn_hc', 'attn_hyper_connection'), ('ffn_hc', 'mlp_hyper_connection')]
_GATED = [('norm', 'hc_norm', '1+w'), ('down', 'input_mix_weight_down', None), ('up', 'input_mix_weight_up', None),
          ('inject', 'block_inject_weight', None)]
_QWEN4_EXP_NAMES = _QWEN3_NEXT_NAMES + [  # its norm rows find nothing here: the collapses are the norms
    *[(f'transformer.h.{{i}}.residual.{ours}.{a}.weight', f'{_LAYER}{theirs}.{b}.weight', how)
      for ours, theirs in _CONNECTIONS for a, b, how in _GATED],
    *[(f'transformer.hc_head.{a}.weight', f'model.hyper_connection_mixer.{b}.weight', how) for a, b, how in _GATED[:3]],
    ('transformer.h.{i}.attn.indexer.wq.weight', _LAYER + 'self_attn.indexer.index_q_proj.weight', None),
    ('transformer.h.{i}.attn.indexer.wk.weight', _LAYER + 'self_attn.indexer.index_k_proj.weight', None),
    ('transformer.h.{i}.attn.indexer.q_norm.weight', _LAYER + 'self_attn.indexer.q_layernorm.weight', '1+w'),
    ('transformer.h.{i}.attn.indexer.k_norm.weight', _LAYER + 'self_attn.indexer.k_layernorm.weight', '1+w'),
    ('transformer.engram_tables.{i}.weight', _LAYER + 'ple.ple_embedding.ngram_embedding.weight', None),
    *[(f'transformer.h.{{i}}.engram.{n}.weight', f'{_LAYER}ple.{n}.weight', None) for n in ('key_proj', 'value_proj')],
    *[(f'transformer.h.{{i}}.engram.{n}.weight', f'{_LAYER}ple.{n}.weight', '1+w')
      for n in ('norm_key', 'norm_query', 'norm_conv')],
    ('transformer.h.{i}.engram.conv.weight', _LAYER + 'ple.conv1d.weight', None),
]
HF_FAMILIES['qwen4_exp_text'] = HFFamily(
    'qwen4_exp_text', 'Qwen4ExpForCausalLM',
    {**{k: v for k, v in HF_FAMILIES['qwen3_next'].carries.items() if k != 'first_dense_layers'}, 'mlp': ('moe',),
     'hc_mult': lambda v: v >= 2, 'hc_kind': ('gated',), 'hc_rank': ANY, 'hc_post_scale': (2.0,),
     'index_topk': ANY, 'index_n_heads': ANY, 'index_head_dim': ANY, 'index_loss_coef': ANY, 'index_stage': ('sparse',),
     'index_block_size': ANY, 'index_block_pool': ('mean',), 'index_tail': ('keep',), 'index_local_blocks': (0,),
     'index_q_norm': (True,), 'index_k_norm': ('rms',), 'index_head_weights': (False,), 'index_norm_eps': ANY,
     'engram_layers': ANY, 'engram_ngram': ANY, 'engram_heads': ANY, 'engram_dim': ANY, 'engram_rows': ANY,
     'engram_conv': ANY, 'engram_eos': ANY},
    _QWEN4_EXP_NAMES, _qwen4_exp_read, _qwen4_exp_write, _unpack, _pack)
