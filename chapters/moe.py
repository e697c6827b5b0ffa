"""
Mixture of experts (mlp='moe'): each token goes to n_expert_active of n_expert SwiGLU experts, weighted by a
router, dropless (Shazeer et al. 2017; Switch Transformer, Fedus et al. 2021; Mixtral). DeepSeekMoE adds shared
experts every token goes to (n_shared_expert) and fine-grained experts; DeepSeek-V3 a sigmoid router balanced by a
bias moved outside the gradient (router='sigmoid', no auxiliary loss), groups of experts (n_expert_group,
topk_group) and the first layers dense (first_dense_layers). Qwen3-Next gates its shared expert; gpt-oss has
biases and a clamped SwiGLU; Llama 4 puts experts on every moe_every-th layer and weights the chosen expert's
input. Balancing losses: Switch Transformer's (moe_aux_loss_coef) and ST-MoE's router z-loss (moe_z_loss_coef).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from model import BOOL, FEATURES, MLPS, NON_NEGATIVE_NUMBER, OPTIONAL_POSITIVE_INT, POSITIVE_INT, POSITIVE_NUMBER, \
    Feature, GatedMLP, changed, flag_list, is_int, kinds, one_of

ROUTERS = ('softmax', 'sigmoid')
# at most this many tokens without a gradient in a compiled graph (compile_decoding's step: its batch) go through
# Experts.pairs, which reads nothing on the host; more (a prefill, training) are grouped by expert, each expert
# computing its own tokens only
STEP_TOKENS = 64
EXPERT_ONLY_FIELDS = ('moe_bias', 'swiglu_limit')  # the experts' own: MoE only, even with dense layers first
# the balancing losses' weights (not the bias's step: a family without the bias, Llama 4's, needs it 0)
TRAINING_FLAGS = ('moe_aux_loss_coef', 'moe_z_loss_coef')


@dataclass
class Config:
    n_expert: int = 8  # routed experts in each MoE layer
    n_expert_active: int = 2  # routed experts each token goes to (top-k)
    moe_hidden: int | None = None  # width of each expert; None: the dense width / n_expert_active
    n_shared_expert: int = 0  # experts every token goes to, each moe_hidden wide (DeepSeekMoE)
    shared_expert_gate: bool = False  # the shared experts' output times sigmoid(a learned projection of the token) (Qwen3-Next)
    router: str = 'softmax'  # 'softmax' (Mixtral, Qwen3-MoE) or 'sigmoid' (DeepSeek-V3, balanced by a bias)
    router_norm_topk: bool = True  # the chosen experts' weights rescaled to sum to 1
    n_expert_group: int = 1  # experts come from the topk_group best of this many groups (DeepSeek)
    topk_group: int = 1  # groups a token's experts may come from
    routed_scaling: float = 1.0  # factor on the routed experts' sum (DeepSeek-V3: 2.5)
    first_dense_layers: int = 0  # the first k layers keep a dense SwiGLU (DeepSeek)
    moe_aux_loss_coef: float = 0.0  # Switch Transformer's load-balancing loss in the training loss; 0: off
    moe_z_loss_coef: float = 0.0  # ST-MoE's router z-loss (logits kept small) in the training loss; 0: off
    moe_bias_update_rate: float = 0.001  # sigmoid router: step of the balancing bias per iteration; 0: frozen
    moe_bias: bool = False  # biases on the router and in the experts (gpt-oss)
    swiglu_limit: float | None = None  # experts' clamped SwiGLU (gpt-oss: 7): (clamp(up)+1) * g*sigmoid(1.702g), g = min(gate, limit); None: plain SwiGLU
    moe_every: int = 1  # with mlp='moe': MoE on every k-th layer (layers k-1, 2k-1, ...), a dense SwiGLU between (Llama 4 Maverick: 2)
    moe_scale_input: bool = False  # the router's weight multiplies each chosen expert's input, not its output (Llama 4)
    moe_activation: str = 'silu'  # with mlp='moe': the experts' gate activation, and the dense MLP's beside them: 'silu' (SwiGLU) or 'gelu' (GEGLU, tanh form: Gemma 4)

    FIELD_TYPES = {
        **kinds('n_expert n_expert_group topk_group moe_every', POSITIVE_INT),
        'n_expert_active': (lambda v, c: is_int(v, 1, c.n_expert), lambda c: f"an int in [1, n_expert={c.n_expert}]"),
        **kinds('n_shared_expert first_dense_layers', (lambda v, c: is_int(v, 0), 'an int >= 0')),
        'moe_hidden': OPTIONAL_POSITIVE_INT,
        'router': one_of(ROUTERS),
        **kinds('routed_scaling swiglu_limit', POSITIVE_NUMBER),
        **kinds('moe_aux_loss_coef moe_z_loss_coef moe_bias_update_rate', NON_NEGATIVE_NUMBER),
        **kinds('router_norm_topk moe_bias shared_expert_gate moe_scale_input', BOOL),
        'moe_activation': (lambda v, c: v in ('silu', 'gelu'), "'silu' or 'gelu'"),
    }
    CHECKS = [
        (lambda c: c.n_expert % c.n_expert_group != 0 or c.topk_group > c.n_expert_group,
         lambda c: f"n_expert_group ({c.n_expert_group}) must divide n_expert ({c.n_expert}) and be >= topk_group "
                   f"({c.topk_group})"),
        (lambda c: c.n_expert_active > c.topk_group * c.n_expert // c.n_expert_group,
         lambda c: f"n_expert_active ({c.n_expert_active}) is more than the experts of topk_group ({c.topk_group}) "
                   f"groups hold"),
        (lambda c: c.shared_expert_gate and not c.n_shared_expert,
         lambda c: "shared_expert_gate=True gates the shared experts: set n_shared_expert >= 1"),
        (lambda c: changed(c, EXPERT_ONLY_FIELDS) and c.mlp != 'moe',
         lambda c: f"{flag_list(c, changed(c, EXPERT_ONLY_FIELDS))} apply to mlp='moe' only, got mlp={c.mlp!r}"),
        (lambda c: changed(c, ('moe_every', 'moe_scale_input', 'moe_activation')) and c.mlp != 'moe',
         lambda c: f"{flag_list(c, changed(c, ('moe_every', 'moe_scale_input', 'moe_activation')))} apply to "
                   f"mlp='moe' only, got mlp={c.mlp!r}"),
        (lambda c: c.moe_every > c.n_layer,
         lambda c: f"moe_every={c.moe_every} is more than n_layer={c.n_layer}: no layer would have experts"),
    ]

    @property
    def expert_hidden(self):
        return self.moe_hidden or max(1, self.mlp_width // self.n_expert_active)

    def mlp_of(self, layer):
        """An MoE model's first_dense_layers, and the layers between every moe_every-th, keep a dense SwiGLU."""
        dense = layer < self.first_dense_layers or (layer + 1) % self.moe_every != 0
        return 'swiglu' if self.mlp == 'moe' and dense else super().mlp_of(layer)


# the modern block plus experts in Mixtral's shape: bench.py's variant 'moe'
VARIANT = {'mlp': 'moe', 'n_expert': 8, 'n_expert_active': 2, 'moe_aux_loss_coef': 0.01}


def grouped_mm_fits(widths, dtype=torch.bfloat16):
    """F.grouped_mm reads rows that start on 16-byte boundaries: every row stride of its inputs and weights (the
    widths n_embd and the expert's hidden width) must be a multiple of 16 bytes, 8 bf16 values; else it raises."""
    return all(w * dtype.itemsize % 16 == 0 for w in widths)


def _fused_grouped_mm(x, widths):
    """PyTorch's grouped matmul is a fused kernel on CUDA in bf16 (on the CPU a slower loop of its own): for
    bf16 inputs, or under bf16 autocast (which does not cover it), at widths it can read."""
    return x.is_cuda and hasattr(F, 'grouped_mm') and (x.dtype == torch.bfloat16 or (
        torch.is_autocast_enabled('cuda') and torch.get_autocast_dtype('cuda') == torch.bfloat16)) \
        and grouped_mm_fits(widths)


def oss_swiglu(gate, up, limit):
    """gpt-oss's clamped SwiGLU: g * sigmoid(1.702 g) * (clamp(up, -L, L) + 1), g = min(gate, L)."""
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(1.702 * gate) * (up + 1)


class Experts(nn.Module):
    """n_expert SwiGLU experts as stacked weights: c_fc (E, 2*hidden, d) as [gate | up], c_proj (E, d, hidden)."""

    def __init__(self, config):
        super().__init__()
        E, h, d = config.n_expert, config.expert_hidden, config.n_embd
        self.k, self.limit = config.n_expert_active, config.swiglu_limit
        self.gelu = config.moe_activation == 'gelu'  # GEGLU experts (Gemma 4)
        self.scale_input = config.moe_scale_input  # Llama 4
        self.c_fc = nn.Parameter(torch.randn(E, 2 * h, d) * 0.02)
        self.c_proj = nn.Parameter(torch.randn(E, d, h) * 0.02)  # GPT rescales it with the other c_proj
        self.c_fc_bias = self.c_proj_bias = None
        if config.moe_bias:  # gpt-oss
            self.c_fc_bias, self.c_proj_bias = nn.Parameter(torch.zeros(E, 2 * h)), nn.Parameter(torch.zeros(E, d))

    def act(self, gate_up):
        """SwiGLU of [gate | up]; with swiglu_limit, gpt-oss's clamped form (gate * sigmoid(1.702 gate), times up + 1)."""
        gate, up = gate_up.chunk(2, dim=-1)
        if self.limit is None:
            return (F.gelu(gate, approximate='tanh') if self.gelu else F.silu(gate)) * up
        return oss_swiglu(gate, up, self.limit)

    def per_expert(self):
        """Parameters of one expert (from the shapes: a sharded stack needs no gathering)."""
        return math.prod(self.c_fc.shape[1:]) + math.prod(self.c_proj.shape[1:])

    def matrix_stacks(self):
        """Its weights that are stacks of one matrix per expert (Muon orthogonalizes each expert's own)."""
        return self.c_fc, self.c_proj

    def token_flops(self, seq_len):
        """Forward + backward FLOPs per token: the k experts it goes to, not the others."""
        return 6 * self.k * self.per_expert()

    def forward(self, x, experts, weights):
        """x (N, d); experts, weights (N, k): each token's sum of weight * expert(token), dropless.
        Tokens are grouped by expert so each expert runs one matmul over all its tokens; a compiled decoding step's
        few tokens (no gradient, at most STEP_TOKENS) take each (token, expert) pair as it comes (pairs()). Eager
        steps keep the loop: its host read costs nothing there, and it reads each expert once, not a copy per pair
        (gpt-oss's 128 experts at batch 8: the pairs' gathered copies made eager decoding 1.4x slower)."""
        N, k = experts.shape
        decoding = torch.compiler.is_compiling() and not torch.is_grad_enabled() and N <= STEP_TOKENS
        if decoding and not _fused_grouped_mm(x, (self.c_fc.size(2), self.c_proj.size(2))):
            return self.pairs(x, experts, weights)
        order = experts.flatten().argsort(stable=True)  # the N*k (token, expert) pairs, grouped by expert
        tokens = order // k
        # tokens per expert: a fixed-size scatter, not bincount (whose data-dependent size syncs with the host
        # and breaks a compiled graph)
        flat = experts.flatten()
        counts = torch.zeros(self.c_fc.size(0), dtype=flat.dtype, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        xs, routed = x[tokens], weights.flatten()[order, None]
        if self.scale_input:
            xs = xs * routed.to(xs.dtype)
        biased = self.c_fc_bias is not None
        if _fused_grouped_mm(xs, (self.c_fc.size(2), self.c_proj.size(2))):  # one kernel for all experts, in bf16
            ends = counts.cumsum(0).to(torch.int32)
            bf16 = torch.bfloat16
            gate_up = F.grouped_mm(xs.to(bf16), self.c_fc.to(bf16).transpose(1, 2), offs=ends)
            if biased:
                gate_up = gate_up + self.c_fc_bias.to(bf16)[flat[order]]
            ys = F.grouped_mm(self.act(gate_up), self.c_proj.to(bf16).transpose(1, 2), offs=ends)
            if biased:
                ys = ys + self.c_proj_bias.to(bf16)[flat[order]]
            ys = ys.to(xs.dtype)
        else:  # a loop over experts, not tokens: the slices' sizes are read on the host (one sync per layer)
            # each expert's tokens and weights taken once (split, unbind) and the outputs joined once (cat): an
            # index or a slice per expert had its gradient written into a zero-filled copy of the whole tensor,
            # and each output written into a slice cloned the gradient, once per expert (an MoE step 1.14x on a
            # CPU). Without a gradient only the experts hit are indexed: unbinding all of gpt-oss's took longer
            # than an eager decoding step's products (0.76x HF's tok/s where indexing gave 1.07x)
            fc, proj, fc_bias, proj_bias = weights = self.c_fc, self.c_proj, self.c_fc_bias, self.c_proj_bias
            if torch.is_grad_enabled():
                fc, proj, fc_bias, proj_bias = (None if w is None else w.unbind(0) for w in weights)
            sizes = counts.tolist()
            hit = [e for e, n in enumerate(sizes) if n]  # the tokens come grouped by expert: only these have rows
            ys = torch.cat([F.linear(self.act(F.linear(tokens_e, fc[e], fc_bias[e] if biased else None)), proj[e],
                                     proj_bias[e] if biased else None)
                            for e, tokens_e in zip(hit, xs.split([sizes[e] for e in hit]))])
        if not self.scale_input:
            ys = ys * routed.to(ys.dtype)
        # in ys's dtype: under autocast the experts' matmuls give half precision for fp32 tokens, as a Linear's
        return ys.new_zeros(x.shape).index_add_(0, tokens, ys)

    def pairs(self, x, experts, weights):
        """forward() for a decoding step's few tokens with nothing read on the host, so a compiled step is one
        graph whatever the routing (the loop over experts reads their token counts: a graph break, and a recompile
        for each new set of counts). The pairs in the loop's order: by expert, each token's in ascending order.
        With fewer (token, expert) pairs than experts each pair's expert weights are gathered; with more, every
        expert runs on every token (reading each expert once) and the chosen pairs are kept."""
        N, k = experts.shape
        # the pairs grouped by expert, as the loop takes them (so each token's experts are added in the same
        # order): an expert two tokens picked is gathered twice in a row, the second time from the cache (a
        # Qwen3-MoE-shaped layer's 64 pairs 1.12x faster compiled on a CPU than in token order)
        flat, order = experts.flatten().sort(stable=True)
        routed, tokens = weights.flatten()[order, None], order // k  # each pair's weight and token
        xs = x[tokens] * routed.to(x.dtype) if self.scale_input else x[tokens]  # (N*k, d)
        if N * k <= self.c_fc.size(0):
            gate_up = torch.bmm(self.c_fc[flat], xs[:, :, None])[..., 0]
            if self.c_fc_bias is not None:
                gate_up = gate_up + self.c_fc_bias[flat]
            ys = torch.bmm(self.c_proj[flat], self.act(gate_up)[:, :, None])[..., 0]
            if self.c_proj_bias is not None:
                ys = ys + self.c_proj_bias[flat]
        else:
            inputs = x.expand(self.c_fc.size(0), -1, -1)  # (E, N, d): every expert, every token
            if self.scale_input:  # Llama 4: each token scaled by its weight for that expert (0 where not chosen)
                dense = torch.zeros(N, self.c_fc.size(0), dtype=x.dtype, device=x.device).scatter_(
                    1, experts, weights.to(x.dtype))
                inputs = inputs * dense.T[:, :, None]
            gate_up = inputs @ self.c_fc.transpose(1, 2)
            if self.c_fc_bias is not None:
                gate_up = gate_up + self.c_fc_bias[:, None]
            ys = self.act(gate_up) @ self.c_proj.transpose(1, 2)
            if self.c_proj_bias is not None:
                ys = ys + self.c_proj_bias[:, None]
            ys = ys[flat, tokens]  # (N*k, d): the chosen pairs
        if not self.scale_input:
            ys = ys * routed.to(ys.dtype)
        return ys.new_zeros(x.shape).index_add_(0, tokens, ys)


class MoE(nn.Module):
    """Mixture of experts: each token goes to n_expert_active of n_expert SwiGLU experts, weighted by the
    router, plus n_shared_expert always-on experts (DeepSeekMoE). Dropless: every token is computed by the
    experts it chose, however uneven the choice.

    router='softmax' (Mixtral, Qwen3-MoE): softmax over all experts, top-k. router='sigmoid' (DeepSeek-V3):
    sigmoid scores; a per-expert bias, added only to choose experts, is moved outside the gradient toward
    even load (update_expert_bias). With groups, a token's experts come from its topk_group best groups (a
    group scored by its best expert, or with sigmoid its best two, as DeepSeek-V2 and V3 do).
    The load and the balancing losses of each forward are kept for logging (moe_report)."""
    gated = True
    inputs = None  # it reads x alone (model.MLP's)
    config_class = Config
    syncs_host = True  # on a CPU its experts' token counts are read on the host: a graph break

    def __init__(self, config):
        super().__init__()
        self.k, self.E, self.sigmoid = config.n_expert_active, config.n_expert, config.router == 'sigmoid'
        self.groups, self.topk_group, self.norm_topk = config.n_expert_group, config.topk_group, config.router_norm_topk
        self.scaling, self.aux_coef, self.z_coef = config.routed_scaling, config.moe_aux_loss_coef, config.moe_z_loss_coef
        self.router = nn.Linear(config.n_embd, self.E, bias=config.moe_bias)
        self.experts = Experts(config)
        self.shared = GatedMLP(config, config.n_shared_expert * config.expert_hidden) if config.n_shared_expert else None
        # how much of the shared experts each token takes (Qwen3-Next)
        self.shared_gate = nn.Linear(config.n_embd, 1, bias=False) if config.shared_expert_gate else None
        if self.sigmoid:  # saved: it is part of what the model computes
            self.register_buffer('expert_bias', torch.zeros(self.E))
        self.register_buffer('load', torch.zeros(self.E), persistent=False)  # assignments per expert
        self.register_buffer('losses', torch.zeros(3), persistent=False)  # aux loss, z loss, forwards
        self.dropout = nn.Dropout(config.dropout)
        self.loss = None  # what this forward adds to the training loss

    def forward(self, x, tokens=None):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits, scores, experts, weights = self.route(x, tokens)
        y = self.experts(x, experts, weights * self.scaling)
        if self.shared is not None:
            y = y + (self.shared(x) * torch.sigmoid(self.shared_gate(x)) if self.shared_gate is not None
                     else self.shared(x))
        self._account(logits, scores, experts)
        return self.dropout(y.view(shape))

    def route(self, x, tokens=None):
        """x (N, d) -> the router's logits and scores (N, E), each token's k experts and their weights (N, k)
        (a subclass's router may read the token ids too)."""
        logits = self.router(x).float()
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)
        choice = scores + self.expert_bias if self.sigmoid else scores
        if self.groups > 1:
            grouped = choice.view(-1, self.groups, self.E // self.groups)
            group_score = grouped.topk(min(2, grouped.size(-1)), dim=-1).values.sum(-1) if self.sigmoid \
                else grouped.amax(dim=-1)
            best = group_score.topk(self.topk_group, dim=-1).indices
            keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
            choice = choice.masked_fill(~keep.repeat_interleave(self.E // self.groups, dim=1), float('-inf'))
        experts = choice.topk(self.k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.norm_topk:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, scores, experts, weights

    def _account(self, logits, scores, experts):
        """Load and balancing losses of this forward: kept for logging, and the training loss's share."""
        counts = torch.zeros_like(self.load).scatter_add_(0, experts.flatten(), torch.ones_like(
            experts.flatten(), dtype=self.load.dtype))
        self.load += counts
        # Switch Transformer: E * sum_e (share of assignments to e) * (mean router probability of e); 1 when even
        share = counts / experts.numel()
        probs = scores / scores.sum(dim=-1, keepdim=True) if self.sigmoid else scores
        aux = self.E * (share * probs.mean(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()  # ST-MoE: keeps router logits small
        self.losses += torch.stack((aux.detach(), z.detach(), torch.ones_like(z)))
        self.loss = self.aux_coef * aux + self.z_coef * z if self.training and (self.aux_coef or self.z_coef) else None

    def inactive_params(self):
        """Parameters of the experts a token does not go to."""
        return (self.E - self.k) * self.experts.per_expert()

    @torch.no_grad()
    def unread_params(self, x, tokens=None):
        """Parameters of the experts no token of x picked: what a forward of x need not read (a decoding step's
        few tokens leave most of a large MoE's experts unread)."""
        picked = self.route(x.reshape(-1, x.size(-1)), tokens)[2].unique().numel()
        return (self.E - picked) * sum(p[0].numel() for p in self.experts.parameters())

    @torch.no_grad()
    def balance(self, rate):
        """DeepSeek-V3's auxiliary-loss-free balancing: each expert's bias moves by `rate` toward even load
        (up if it got less than the mean since the last call, down if more). The load then restarts."""
        if self.sigmoid and rate:
            self.expert_bias += rate * torch.sign(self.load.mean() - self.load)
        self.load.zero_()


def moe_report(layers, reset=False):
    """Since the counts last restarted: per MoE layer the share of assignments each expert got, the max/mean
    load, and the mean balancing losses (unweighted); reset: then every count restarts."""
    report = {'load': [], 'max_over_mean': []}
    totals = torch.zeros(3)
    for m in layers:
        load = m.load.float().cpu()
        share = load / load.sum().clamp(min=1)
        report['load'].append([round(v, 4) for v in share.tolist()])
        report['max_over_mean'].append(round((load.max() / load.mean().clamp(min=1e-9)).item(), 3))
        totals += m.losses.cpu()
        if reset:
            m.load.zero_()
            m.losses.zero_()
    if totals[2]:
        report.update(aux_loss=(totals[0] / totals[2]).item(), z_loss=(totals[1] / totals[2]).item())
    return report


MLPS['moe'] = MoE


def moe_layers(model):
    """The MoE layers of the model's blocks."""
    return [block.mlp for block in model.transformer.h if isinstance(block.mlp, MoE)]


def report_and_reset(model):
    """Since the last call, the experts' load and balancing losses (moe_report); then every count restarts."""
    return moe_report(moe_layers(model), reset=True)


def update_expert_bias(model):
    """After an optimizer step: move the sigmoid routers' balancing biases (moe_bias_update_rate) by the load
    since the last step, then restart the counts. With DDP, all-reduce counters(model) first."""
    for m in moe_layers(model):
        m.balance(model.config.moe_bias_update_rate)


def reads_expert_load(model):
    """Whether update_expert_bias reads the load (sigmoid routers with a bias step): only then do DDP ranks need to
    sum it every step."""
    return bool(moe_layers(model)) and model.config.router == 'sigmoid' and model.config.moe_bias_update_rate > 0


def counters(model):
    """The MoE layers' running counts (load, losses): what DDP ranks sum before using them."""
    return [t for m in moe_layers(model) for t in (m.load, m.losses)]


class Balancing(Feature):
    """The MoE layers' balancing losses join the training loss: their mean over layers, so a coefficient means
    the same at any depth."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.mlp == 'moe'

    def loss(self, model, idx, h, targets):
        balancing = [m.loss for m in moe_layers(model) if m.loss is not None]
        return sum(balancing) / len(balancing) if balancing else None

    def objective(self, model):
        if any(m.aux_coef or m.z_coef for m in moe_layers(model)):
            return "the MoE routers' balancing losses (moe_aux_loss_coef, moe_z_loss_coef)"
        return None

    def after_step(self, model, sum_across):
        """Sigmoid routers' balancing bias follows this step's load, alike on every process."""
        if reads_expert_load(model):  # a softmax router never reads the load: nothing to sum
            sum_across([m.load for m in moe_layers(model)])
        update_expert_bias(model)


FEATURES.append(Balancing)
