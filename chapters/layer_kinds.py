"""
Layers of several kinds: each layer's token mixer picked by its letter in `layers`, the string tiled over the
layers ('LLLLLG': five local layers to one global, Gemma 3).

- 'L' local attention: a sliding window of sliding_window tokens, itself included (Mistral; Gemma 2/3, gpt-oss,
  OLMo 3 mix them with global layers), its cache a ring of the window; rope_local_theta gives local layers a RoPE
  base of their own (Gemma 3: 10k local, 1M global), never rescaled by rope_scaling.
- 'N' global attention without RoPE, NoPE (Kazemnejad et al. 2023; SmolLM3, Llama 4).
- '-' no token mixer, the MLP alone; with mlp_with_mixer=False every layer is one part, a mixer or an MLP
  (Nemotron-H).
- pos='none': no positions at all, neither a table nor rotations (Kimi Linear, whose recurrent layers know the
  order).

The other kinds have chapters of their own: 'C' chunked (llama4.py), 'V' (short_conv.py), 'D' and 'K'
(deltanet.py), 'S' (mamba2.py).
"""

from dataclasses import dataclass

import torch.nn as nn

from model import BOOL, FEATURES, LAYER_KINDS, OPTIONAL_POSITIVE_INT, POSITIONS, POSITIVE_NUMBER, Feature, LayerKind, \
    Rotary, TokenMixer, attention


WINDOWED = {'L'}  # the kinds whose mixers slide sliding_window over the past (a later chapter adds its own)


@dataclass
class Config:
    sliding_window: int | None = None  # 'L' layers: each query sees only the last W keys, itself included (Mistral); without layers, every layer is 'L'
    rope_local_theta: float | None = None  # RoPE base of 'L' layers, which then take no rope_scaling (Gemma 3: 10k local, 1M global); None: as the others
    mlp_with_mixer: bool = True  # a layer's token mixer is followed by an MLP; False: each layer one part, a mixer or ('-') an MLP (Nemotron-H)

    FIELD_TYPES = {'sliding_window': OPTIONAL_POSITIVE_INT, 'rope_local_theta': POSITIVE_NUMBER, 'mlp_with_mixer': BOOL}
    CHECKS = [
        (lambda c: c.layers is not None and 'L' in c.layers and c.sliding_window is None,
         lambda c: f"layers={c.layers!r} has local ('L') layers: set sliding_window, their window"),
        (lambda c: c.layers is not None and 'N' in c.layers and c.pos != 'rope',
         lambda c: f"layers={c.layers!r} has layers without RoPE ('N'): that needs pos='rope', got pos={c.pos!r}"),
        (lambda c: c.sliding_window is not None and not WINDOWED & set(c.layer_kinds),
         lambda c: f"sliding_window={c.sliding_window} applies to layers with a window "
                   f"({', '.join(map(repr, sorted(WINDOWED)))}) and layers={c.layers!r} has none: add 'L' to layers or "
                   f"set --sliding_window=None"),
        (lambda c: c.rope_local_theta is not None and 'L' not in c.layer_kinds,
         lambda c: f"rope_local_theta={c.rope_local_theta} applies to local ('L') layers and there are none: set layers "
                   f"(e.g. 'LLLLLG') and sliding_window, or rope_local_theta=None"),
        (lambda c: c.rope_local_theta is not None and c.pos != 'rope',
         lambda c: f"rope_local_theta needs pos='rope', got pos={c.pos!r}"),
        (lambda c: ('-' in c.layer_kinds or not c.mlp_with_mixer) and c.norm_position != 'pre',
         lambda c: f"layers of one part (layers={c.layers!r}, mlp_with_mixer={c.mlp_with_mixer}) need "
                   f"norm_position='pre', got {c.norm_position!r}"),
    ]

    @property
    def default_layers(self):
        return 'L' if self.sliding_window is not None else super().default_layers

    def window_of(self, layer):
        """The sliding window of a layer, None for full attention."""
        return self.sliding_window if self.layer_kinds[layer] == 'L' else None

    def has_mlp(self, layer):
        return (self.mlp_with_mixer or self.layer_kinds[layer] == '-') and super().has_mlp(layer)

    @property
    def nope_positions(self):
        """The table 'N' layers read instead of rotations: None (Llama 4's chapter scales their queries)."""
        return None


RUNTIME_FLAGS = ('sliding_window',)


class NoMixer(TokenMixer):
    """'-': a layer without a token mixer, its MLP alone (Block builds no norm for it). It declares nothing: no
    positions, nothing cached, no FLOPs."""
    mixes = False

    def __init__(self, config, layer=0):
        super().__init__()


class NoPositions(nn.Module):
    """pos='none': no position information at all, neither a table nor rotations."""

    def __init__(self, config):
        super().__init__()

    def forward(self, x, start):
        return x, None


class LocalTables(Feature):
    """The rotary tables local layers read (tables['local']): their own base's with rope_local_theta, else the
    model's."""
    config_class = Config

    @staticmethod
    def applies(config):
        return 'L' in config.layer_kinds

    def build(self, model):
        # no weights; the attribute name is not a parameter's
        model.rope_local = Rotary(self.config, theta=self.config.rope_local_theta, plain=True) \
            if self.config.rope_local_theta is not None else None

    def embed(self, model, idx, x, start, tables):
        tables['local'] = tables['rope'] if model.rope_local is None else model.rope_local(x, start)[1]
        return x


def local_attention(config, layer):
    return attention(config, layer, positions='local', window=config.sliding_window)


def nope_attention(config, layer):
    return attention(config, layer, positions=config.nope_positions)


LAYER_KINDS['L'] = LayerKind('local', local_attention, 'local', attention=True, config_class=Config,
                             needs=lambda flags, window: {'sliding_window': window})
LAYER_KINDS['N'] = LayerKind('global without RoPE', nope_attention, 'nope', attention=True, full=True,
                             config_class=Config)
LAYER_KINDS['-'] = LayerKind('no mixer: the MLP alone', NoMixer, 'mlp-only', config_class=Config)
POSITIONS['none'] = NoPositions
FEATURES.append(LocalTables)
