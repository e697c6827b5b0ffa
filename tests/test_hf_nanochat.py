"""nanochat (hf/nanochat.py), both ways."""

import pytest
import torch

from export import to_hf
from hf import HF_FAMILIES
from hf.nanochat import _rope_turned_back
from hf_tiny import GPT, ROPES, VOCAB, check_parity, randomized, tiny, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def nanochat(**overrides):
    return tiny(transformers.NanoChatConfig, **{'hidden_act': 'relu2', 'final_logit_softcapping': 3.0, **overrides})


@pytest.mark.parametrize('overrides', [{}, dict(tie_word_embeddings=True, final_logit_softcapping=None,
                                                num_key_value_heads=4, rope_parameters=ROPES['linear'])],
                         ids=['untied-softcap-gqa', 'tied-mha-linear-rope'])
def test_nanochat_weightless_norms_and_its_rope_turned_back(overrides, tmp_path):
    torch.manual_seed(0)
    ours = check_parity(randomized(transformers.NanoChatForCausalLM(nanochat(**overrides)), seed=12), tmp_path)
    assert ours.config.norm_gain is False and ours.config.embed_norm and ours.config.mlp == 'relu2'
    assert not [n for n, _ in ours.named_parameters() if 'ln_' in n or 'norm' in n]  # no norm weight anywhere
    assert type(to_hf(GPT(ours.config))) is transformers.NanoChatForCausalLM  # the only family carrying it


def test_nanochats_rope_conversion_is_needed(tmp_path):
    """Without turning the rotation back, the logits differ: the conversion is what makes them equal."""
    torch.manual_seed(0)
    hf = randomized(transformers.NanoChatForCausalLM(nanochat()), seed=12)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    state = {k: v.clone() for k, v in ours.state_dict().items()}
    for i in range(ours.config.n_layer):
        name = f'transformer.h.{i}.attn.c_attn.weight'
        state[name] = _rope_turned_back(state[name], ours.config)  # undone: nanochat's rows as they are
    ours.load_state_dict(state)
    idx = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max() > 1e-3


@pytest.mark.parametrize('change, match', [(dict(hidden_act='silu'), 'hidden_act'),
                                           (dict(attention_bias=True), 'attention_bias')])
def test_nanochat_features_we_lack_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        HF_FAMILIES['nanochat'].read_config(nanochat(**change))
