"""python -m hf.tiny FAMILY DIR: a tiny random checkpoint of every family we carry, offline, that GPT.from_pretrained
loads with transformers' logits and sample.py samples from (its character tokenizer beside it)."""

import pytest
import torch

from hf_tiny import GPT, HF_FAMILIES, VOCAB, transformers

pytestmark = pytest.mark.usefixtures('single_thread')


def tiny_dir(family, path, capsys):
    """python -m hf.tiny FAMILY DIR in this process: (exit code, its output)."""
    from hf.tiny import main
    code = 0
    try:
        main([family, str(path)])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr()


@pytest.mark.parametrize('family', list(HF_FAMILIES))
def test_every_family_has_a_tiny_checkpoint_with_transformers_logits(family, tmp_path, capsys):
    code, out = tiny_dir(family, tmp_path / 'tiny', capsys)
    assert code == 0 and f'to {tmp_path / "tiny"}' in out.out, out.err
    hf = getattr(transformers, HF_FAMILIES[family].auto_class).from_pretrained(tmp_path / 'tiny').eval()
    assert hf.config.model_type == family or hf.config.get_text_config().model_type == family
    ours = GPT.from_pretrained(str(tmp_path / 'tiny')).eval()
    idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / 'tiny')
    assert tokenizer('Hi!', add_special_tokens=False)['input_ids'] == [ord(c) - 31 for c in 'Hi!']


def test_an_unknown_family_or_a_used_directory_is_one_line(tmp_path, capsys):
    code, out = tiny_dir('llama9', tmp_path / 'a', capsys)
    assert code == 2 and out.err.startswith("error: unknown family 'llama9'; families: gpt2, llama,") and \
        len(out.err.strip().splitlines()) == 1
    (tmp_path / 'used').mkdir()
    (tmp_path / 'used' / 'notes.txt').write_text('mine')
    code, out = tiny_dir('llama', tmp_path / 'used', capsys)
    assert code == 2 and "is not an empty directory" in out.err and (tmp_path / 'used' / 'notes.txt').exists()
