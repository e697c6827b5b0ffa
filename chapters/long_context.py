"""
Long context: RoPE past the length a model was trained at (rope_scaling), the formulas transformers uses.

- 'linear': position interpolation (Chen et al. 2023): positions squeezed `factor` times.
- 'dynamic': NTK-aware scaling (bloc97, Code Llama): a larger base once the sequence outgrows the trained length,
  so its angles follow the length reached.
- 'yarn': YaRN (Peng et al. 2023; DeepSeek-V2/V3, gpt-oss, Qwen): the slow dims stretched, the fast ones kept, a
  ramp between, and the attention sharpened (the factor on cos and sin; DeepSeek's mscale also scales MLA's
  softmax).
- 'llama3': Llama 3.1's: long wavelengths stretched, short ones kept, a smooth band between.

Local layers' own tables (rope_local_theta) are never rescaled (plain tables). The sliding window, the other road
to long context, is a layer kind (layer_kinds.py).
"""

import math
from dataclasses import dataclass

import torch

from model import BOOL, NON_NEGATIVE_NUMBER, OPTIONAL_POSITIVE_INT, POSITIVE_NUMBER, changed, kinds, one_of

ROPE_SCALINGS = (None, 'linear', 'dynamic', 'yarn', 'llama3')
# the flags of a RoPE scaling, and the rope_scaling values they apply to
ROPE_SCALING_FLAGS = {'rope_factor': ('linear', 'dynamic', 'yarn', 'llama3'),
                      'rope_original_length': ('linear', 'dynamic', 'yarn', 'llama3'),
                      'rope_low_freq_factor': ('llama3',), 'rope_high_freq_factor': ('llama3',),
                      'yarn_beta_fast': ('yarn',), 'yarn_beta_slow': ('yarn',), 'yarn_mscale': ('yarn',),
                      'yarn_mscale_all_dim': ('yarn',), 'rope_attention_factor': ('yarn',), 'yarn_truncate': ('yarn',)}


@dataclass
class Config:
    rope_scaling: str | None = None  # RoPE past the trained length: None, 'linear', 'dynamic', 'yarn' or 'llama3'
    rope_factor: float | None = None  # rope_scaling's stretch; None: block_size / rope_original_length
    rope_original_length: int | None = None  # the context RoPE was trained at; None: block_size
    rope_low_freq_factor: float = 1.0  # llama3: wavelengths over original_length / this are stretched fully
    rope_high_freq_factor: float = 4.0  # llama3: wavelengths under original_length / this are kept
    yarn_beta_fast: float = 32.0  # yarn: dims turning more often than this within the original length are kept
    yarn_beta_slow: float = 1.0  # yarn: dims turning less often than this are stretched fully
    yarn_mscale: float = 0.0  # yarn: DeepSeek's attention temperature (with yarn_mscale_all_dim); 0: off
    yarn_mscale_all_dim: float = 0.0  # yarn: DeepSeek's; also scales MLA's softmax; 0: off
    rope_attention_factor: float | None = None  # yarn: factor on cos and sin; None: 0.1*ln(factor)+1
    yarn_truncate: bool = True  # yarn: the band between kept and stretched dims starts and ends at whole dims (gpt-oss: False)

    FIELD_TYPES = {
        'rope_scaling': one_of(ROPE_SCALINGS),
        'rope_original_length': OPTIONAL_POSITIVE_INT,
        **kinds('rope_factor rope_low_freq_factor rope_high_freq_factor yarn_beta_fast yarn_beta_slow '
                'rope_attention_factor', POSITIVE_NUMBER),
        **kinds('yarn_mscale yarn_mscale_all_dim', NON_NEGATIVE_NUMBER),
        'yarn_truncate': BOOL,
    }
    CHECKS = [
        (lambda c: c.rope_scaling is not None and c.pos != 'rope',
         lambda c: f"rope_scaling={c.rope_scaling!r} needs pos='rope', got pos={c.pos!r} (set --pos=rope or "
                   f"--rope_scaling=None)"),
        (lambda c: not c.rope_high_freq_factor > c.rope_low_freq_factor,
         lambda c: f"rope_high_freq_factor ({c.rope_high_freq_factor}) must be greater than rope_low_freq_factor "
                   f"({c.rope_low_freq_factor})"),
        # a scaling's own flags do nothing without it: refused rather than recorded as if they applied
        *[(lambda c, name=name: name in changed(c, (name,)) and c.rope_scaling not in ROPE_SCALING_FLAGS[name],
           lambda c, name=name: f"{name}={getattr(c, name)!r} applies only with rope_scaling="
                                f"{' or '.join(map(repr, ROPE_SCALING_FLAGS[name]))}, got rope_scaling="
                                f"{c.rope_scaling!r} (set --rope_scaling, or "
                                f"--{name}={type(c).__dataclass_fields__[name].default})")
          for name in ROPE_SCALING_FLAGS],
    ]

    @property
    def rope_length(self):
        """The context RoPE was trained at: rope_scaling stretches past it."""
        return self.rope_original_length or self.block_size

    @property
    def rope_scale(self):
        return self.rope_factor or self.block_size / self.rope_length

    def rope_frequencies(self, dim, theta, length, plain=False):
        inv, factor = super().rope_frequencies(dim, theta, length, plain)
        if self.rope_scaling is None or plain:
            return inv, factor
        return scaled_frequencies(self, inv, dim, theta, length)

    @property
    def positions_follow_length(self):
        return self.rope_scaling == 'dynamic' or super().positions_follow_length

    def rope_tables_for(self, length, plain=False):
        """'dynamic' changes every angle with the length reached past the trained one (as transformers does)."""
        if self.rope_scaling == 'dynamic' and length > self.rope_length and not plain:
            return length
        return super().rope_tables_for(length, plain)


RUNTIME_FLAGS = ('rope_scaling', 'rope_factor', 'rope_original_length', 'rope_low_freq_factor',
                 'rope_high_freq_factor', 'yarn_beta_fast', 'yarn_beta_slow', 'yarn_mscale', 'yarn_mscale_all_dim',
                 'rope_attention_factor', 'yarn_truncate')


def yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def scaled_frequencies(config, inv, dim, theta, length):
    """RoPE's frequencies inv stretched past the trained length by config.rope_scaling, for a sequence of `length`
    positions (only 'dynamic' depends on it), and the factor on cos and sin."""
    kind, factor, original = config.rope_scaling, config.rope_scale, config.rope_length
    if kind == 'linear':
        return inv / factor, 1.0
    if kind == 'dynamic':
        longest = max(length, original)
        base = theta * ((factor * longest / original) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim), 1.0
    if kind == 'llama3':
        low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
        wavelength = 2 * math.pi / inv
        stretched = torch.where(wavelength > original / low, inv / factor, inv)
        smooth = (original / wavelength - low) / (high - low)
        band = (wavelength >= original / high) & (wavelength <= original / low)
        return torch.where(band, (1 - smooth) * stretched / factor + smooth * stretched, stretched), 1.0
    return yarn_frequencies(config, inv, dim, theta)


def yarn_frequencies(config, inv, dim, theta):
    """yarn: stretch the dims that turn fewer than beta_slow times within the original length, keep those turning
    more than beta_fast times, ramp between; and sharpen the attention (the factor on cos and sin)."""
    factor, original = config.rope_scale, config.rope_length

    def dim_turning(turns):
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))
    low, high = dim_turning(config.yarn_beta_fast), dim_turning(config.yarn_beta_slow)
    if config.yarn_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
    attention_factor = config.rope_attention_factor
    if attention_factor is None:
        if config.yarn_mscale and config.yarn_mscale_all_dim:
            attention_factor = yarn_mscale(factor, config.yarn_mscale) / yarn_mscale(factor, config.yarn_mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    return inv / factor * ramp + inv * (1 - ramp), attention_factor
