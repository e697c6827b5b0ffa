"""
nanochat's block (Karpathy's small chat model): the modern block without any norm weight, on top of the speedrun's
parts (squared ReLU, untied head, a logit soft cap, QK-norm). norm_gain=False makes every norm module (the
blocks', the final one, the QK-norms, MLA's latents; not a linear layer's per-head output norm) a plain
x / RMS(x) (LayerNorm then also drops its bias); embed_norm normalizes the first block's input. Its QK-norm comes
after RoPE in nanochat's code, but a rotation keeps each head's RMS, so a weightless QK-norm before it is the
same; its RoPE turns the other way, which hf/ converts in the weights.
"""

from dataclasses import dataclass

from model import BOOL, FEATURES, Feature, make_norm

NANOCHAT_BLOCK = {'norm': 'rms', 'norm_gain': False, 'embed_norm': True, 'qk_norm': True, 'mlp': 'relu2',
                  'pos': 'rope', 'bias': False, 'tie_embeddings': False, 'logit_softcap': 15.0}


@dataclass
class Config:
    norm_gain: bool = True  # norms multiply by a learned gain (and LayerNorm adds a bias); False: weightless, every norm module (nanochat)
    embed_norm: bool = False  # a norm on the first block's input, the token embeddings (nanochat)

    FIELD_TYPES = {'norm_gain': BOOL, 'embed_norm': BOOL}

    @property
    def norm_weights(self):
        return self.norm_gain and super().norm_weights


class EmbedNorm(Feature):
    """embed_norm: the first block's input normalized (transformer.ln_emb)."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.embed_norm

    def build(self, model):
        model.transformer.ln_emb = make_norm(self.config)

    def embed(self, model, idx, x, start, tables):
        return model.transformer.ln_emb(x)


FEATURES.append(EmbedNorm)
