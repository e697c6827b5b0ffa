"""Tiny models for the tests of model.py and of each chapter (tests/test_model.py, tests/test_<chapter>.py) and of
what runs them (test_generate.py, ...): the config and builder, and the checks every kind of model passes (its
gradients, causality, the KV cache against full forwards, greedy decoding against a reference), FLOPs as torch counts
them, a few training steps. Not a test file."""
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')

import torch  # noqa: E402

import generate as G  # noqa: E402
import model as M  # noqa: E402
from chapters import GPT, GPTConfig, attention  # noqa: E402

VOCAB = 64
BLOCK = 16
N_EMBD = 32
N_HEAD = 4


def tiny_config(config_class=GPTConfig, **overrides):
    args = dict(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=N_HEAD, n_embd=N_EMBD, dropout=0.0)
    args.update(overrides)
    return config_class(**args)


def build(seed=0, config_class=GPTConfig, **overrides):
    torch.manual_seed(seed)
    model = GPT(tiny_config(config_class, **overrides))
    model.eval()
    return model


def assert_close(actual, expected, atol):
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=atol)


@torch.no_grad()
def assert_steps_equal_full_forwards(model, seq, cache, prefill, atol=2e-5):
    """seq's first `prefill` tokens into the cache, then decode_step one token at a time (each written into the
    cache in place): every step's logits are those of a full forward over the tokens so far."""
    model(seq[:, :prefill], cache=cache)
    for i in range(prefill, seq.size(1)):
        logits = G.decode_step(model, seq[:, i:i + 1], cache.position, cache.stores, cache.features)
        cache.advance(1)
        assert_close(logits, model(seq[:, :i + 1])[0][:, -1], atol=atol)


def reference_greedy(model, idx, max_new_tokens):
    """Greedy decoding with full forwards only, following generate_stream's documented window policy:
    at most block_size tokens; when a new token overflows the window, the oldest half is dropped."""
    block_size = model.config.block_size
    keep = max(1, block_size // 2)
    out = idx
    window = idx if idx.size(1) <= block_size else idx[:, -keep:]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits, _ = model(window)
            assert torch.isfinite(logits).all()
            nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            out = torch.cat((out, nxt), dim=1)
            window = torch.cat((window, nxt), dim=1)
            if window.size(1) > block_size:
                window = window[:, -keep:]
    return out


def check_backward(model):
    model.train()
    torch.manual_seed(1)
    idx = torch.randint(0, VOCAB, (2, BLOCK))
    targets = torch.randint(0, VOCAB, (2, BLOCK))
    model.zero_grad(set_to_none=True)
    logits, loss = model(idx, targets)
    assert logits.shape == (2, BLOCK, VOCAB)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"
    model.zero_grad(set_to_none=True)
    model.eval()


def check_autocast_backward(model, dtype):
    """A training step under CPU autocast (train.py's --dtype=bfloat16 or float16 there): a finite loss and a finite
    gradient for every parameter that gets one."""
    model.train()
    torch.manual_seed(1)
    vocab, block = model.config.vocab_size, model.config.block_size
    idx, targets = torch.randint(0, vocab, (2, block)), torch.randint(0, vocab, (2, block))
    model.zero_grad(set_to_none=True)
    with torch.autocast('cpu', dtype=dtype):
        _, loss = model(idx, targets)
    assert torch.isfinite(loss), f"the loss under {dtype} autocast is {loss.item()}"
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient under {dtype}"
    model.zero_grad(set_to_none=True)
    model.eval()


@torch.no_grad()
def check_causal(model):
    torch.manual_seed(2)
    idx = torch.randint(0, VOCAB, (2, BLOCK))
    base, _ = model(idx)
    for t in (0, 6, BLOCK - 1):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1 + torch.arange(2)) % VOCAB
        logits, _ = model(changed)
        assert_close(logits[:, :t], base[:, :t], atol=1e-6)
        assert (logits[:, t] - base[:, t]).abs().amax(dim=-1).min() > 1e-5, f"token {t} does not affect its logits"


@torch.no_grad()
def check_cache_logits(model):
    """Prefill, a multi-token chunk, then single tokens: each step's logits equal a full forward's."""
    torch.manual_seed(3)
    B = 2
    seq = torch.randint(0, VOCAB, (B, BLOCK))
    cache = G.KVCache(model, B, BLOCK, torch.float32, torch.device('cpu'))
    logits, _ = model(seq[:, :5], cache=cache)
    assert cache.pos == 5
    assert_close(logits, model(seq[:, :5])[0], atol=1e-5)
    logits, _ = model(seq[:, 5:9], cache=cache)  # chunk after a prefill: mask with past > 0
    assert cache.pos == 9
    assert_close(logits, model(seq[:, :9])[0][:, 5:9], atol=1e-5)
    for i in range(9, BLOCK):
        logits, _ = model(seq[:, i:i + 1], cache=cache)
        assert logits.shape == (B, 1, VOCAB)
        assert cache.pos == i + 1
        assert_close(logits[:, -1], model(seq[:, :i + 1])[0][:, -1], atol=1e-5)


def generate_recording_logits(model, prompt, new, use_cache):
    """Greedy generate, plus the logits every step sampled from (B, steps, vocab)."""
    seen, original = [], G.sample_next

    def recording(logits, *args):
        seen.append(logits.clone())
        return original(logits, *args)
    G.sample_next = recording
    try:
        tokens = model.generate(prompt, new, temperature=0.0, use_cache=use_cache)
    finally:
        G.sample_next = original
    return tokens, torch.stack(seen, dim=1)


@torch.no_grad()
def check_generate_cache(model):
    torch.manual_seed(4)
    prompt = torch.randint(0, VOCAB, (2, 5))
    for new in (8, 40):  # inside block_size, then far past it (several context shifts)
        with_cache, logits_cache = generate_recording_logits(model, prompt, new, use_cache=True)
        without, logits_plain = generate_recording_logits(model, prompt, new, use_cache=False)
        assert with_cache.shape == (2, 5 + new) and logits_cache.shape == (2, new, VOCAB)
        assert torch.equal(with_cache[:, :5], prompt)
        assert torch.equal(with_cache, without), f"cache changes greedy tokens ({new} new)"
        assert_close(logits_cache, logits_plain, atol=1e-5)


def rope_tables(rotary, start, length):
    """The (cos, sin) tables a Rotary gives for positions start..start+length."""
    return rotary(torch.zeros(1, length, 1), start)[1]


def explicit_attend(q, k, v, mask, dropout_p=0.0, scale=None, sinks=None):
    """attend() with plain matmuls, which torch's FLOP counter sees (it does not count SDPA on the CPU); sinks as
    gpt-oss writes them: a logit column joining each row's softmax, dropped after it."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    scores = q @ k.transpose(-2, -1) * (q.size(-1) ** -0.5 if scale is None else scale)
    if mask is None:
        mask = q.size(2) > 1
    if isinstance(mask, bool):  # True: causal, the queries being the last positions; False: sees everything
        full = torch.ones(q.size(2), k.size(2), dtype=torch.bool)
        mask = full.tril(diagonal=k.size(2) - q.size(2)) if mask else full
    scores = scores.masked_fill(~mask, float('-inf'))
    if sinks is not None:
        scores = torch.cat((scores, sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)), dim=-1)
        return scores.softmax(dim=-1)[..., :-1] @ v
    return scores.softmax(dim=-1) @ v


def counted_training_flops(model, idx, monkeypatch):
    """FLOPs torch counts for one forward and backward over idx."""
    from torch.utils.flop_counter import FlopCounterMode
    monkeypatch.setattr(M, 'attend', explicit_attend)
    monkeypatch.setattr(attention, 'attend_with_sinks', explicit_attend)
    model.train()
    with FlopCounterMode(display=False) as counter:
        model(idx, idx)[1].backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def train_steps(model, seed, steps=8):
    """A few AdamW steps at a high rate on random tokens (a tiny model learns their frequencies): the losses.
    The model is left in training mode, its last gradients kept."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, VOCAB, (4, BLOCK + 1), generator=torch.Generator().manual_seed(seed))
    losses = []
    for _ in range(steps):
        _, loss = model(data[:, :-1], data[:, 1:])
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses


def train_a_few_steps(model, steps=8):
    """Losses of a few AdamW steps on a fixed random batch (a tiny model memorizes it): train_steps' on seed 3, the
    model left in evaluation mode."""
    losses = train_steps(model, seed=3, steps=steps)
    model.eval()
    return losses


def losses_fall(losses):
    return losses[-1] < losses[0] - 0.5


def config_id(value):
    """A test id for a config-validation table's row: its flags joined (k=v-k=v), or the field or message as it is."""
    return str(value) if not isinstance(value, dict) else '-'.join(f'{k}={x}' for k, x in value.items())
