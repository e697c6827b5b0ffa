"""GPT-2: learned positions, LayerNorm, GELU; its Conv1D matrices transposed ('T')."""

from .engine import ANY, HF_FAMILIES, HFFamily
from .shared import _SIZES


GELUS = {'gelu_new': 'tanh', 'gelu_pytorch_tanh': 'tanh', 'gelu': 'erf'}  # HF's activation -> our gelu


def _gpt2_read(c):
    if c.activation_function not in GELUS:
        raise ValueError(f"GPT-2 checkpoint uses activation {c.activation_function!r}; only GELU, tanh ('gelu_new', "
                         f"GPT-2's own) or exact ('gelu'), is supported")
    return dict(gelu=GELUS[c.activation_function], n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
                block_size=c.n_positions, vocab_size=c.vocab_size, bias=True, norm_eps=c.layer_norm_epsilon,
                ffn_hidden=None if getattr(c, 'n_inner', None) in (None, 4 * c.n_embd) else c.n_inner,
                tie_embeddings=bool(getattr(c, 'tie_word_embeddings', True)))


def _gpt2_write(cfg):
    eot = 50256  # GPT-2's <|endoftext|>, only where the vocabulary has it (not a character one)
    special = eot if cfg.vocab_size > eot else None
    return dict(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                n_head=cfg.n_head, n_inner=cfg.mlp_width,
                activation_function='gelu_new' if cfg.gelu == 'tanh' else 'gelu',
                layer_norm_epsilon=cfg.norm_eps, resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
                attn_pdrop=cfg.dropout, tie_word_embeddings=cfg.tie_embeddings, bos_token_id=special,
                eos_token_id=special)


_GPT2_NAMES = [(n, n, None) for n in ('transformer.wte.weight', 'transformer.wpe.weight', 'transformer.ln_f.{b}',
                                      'transformer.h.{i}.ln_1.{b}', 'transformer.h.{i}.ln_2.{b}', 'lm_head.weight')] + [
    (n, n, 'T') for n in ('transformer.h.{i}.attn.c_attn.{b}', 'transformer.h.{i}.attn.c_proj.{b}',
                          'transformer.h.{i}.mlp.c_fc.{b}', 'transformer.h.{i}.mlp.c_proj.{b}')]

HF_FAMILIES['gpt2'] = HFFamily('gpt2', 'GPT2LMHeadModel', {**_SIZES, 'bias': ANY, 'gelu': ANY}, _GPT2_NAMES,
                               _gpt2_read, _gpt2_write)
