"""
Multi-token prediction (mtp_depth; Gloeckle et al. 2024, DeepSeek-V3's sequential form): extra modules after the
model, the k-th predicting the token k+1 ahead with the shared head, trained beside the main head (their mean
loss times mtp_loss_coef). At inference they are drafters for self-speculative decoding (generate.py's
generate_speculative): the model verifies their drafts in one forward.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters.sparse_attention import mean_loss_and_reset
from generate import KVCache, cache_dtype
from model import FEATURES, GPT, NON_NEGATIVE_NUMBER, Block, Feature, causal_mask, changed, is_int, make_norm


@dataclass
class Config:
    mtp_depth: int = 0  # extra modules after the model, the k-th predicting the token k+1 ahead with the shared head; 0: none
    mtp_loss_coef: float = 0.3  # their mean loss, times this, joins the training loss (DeepSeek-V3: 0.3, later 0.1); 0: not computed

    FIELD_TYPES = {'mtp_depth': (lambda v, c: is_int(v, 0), 'an int >= 0'), 'mtp_loss_coef': NON_NEGATIVE_NUMBER}
    CHECKS = [
        (lambda c: changed(c, ('mtp_loss_coef',)) and not c.mtp_depth,
         lambda c: f"mtp_loss_coef={c.mtp_loss_coef} applies to multi-token prediction only: set mtp_depth >= 1 or "
                   f"leave it at its default"),
        (lambda c: c.mtp_depth and c.index_topk is not None,
         lambda c: f"mtp_depth={c.mtp_depth} with sparse attention (index_topk={c.index_topk}) is not supported yet: "
                   f"set one of them off"),
    ]


RUNTIME_FLAGS = ('mtp_loss_coef',)


class MTPModule(nn.Module):
    """One depth of DeepSeek-V3's multi-token prediction: the previous depth's hidden state of token i (the main
    model's at the first) and the embedding of token i + k, both normalized, concatenated and projected, pass one
    block (the last layer's kind) and a norm; the shared head then predicts token i + k + 1."""

    def __init__(self, config, features=()):
        super().__init__()
        self.norm_h, self.norm_e, self.norm = make_norm(config), make_norm(config), make_norm(config)
        self.proj = nn.Linear(2 * config.n_embd, config.n_embd, bias=False)
        self.block = Block(config, config.n_layer - 1)
        for feature in features:  # the model's features give its block what they give the last layer's
            feature.build_block(self.block, config.n_layer - 1)
        self.apply(GPT._init_weights)
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):  # GPT-2's scaled init, as the model's blocks
                nn.init.normal_(p, mean=0.0, std=0.0 if config.zero_init else 0.02 / math.sqrt(2 * config.n_layer))
        self.register_buffer('losses', torch.zeros(2), persistent=False)  # loss summed, forwards

    def forward(self, h, embedded, tables):
        """h, embedded (B, L, n_embd) -> this depth's hidden states (B, L, n_embd), before its norm."""
        x = self.proj(torch.cat((self.norm_h(h), self.norm_e(embedded)), dim=-1))
        mixer = self.block.attn
        mask = causal_mask(x.size(1), mixer.window, x.device)
        return self.block(x, tables[mixer.positions], x.size(1) > 1 if mask is None else mask, None, tables)


def mtp_flops(model, T):
    """Training FLOPs of the MTP modules per token of a T-token sequence: depth k runs over T - k tokens (its
    Linears, its block's mixer and experts, the shared head); none at weight 0 (not computed)."""
    if not model.config.mtp_loss_coef:
        return 0
    flops = 0
    for k, module in enumerate(model.mtp, start=1):
        L = T - k
        if L < 1:
            break
        per_token = 6 * model.lm_head.weight.numel()
        for part in module.modules():
            if isinstance(part, nn.Linear):
                per_token += 6 * part.weight.numel()
            elif hasattr(part, 'token_flops'):
                per_token += part.token_flops(L)
        flops += per_token * L
    return flops / T


def layer_tables(model, tokens, embedded):
    """The tables the model's layers read at positions 0.. of tokens (rotary tables by kind), as GPT.embed makes
    them; the embeddings themselves are the MTP module's input."""
    tables = {'rope': model.transformer.wpe(embedded, 0)[1], None: None, 'cache': None, 'tokens': tokens}
    for feature in model.features:
        feature.embed(model, tokens, embedded, 0, tables)
    return tables


def mtp_states(model, module, h, tokens):
    """One depth's hidden states (B, L, n_embd) from the previous depth's h and the tokens (B, L) one further on."""
    embedded = model.transformer.wte(tokens)
    return module(h, embedded, layer_tables(model, tokens, embedded))


def mtp_loss(model, idx, h, targets):
    """The mean over depths of each MTP module's loss: at depth k, position i reads the input token i + k and
    predicts the next (targets' i + k); the sequence shortens by one a depth. The inputs are the tokens
    themselves, known whatever a task's mask leaves unscored in the targets."""
    T = targets.size(1)
    losses = []
    for k, module in enumerate(model.mtp, start=1):
        L = T - k
        if L < 1:
            break
        h = mtp_states(model, module, h[:, :L], idx[:, k:T])
        logits = model.logits(module.norm(h))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets[:, k:].reshape(-1), ignore_index=-1)
        module.losses += torch.stack((loss.detach(), torch.ones_like(loss.detach())))
        losses.append(loss)
    return sum(losses) / len(losses)


def mtp_loss_and_reset(model):
    """The MTP modules' mean loss over the training forwards since the last call (None if none); then the counts
    restart: what train.py logs apart from the main loss."""
    return mean_loss_and_reset(model.mtp if model.config.mtp_depth else [])


class MultiTokenPrediction(Feature):
    """model.mtp, made after the main model's init and on a fork of the RNG, so the main model trains as it would
    without them; their loss in training, their FLOPs apart (they run over shorter sequences)."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.mtp_depth > 0

    def init(self, model):
        with torch.random.fork_rng(devices=[]):
            model.mtp = nn.ModuleList([MTPModule(self.config, model.features) for _ in range(self.config.mtp_depth)])

    def loss(self, model, idx, h, targets):
        if self.config.mtp_loss_coef and model.training:
            return self.config.mtp_loss_coef * mtp_loss(model, idx, h, targets)
        return None

    def flops(self, model, seq_len):
        return mtp_flops(model, seq_len)


# ----------------------------------------------------------------------------- self-speculative decoding

def speculation_problem(model):
    """Why the model cannot decode speculatively, in one line; None when it can."""
    if not model.config.mtp_depth:
        return "speculative decoding drafts with the MTP modules: this model has none (train with mtp_depth >= 1)"
    taken_back = [i for i, block in enumerate(model.transformer.h)
                  if block.attn.window is not None or block.attn.cache_states()]
    if taken_back:
        return (f"speculative decoding takes drafted tokens back out of the cache, which layer {taken_back[0]} "
                f"cannot (a sliding window's ring or a recurrent state): every layer must be global attention")
    if model.config.positions_follow_length:
        return "speculative decoding with rope_scaling='dynamic' is not supported (its angles follow the length)"
    kept = [name for feature in model.features for name in feature.cache_states()]
    if kept:
        return (f"speculative decoding takes drafted tokens back out of the cache, which the states of this model's "
                f"features ({', '.join(kept)}: a last token) cannot be: decode without --speculative")
    return None


def draft(model, hidden, window, n):
    """n tokens drafted greedily by the first n MTP modules after window (B, t + 1), whose first t tokens the
    cache holds with their final hidden states `hidden` (B, t, n_embd): depth k reads, at each position i, the
    previous depth's state and token i + k (window's, then the drafts), so its last position predicts token t + k."""
    drafts, h = [], hidden
    for k, module in enumerate(model.mtp[:n], start=1):
        h = mtp_states(model, module, h, torch.cat([window[:, k:]] + drafts, dim=1))
        drafts.append(model.logits(module.norm(h[:, -1:])).argmax(dim=-1))
    return drafts


@torch.no_grad()
def generate_speculative(model, idx, max_new_tokens, vocab_limit=None):
    """Greedy decoding (temperature 0) with the MTP modules as drafters: each round they draft up to mtp_depth
    tokens, the model verifies the pending token and the drafts in one forward, and keeps the drafts it would
    have chosen itself plus its own next token; the cache takes the rest back. The tokens are plain greedy
    decoding's (each the model's argmax after the ones before; the context shifts as generate's); fewer forwards.
    Returns (idx and the new tokens, {'drafted', 'accepted', 'rounds'}). A batch's rows keep the drafts all
    accepted."""
    problem = speculation_problem(model)
    if problem:
        raise ValueError(problem)
    block_size = model.config.block_size
    keep = max(1, block_size // 2)
    window = idx if idx.size(1) <= block_size else idx[:, -keep:]
    cache = KVCache(model, idx.size(0), block_size, cache_dtype(model), idx.device)
    new, stats, hidden = [], {'drafted': 0, 'accepted': 0, 'rounds': 0}, None
    made = 0
    while made < max_new_tokens:
        if cache.pos == 0:  # the cache holds every token but the pending last one
            hidden = model.hidden_states(window[:, :-1], cache) if window.size(1) > 1 else window.new_zeros(0)
        t = cache.pos
        # drafts that fit: the window may pass block_size only with the round's last token, as generate's does
        n = min(model.config.mtp_depth, t, block_size - window.size(1), max_new_tokens - made - 1)
        drafts = draft(model, hidden, window, n) if n > 0 else []
        h = model.hidden_states(torch.cat([window[:, -1:]] + drafts, dim=1), cache)
        chosen = model.logits(h)[..., :vocab_limit].argmax(dim=-1)  # (B, n + 1): the model's own choices
        agreed = (chosen[:, :n] == torch.cat(drafts, dim=1)).all(dim=0) if n else chosen.new_zeros(0, dtype=torch.bool)
        accepted = int(agreed.int().cumprod(0).sum())
        cache.advance(accepted - n)  # the drafts not taken are taken back out of the cache
        hidden = torch.cat((hidden, h[:, :accepted + 1]), dim=1) if hidden.numel() else h[:, :accepted + 1]
        tokens = chosen[:, :accepted + 1]
        new.append(tokens)
        made += tokens.size(1)
        stats['drafted'] += n
        stats['accepted'] += accepted
        stats['rounds'] += 1
        window = torch.cat((window, tokens), dim=1)
        if window.size(1) > block_size:
            window = window[:, -keep:]
            cache.reset()
    return torch.cat([idx] + new, dim=1), stats


FEATURES.append(MultiTokenPrediction)
