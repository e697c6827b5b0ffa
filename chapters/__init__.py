"""
The chapters after the lesson (model.py), one file each, in reading order:

    small_swaps       other MLP activations, scaled embeddings, a logit soft cap, zero-initialized projections
    attention         attention's switches: QK-norm, q/k/v biases, sinks, an output gate, the softmax scale, partial RoPE
    long_context      RoPE past the trained length (rope_scaling: linear, dynamic NTK, YaRN, Llama 3's)
    layer_kinds       layers of several kinds: local ('L'), NoPE ('N'), no mixer ('-'); no positions at all
    moe               mixture of experts (mlp='moe')
    mla               multi-head latent attention (attn='mla')
    nanochat          weightless norms, a norm on the embeddings
    llama4            chunked attention ('C'), NoPE layers' temperature
    short_conv        the gated short convolution ('V': LFM2)
    deltanet          linear attention: Gated DeltaNet ('D') and Kimi Delta Attention ('K')
    mamba2            the selective state-space layer ('S': Mamba-2)
    sparse_attention  DeepSeek's lightning indexer (index_topk)
    block_sparse      the indexer picking blocks of keys (index_block_size: MiniMax-M3, QSA, KPool)
    mtp               multi-token prediction (mtp_depth)
    gemma4            Gemma 4's K = V, K/V sharing, global layers' shapes, MoE block, per-layer embeddings
    deepseek_v4       DeepSeek-V4: one shared K = V head, compressed layers (HCA 'H', CSA 'I'), hash routing, ...
    speedrun          the speedrun's: value embeddings, skips, smear, backout, a bigram hash table, XSA, key offset, ...
    engram            hashed n-gram memories gated by the hidden state (DeepSeek's Engram)
    hyper_connections the residual stream widened to parallel copies, collapsed and spread around each branch (mHC)

A chapter file holds what it is and where it comes from, its config fields with their checks (its Config), its
classes, and its registration: entries in model.py's registries and Features. Importing this package loads
them all; GPTConfig below is the lesson's config with every chapter's fields, the one the scripts use:

    from chapters import GPT, GPTConfig

Adding a chapter: its file here, then its name in the import and in CHAPTERS below (configurator.py reads
CHAPTERS too, so its fields become every script's flags).
"""

from dataclasses import dataclass

import model
# in reading order, so the registries list their entries in it (each chapter imports only earlier ones)
from chapters import small_swaps, attention, long_context, layer_kinds, moe, mla, nanochat, llama4  # noqa: I001
from chapters import short_conv, deltanet, mamba2, sparse_attention, block_sparse, mtp, gemma4  # noqa: I001
from chapters import deepseek_v4, speedrun, engram, hyper_connections  # noqa: I001
from model import GPT, SWAPS, swap_flags  # noqa: F401  (what the scripts take from here)

CHAPTERS = (small_swaps, attention, long_context, layer_kinds, moe, mla, nanochat, llama4, short_conv, deltanet,
            mamba2, sparse_attention, block_sparse, mtp, gemma4, deepseek_v4, speedrun, engram, hyper_connections)


# The lesson's flags, then every chapter's in reading order: a dataclass whose bases are the chapters' Configs, the
# last chapter first, so that a later chapter's derived properties wrap an earlier one's (their super() calls).
GPTConfig = dataclass(type('GPTConfig', tuple(chapter.Config for chapter in reversed(CHAPTERS)) + (model.GPTConfig,),
                           {'__module__': __name__, '__qualname__': 'GPTConfig',
                            '__doc__': "The lesson's config with every chapter's fields (chapters/__init__.py)."}))


# the flags that change no weight (model.RUNTIME_FLAGS), every chapter's included
RUNTIME_FLAGS = model.RUNTIME_FLAGS + tuple(name for chapter in CHAPTERS for name in getattr(chapter, 'RUNTIME_FLAGS', ()))
# the flags that shape training alone (model.TRAINING_FLAGS), every chapter's included
TRAINING_FLAGS = model.TRAINING_FLAGS + tuple(name for chapter in CHAPTERS
                                              for name in getattr(chapter, 'TRAINING_FLAGS', ()))

# The next chapters' swaps, each on top of the modern block, with the published defaults: bench.py's variants
BEYOND_MODERN = {'moe': moe.VARIANT, 'mla': mla.VARIANT, 'mhc': hyper_connections.VARIANT}
