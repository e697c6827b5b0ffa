"""
Llama 4's block (Meta, 2025): three RoPE layers in four attend in chunks ('C': a query sees only the tokens of its
own chunk of attention_chunk_size, chunks starting at multiples of it, so the cache keeps one chunk, a ring
aligned with the chunks); the fourth is global without RoPE ('N'), its queries sharpened with the position
(nope_temperature: attention temperature tuning, so attention over very long contexts does not flatten). Its
RoPE layers' queries and keys are scaled to unit RMS after RoPE (attention.py's rope_qk_norm), and its MoE
(moe.py) has a sigmoid router whose weight scales the chosen expert's input (moe_scale_input), one shared expert,
and experts on every moe_every-th layer.
"""

from dataclasses import dataclass

import torch

from model import FEATURES, LAYER_KINDS, OPTIONAL_POSITIVE_INT, POSITIVE_INT, POSITIVE_NUMBER, Feature, LayerKind, \
    attention


@dataclass
class Config:
    attention_chunk_size: int | None = None  # 'C' layers: a query sees only the tokens of its own chunk of this many, chunks starting at multiples of it (Llama 4: 8192)
    nope_temperature: float | None = None  # 'N' layers: queries times 1 + this * ln(1 + floor((pos + 1) / nope_temperature_floor)) (Llama 4: 0.1); None: off
    nope_temperature_floor: int = 8192  # the positions per step of nope_temperature's growth (Llama 4: 8192)

    FIELD_TYPES = {'attention_chunk_size': OPTIONAL_POSITIVE_INT, 'nope_temperature': POSITIVE_NUMBER,
                   'nope_temperature_floor': POSITIVE_INT}
    CHECKS = [
        (lambda c: 'C' in c.layer_kinds and c.attention_chunk_size is None,
         lambda c: f"layers={c.layers!r} has chunked ('C') layers: set attention_chunk_size, their chunk"),
        (lambda c: c.attention_chunk_size is not None and 'C' not in c.layer_kinds,
         lambda c: f"attention_chunk_size={c.attention_chunk_size} applies to chunked ('C') layers and "
                   f"layers={c.layers!r} has none: add 'C' to layers or set --attention_chunk_size=None"),
        (lambda c: c.nope_temperature is not None and 'N' not in c.layer_kinds,
         lambda c: f"nope_temperature={c.nope_temperature} applies to layers without RoPE ('N') and "
                   f"layers={c.layers!r} has none: add 'N' to layers or set --nope_temperature=None"),
        (lambda c: c.attn == 'mla' and c.nope_temperature is not None,
         lambda c: "rope_qk_norm and nope_temperature apply to attn='mha' only (MLA makes its own queries and keys)"),
    ]

    @property
    def nope_positions(self):
        return 'temperature' if self.nope_temperature is not None else super().nope_positions


def nope_temperature_scales(config, start, T, device):
    """The factor on the queries of 'N' layers at positions start.. (start: an int, or a (1,) tensor in a decoding
    step): 1 + beta * ln(1 + floor((pos + 1) / F)), 1 for the first F - 1 positions, growing slowly after them."""
    positions = start + torch.arange(T, device=device)
    steps = torch.floor((positions.float() + 1.0) / config.nope_temperature_floor)
    return 1.0 + config.nope_temperature * torch.log1p(steps)


class Temperature(Feature):
    """tables['temperature']: the 'N' layers' query scales, which they read instead of rotations."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.nope_temperature is not None

    def embed(self, model, idx, x, start, tables):
        tables['temperature'] = nope_temperature_scales(self.config, start, idx.size(1), idx.device)
        return x


def chunked_attention(config, layer):
    """A RoPE attention layer that sees the tokens of its own chunk only: its window is the chunk."""
    mixer = attention(config, layer, window=config.attention_chunk_size)
    mixer.chunked = True
    return mixer


LAYER_KINDS['C'] = LayerKind('chunked', chunked_attention, 'chunked', attention=True, config_class=Config,
                             needs=lambda flags, window: {'attention_chunk_size': window})
FEATURES.append(Temperature)
