"""
Export a trained checkpoint as a Hugging Face transformers model:

    python export.py --out_dir=out-shakespeare-modern --hf_dir=hf-shakespeare-modern

A vanilla (GPT-2-shaped) config becomes GPT2LMHeadModel, a modern one (rms, swiglu, rope, pre-norm)
LlamaForCausalLM. to_hf(model) gives the transformers model in memory.
"""

import os
import sys

import torch

# the flags each family fixes; every other flag (sizes, n_kv_head for Llama, bias, tying) carries over
GPT2_NEEDS = {'norm': 'layernorm', 'mlp': 'gelu', 'pos': 'learned', 'prenorm': True}
LLAMA_NEEDS = {'norm': 'rms', 'mlp': 'swiglu', 'pos': 'rope', 'prenorm': True}


def hf_family(config):
    """'gpt2' or 'llama', or ValueError naming the flags that keep the config out of both."""
    def blocking(needs):
        wrong = [f"{k}={getattr(config, k)!r} (needs {v!r})" for k, v in needs.items() if getattr(config, k) != v]
        return wrong
    gpt2 = blocking(GPT2_NEEDS)
    if config.kv_heads != config.n_head:
        gpt2.append(f"n_kv_head={config.n_kv_head} (GPT-2 has no GQA)")
    llama = blocking(LLAMA_NEEDS)
    if not gpt2:
        return 'gpt2'
    if not llama:
        return 'llama'
    raise ValueError(f"neither GPT-2 nor Llama can represent this model: for GPT-2 change {', '.join(gpt2)}; "
                     f"for Llama change {', '.join(llama)}")


def to_hf(model):
    """The transformers model computing the same logits as our GPT (fp32, eval mode)."""
    config = model.config
    family = hf_family(config)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if family == 'gpt2':
        from transformers import GPT2Config, GPT2LMHeadModel
        eot = 50256
        hf_config = GPT2Config(vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
                               n_layer=config.n_layer, n_head=config.n_head, n_inner=config.hidden_size,
                               activation_function='gelu_new', layer_norm_epsilon=config.norm_eps,
                               resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=config.dropout,
                               tie_word_embeddings=config.tie_embeddings,
                               # GPT-2's <|endoftext|> id only where the vocabulary has it (not a char one)
                               bos_token_id=eot if config.vocab_size > eot else None,
                               eos_token_id=eot if config.vocab_size > eot else None)
        hf = GPT2LMHeadModel(hf_config)
        hf_state = _to_gpt2_state(state, hf.state_dict())
    else:
        from transformers import LlamaConfig, LlamaForCausalLM
        hf_config = LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.n_embd,
                                intermediate_size=config.hidden_size, num_hidden_layers=config.n_layer,
                                num_attention_heads=config.n_head, num_key_value_heads=config.kv_heads,
                                max_position_embeddings=config.block_size, rms_norm_eps=config.norm_eps,
                                attention_bias=config.bias, mlp_bias=config.bias, hidden_act='silu',
                                attention_dropout=config.dropout, tie_word_embeddings=config.tie_embeddings,
                                rope_theta=config.rope_theta,
                                rope_parameters={'rope_type': 'default', 'rope_theta': config.rope_theta})
        hf = LlamaForCausalLM(hf_config)
        hf_state = _to_llama_state(state, config)
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    missing = [k for k in missing if not (config.tie_embeddings and k == 'lm_head.weight')]
    if missing or unexpected:
        raise RuntimeError(f"export to {family} left weights unmatched: missing {missing}, unexpected {unexpected}")
    if config.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def _to_gpt2_state(state, hf_state):
    # GPT-2 keeps its linear layers as Conv1D (transposed); biases our bias=False config lacks are zeros
    transposed = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
    out = {}
    for k, ref in hf_state.items():
        if k in state:
            out[k] = state[k].t().contiguous() if k.endswith(transposed) else state[k]
        elif k.endswith('.bias') and not k.endswith('.attn.bias'):  # not the causal-mask buffer
            out[k] = torch.zeros_like(ref)
    return out


def _to_llama_state(state, config):
    hs, n_q, n_kv, hidden = config.head_size, config.n_head, config.kv_heads, config.hidden_size
    out = {'model.embed_tokens.weight': state['transformer.wte.weight'],
           'model.norm.weight': state['transformer.ln_f.weight'],
           'lm_head.weight': state['lm_head.weight']}
    for i in range(config.n_layer):
        o, p = f'transformer.h.{i}.', f'model.layers.{i}.'
        out[p + 'input_layernorm.weight'] = state[o + 'ln_1.weight']
        out[p + 'post_attention_layernorm.weight'] = state[o + 'ln_2.weight']
        for suffix in ('weight', 'bias') if config.bias else ('weight',):
            q, k, v = state[o + f'attn.c_attn.{suffix}'].split([n_q * hs, n_kv * hs, n_kv * hs])
            out[p + f'self_attn.q_proj.{suffix}'] = q
            out[p + f'self_attn.k_proj.{suffix}'] = k
            out[p + f'self_attn.v_proj.{suffix}'] = v
            out[p + f'self_attn.o_proj.{suffix}'] = state[o + f'attn.c_proj.{suffix}']
            gate, up = state[o + f'mlp.c_fc.{suffix}'].split([hidden, hidden])
            out[p + f'mlp.gate_proj.{suffix}'] = gate
            out[p + f'mlp.up_proj.{suffix}'] = up
            out[p + f'mlp.down_proj.{suffix}'] = state[o + f'mlp.c_proj.{suffix}']
    return out


if __name__ == '__main__':
    from common import die, load_checkpoint, model_from_checkpoint
    from configurator import configure, settings_of
    out_dir = 'out'  # where train.py wrote ckpt.pt
    hf_dir = ''  # where to write the transformers model (required)
    cfg = configure(settings_of(globals()), sys.argv[1:], prog='export.py', doc=__doc__)
    if not cfg['hf_dir']:
        die("hf_dir is required: python export.py --out_dir=DIR --hf_dir=DIR2")
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    model = model_from_checkpoint(load_checkpoint(ckpt_path), ckpt_path)
    try:
        hf = to_hf(model)
    except ValueError as e:
        die(f"cannot export '{ckpt_path}': {e}")
    except ImportError:
        die("export needs transformers: pip install transformers")
    try:
        hf.save_pretrained(cfg['hf_dir'])
    except OSError as e:
        die(f"cannot write hf_dir '{cfg['hf_dir']}': {e.strerror or e}")
    print(f"wrote {type(hf).__name__} ({model.get_num_params() / 1e6:.2f}M parameters) to {cfg['hf_dir']}")
