"""
Hyper-connections: the residual stream widened to hc_mult parallel copies (Zhu et al. 2024, "Hyper-Connections").
Before each token mixer and each MLP the copies are collapsed into one input by weights computed from the copies
themselves; after it, the branch's output is spread back over the copies, and the copies are carried on, mixed or
not. The stream is (B, T, hc_mult, n_embd) between the blocks; each branch still sees (B, T, n_embd).

- 'mhc', manifold-constrained (Xie et al. 2025, arXiv 2512.24880; DeepSeek-V4, GLM-5.3-Flash): from the unweighted
  RMS norm of the flattened copies one projection gives the collapse weights (sigmoid, plus an epsilon that is
  added, never renormalised), the spread weights (hc_post_scale * sigmoid) and a mixing matrix made doubly
  stochastic by Sinkhorn iterations (a softmax, then alternating column and row normalisations, an epsilon in each
  denominator); the copies become post * F(u) + comb^T x. A doubly stochastic mix cannot grow the stream, which is
  what the paper claims stabilises deep stacks.
- 'ihc', independent (HY-V4): the same collapse and spread, the copies carried on unmixed: post * F(u) + x.
  HY-V4 adds the epsilon to the spread weights too (hc_post_eps).
- 'gated', Qwen4-Exp's gated residual (transformers' qwen4_exp): each copy RMS-normalized with gains of its own
  (a grouped norm, which is the branch's norm: the block has no other); the collapse weights are per copy and
  channel, sigmoid(up(silu(down(copies) / n))) through a low-rank bottleneck of hc_rank; the branch reads the
  mean over the copies of weights times normalized copies; the spread weights, hc_post_scale * sigmoid(inject(
  copies) / n), one per copy; the copies carried on unmixed: post * F(u) + x. The learned last collapse is the
  same collapse, and is the final norm.
The final collapse, before the last norm, is a learned weighting of the copies (hc_final='learned': DeepSeek-V4,
HY-V4, Qwen4-Exp) or their mean ('mean': GLM-5.3-Flash). mHC's and iHC's projections run in fp32. Nothing of it
is cached: the copies are per token.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters.engram import Engram, GroupedRMSNorm
from chapters.speedrun import STREAM_FIELDS
from model import BOOL, FEATURES, NON_NEGATIVE_NUMBER, OPTIONAL_POSITIVE_INT, POSITIVE_NUMBER, RESIDUALS, Add, \
    Feature, changed, flag_list, is_int, one_of

HC_KINDS = ('mhc', 'ihc', 'gated')
VARIANT = {'hc_mult': 4}  # bench.py's 'mhc': DeepSeek-V4's four copies, mixed
HC_FINALS = ('learned', 'mean')
HC_FIELDS = ('hc_kind', 'hc_sinkhorn_iters', 'hc_eps', 'hc_post_scale', 'hc_final', 'hc_post_eps', 'hc_rank')
WEIGHTED_FIELDS = ('hc_sinkhorn_iters', 'hc_eps', 'hc_post_eps')  # mhc's and ihc's, which 'gated' has no use for


@dataclass
class Config:
    hc_mult: int = 1  # copies of the residual stream (hyper-connections; DeepSeek-V4: 4); 0 or 1: the plain stream
    hc_kind: str = 'mhc'  # 'mhc': copies mixed by a doubly stochastic matrix (DeepSeek-V4, GLM-5.3-Flash); 'ihc': not mixed (HY-V4); 'gated': per-copy norms and low-rank collapse weights, not mixed (Qwen4-Exp)
    hc_sinkhorn_iters: int = 20  # mhc: Sinkhorn iterations making the mixing matrix doubly stochastic (DeepSeek-V4: 20)
    hc_eps: float = 1e-6  # added to the collapse weights and to each Sinkhorn denominator
    hc_post_scale: float = 2.0  # the spread weights are this times a sigmoid (DeepSeek-V4: 2; HY-V4's hc_magnitude)
    hc_final: str = 'learned'  # the copies' last collapse: 'learned' weights (DeepSeek-V4, HY-V4) or their 'mean' (GLM-5.3-Flash)
    hc_post_eps: bool = False  # hc_eps added to the spread weights as well as the collapse weights (HY-V4); False: to the collapse weights only (DeepSeek-V4)
    hc_rank: int | None = None  # 'gated': width of the low-rank bottleneck the collapse weights come through (Qwen4-Exp's hc_lowrank: 320); None: n_embd

    FIELD_TYPES = {
        'hc_mult': (lambda v, c: is_int(v, 0), 'an int >= 0'),
        'hc_kind': one_of(HC_KINDS),
        'hc_sinkhorn_iters': (lambda v, c: is_int(v), 'an int >= 1'),
        'hc_eps': NON_NEGATIVE_NUMBER,
        'hc_post_scale': POSITIVE_NUMBER,
        'hc_final': one_of(HC_FINALS),
        'hc_post_eps': BOOL,
        'hc_rank': OPTIONAL_POSITIVE_INT,
    }
    CHECKS = [
        (lambda c: changed(c, HC_FIELDS) and c.hc_mult <= 1,
         lambda c: f"{', '.join(changed(c, HC_FIELDS))} apply to hyper-connections: set hc_mult >= 2 (the copies of "
                   f"the stream) or leave them at their defaults"),
        (lambda c: c.hc_mult > 1 and c.norm_position == 'post',
         lambda c: "hyper-connections collapse the copies into each branch's input: norm_position='post' normalizes "
                   "the stream itself instead; use 'pre', 'sandwich' or 'after'"),
        (lambda c: c.hc_mult > 1 and (c.mtp_depth or c.per_layer_embd or c.layer_scalar),
         lambda c: "hyper-connections with mtp_depth, per_layer_embd or layer_scalar are not supported yet: they "
                   "read one stream where there are hc_mult copies"),
        (lambda c: c.hc_mult > 1 and changed(c, STREAM_FIELDS),  # the speedrun's, an earlier chapter's
         lambda c: f"{flag_list(c, changed(c, STREAM_FIELDS))} with hyper-connections (hc_mult={c.hc_mult}) are "
                   f"not supported yet: they add to one stream where there are hc_mult copies"),
        (lambda c: c.hc_rank is not None and c.hc_kind != 'gated',
         lambda c: f"hc_rank={c.hc_rank} is the gated residual's bottleneck: set hc_kind='gated' or hc_rank=None"),
        (lambda c: c.hc_kind == 'gated' and changed(c, WEIGHTED_FIELDS),
         lambda c: f"{flag_list(c, changed(c, WEIGHTED_FIELDS))} apply to hc_kind 'mhc' and 'ihc', not to 'gated' "
                   f"(no Sinkhorn mix, no epsilon on its weights): leave them at their defaults"),
        (lambda c: c.hc_mult > 1 and c.hc_kind == 'gated' and c.norm_position != 'pre',
         lambda c: f"hc_kind='gated' normalizes each copy in its collapse, the branch's only norm: norm_position="
                   f"{c.norm_position!r} puts norms elsewhere; use 'pre'"),
    ]

    @property
    def residual(self):
        return self.hc_kind if self.hc_mult > 1 else super().residual

    @property
    def stream_copies(self):
        return max(self.hc_mult, 1)


def normed_projection(x, weight, eps):
    """F.linear of x's unweighted RMS norm, the norm's scalar per token applied to the few outputs instead of to
    the n * d inputs (an elementwise pass over the copies less, forward and backward). In fp32 whatever autocast
    says, as DeepSeek-V4 computes the mixes: in half precision the scale's backward, r^3, overflowed at an RMS
    below 0.04 (the embeddings' at initialization)."""
    with torch.autocast(x.device.type, enabled=False):
        x = x.float()
        return F.linear(x, weight.float()) * torch.rsqrt(MeanSquare.apply(x) + eps)


class MeanSquare(torch.autograd.Function):
    """x.square().mean(-1, keepdim=True) of the n copies side by side, read in one pass (a dot product) and
    differentiated in one, 2 x dL/dms x / width: autograd's square and mean wrote the square and took four
    passes over the (B, T, n * d) stream back (forward and backward 1.9x faster at 8 x 256 x 4 x 128 on a CPU)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.linalg.vecdot(x, x).unsqueeze(-1) / x.size(-1)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return x * (grad * (2 / x.size(-1)))


def sinkhorn_sums(iters):
    """The dims Sinkhorn's normalisations sum over, in order: columns, then rows and columns iters - 1 times."""
    return [-2] + [-1, -2] * (iters - 1)


class Sinkhorn(torch.autograd.Function):
    """From logits (B, T, n, n): comb = softmax over each row + eps, then comb / (its sums over each of
    sinkhorn_sums(iters) + eps), one after another, with the gradient autograd would give. The softmax is here too,
    over the same layout (torch's over a last dim of 4 took as long as the 39 normalisations). Its own backward
    because autograd records three operators a normalisation and runs more for its backward, on (B, T, n, n)
    tensors too small for the work to outweigh each operator's overhead (20 iterations: a fifth of a one-layer mHC
    model's training step on the CPU). It works on the matrices laid out (n, n, B, T): a sum over one of the n-long
    dims is then a sum of contiguous slabs, 6-7x faster on a CPU than over the last dims of (B, T, n, n). The
    forward keeps the last output and each normalisation's denominator's reciprocal, a vector per matrix, and the
    backward recovers each output before by dividing by it: 188 numbers kept a token at n = 4, where the 39
    outputs made it 796 (more than the stream's copies at a width of 128). Without a gradient
    (decoding) it keeps nothing and divides in place."""

    @staticmethod
    def forward(ctx, logits, iters, eps):
        logits = logits.permute(2, 3, 0, 1).contiguous()  # a row's entries: dim 1
        soft = (logits - logits.amax(1, keepdim=True)).exp_()
        soft.mul_(soft.sum(1, keepdim=True).reciprocal_())
        if not ctx.needs_input_grad[0]:  # decoding: nothing kept, each normalisation in place, a division
            comb = soft.add_(eps)  # (3 operators where the product by the reciprocal takes 4: the step's count)
            for dim in sinkhorn_sums(iters):
                comb.div_(comb.sum(dim=dim + 2, keepdim=True).add_(eps))
            return comb.permute(2, 3, 0, 1)
        comb, inverses = soft + eps, []
        for dim in sinkhorn_sums(iters):
            # -2, -1 of (B, T, n, n): 0, 1 here; a product by the reciprocal where a division took 1.5x as long
            inverse = comb.sum(dim=dim + 2, keepdim=True).add_(eps).reciprocal_()
            inverses.append(inverse)
            comb.mul_(inverse)
        ctx.save_for_backward(soft, comb, *inverses)
        ctx.iters = iters
        return comb.permute(2, 3, 0, 1)

    @staticmethod
    def backward(ctx, grad):
        soft, y, *inverses = ctx.saved_tensors
        y = y.clone()  # the output, then each normalisation's output before it
        grad = grad.permute(2, 3, 0, 1).contiguous()
        # y = c / (sum_dim c + eps): dL/dc = (dL/dy - sum_dim(dL/dy * y)) / (sum_dim c + eps)
        for inverse, dim in reversed(list(zip(inverses, sinkhorn_sums(ctx.iters)))):
            grad = (grad - (grad * y).sum(dim=dim + 2, keepdim=True)).mul_(inverse)
            y.div_(inverse)
        # the softmax's: dL/dl = s (dL/ds - sum_row(dL/ds * s))
        grad = (grad - (grad * soft).sum(1, keepdim=True)).mul_(soft)
        return grad.permute(2, 3, 0, 1), None, None


class HyperConnection(nn.Module):
    """One branch's hyper-connection: the collapse weights pre, the spread weights post and (mixed) the matrix comb,
    from the copies x (B, T, n, d); connect() collapses, runs the branch and updates the copies."""

    def __init__(self, config, mixed):
        super().__init__()
        n = self.n = config.hc_mult
        self.mixed, self.iters, self.eps, self.post_scale = mixed, config.hc_sinkhorn_iters, config.hc_eps, config.hc_post_scale
        self.post_eps = config.hc_eps if config.hc_post_eps else 0.0  # HY-V4's spread weights take the epsilon too
        self.norm_eps, self.width = config.norm_eps, config.n_embd
        outputs = (2 + n) * n if mixed else 2 * n  # [pre | post | comb]
        # HY-V4's init: weights near zero, so the copies start as one stream: the collapse a mean (sigmoid of
        # -ln(n-1) = 1/n), the spread sigmoid(0) times its scale, the mix uniform
        self.fn = nn.Parameter(torch.randn(outputs, n * config.n_embd) * 0.02)
        self.base = nn.Parameter(torch.cat((torch.full((n,), -math.log(max(n - 1, 1))), torch.zeros(outputs - n))))
        self.scale = nn.Parameter(torch.full((3 if mixed else 2,), 0.01))

    def weights(self, x):
        """pre (B, T, n), post (B, T, n) and comb (B, T, n, n) or None, in fp32."""
        n = self.n
        mixes = normed_projection(x.flatten(2).float(), self.fn.float(), self.norm_eps)
        parts = mixes.split([n, n, n * n] if self.mixed else [n, n], dim=-1)
        bases = self.base.float().split([n, n, n * n] if self.mixed else [n, n])
        logits = [part * scale + base for part, scale, base in zip(parts, self.scale.float().unbind(0), bases)]
        pre = torch.sigmoid(logits[0]) + self.eps
        post = self.post_scale * torch.sigmoid(logits[1]) + self.post_eps
        if not self.mixed:
            return pre, post, None
        return pre, post, Sinkhorn.apply(logits[2].unflatten(-1, (n, n)), self.iters, self.eps)

    def connect(self, x, branch):
        pre, post, comb = self.weights(x)
        # the collapse pre^T x and the mix comb^T x of each token's copies in one matmul, [pre | comb]^T (n+1, n)
        # by x (n, d): a batched matmul of tiny matrices, 3-4x faster forward and backward on a CPU than the
        # products summed over the copies, whose (n, n, d) intermediate per token was half an mHC step's time
        weights = pre.unsqueeze(-2) if comb is None else torch.cat((pre.unsqueeze(-2), comb.transpose(-1, -2)), -2)
        # contiguous: the first block's copies are the embedding expanded (stride 0), and over those the batched
        # matmul fell back to a loop of 2 x B x T small ones, forward and back (an mHC step 1.04x). Outside autocast:
        # the copies are the residual stream, kept in its dtype as the one stream is (in fp16 a branch's norm of a
        # zero copy, a padding token's, overflowed in its backward)
        with torch.autocast(x.device.type, enabled=False):
            mixed = weights.to(x.dtype) @ x.contiguous()  # (B, T, 1 or n+1, d)
        # split, not indexed: the gradients of two slices would each be a zero-filled (B, T, n+1, d)
        collapsed, kept = (mixed, x) if comb is None else mixed.split([1, self.n], dim=2)
        y = branch(collapsed.squeeze(2))
        return torch.addcmul(kept, post.to(x.dtype).unsqueeze(-1), y.unsqueeze(-2))  # the spread, in one pass

    def token_flops(self, seq_len):
        """The projection as a Linear's, and the collapse and mix as the matmul of [pre | comb]^T by the copies
        (forward and backward, as a Linear of that shape)."""
        rows = self.n + 1 if self.mixed else 1
        return 6 * self.fn.numel() + 6 * rows * self.n * self.width


class HyperConnections(Add):
    """A block's two hyper-connections, around its token mixer (attn_hc) and its MLP (ffn_hc), DeepSeek-V4's names."""
    mixed = True

    def __init__(self, config, layer=0):
        super().__init__(config, layer)
        self.attn_hc, self.ffn_hc = HyperConnection(config, self.mixed), HyperConnection(config, self.mixed)

    def forward(self, x, branch, which):
        return (self.attn_hc, self.ffn_hc)[which].connect(x, branch)


class IndependentHyperConnections(HyperConnections):
    mixed = False


class GatedConnection(nn.Module):
    """Qwen4-Exp's gated residual around one branch (or, spreads=False, the last collapse): the copies x
    (B, T, n, d) normalized each with its own gains, collapsed by per-channel weights through a low-rank
    bottleneck; connect() runs the branch on the collapse and adds its output to each copy times that copy's gate.
    The weights read the normalized copies flattened; both pre-activations are divided by n, Qwen4-Exp's scale."""

    def __init__(self, config, spreads=True):
        super().__init__()
        self.n = n = config.hc_mult
        d = config.n_embd
        self.post_scale = config.hc_post_scale  # Qwen4-Exp's 2: the gates start at 1, as a plain residual's
        self.norm = GroupedRMSNorm(n, d, config.norm_eps)
        self.down = nn.Linear(n * d, config.hc_rank or d, bias=False)
        self.up = nn.Linear(config.hc_rank or d, n * d, bias=False)
        self.inject = nn.Linear(n * d, n, bias=False) if spreads else None

    def collapse(self, x):
        """The branch's input (B, T, d), and the normalized copies flattened (B, T, n d) the gates read."""
        normed = self.norm(x)
        flat = normed.flatten(2)
        weights = torch.sigmoid(self.up(F.silu(self.down(flat) / self.n))).view_as(normed)
        return (weights * normed).mean(2), flat

    def forward(self, x):
        return self.collapse(x)[0]

    def connect(self, x, branch):
        u, flat = self.collapse(x)
        post = self.post_scale * torch.sigmoid(self.inject(flat) / self.n)  # (B, T, n)
        return x + post.unsqueeze(-1) * branch(u).unsqueeze(-2)


class GatedConnections(HyperConnections):
    """A block's two gated residuals (Qwen4-Exp's attn_hyper_connection and mlp_hyper_connection)."""

    def __init__(self, config, layer=0):
        Add.__init__(self, config, layer)
        self.attn_hc, self.ffn_hc = GatedConnection(config), GatedConnection(config)


class HyperHead(nn.Module):
    """The copies' learned last collapse (DeepSeek-V4's hc_head): sigmoid weights from their unweighted RMS norm."""

    def __init__(self, config):
        super().__init__()
        n = config.hc_mult
        self.eps, self.norm_eps = config.hc_eps, config.norm_eps
        self.hc_fn = nn.Parameter(torch.randn(n, n * config.n_embd) * 0.02)
        self.hc_base = nn.Parameter(torch.full((n,), -math.log(max(n - 1, 1))))
        self.hc_scale = nn.Parameter(torch.full((1,), 0.01))

    def forward(self, x):
        mixes = normed_projection(x.flatten(2).float(), self.hc_fn.float(), self.norm_eps)
        pre = torch.sigmoid(mixes * self.hc_scale.float() + self.hc_base.float()) + self.eps
        return (pre.unsqueeze(-1) * x).sum(dim=2).to(x.dtype)

    def token_flops(self, seq_len):
        return 6 * self.hc_fn.numel()


class Streams(Feature):
    """The stream widened to hc_mult copies of the first block's input, and collapsed after the last block."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.hc_mult > 1

    def build_block(self, block, layer):
        if self.config.hc_kind == 'gated':  # its collapse normalizes each copy: the branches take no norm of their own
            block.ln_1 = None if block.ln_1 is None else nn.Identity()
            block.ln_2 = None if block.ln_2 is None else nn.Identity()

    def build(self, model):
        gated = self.config.hc_kind == 'gated'
        if self.config.hc_final == 'learned':
            model.transformer.hc_head = GatedConnection(self.config, spreads=False) if gated else \
                HyperHead(self.config)
            if gated:  # Qwen4-Exp's last collapse normalizes the copies: the head reads it as it is
                model.transformer.ln_f = nn.Identity()

    def embed(self, model, idx, x, start, tables):
        return x.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1)

    def final(self, model, x):
        return model.transformer.hc_head(x) if self.config.hc_final == 'learned' else x.mean(dim=2)


RESIDUALS.update(mhc=HyperConnections, ihc=IndependentHyperConnections, gated=GatedConnections)
# the copies are made before the n-gram memory's embed hook adds to them (a memory at layer 0 gates each copy)
FEATURES.insert(FEATURES.index(Engram), Streams)
