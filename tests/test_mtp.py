"""Tests for chapters/mtp.py, multi-token prediction (mtp_depth): DeepSeek-V3's MTP modules against the formula
written out, their loss in training only, zero weight leaving training unchanged bit for bit, the loss logged apart
in log.jsonl and resumed exactly, bad settings and export (tiny random models). Self-speculative decoding with them:
test_generate.py."""
import pytest
import torch
import torch.nn.functional as F

from chapters import GPT, mtp
from common.checkpoints import load_checkpoint
from test_sparse_attention import straight_and_resumed
from tiny_models import BLOCK, VOCAB, assert_close, tiny_config
from test_train import run, workdir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures('single_thread')

FLAGS = dict(norm='rms', mlp='swiglu', pos='rope', n_kv_head=2)


def tokens(B, T, seed):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def test_each_depth_predicts_one_token_further_from_the_previous_depth_and_the_next_embedding():
    torch.manual_seed(0)
    model = GPT(tiny_config(**FLAGS, mtp_depth=2, mtp_loss_coef=0.5))
    model.train()
    idx, targets = tokens(2, BLOCK, 1), tokens(2, BLOCK, 2)
    logits, loss = model(idx, targets)
    main = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    h, expected = model.hidden_states(idx), []
    # written out: position i reads the input token i + k (the inputs themselves: a task's targets are -1 where
    # unscored), predicts target i + k; targets unrelated to the inputs here, so reading them would show
    for k, module in enumerate(model.mtp, start=1):
        L = BLOCK - k
        x = module.proj(torch.cat((module.norm_h(h[:, :L]), module.norm_e(model.transformer.wte(idx[:, k:]))), dim=-1))
        rope = model.transformer.wpe(x, 0)[1]
        h = module.block(x, rope, True)
        expected.append(F.cross_entropy(model.lm_head(module.norm(h)).view(-1, VOCAB), targets[:, k:].reshape(-1)))
    assert_close(loss, main + 0.5 * sum(expected) / 2, atol=1e-6)
    assert_close(torch.tensor(mtp.mtp_loss_and_reset(model)), sum(expected).detach() / 2, atol=1e-6)
    model.eval()
    assert torch.equal(model(idx, targets)[1], main)  # evaluation: the main head's loss alone
    assert mtp.mtp_loss_and_reset(model) is None


def train_steps(steps=6, **flags):
    torch.manual_seed(0)
    model = GPT(tiny_config(**FLAGS, dropout=0.1, **flags))
    model.train()
    opt = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), 'cpu')
    data = tokens(4, BLOCK + 1, 3)
    losses = []
    for _ in range(steps):
        _, loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model


def test_zero_weight_leaves_training_unchanged_bit_for_bit():
    """The modules are made after the main model's init and their loss is not computed at weight 0: the same
    losses and weights as without them, dropout and the optimizer included; any weight changes training."""
    plain, plain_model = train_steps()
    zero, zero_model = train_steps(mtp_depth=2, mtp_loss_coef=0.0)
    assert zero == plain
    zero_state = zero_model.state_dict()
    assert all(torch.equal(t, zero_state[k]) for k, t in plain_model.state_dict().items())
    weighted, _ = train_steps(mtp_depth=2)
    assert weighted[0] != plain[0] and weighted[1:] != plain[1:]


def test_training_lowers_the_mtp_loss():
    torch.manual_seed(0)
    model = GPT(tiny_config(**FLAGS, mtp_depth=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = tokens(4, BLOCK + 2, 4)
    first = last = None
    for step in range(30):
        model(data[:, :-1], data[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        last = mtp.mtp_loss_and_reset(model)
        first = first or last
    assert last < first - 1.0


def test_training_logs_the_mtp_loss_apart_and_resumes_exactly(workdir, run):
    records, resumed = straight_and_resumed(workdir, run, '--dropout=0.1', '--mtp_depth=2')
    assert 'mtp_loss' not in records[0] and all(r['mtp_loss'] > 0 for r in records[1:])
    assert [r.get('mtp_loss') for r in records] == [r.get('mtp_loss') for r in resumed]
    final = load_checkpoint(str(workdir / 'b' / 'ckpt.pt'))
    assert any(k.startswith('mtp.1.block.') for k in final['model'])  # the checkpoint keeps the modules


@pytest.mark.parametrize('flags, fragment', [
    (dict(mtp_depth=-1), "mtp_depth must be an int >= 0, got -1"),
    (dict(mtp_loss_coef=0.1), "mtp_loss_coef=0.1 applies to multi-token prediction only: set mtp_depth >= 1"),
    (dict(mtp_depth=1, mtp_loss_coef=-0.1), "mtp_loss_coef must be a number >= 0, got -0.1"),
    (dict(mtp_depth=1, index_topk=4), "mtp_depth=1 with sparse attention (index_topk=4) is not supported yet"),
])
def test_bad_mtp_settings_are_one_line_each(flags, fragment):
    with pytest.raises(ValueError) as e:
        tiny_config(**flags)
    assert fragment in str(e.value) and '\n' not in str(e.value)


def test_export_says_no_family_carries_the_mtp_modules():
    from export import hf_family
    with pytest.raises(ValueError, match='mtp_depth=1'):
        hf_family(tiny_config(**FLAGS, mtp_depth=1))


@pytest.mark.parametrize('coef', [0.3, 0.0])
def test_flops_per_token_counts_each_depth_over_its_shorter_sequence(coef, monkeypatch):
    from tiny_models import counted_training_flops
    torch.manual_seed(0)
    model = GPT(tiny_config(**FLAGS, mtp_depth=2, mtp_loss_coef=coef))
    idx = tokens(2, 12, 5)
    assert model.flops_per_token(seq_len=12) * 2 * 12 == pytest.approx(counted_training_flops(model, idx, monkeypatch),
                                                                      rel=1e-12)
