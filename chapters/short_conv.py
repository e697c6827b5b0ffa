"""
The gated short convolution ('V' layers; LFM2, Liquid AI 2025; after Hyena and H3's short convolutions): B, C and x
from one projection of the token, then y = out(C * conv(B * x)), conv a causal depthwise convolution over the last
short_conv_kernel tokens. No positions and no softmax: what a token sees of the past is the kernel's reach, so a
cache keeps the last kernel-1 gated inputs whatever the context. The depthwise convolution here is also the one
the linear layers (deltanet.py, mamba2.py) run over their inputs.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn

from model import LAYER_KINDS, LayerKind, TokenMixer, changed, is_int


@dataclass
class Config:
    short_conv_kernel: int = 3  # a 'V' layer's causal depthwise convolution, in tokens (LFM2's conv_L_cache)

    FIELD_TYPES = {'short_conv_kernel': (lambda v, c: is_int(v), 'an int >= 1')}
    CHECKS = [
        (lambda c: changed(c, ('short_conv_kernel',)) and 'V' not in c.layer_kinds,
         lambda c: f"short_conv_kernel={c.short_conv_kernel} applies to gated short convolution ('V') layers and "
                   f"layers={c.layers!r} has none: add 'V' to layers or leave it at 3"),
    ]


def causal_depthwise_conv(x, weight, bias=None, cache=None, name='conv'):
    """Each channel of x (B, T, channels) convolved over its last kernel inputs, its own kernel (weight: a
    depthwise Conv1d's (channels, 1, kernel)), the inputs before the first taken as zeros or, with a cache, as
    the last kernel-1 inputs it keeps under `name` ((B, channels, kernel-1); then overwritten with the new last
    ones)."""
    kernel = weight.size(-1)
    past = x.new_zeros(x.size(0), kernel - 1, x.size(2)) if cache is None else \
        cache.stores[name].to(x.dtype).transpose(1, 2)
    x = torch.cat((past, x), dim=1)
    if cache is not None:
        cache.stores[name].copy_(x[:, x.size(1) - (kernel - 1):].transpose(1, 2))
    y = shifted_products(x, weight)
    return y if bias is None else y + bias


def shifted_products(x, weight, dilation=1):
    """The depthwise convolution of x (B, T + (kernel - 1) dilation, channels) as kernel-many shifted products,
    summed: each shift a slice of whole time steps times a row of weights along the contiguous channels. torch's
    FLOP counter miscounts a grouped convolution's backward; on a CPU this runs forward and backward faster than
    conv1d, and 1.5-2x faster than the same products over (B, channels, T) with the transposes to it and back."""
    return ShiftedProducts.apply(x, weight, dilation)


class ShiftedProducts(torch.autograd.Function):
    """shifted_products with its backward written out. Autograd's, through addcmul and the slices, wrote each
    slice's gradient into a zero-filled copy of the whole input and summed them, and multiplied by addcmul's
    value 1: the backward below is one pass per shift for the input and a product and a sum per shift for the
    weights (the convolution forward and backward 1.8x faster at 8 x 256 steps of 384 channels, one thread)."""

    @staticmethod
    def forward(ctx, x, weight, dilation):
        kernel = weight.size(-1)
        T = x.size(1) - (kernel - 1) * dilation
        w = weight.view(weight.size(0), kernel).t()  # (kernel, channels)
        y = x[:, :T] * w[0]
        for i in range(1, kernel):
            y.addcmul_(x[:, i * dilation:i * dilation + T], w[i])
        ctx.save_for_backward(x, weight)
        ctx.dilation = dilation
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dilation, kernel, T = ctx.dilation, weight.size(-1), grad.size(1)
        w = weight.view(weight.size(0), kernel).t().to(grad.dtype)
        shifts = [slice(i * dilation, i * dilation + T) for i in range(kernel)]
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:  # the last shift covers every step but the first (kernel - 1) dilation
            grad_x = grad.new_empty(x.shape)
            grad_x[:, :shifts[-1].start].zero_()
            torch.mul(grad, w[-1], out=grad_x[:, shifts[-1]])
            for i in range(kernel - 1):
                grad_x[:, shifts[i]].addcmul_(grad, w[i])
            grad_x = grad_x.to(x.dtype)
        if ctx.needs_input_grad[1]:  # a sequence at a time: its products stay in the cache (3.9x faster)
            grad_w = grad.new_zeros(kernel, grad.size(-1))
            products = grad.new_empty(grad.shape[1:])
            for b in range(grad.size(0)):
                for i, shift in enumerate(shifts):
                    grad_w[i] += torch.mul(grad[b], x[b, shift], out=products).sum(0)
            grad_w = grad_w.t().reshape(weight.shape).to(weight.dtype)
        return grad_x, grad_w, None


class ShortConv(TokenMixer):
    """LFM2's gated short convolution, a 'V' layer: B, C and x from one projection of the token, then
    y = out(C * conv(B * x)), conv a causal depthwise convolution over the last short_conv_kernel tokens (a
    few). No positions and no softmax: what a token sees of the past is the kernel's reach in this layer, so a
    cache keeps the last kernel-1 gated inputs, whatever the context."""

    def __init__(self, config, layer=0):
        super().__init__()
        d, self.kernel = config.n_embd, config.short_conv_kernel
        self.in_proj = nn.Linear(d, 3 * d, bias=config.bias)  # [B | C | x]
        self.conv1d = nn.Conv1d(d, d, self.kernel, groups=d, bias=config.bias)
        self.c_proj = nn.Linear(d, d, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def cache_states(self):
        return {'conv': ((self.conv1d.in_channels, self.kernel - 1), None)}

    def token_flops(self, seq_len):
        """The convolution multiplies each of its weights once per token, as a Linear does."""
        return 6 * self.conv1d.weight.numel()

    def forward(self, x, rope=None, mask=None, cache=None):
        """rope and mask are attention's: the convolution has no positions but its order."""
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        h = causal_depthwise_conv(b * h, self.conv1d.weight, self.conv1d.bias, cache)
        return self.resid_dropout(self.c_proj(c * h))



LAYER_KINDS['V'] = LayerKind('gated short convolution', ShortConv, 'shortconv', config_class=Config)
