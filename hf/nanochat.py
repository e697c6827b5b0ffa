"""nanochat: weightless norms (one on the embeddings too), QK-norm after its RoPE, squared ReLU, a soft-cap."""

from types import SimpleNamespace

from .engine import _TRANSFORMS, ANY, HF_FAMILIES, HFFamily
from .shared import _LLAMA_LIKE, _llama_like_read, _llama_like_write


def _nanochat_read(c):
    if c.hidden_act != 'relu2':
        raise ValueError(f"nanochat with hidden_act {c.hidden_act!r} is not supported (only 'relu2', squared ReLU)")
    if c.attention_bias:
        raise ValueError("nanochat with attention_bias is not supported")
    llama_like = _llama_like_read(SimpleNamespace(**{**c.to_dict(), 'hidden_act': 'silu'}))  # its MLP set below
    return {**llama_like, 'head_dim': None, 'mlp': 'relu2', 'norm_gain': False, 'embed_norm': True, 'qk_norm': True,
            'logit_softcap': c.final_logit_softcapping}


def _nanochat_write(cfg):
    out = {**_llama_like_write(cfg), 'hidden_act': 'relu2', 'final_logit_softcapping': cfg.logit_softcap,
           'attention_bias': False}
    del out['head_dim']  # nanochat's heads are n_embd / n_head wide
    return out


def _rope_turned_back(t, config):
    """nanochat rotates each pair (x[j], x[j + d/2]) by minus our angle: the same rotation as ours of the pair
    with its second half negated, so the rows giving the second half of each q and k head change sign (q.k keeps
    its value; a weightless QK-norm does not see signs). Its own inverse, so used both ways."""
    hs, rows = config.head_size, (config.n_head + config.kv_heads) * config.head_size
    t = t.clone()
    heads = t[:rows].view(-1, 2, hs // 2, t.size(-1))
    heads[:, 1] = -heads[:, 1]
    return t


_TRANSFORMS['rope_turned_back'] = (_rope_turned_back, _rope_turned_back)
_NANOCHAT_NAMES = [
    ('transformer.wte.weight', 'model.embed_tokens.weight', None),
    ('lm_head.weight', 'lm_head.weight', None),
    ('transformer.h.{i}.attn.c_attn.weight', tuple(f'model.layers.{{i}}.self_attn.{n}_proj.weight' for n in 'qkv'),
     'rope_turned_back'),
    ('transformer.h.{i}.attn.c_proj.weight', 'model.layers.{i}.self_attn.o_proj.weight', None),
    ('transformer.h.{i}.mlp.c_fc.weight', 'model.layers.{i}.mlp.fc1.weight', None),
    ('transformer.h.{i}.mlp.c_proj.weight', 'model.layers.{i}.mlp.fc2.weight', None),
]
HF_FAMILIES['nanochat'] = HFFamily(
    'nanochat', 'NanoChatForCausalLM',
    {**_LLAMA_LIKE, 'head_dim': (None,), 'bias': (False,), 'mlp': ('relu2',), 'norm_gain': (False,),
     'embed_norm': (True,), 'qk_norm': (True,), 'logit_softcap': ANY},
    _NANOCHAT_NAMES, _nanochat_read, _nanochat_write)
