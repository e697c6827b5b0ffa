"""export.py: our GPT -> transformers, logits equal in fp32, for both families, and the CLI."""

import errno
import json
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault('HF_HUB_OFFLINE', '1')
transformers = pytest.importorskip('transformers')

import common.errors  # noqa: E402
from common.checkpoints import new_checkpoint, save_checkpoint  # noqa: E402
from common.errors import Interrupted  # noqa: E402
from common.tokenizer import hf_tokenizer  # noqa: E402
from export import hf_family, to_hf  # noqa: E402
from chapters import GPT, GPTConfig  # noqa: E402
from test_train import one_line_error, train_here  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(block_size=32, vocab_size=100, n_layer=2, n_head=4, n_embd=32)
MODERN = dict(norm='rms', mlp='swiglu', pos='rope', bias=False)


def perturbed(**flags):
    """A small model whose norm gains and biases are not their init values, so a mis-mapped one shows."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**SMALL, **flags})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize('flags, family', [
    ({}, 'GPT2LMHeadModel'),
    ({'bias': False}, 'GPT2LMHeadModel'),
    ({'tie_embeddings': False, 'ffn_hidden': 48}, 'GPT2LMHeadModel'),
    ({**MODERN, 'n_kv_head': 2, 'rope_theta': 500000.0, 'norm_eps': 1e-6}, 'LlamaForCausalLM'),
    ({**MODERN, 'n_kv_head': 1, 'tie_embeddings': False, 'ffn_hidden': 80}, 'LlamaForCausalLM'),
    ({**MODERN, 'bias': True}, 'LlamaForCausalLM'),
])
def test_export_logits_match_and_round_trip(tmp_path, flags, family):
    model = perturbed(**flags)
    hf = to_hf(model)
    assert type(hf).__name__ == family
    idx = torch.randint(0, 100, (2, 24))
    with torch.no_grad():
        ours = model(idx)[0]
        torch.testing.assert_close(hf(idx).logits, ours, atol=1e-4, rtol=0)
        hf.save_pretrained(tmp_path / 'hf')
        back = GPT.from_pretrained(str(tmp_path / 'hf')).eval()
        torch.testing.assert_close(back(idx)[0], ours, atol=1e-4, rtol=0)
    assert back.config.kv_heads == model.config.kv_heads
    assert back.config.tie_embeddings == model.config.tie_embeddings
    assert back.config.mlp_width == model.config.mlp_width
    assert back.config.rope_theta == model.config.rope_theta


@pytest.mark.parametrize('flags, named', [
    ({'norm': 'rms'}, ["norm='rms' is carried by llama", "mlp='swiglu'", "pos='rope'"]),  # what llama needs too
    ({'norm_position': 'post'}, ["norm_position='post'"]),
    ({'mlp': 'geglu', 'pos': 'rope'}, ["mlp='geglu'"]),
    ({'n_kv_head': 2}, ['n_kv_head=2']),
])
def test_unrepresentable_configs_name_the_blocking_flags(flags, named):
    with pytest.raises(ValueError) as e:
        hf_family(GPTConfig(**SMALL, **flags))
    for fragment in named:
        assert fragment in str(e.value)


@pytest.fixture
def export_here(monkeypatch, capsys):
    """export.py's main in this process: (exit code, stderr)."""
    import export
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)

    def run(cwd, out_dir, hf_dir, **settings):
        monkeypatch.chdir(cwd)
        capsys.readouterr()  # what the test printed before is not export's
        try:
            export.main(out_dir, hf_dir, **settings)
            code = 0
        except SystemExit as e:
            code = e.code
        captured = capsys.readouterr()
        run.out = captured.out  # what it printed on stdout, for the tests that read it
        return code, captured.err
    return run


def test_export_cli(tmp_path, export_here):
    model = perturbed(**MODERN, n_kv_head=2)
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(model, config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    run = lambda *args: subprocess.run([sys.executable, str(REPO / 'export.py'), *args], cwd=tmp_path,
                                       capture_output=True, text=True, timeout=120,
                                       env={**os.environ, 'HF_HUB_OFFLINE': '1'})
    result = run('--out_dir=out', '--hf_dir=hf')
    assert result.returncode == 0, result.stderr
    assert 'LlamaForCausalLM' in result.stdout
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf').eval()
    idx = torch.randint(0, 100, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0], atol=1e-4, rtol=0)

    blocked = perturbed(norm='rms')
    save_checkpoint(new_checkpoint(blocked, config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    for args, fragment in [(('out', 'hf2'), "norm='rms'"), (('nowhere', 'hf2'), 'nowhere/ckpt.pt'), (('out', ''), 'hf_dir')]:
        code, err = export_here(tmp_path, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith('error:'), err
        assert fragment in lines[0]
    assert not (tmp_path / 'hf2').exists()


@pytest.mark.parametrize('umask', [0o022, 0o027])
def test_every_exported_file_has_the_umasks_mode(tmp_path, export_here, umask):
    """transformers writes model.safetensors 0600: the export writes it as its other files, by the umask."""
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(perturbed(**MODERN), config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    old = os.umask(umask)
    try:
        code, err = export_here(tmp_path, 'out', 'hf')
    finally:
        os.umask(old)
    assert code == 0, err
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / 'hf').iterdir()}
    assert 'model.safetensors' in modes and set(modes.values()) == {0o666 & ~umask}, modes


def test_a_character_model_exports_with_its_tokenizer_and_samples_back(tmp_path, monkeypatch, capsys):
    """The exported directory alone: transformers loads model and tokenizer (no stray bos/eos ids), and
    sample.py --init_from=DIR decodes the same characters as from the checkpoint."""
    from conftest import make_char_dataset
    make_char_dataset(tmp_path, 'chars')
    chars = json.loads((tmp_path / 'data' / 'chars' / 'meta.json').read_text())['chars']
    model = perturbed(**{**MODERN, 'vocab_size': len(chars)})
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(model, config={'dataset': 'chars'}), str(tmp_path / 'out' / 'ckpt.pt'))
    env = {**os.environ, 'HF_HUB_OFFLINE': '1'}
    result = subprocess.run([sys.executable, str(REPO / 'export.py'), '--out_dir=out', '--hf_dir=hf-chars'],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0 and 'with its tokenizer' in result.stdout, result.stderr
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / 'hf-chars')
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf-chars').eval()
    assert hf.config.bos_token_id is None and hf.config.eos_token_id is None
    prompt = 'the quick'
    assert tok.encode(prompt) == [chars.index(c) for c in prompt]
    with torch.no_grad():
        hf_text = tok.decode(hf.generate(torch.tensor([tok.encode(prompt)]), max_new_tokens=20, do_sample=False,
                                         pad_token_id=0)[0])
    texts = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)  # pytest keeps its own Ctrl-C
    capsys.readouterr()
    for source in ('--init_from=hf-chars', '--out_dir=out'):
        monkeypatch.setattr(sys, 'argv', ['sample.py', source, '--start=the quick', '--num_samples=1',
                                          '--max_new_tokens=20', '--temperature=0', '--device=cpu'])
        runpy.run_path(str(REPO / 'sample.py'), run_name='__main__')
        texts.append(capsys.readouterr().out.split('\n---------------')[0])
    assert texts[0] == texts[1] == hf_text and len(hf_text) == len(prompt) + 20


def test_export_to_a_file_is_refused_and_writes_nothing(tmp_path, export_here):
    model = perturbed(**MODERN)
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(model, config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    (tmp_path / 'taken').write_text('not a directory')
    code, err = export_here(tmp_path, 'out', 'taken')
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "hf_dir 'taken' is a file" in lines[0]
    assert (tmp_path / 'taken').read_text() == 'not a directory'


def test_a_bpe_run_exports_gpt2s_tokenizer(tmp_path, monkeypatch):
    cache = REPO.parent / 'shared' / 'data' / 'tiktoken_cache'
    if not os.environ.get('TIKTOKEN_CACHE_DIR') and not cache.is_dir():
        pytest.skip('no tiktoken cache: set TIKTOKEN_CACHE_DIR to run the GPT-2 BPE tests offline')
    monkeypatch.setenv('TIKTOKEN_CACHE_DIR', os.environ.get('TIKTOKEN_CACHE_DIR') or str(cache))
    (tmp_path / 'data' / 'bpe').mkdir(parents=True)
    (tmp_path / 'data' / 'bpe' / 'meta.json').write_text('{"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 50257}')
    monkeypatch.chdir(tmp_path)
    tok = hf_tokenizer({'dataset': 'bpe'})
    import tiktoken
    text = 'Hello world, café 日本 <|endoftext|>!'
    assert tok.encode(text) == tiktoken.get_encoding('gpt2').encode(text, allowed_special='all')
    assert tok.bos_token_id == tok.eos_token_id == 50256 and len(tok) == 50257


def test_a_run_whose_vocabulary_is_broken_exports_saying_why_it_has_no_tokenizer(tmp_path, export_here):
    """A meta.json without its characters: the model is exported, and the one note and the result name the file,
    not 'its run names none'."""
    (tmp_path / 'data' / 'chars').mkdir(parents=True)
    (tmp_path / 'data' / 'chars' / 'meta.json').write_text('{"kind": "char", "vocab_size": 100}')
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(perturbed(**MODERN), config={'dataset': 'chars'}),
                           str(tmp_path / 'out' / 'ckpt.pt'))
    code, err = export_here(tmp_path, 'out', 'hf')
    assert code == 0 and (tmp_path / 'hf' / 'config.json').exists()
    notes = [line for line in err.splitlines() if line.startswith('note:')]
    assert len(notes) == 1 and "data/chars/meta.json" in notes[0] and "'chars'" in notes[0], err
    out = export_here.out
    assert 'without a tokenizer' in out and 'meta.json' in out and 'names none' not in out


def test_a_model_trained_from_qwen3_5_exports_back_to_it(tmp_path, export_here, monkeypatch, capsys):
    """train.py --init_from=<Qwen3.5 dir>, then a resume: the checkpoint still exports as Qwen3.5 (not as
    Qwen3-Next, which carries the same flags and comes first); --family chooses, or is refused in one line."""
    from conftest import make_char_dataset
    from test_hf_qwen3_next import tiny_qwen3_5
    make_char_dataset(tmp_path)
    tiny_qwen3_5().save_pretrained(tmp_path / 'qwen')
    for args in (['--init_from=qwen', '--max_iters=2'], ['--init_from=resume', '--max_iters=3']):
        code, _, err = train_here(tmp_path, *args, '--eval_interval=2', '--out_dir=out', monkeypatch=monkeypatch,
                                  capsys=capsys)
        assert code == 0, err[-2000:]
    for hf_dir, family, hf_class in (('hf', '', 'Qwen3_5ForCausalLM'),
                                     ('hf-next', 'qwen3_next', 'Qwen3NextForCausalLM')):
        code, err = export_here(tmp_path, 'out', hf_dir, family=family)
        assert code == 0 and hf_class in export_here.out, err
        assert json.loads((tmp_path / hf_dir / 'config.json').read_text())['architectures'] == [hf_class]
    one_line_error(*export_here(tmp_path, 'out', 'hf-llama', family='llama'), '--family=llama cannot carry',
                   'attn_gate=True', 'families that can: qwen3_next, qwen3_5_text')
    one_line_error(*export_here(tmp_path, 'out', 'hf-typo', family='qwen3.5'), "--family='qwen3.5' is not a family",
                   'allowed: gpt2, llama,', 'qwen3_5_text')
    assert not (tmp_path / 'hf-llama').exists() and not (tmp_path / 'hf-typo').exists()


def files_of(directory):
    return {p.name: p.read_bytes() for p in Path(directory).iterdir()}


def test_an_hf_dir_holding_a_model_is_replaced_only_with_overwrite(tmp_path, export_here):
    for out_dir, flags in (('out', MODERN), ('out2', {**MODERN, 'n_kv_head': 2})):
        (tmp_path / out_dir).mkdir()
        save_checkpoint(new_checkpoint(perturbed(**flags), config={}),
                               str(tmp_path / out_dir / 'ckpt.pt'))
    assert export_here(tmp_path, 'out', 'hf')[0] == 0
    before = files_of(tmp_path / 'hf')
    one_line_error(*export_here(tmp_path, 'out2', 'hf'), "hf_dir 'hf' already holds a model", '--overwrite=True')
    assert files_of(tmp_path / 'hf') == before
    code, err = export_here(tmp_path, 'out2', 'hf', overwrite=True)
    assert code == 0 and 'replacing the model it held' in export_here.out, err
    assert json.loads((tmp_path / 'hf' / 'config.json').read_text())['num_key_value_heads'] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hf', 'out', 'out2']  # nothing left aside
    # never a directory of other files, nor an out_dir (its checkpoints), --overwrite or not
    (tmp_path / 'notes').mkdir()
    (tmp_path / 'notes' / 'todo.txt').write_text('keep me')
    one_line_error(*export_here(tmp_path, 'out', 'notes', overwrite=True), "'notes' holds files but no model")
    one_line_error(*export_here(tmp_path, 'out', 'out2', overwrite=True), "'out2' holds checkpoints (ckpt.pt)")
    assert (tmp_path / 'notes' / 'todo.txt').read_text() == 'keep me' and (tmp_path / 'out2' / 'ckpt.pt').exists()


def test_overwrite_replaces_a_hugging_face_export_and_nothing_else(tmp_path, export_here):
    """issue #44: --overwrite=True replaces a directory holding an export alone (its tokenizer files too); a dataset
    (meta.json, prepare.py, .bin files), a model beside a checkpoint in a subfolder, or beside notes, is refused in
    one line naming what it holds, and left as it was."""
    from conftest import make_char_dataset
    data = make_char_dataset(tmp_path, 'copy')
    (data / 'prepare.py').write_text('# writes train.bin, val.bin and meta.json\n')
    vocab = len(json.loads((data / 'meta.json').read_text())['chars'])
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(perturbed(**MODERN, vocab_size=vocab), config={'dataset': 'copy'}),
                           str(tmp_path / 'out' / 'ckpt.pt'))
    for _ in range(2):  # the second export replaces the first, tokenizer and all
        code, err = export_here(tmp_path, 'out', 'hf', overwrite=True)
        assert code == 0 and 'with its tokenizer' in export_here.out, err
    hf = tmp_path / 'hf'
    assert {'config.json', 'model.safetensors', 'tokenizer.json'} <= set(files_of(hf))
    dataset = files_of(data)
    one_line_error(*export_here(tmp_path, 'out', 'data/copy', overwrite=True),
                   "hf_dir 'data/copy' holds files but no model (meta.json, prepare.py, train.bin, val.bin)")
    assert files_of(data) == dataset
    (hf / 'finetune_run').mkdir()
    (hf / 'finetune_run' / 'ckpt.pt').write_bytes(b'a checkpoint')
    one_line_error(*export_here(tmp_path, 'out', 'hf', overwrite=True),
                   "hf_dir 'hf' holds checkpoints (finetune_run/ckpt.pt), which export never replaces")
    (hf / 'finetune_run' / 'ckpt.pt').rename(hf / 'finetune_run' / 'log.jsonl')
    one_line_error(*export_here(tmp_path, 'out', 'hf', overwrite=True),
                   "hf_dir 'hf' holds a model and what export did not write (finetune_run/)")
    (hf / 'notes.md').write_text('keep me')
    one_line_error(*export_here(tmp_path, 'out', 'hf', overwrite=True), "(finetune_run/, notes.md)")
    assert (hf / 'notes.md').read_text() == 'keep me' and (hf / 'finetune_run' / 'log.jsonl').exists()
    assert (hf / 'config.json').exists()


def test_a_model_no_family_carries_is_refused_naming_the_family_that_carries_its_flag(tmp_path, export_here):
    """issue #49: the one line names the family that carries index_topk and what else it needs, not two that
    cannot; nothing is written."""
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(perturbed(**MODERN, n_kv_head=2, index_topk=16), config={}),
                           str(tmp_path / 'out' / 'ckpt.pt'))
    line = one_line_error(*export_here(tmp_path, 'out', 'hf'), 'no Hugging Face family can represent this model: '
                          "index_topk=16 is carried by deepseek_v32 and glm_moe_dsa, which also need", "attn='mla'")
    assert 'llama' not in line and not (tmp_path / 'hf').exists()


@pytest.mark.parametrize('flags, family, note', [
    # the speedrun's shared-head MTP and its window schedule: training's alone (issue 65.5)
    ({'mtp_shared': 2, 'mtp_shared_decay': 0.7}, 'llama', 'mtp_shared=2, mtp_shared_decay=0.7'),
    ({'sliding_window': 8, 'sliding_window_start': 4}, 'mistral', 'sliding_window_start=4'),  # every layer local
], ids=['mtp_shared', 'sliding_window_start'])
def test_flags_that_shape_training_alone_are_dropped_not_refused(tmp_path, export_here, flags, family, note):
    """A loss term's weight or a schedule adds no weight: the export goes without it, says so in one line, and
    computes the model's logits."""
    model = perturbed(**{**MODERN, 'n_kv_head': 2, **flags})
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(model, config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    code, err = export_here(tmp_path, 'out', 'hf')
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith('note:')] == [
        f"note: {note} shaped training alone (no weight, the same logits): {family} goes without"], err
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf').eval()
    assert hf.config.model_type == family
    idx = torch.randint(0, 100, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize('failure', ['disk full', 'interrupt'])
def test_a_failed_export_leaves_the_model_there_whole(failure, tmp_path, export_here, monkeypatch):
    """The new model is written aside and switched in: a failure half-way through its files (a full disk, Ctrl-C)
    leaves the directory's old model file for file, and nothing beside it."""
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(perturbed(**MODERN), config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    assert export_here(tmp_path, 'out', 'hf')[0] == 0
    before = files_of(tmp_path / 'hf')

    def fails_half_way(self, directory, *args, **kwargs):
        (Path(directory) / 'config.json').write_text('{"half": ')
        if failure == 'interrupt':
            raise Interrupted(signal.SIGINT)
        raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(transformers.PreTrainedModel, 'save_pretrained', fails_half_way)
    if failure == 'interrupt':
        with pytest.raises(KeyboardInterrupt):
            export_here(tmp_path, 'out', 'hf', overwrite=True)
    else:
        one_line_error(*export_here(tmp_path, 'out', 'hf', overwrite=True), 'No space left on device',
                       'what it held is unchanged')
    assert files_of(tmp_path / 'hf') == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hf', 'out']


def test_a_model_left_aside_by_a_killed_export_is_pointed_to(tmp_path, export_here):
    """kill -9 between the switch's two renames leaves the old model beside a missing hf_dir: a new export
    into hf_dir says where it is, rather than hide it for good."""
    (tmp_path / 'out').mkdir()
    save_checkpoint(new_checkpoint(perturbed(**MODERN), config={}), str(tmp_path / 'out' / 'ckpt.pt'))
    (tmp_path / '.hf.old4242').mkdir()
    (tmp_path / '.hf.old4242' / 'config.json').write_text('{}')
    one_line_error(*export_here(tmp_path, 'out', 'hf'), "hf_dir 'hf' is missing", '.hf.old4242', 'move it back')
    assert not (tmp_path / 'hf').exists()
