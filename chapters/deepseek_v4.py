"""
DeepSeek-V4's block (DeepSeek, 2026), the parts the earlier chapters lack; its hyper-connections are the next
chapter's (hyper_connections.py), its sliding window layer_kinds.py's, its sinks and partial RoPE attention.py's.

- Attention with one shared key-value head (attn='shared_kv'): the queries from a low-rank bottleneck (q_rank,
  RMS-normalised with a gain), then each query head scaled to unit RMS without one; one head per token, normalised
  and rotated, is both the key and the value of every query head, so the cache keeps head_dim numbers per token
  and layer, half of MQA's. The softmax scale is head_dim^-1/2, sinks (attn_sinks) join it. With K = V the values
  are rotated too: the output's rotated dims are turned back by the query's position (inverse RoPE), so what each
  past token contributes depends only on how far back it is.
- The grouped low-rank output projection (o_groups, o_lora_rank): the heads fall into o_groups groups, each
  projected apart to o_lora_rank (one block-diagonal matrix), then the groups together to n_embd, so the output
  projection of n_head * head_dim (32768 in the release) costs a fraction of a dense one.
- The router's sqrt-softplus score (router_score='sqrtsoftplus', with router='sigmoid': the biased top-k of
  DeepSeek-V3, its weights renormalised and times routed_scaling): score = sqrt(softplus(logit)).
- The clamped SwiGLU of DeepSeek-V4 (swiglu_form='plain' with swiglu_limit L): silu(min(gate, L)) * clamp(up, -L,
  L), on the routed and the shared experts; gpt-oss's form (moe.py) is another.

DeepSeek-V4 rotates the last dims of each head in pairs; these rotate the first in halves, as every chapter here
does: the same model with its head dims in another order (hf/deepseek_v4.py reorders the weights). Not here yet:
the compressed layers (HCA, CSA) and hash routing (its experts chosen by the token id: the MLP would need the
token ids, which no extension point of model.py hands it).
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from chapters import attention
from chapters.moe import Experts, MoE
from model import ATTENTIONS, FEATURES, OPTIONAL_POSITIVE_INT, POSITIVE_INT, Feature, GatedMLP, RMSNorm, TokenMixer, \
    apply_rope, changed, flag_list, is_int, one_of

SHARED_KV_FIELDS = ('q_rank', 'o_groups', 'o_lora_rank')
# attention's switches that a shared key-value head, normalised its own way, cannot take
SHARED_KV_CANNOT = ('n_kv_head', 'qk_norm', 'qk_norm_all_heads', 'qkv_bias', 'attn_gate', 'v_norm', 'rope_qk_norm',
                    'nope_temperature', 'index_topk')
ROUTER_SCORES = (None, 'sqrtsoftplus')
SWIGLU_FORMS = ('gpt-oss', 'plain')


def defaults(c, names):
    """The flags of names set away from their defaults, as the command-line flags that put them back."""
    return ' '.join(f'--{k}={type(c).__dataclass_fields__[k].default}' for k in changed(c, names))


@dataclass
class Config:
    q_rank: int | None = None  # attn='shared_kv': the queries' low-rank bottleneck, RMS-normalised with a gain (DeepSeek-V4's q_lora_rank: 1024); None: queries projected directly
    o_groups: int = 1  # attn='shared_kv' with o_lora_rank: the heads fall into this many groups, each projected apart (DeepSeek-V4: 8)
    o_lora_rank: int | None = None  # attn='shared_kv': each group of heads projected to this width, then all groups to n_embd (DeepSeek-V4: 1024); None: one projection
    router_score: str | None = None  # router='sigmoid': 'sqrtsoftplus' scores the experts by sqrt(softplus(logit)) in place of the sigmoid (DeepSeek-V4); None: the sigmoid
    swiglu_form: str = 'gpt-oss'  # how swiglu_limit L clamps: 'gpt-oss' (moe.py's); 'plain': silu(min(gate, L)) * clamp(up, -L, L), routed and shared experts (DeepSeek-V4: L = 10)
    hash_moe_layers: int = 0  # the first k MoE layers route by the token id: each id's experts from a frozen random table, weighted by the router's scores (DeepSeek-V4: 3)

    FIELD_TYPES = {
        'q_rank': OPTIONAL_POSITIVE_INT,
        'o_groups': POSITIVE_INT,
        'o_lora_rank': OPTIONAL_POSITIVE_INT,
        'router_score': one_of(ROUTER_SCORES),
        'swiglu_form': one_of(SWIGLU_FORMS),
        'hash_moe_layers': (lambda v, c: is_int(v, 0), 'an int >= 0'),
    }
    CHECKS = [
        (lambda c: changed(c, SHARED_KV_FIELDS) and c.attn != 'shared_kv',
         lambda c: f"{flag_list(c, changed(c, SHARED_KV_FIELDS))} apply to attn='shared_kv' only, got attn={c.attn!r}"),
        (lambda c: c.attn == 'shared_kv' and changed(c, SHARED_KV_CANNOT),
         lambda c: f"attn='shared_kv' makes one key-value head, normalised its own way: "
                   f"{flag_list(c, changed(c, SHARED_KV_CANNOT))} cannot apply (set {defaults(c, SHARED_KV_CANNOT)})"),
        (lambda c: c.o_groups != 1 and c.o_lora_rank is None,
         lambda c: f"o_groups={c.o_groups} groups the low-rank output projection: set o_lora_rank (each group's "
                   f"width)"),
        (lambda c: c.n_head % c.o_groups != 0,
         lambda c: f"o_groups ({c.o_groups}) must divide n_head ({c.n_head}): each group is whole heads"),
        (lambda c: c.router_score is not None and (c.mlp != 'moe' or c.router != 'sigmoid'),
         lambda c: f"router_score={c.router_score!r} scores the experts of the biased top-k router: set mlp='moe' and "
                   f"router='sigmoid', got mlp={c.mlp!r}, router={c.router!r}"),
        (lambda c: c.router_score is not None and c.n_expert_group != 1,
         lambda c: f"router_score={c.router_score!r} chooses among all the experts (DeepSeek-V4 has no groups): set "
                   f"n_expert_group=1, got {c.n_expert_group}"),
        (lambda c: changed(c, ('swiglu_form',)) and c.swiglu_limit is None,
         lambda c: f"swiglu_form={c.swiglu_form!r} says how swiglu_limit clamps: set swiglu_limit (DeepSeek-V4: 10)"),
        (lambda c: c.hash_moe_layers and c.mlp != 'moe',
         lambda c: f"hash_moe_layers={c.hash_moe_layers} routes MoE layers by the token id: set mlp='moe', got "
                   f"mlp={c.mlp!r}"),
        (lambda c: c.mlp == 'moe' and c.hash_moe_layers > len(c.moe_layer_indices),
         lambda c: f"hash_moe_layers={c.hash_moe_layers} is more than the model's {len(c.moe_layer_indices)} MoE "
                   f"layers"),
    ]

    @property
    def moe_layer_indices(self):
        """The layers whose MLP is an MoE."""
        return [i for i in range(self.n_layer) if self.mlp_of(i) == 'moe']

    @property
    def hash_layers(self):
        """The layers routed by the token id (hash_moe_layers): the first MoE layers."""
        return self.moe_layer_indices[:self.hash_moe_layers] if self.mlp == 'moe' else []


# ----------------------------------------------------------------------------- attention

class GroupedLinear(nn.Linear):
    """A block-diagonal linear: the input's `groups` equal parts each through its own rows of the weight
    (out_features / groups of them), the outputs side by side. Its weight is (out_features, in_features / groups),
    transformers' DeepseekV4GroupedLinear's; a token multiplies each weight once, as through a Linear."""

    def __init__(self, in_features, out_features, groups):
        super().__init__(in_features // groups, out_features, bias=False)
        self.groups = groups

    def forward(self, x):
        parts = x.unflatten(-1, (self.groups, self.in_features))  # (..., groups, in / groups)
        w = self.weight.view(self.groups, -1, self.in_features)  # (groups, out / groups, in / groups)
        return torch.einsum('...gi,goi->...go', parts, w).flatten(-2)


class SharedKVAttention(TokenMixer):
    """DeepSeek-V4's attention: n_head query heads over one key-value head. Queries from a low-rank bottleneck
    (q_rank) or one projection, each head RMS-normalised without a gain; the key-value head RMS-normalised with
    one; both rotated (their first rope_dim dims), the sinks in the softmax, the output's rotated dims turned
    back by the query's position, then the (grouped low-rank) output projection. A cache keeps the one head."""
    attends = True
    config_class = Config

    def __init__(self, config, layer=0, positions='rope', window=None):
        super().__init__()
        self.positions, self.window = positions, window
        self.n_head, self.head_size = H, hs = config.n_head, config.head_size
        d = config.n_embd
        if config.q_rank:
            self.q_a = nn.Linear(d, config.q_rank, bias=config.bias)
            self.q_a_norm = RMSNorm(config.q_rank, config)
            self.q_b = nn.Linear(config.q_rank, H * hs, bias=False)
            self.q_proj = None
        else:
            self.q_proj = nn.Linear(d, H * hs, bias=config.bias)
        self.c_kv = nn.Linear(d, hs, bias=config.bias)  # the one head, key and value
        self.kv_norm = RMSNorm(hs, config)
        self.sinks = nn.Parameter(torch.zeros(H)) if config.attn_sinks else None
        self.c_group = GroupedLinear(H * hs, config.o_groups * config.o_lora_rank, config.o_groups) \
            if config.o_lora_rank else None
        self.c_proj = nn.Linear(config.o_groups * config.o_lora_rank if config.o_lora_rank else H * hs, d,
                                bias=config.bias)
        self.scale, self.eps = config.attn_scale, config.norm_eps
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout

    def cache_entries(self):
        return {'kv': (1, self.head_size)}

    def token_flops(self, seq_len):
        """q.k and att.v over seq_len keys (at most the window), each key its own value."""
        return 3 * 2 * 2 * self.n_head * self.head_size * min(seq_len, self.window or seq_len)

    def forward(self, x, rope=None, mask=None, cache=None):
        B, T, _ = x.size()
        H, hs = self.n_head, self.head_size
        q = self.q_b(self.q_a_norm(self.q_a(x))) if self.q_proj is None else self.q_proj(x)
        q = F.rms_norm(q.view(B, T, H, hs), (hs,), eps=self.eps).transpose(1, 2)  # (B, H, T, hs), no gain
        kv = self.kv_norm(self.c_kv(x)).unsqueeze(1)  # (B, 1, T, hs)
        if rope is not None:
            q, kv = apply_rope(q, *rope), apply_rope(kv, *rope)
        if cache is not None:
            kv, = cache.update(kv=kv)
        # through the module, so a probe that replaces it sees the call
        y = attention.attend_with_sinks(q, kv, kv, mask, self.dropout if self.training else 0.0, self.scale, self.sinks)
        if rope is not None:  # the values were rotated at their positions: turn back by the query's
            y = apply_rope(y, rope[0], -rope[1])
        y = y.transpose(1, 2).reshape(B, T, H * hs)
        if self.c_group is not None:
            y = self.c_group(y)
        return self.resid_dropout(self.c_proj(y))


# ----------------------------------------------------------------------------- experts

def clamped_swiglu(gate, up, limit):
    """DeepSeek-V4's SwiGLU of clamped inputs: silu(min(gate, L)) * clamp(up, -L, L)."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


class ClampedExperts(Experts):
    """The experts with DeepSeek-V4's clamped SwiGLU."""

    def act(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return clamped_swiglu(gate, up, self.limit)


class ClampedGatedMLP(GatedMLP):
    """The shared experts with DeepSeek-V4's clamped SwiGLU."""

    def __init__(self, config, hidden=None):
        super().__init__(config, hidden)
        self.limit = config.swiglu_limit

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        return self.dropout(self.c_proj(clamped_swiglu(gate, up, self.limit)))


class DeepseekV4MoE(MoE):
    """The MoE of moe.py with DeepSeek-V4's router score (sqrt(softplus(logit)): the experts chosen by the top-k of
    score + the balancing bias, weighted by their scores renormalised, times routed_scaling) and clamped SwiGLU
    (swiglu_form='plain', routed and shared experts). Its weights and names are the MoE's."""

    def __init__(self, config):
        super().__init__(config)
        self.sqrt_softplus = config.router_score == 'sqrtsoftplus'
        if config.swiglu_form == 'plain':  # built anew in the clamped form (the same shapes)
            self.experts = ClampedExperts(config)
            if self.shared is not None:
                self.shared = ClampedGatedMLP(config, config.n_shared_expert * config.expert_hidden)

    def score(self, logits):
        """Each expert's score: sqrt(softplus(logit)), or the router's sigmoid or softmax."""
        if self.sqrt_softplus:
            return F.softplus(logits).sqrt()
        return logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)

    def choose(self, scores, tokens):
        """Each token's experts (N, k): the top k of score + the balancing bias."""
        return (scores + self.expert_bias).topk(self.k, dim=-1).indices

    def forward(self, x, tokens=None):
        if not self.sqrt_softplus and tokens is None:
            return super().forward(x)
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x).float()
        scores = self.score(logits)
        experts = self.choose(scores, tokens)
        weights = scores.gather(1, experts)
        if self.norm_topk:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        y = self.experts(x, experts, weights * self.scaling)
        if self.shared is not None:
            shared = self.shared(x)
            y = y + (shared * torch.sigmoid(self.shared_gate(x)) if self.shared_gate is not None else shared)
        self._account(logits, scores, experts)
        return self.dropout(y.view(shape))


def hash_table(vocab_size, n_expert, k, generator=None):
    """(vocab_size, k): for each token id, k distinct experts drawn at random (the k largest of uniform draws)."""
    return torch.rand(vocab_size, n_expert, generator=generator).topk(k, dim=-1).indices


class HashMoE(DeepseekV4MoE):
    """DeepSeek-V4's hash routing (hash_moe_layers): a token's experts are its id's row of a frozen table
    (tid2eid, a saved buffer: random here, k distinct experts per id; Hugging Face starts it at zeros, the
    checkpoint brings its own), weighted by the router's scores of those experts renormalised, times
    routed_scaling. No balancing bias and no balancing loss: the router's scores do not choose. It reads the
    token ids beside x (inputs='tokens')."""
    inputs = 'tokens'

    def __init__(self, config):
        super().__init__(config)
        if self.sigmoid:  # the table chooses: no bias to balance it
            del self.expert_bias
        self.register_buffer('tid2eid', hash_table(config.vocab_size, self.E, self.k))

    def choose(self, scores, tokens):
        return self.tid2eid[tokens.reshape(-1)]

    def forward(self, x, tokens):
        y = super().forward(x, tokens)
        self.loss = None  # the table's choice is nothing a loss on the router's scores can balance
        return y

    @torch.no_grad()
    def balance(self, rate):
        self.load.zero_()


class DeepseekV4Experts(Feature):
    """The MoE layers in DeepSeek-V4's form where its router score or clamp is set, the first hash_moe_layers of
    them routed by the token id."""
    config_class = Config

    @staticmethod
    def applies(config):
        return config.mlp == 'moe' and bool(changed(config, ('router_score', 'swiglu_form', 'hash_moe_layers')))

    def build_block(self, block, layer):
        if type(block.mlp) is not MoE:
            return
        if layer in self.config.hash_layers:
            block.mlp = HashMoE(self.config)
        elif changed(self.config, ('router_score', 'swiglu_form')):
            block.mlp = DeepseekV4MoE(self.config)


ATTENTIONS['shared_kv'] = SharedKVAttention
FEATURES.append(DeepseekV4Experts)
