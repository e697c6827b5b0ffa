"""
The small swaps: one-line changes the families and the speedrun made around the block, each a flag.

- Other MLP activations: mlp='relu' (2017's Transformer), 'relu2' (squared ReLU: Primer, So et al. 2021, and
  modded-nanogpt's MLP: sparse like ReLU, smooth at zero, no gate), 'geglu' (GELU-gated, Shazeer 2020: Gemma).
- embed_scale: the token embeddings times sqrt(n_embd), as Gemma's scaled embedding module does.
- logit_softcap: the final logits squashed to c*tanh(logits/c) (Gemma 2, nanochat, the speedrun), so no logit
  runs away.
- zero_init: the projections into the residual stream (every c_proj: attention's, the MLPs', the experts', the
  linear layers') and an untied head start at zero (the speedrun, nanochat): each block begins as the identity
  and learns what to add.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from model import BOOL, FEATURES, MLPS, POSITIVE_NUMBER, Feature, GatedMLP, MLP


@dataclass
class Config:
    embed_scale: bool = False  # token embeddings times sqrt(n_embd) (Gemma)
    logit_softcap: float | None = None  # final logits squashed to c*tanh(logits/c) (Gemma 2, the speedrun); None: off
    zero_init: bool = False  # the projections into the residual stream (c_proj, experts, DeltaNet's out) and an untied head start at zero (the speedrun)

    FIELD_TYPES = {'embed_scale': BOOL, 'zero_init': BOOL, 'logit_softcap': POSITIVE_NUMBER}


class ReLUMLP(MLP):
    """2017's MLP: up, ReLU, down."""

    def act(self, h):
        return F.relu(h)


class ReLU2MLP(MLP):
    """Primer's squared ReLU: up, ReLU(h)^2, down."""

    def act(self, h):
        return F.relu(h).square()


class GEGLU(GatedMLP):
    """The gated MLP with GELU (tanh form, as 'gelu' and Gemma compute it) as the gate's activation."""

    def act(self, gate):
        return F.gelu(gate, approximate='tanh')


class ScaledEmbedding(nn.Embedding):
    """The token embedding times sqrt(its width) on lookup (Gemma's scaled word embedding); the same weight."""

    def forward(self, idx):
        return super().forward(idx) * self.embedding_dim ** 0.5


class SmallSwaps(Feature):
    config_class = Config

    @staticmethod
    def applies(config):
        return config.embed_scale or config.logit_softcap is not None or config.zero_init

    def build(self, model):
        if self.config.embed_scale:  # the same weight, so nothing is drawn and a tied head still shares it
            wte = model.transformer.wte
            model.transformer.wte = ScaledEmbedding(wte.num_embeddings, wte.embedding_dim, _weight=wte.weight)

    @torch.no_grad()
    def init(self, model):
        if not self.config.zero_init:
            return
        for name, p in model.named_parameters():
            if name.endswith(('c_proj.weight', '.c_proj')):
                p.zero_()
        if not self.config.tie_embeddings:  # a tied head is the embedding: kept
            model.lm_head.weight.zero_()

    def logits(self, model, logits):
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)


MLPS.update(relu=ReLUMLP, relu2=ReLU2MLP, geglu=GEGLU)
FEATURES.append(SmallSwaps)
