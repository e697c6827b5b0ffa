"""Tests for chapters/speedrun.py: every default the attention chapter's model, bit for bit; the attention steps
(value embeddings, key offset, XSA) and the stream's (x0 mix, U-net and layer skips, backout, bigram rows, smear)
against the formulas written out; the sigmoid cap and the shared-head MTP loss; decoding through the cache as without
it past block_size (the smear and the bigram table through the last token the cache keeps); FLOPs as torch counts
them, parameters and cache bytes written out; training moves every new part; the window schedule; export and bad
settings refused in one line."""
import math

import pytest
import torch
import torch.nn.functional as F

import model as M
from chapters import GPTConfig, attention, speedrun
from test_train import workdir  # noqa: F401 (a fixture)
from tiny_models import (BLOCK, N_EMBD, N_HEAD, VOCAB, assert_close, build, check_cache_logits, check_causal,
                         counted_training_flops, generate_recording_logits, reference_greedy, tiny_config, train_steps)

pytestmark = pytest.mark.usefixtures('single_thread')

MODERN = dict(n_layer=4, norm='rms', mlp='swiglu', pos='rope', n_kv_head=2, bias=False)
HS = N_EMBD // N_HEAD
# each switch alone, on the modern block
SWITCHES = {
    'value_embeds': dict(value_embed_layers='0,-1'),
    'xsa': dict(xsa_layers='1,2'),
    'key_offset': dict(key_offset=True),
    'x0_lambdas': dict(x0_lambdas=True),
    'unet': dict(unet_skips=True),
    'layer_skip': dict(layer_skip_from=0, layer_skip_to=3),
    'backout': dict(backout_layer=2),
    'sigmoid_softcap': dict(sigmoid_softcap=True),
    'mtp_shared': dict(mtp_shared=2),
    'smear': dict(smear=True),
    'bigram': dict(bigram_vocab=97),
}
DECODED = [name for name in SWITCHES if name not in ('smear', 'bigram')]  # the two read the previous token
STACKED = {k: v for name in SWITCHES for k, v in SWITCHES[name].items()}


def randomized(model, seed, scale=0.3):
    """The chapter's new parts away from their init (a zero gate would hide a wrong formula)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(part in name for part in ('value_gate', 'xsa', 'lambda', 'unet_weights', 'smear_gate',
                                             'bigram_embed', 'value_embeds')):
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model


def test_every_default_is_the_attention_chapters_model_bit_for_bit(monkeypatch):
    """Every switch off, the registry's attention is the attention chapter's: the same parameters drawn from the
    same seed, the same logits, no feature added, nothing more cached."""
    ours = build(**MODERN)
    assert not any(isinstance(f, speedrun.Speedrun) for f in ours.features)
    monkeypatch.setitem(M.ATTENTIONS, 'mha', attention.Attention)
    theirs = build(**MODERN)
    assert type(theirs.transformer.h[0].attn) is attention.Attention
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert all(torch.equal(p, theirs.state_dict()[k]) for k, p in ours.state_dict().items())
    idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(1))
    assert torch.equal(ours(idx)[0], theirs(idx)[0])
    assert ours.kv_cache_bytes(2, BLOCK) == theirs.kv_cache_bytes(2, BLOCK)


# ----------------------------------------------------------------------------- the formulas written out

def attention_written_out(attn, x, rope, rows=None):
    """One layer's attention with the switches, step by step: the values plus 2 sigmoid(w . x[:12]) times the
    rows, RoPE, each key's second half the previous token's, causal softmax attention, minus tanh(a) times the
    projection on the token's own value, the output projection."""
    B, T, _ = x.shape
    q, k, v = attn.c_attn(x).split([N_HEAD * HS, 2 * HS, 2 * HS], dim=-1)
    q, k, v = (t.view(B, T, -1, HS).transpose(1, 2) for t in (q, k, v))
    if rows is not None:
        gate = 2 * torch.sigmoid(x[..., :12] @ attn.value_gate.T)  # (B, T, 2)
        v = v + gate.transpose(1, 2)[..., None] * rows.view(B, T, 2, HS).transpose(1, 2)
    q, k = M.apply_rope(q, *rope), M.apply_rope(k, *rope)
    if attn.key_offset:
        k = k.clone()
        k[:, :, 1:, HS // 2:] = k[:, :, :-1, HS // 2:].clone()
    k_all, v_all = (t.repeat_interleave(N_HEAD // 2, dim=1) for t in (k, v))
    y = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)
    if attn.xsa is not None:
        dot = (y * v_all).sum(-1, keepdim=True)
        y = y - torch.tanh(attn.xsa).view(1, -1, 1, 1) * dot / (v_all * v_all).sum(-1, keepdim=True) * v_all
    return attn.c_proj(y.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize('switches', [dict(value_embed_layers='0'), dict(key_offset=True), dict(xsa_layers='0'),
                                      dict(value_embed_layers='0', key_offset=True, xsa_layers='0')],
                         ids=lambda s: '+'.join(s))
@torch.no_grad()
def test_the_attention_steps_are_the_formulas_written_out(switches):
    model = randomized(build(**MODERN, **switches), 2)
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 7, N_EMBD, generator=torch.Generator().manual_seed(3))
    rope = model.transformer.wpe(x, 0)[1]
    rows = None if attn.value_gate is None else torch.randn(2, 7, 2 * HS, generator=torch.Generator().manual_seed(4))
    table = rope if rows is None else (rope, {0: rows})
    assert_close(attn(x, table, True), attention_written_out(attn, x, rope, rows), atol=1e-5)


@torch.no_grad()
def test_the_stream_steps_are_the_formulas_written_out():
    """Each block's input: the U-net skip and the layer skip into it, then a*x + b*x0, then the bigram rows times
    the layer's gate; after the last block the backout layer's output times its share taken away; the smear on
    the embeddings; the sigmoid cap on the logits."""
    flags = dict(x0_lambdas=True, unet_skips=True, layer_skip_from=0, layer_skip_to=2, backout_layer=1, smear=True,
                 bigram_vocab=11, sigmoid_softcap=True)
    model = randomized(build(**{**MODERN, 'n_layer': 5}, **flags), 5)
    t = model.transformer
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(6))
    x = t.wte(idx)
    share = t.smear_lambda * torch.sigmoid(x[:, 1:, :12] @ t.smear_gate.T)
    x0 = torch.cat((x[:, :1], x[:, 1:] + share * x[:, :-1]), dim=1)
    rows = [10] + [(36313 * int(idx[b, i]) ^ 27191 * int(idx[b, i - 1])) % 10 for b in range(2) for i in range(1, 9)]
    rows = torch.tensor([[10] + rows[1 + 8 * b:9 + 8 * b] for b in range(2)])
    assert torch.equal(speedrun.bigram_hash(idx, 11), rows)
    bigram = t.bigram_embed(rows)
    rope, outputs, x = t.wpe(x0, 0)[1], [], x0
    for i, block in enumerate(t.h):
        if i == 4:  # the U-net over 5 layers: layer 0's output into layer 4's input, layer 1's into layer 3's
            x = x + t.unet_weights[0] * outputs[0]
        if i == 3:
            x = x + t.unet_weights[1] * outputs[1]
        if i == 2:  # the layer skip: layer 0's output into layer 2's input
            x = x + torch.sigmoid(t.layer_skip_lambda) * outputs[0]
        x = t.resid_lambdas[i] * x + t.x0_lambdas[i] * x0 + t.bigram_lambdas[i] * bigram
        x = block(x, rope, True)
        outputs.append(x)
    x = x - t.backout_lambda * outputs[1]
    logits = 23 * torch.sigmoid((model.lm_head(t.ln_f(x)) + 5) / 7.5)
    assert speedrun.unet_pairs(5) == {4: (0, 0), 3: (1, 1)}
    assert_close(model(idx)[0], logits, atol=1e-5)


def test_the_shared_head_predicts_further_tokens_in_training_only():
    """In training the loss is the next token's plus decay**k times the head's loss against the token k + 1
    ahead, from the same logits (at the start of training, before any weight fades); in evaluation the next
    token's alone."""
    model = build(**MODERN, mtp_shared=2, mtp_shared_decay=0.7)
    idx = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(7))
    targets = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(8))
    logits, loss = model(idx, targets)
    assert_close(loss, ce(logits, targets), atol=1e-6)
    model.train()
    _, train_loss = model(idx, targets)
    expected = ce(logits, targets) + 0.7 * ce(logits[:, :-1], targets[:, 1:]) + \
        0.49 * ce(logits[:, :-2], targets[:, 2:])
    assert_close(train_loss, expected, atol=1e-5)


def ce(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def test_the_further_tokens_weights_fade_the_furthest_first():
    """The speedrun's schedule for two further tokens: [.5, .25] fading to [.5, 0] over the first third, to
    [0, 0] over the second, the last third the next token alone; the loss follows the progress hook."""
    config = tiny_config(**MODERN, mtp_shared=2)
    points = {0: [0.5, 0.25], 1 / 6: [0.5, 0.125], 1 / 3: [0.5, 0], 1 / 2: [0.25, 0], 2 / 3: [0, 0], 1: [0, 0]}
    for fraction, expected in points.items():
        assert speedrun.mtp_weights(config, fraction) == pytest.approx(expected, abs=1e-12), fraction
    assert speedrun.mtp_weights(tiny_config(**MODERN, mtp_shared=2, mtp_shared_fade=False), 0.9) == [0.5, 0.25]
    model = build(**MODERN, mtp_shared=2)
    idx = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(7))
    targets = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(8))
    logits, _ = model(idx, targets)
    model.train()
    for feature in model.features:
        feature.progress(model, 1 / 2)
    assert_close(model(idx, targets)[1], ce(logits, targets) + 0.25 * ce(logits[:, :-1], targets[:, 1:]), atol=1e-5)
    for feature in model.features:
        feature.progress(model, 0.8)
    assert_close(model(idx, targets)[1], ce(logits, targets), atol=1e-6)


# ----------------------------------------------------------------------------- decoding

@pytest.mark.parametrize('name', DECODED + ['stacked'])
@torch.no_grad()
def test_decoding_through_the_cache_is_decoding_without_it(name):
    """Prefill, a chunk and single steps give full forwards' logits; greedy decoding past block_size (the cache
    restarting with the window) gives the tokens of full forwards; causal."""
    flags = {k: v for k, v in STACKED.items() if k not in ('smear', 'bigram_vocab')} if name == 'stacked' \
        else SWITCHES[name]
    model = randomized(build(**MODERN, **flags), 9)
    check_causal(model)
    check_cache_logits(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(10))
    cached, cached_logits = generate_recording_logits(model, prompt, 2 * BLOCK + 3, use_cache=True)
    plain, plain_logits = generate_recording_logits(model, prompt, 2 * BLOCK + 3, use_cache=False)
    assert torch.equal(cached, plain) and torch.equal(cached, reference_greedy(model, prompt, 2 * BLOCK + 3))
    assert_close(cached_logits, plain_logits, atol=1e-5)


@torch.no_grad()
def test_compiled_decoding_with_the_attention_steps_is_eager_decoding():
    model = randomized(build(**MODERN, value_embed_layers='0,-1', key_offset=True, xsa_layers='1'), 11)
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(12))
    eager = model.generate(prompt, 6, temperature=0)
    model.compile_decoding(backend='aot_eager')
    assert torch.equal(model.generate(prompt, 6, temperature=0), eager)


@pytest.mark.parametrize('name', ['smear', 'bigram'])
@torch.no_grad()
def test_the_previous_token_switches_decode_through_the_last_token_the_cache_keeps(name):
    """The cache keeps the last token's embedding (smear) or id (bigram) for the next call: cached decoding, and
    the compiled step, are full forwards' past block_size; the state is in the cache's bytes; speculative decoding,
    which takes drafts back, refuses it."""
    from chapters.mtp import speculation_problem
    model = randomized(build(**MODERN, **SWITCHES[name]), 13)
    check_causal(model)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(14))
    cached = model.generate(prompt, 2 * BLOCK, temperature=0)
    assert torch.equal(cached, model.generate(prompt, 2 * BLOCK, temperature=0, use_cache=False))
    assert torch.equal(cached, reference_greedy(model, prompt, 2 * BLOCK))
    state = 2 * (N_EMBD * 4 if name == 'smear' else 8)  # two sequences' last embedding (fp32) or id (int64)
    assert model.kv_cache_bytes(2, 10) == build(**MODERN).kv_cache_bytes(2, 10) + state
    model.compile_decoding(backend='aot_eager')
    assert torch.equal(model.generate(prompt, 2 * BLOCK, temperature=0), cached)
    model.config.mtp_depth = 1  # a model with drafters would still be refused
    assert 'takes drafted tokens back out of the cache' in speculation_problem(model)


def test_the_cache_keeps_the_last_tokens_key_half_per_global_layer():
    plain, offset = build(**MODERN), build(**MODERN, key_offset=True)
    for seq_len in (3, BLOCK):  # two sequences, four global layers, 2 K/V heads of the last 4 dims, fp32
        assert offset.kv_cache_bytes(2, seq_len) == plain.kv_cache_bytes(2, seq_len) + 2 * 4 * 2 * (HS - HS // 2) * 4
    local = build(**MODERN, layers='LG', sliding_window=5, key_offset=True)
    assert [b.attn.key_offset for b in local.transformer.h] == [False, True, False, True]


# ----------------------------------------------------------------------------- accounting and training

@pytest.mark.parametrize('name', list(SWITCHES))
def test_flops_per_token_is_what_torch_counts(name, monkeypatch):
    """The value gates, the smear's gate and the head run again for the shared MTP are matmuls; the tables are
    lookups and the rest elementwise: counted by neither."""
    model = build(**MODERN, **SWITCHES[name])
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(15))
    assert model.flops_per_token(seq_len=12) * 2 * 12 == counted_training_flops(model, idx, monkeypatch)


def test_parameters_written_out():
    """The tables count as parameters (get_num_params counts every parameter; flops_per_token none of theirs), as
    Gemma 4's per-layer embeddings: value tables V x (K/V heads x head width) per layer, the bigram table
    bigram_vocab x n_embd; then the gates and scalars."""
    model, plain = build(**MODERN, **STACKED), build(**MODERN)
    L, kv_width = 4, 2 * HS
    tables = 2 * VOCAB * kv_width + 97 * N_EMBD
    gates = 2 * 2 * 12 + 2 * N_HEAD + 12 + 1  # value gates of two layers, XSA shares of two, the smear's gate and share
    scalars = 2 * L + 1 + 1 + 1 + L  # x0 mix, one U-net weight, the layer skip, backout, bigram gates
    assert model.get_num_params() == plain.get_num_params() + tables + gates + scalars
    gate_flops, smear_flops, head_again = 2 * 6 * 2 * 12, 6 * 12 * 7 / 8, 6 * VOCAB * N_EMBD * 7 / 8  # at 8 tokens
    assert model.flops_per_token(8) == plain.flops_per_token(8) + gate_flops + smear_flops + head_again


def test_training_moves_every_new_part():
    model = build(**MODERN, **STACKED)
    new = {name: p.detach().clone() for name, p in model.named_parameters()
           if any(part in name for part in ('value_', 'xsa', 'lambda', 'unet_weights', 'smear', 'bigram'))}
    assert len(new) == 2 * 2 + 2 + 2 + 1 + 1 + 2 + 1 + 2
    losses = train_steps(model, seed=16)
    assert losses[-1] < losses[0] - 0.5
    unmoved = [name for name, before in new.items() if torch.equal(before, dict(model.named_parameters())[name])]
    assert unmoved == []


def test_muon_leaves_the_tables_to_adamw():
    model = build(**MODERN, value_embed_layers='0', bigram_vocab=97, smear=True)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu', optimizer='muon')
    muon = {id(p) for group in opt.muon.param_groups for p in group['params']}
    t = model.transformer
    assert id(t.value_embeds['0'].weight) not in muon and id(t.bigram_embed.weight) not in muon


# ----------------------------------------------------------------------------- the window schedule

@torch.no_grad()
def test_the_window_grows_from_its_start_and_the_model_follows_it():
    flags = dict(**MODERN, layers='LG', sliding_window=8)
    model = build(**flags, sliding_window_start=2)
    config = model.config
    assert [speedrun.window_at(config, f) for f in (0.0, 0.5, 1.0, 2.0)] == [2, 5, 8, 8]
    narrow = build(**{**flags, 'sliding_window': 2})
    idx = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(17))
    assert not torch.equal(model(idx)[0], narrow(idx)[0])
    speedrun.set_window(model, 2)
    assert torch.equal(model(idx)[0], narrow(idx)[0]) and model.flops_per_token() == narrow.flops_per_token()
    assert model.kv_cache_bytes(2, BLOCK) == narrow.kv_cache_bytes(2, BLOCK)
    speedrun.set_window(model, config.sliding_window)
    assert model.flops_per_token() == build(**flags).flops_per_token()
    for fraction, window in ((0.0, 2), (0.5, 5), (1.0, 8)):  # the hook train.py calls before each step
        for feature in model.features:
            feature.progress(model, fraction)
        assert model.transformer.h[0].attn.window == window


def test_train_py_grows_the_window_and_evaluates_at_the_last(workdir, monkeypatch, capsys):  # noqa: F811
    """train.py calls the features' progress hook: a run with sliding_window_start trains at growing windows and
    its checkpoint is evaluated at sliding_window (what a model built with that window computes)."""
    from test_train import train_here
    seen = []
    set_window = speedrun.set_window
    monkeypatch.setattr(speedrun, 'set_window', lambda model, w: seen.append(w) or set_window(model, w))
    code, _, err = train_here(workdir, '--pos=rope', '--layers=LG', '--sliding_window=8', '--sliding_window_start=2',
                              '--max_iters=4', '--eval_interval=4', '--out_dir=out', monkeypatch=monkeypatch,
                              capsys=capsys)
    assert code == 0, err
    assert seen == [8, 2, 3, 5, 6, 8]  # evaluated at the end's window, then each step's, then evaluated again


# ----------------------------------------------------------------------------- export and settings

@pytest.mark.parametrize('name', [name for name in SWITCHES if name != 'mtp_shared'])
def test_no_hugging_face_family_carries_a_switch(name):
    pytest.importorskip('transformers')
    from export import hf_family
    flags = SWITCHES[name]
    with pytest.raises(ValueError) as e:
        hf_family(tiny_config(**MODERN, **flags))
    flag, value = next(iter(flags.items()))
    assert f"{flag}={value!r}" in str(e.value) and '\n' not in str(e.value)


def test_the_switches_that_shape_training_alone_block_no_export():
    """mtp_shared (a loss on the head's logits) and the window schedule add no weight: the plain model's family
    carries the model without them (export.py says it drops them; test_export.py)."""
    pytest.importorskip('transformers')
    from export import hf_family
    assert hf_family(tiny_config(**MODERN, mtp_shared=2, mtp_shared_decay=0.7)).model_type == 'llama'
    assert hf_family(tiny_config(**MODERN, sliding_window=8, sliding_window_start=2)).model_type == 'mistral'


@pytest.mark.parametrize('overrides, message', [
    (dict(value_embed_layers='0,4'), "value_embed_layers must be None or layer numbers in [-4, 3]"),
    (dict(xsa_layers='1,-3'), "xsa_layers must be None or layer numbers in [-4, 3] separated by commas, each once"),
    (dict(value_embed_layers='0', attn='mla', n_kv_head=None), "value_embed_layers='0' apply to attn='mha' only"),
    (dict(xsa_layers='0', layers='DG', linear_n_key_head=2, linear_key_dim=6),
     "xsa_layers='0' name layers of kinds 'D': only softmax attention layers"),
    (dict(value_embed_layers='-1', kv_shared_layers=1), "name layers [3] that share another layer's keys"),
    (dict(key_offset=True, sliding_window=5), "key_offset=True applies to global layers"),
    (dict(key_offset=True, kv_shared_layers=1), "key_offset=True with kv_shared_layers=1 is not supported yet"),
    (dict(x0_lambdas=True, norm_position='post'), "x0_lambdas=True add to the stream between blocks"),
    (dict(backout_layer=1, hc_mult=2), "backout_layer=1 with hyper-connections (hc_mult=2) are not supported yet"),
    (dict(unet_skips=True, n_layer=2), "unet_skips=True needs n_layer >= 3"),
    (dict(layer_skip_from=1), "set both"),
    (dict(layer_skip_from=1, layer_skip_to=2), "layer_skip_to=2 must be at least layer_skip_from+2=3"),
    (dict(layer_skip_to=4), "layer_skip_to must be None or an int in [0, n_layer-1=3], got 4"),
    (dict(backout_layer=3), "backout_layer must be None or an int in [0, n_layer-2=2], got 3"),
    (dict(bigram_vocab=1), "bigram_vocab=1 leaves no row for the bigrams"),
    (dict(bigram_vocab=-2), "bigram_vocab must be an int >= 0"),
    (dict(sigmoid_softcap=True, logit_softcap=15.0), "are two soft caps"),
    (dict(mtp_shared_decay=0.3), "mtp_shared_decay=0.3 apply to mtp_shared only"),
    (dict(mtp_shared_fade=False), "mtp_shared_fade=False apply to mtp_shared only"),
    (dict(mtp_shared=1, mtp_shared_decay=0), "mtp_shared_decay must be a number > 0"),
    (dict(sliding_window_start=2), "sliding_window_start=2 schedules local ('L') layers' window and there are none"),
    (dict(sliding_window_start=9, sliding_window=8, layers='LG'), "must be at most sliding_window=8"),
])
def test_bad_settings_are_one_line(overrides, message):
    with pytest.raises(ValueError) as e:
        tiny_config(**{**MODERN, **overrides})
    assert message in str(e.value) and '\n' not in str(e.value)


def test_layer_lists_read_negative_numbers_from_the_end():
    assert speedrun.layer_numbers('0, -1,2', 4) == [0, 2, 3]
    assert tiny_config(**MODERN, value_embed_layers='-4').attention_switches(0)['value_embed']
    assert math.isclose(GPTConfig.__dataclass_fields__['mtp_shared_decay'].default, 0.5)
