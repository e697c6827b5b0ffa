"""eval.py: our GPT through lm-evaluation-harness's LM interface scores a task exactly as the harness's own `hf`
backend scores export.py's directory of the same weights; its settings and bad input are one line."""

import json
import os
import runpy
import sys
from pathlib import Path

import pytest
import torch

for key in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE', 'HF_DATASETS_OFFLINE'):
    os.environ.setdefault(key, '1')

import common.errors  # noqa: E402
from common.checkpoints import new_checkpoint, save_checkpoint  # noqa: E402
from common.tokenizer import load_tokenizer  # noqa: E402
from conftest import CHOICE_TASK_YAML  # noqa: E402
from chapters import GPT, GPTConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TIKTOKEN_CACHE = REPO.parent / 'shared' / 'data' / 'tiktoken_cache'
# HellaSwag's shape: a context and four endings, one of them right
ITEMS = [
    {'ctx': 'The man opens the fridge and', 'endings': [' takes out a bottle of milk.', ' flies to the moon.',
                                                        ' paints the sky green.', ' sings to the eggs.'], 'label': 0},
    {'ctx': 'She ties her running shoes, then', 'endings': [' eats the laces.', ' goes for a jog in the park.',
                                                            ' reads a shoe.', ' sleeps on the road.'], 'label': 1},
    {'ctx': 'To bake bread, first you', 'endings': [' drive a car.', ' mix flour, water and yeast.',
                                                    ' climb a tree.', ' call the river.'], 'label': 1},
    {'ctx': 'The kids build a snowman and', 'endings': [' give it a carrot nose.', ' cook it for dinner.',
                                                        ' mail it abroad.', ' plug it in.'], 'label': 0},
    {'ctx': 'He tunes the guitar before he', 'endings': [' eats it.', ' plants it.', ' plays a song.',
                                                         ' washes the cat.'], 'label': 2},
]
TEXTS = ['The quick brown fox jumps over the lazy dog. ' * 6, 'A short line of text.']
CHOICE_YAML = CHOICE_TASK_YAML.replace('{name}', 'tiny_swag')
ROLLING_YAML = """task: tiny_text
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
"""
GENERATE_YAML = """task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
validation_split: validation
output_type: generate_until
doc_to_text: "{{{{ctx}}}}"
doc_to_target: "{{{{endings[label]}}}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.fixture
def bpe(monkeypatch):
    if not os.environ.get('TIKTOKEN_CACHE_DIR'):
        if not TIKTOKEN_CACHE.is_dir():
            pytest.skip("no tiktoken cache: set TIKTOKEN_CACHE_DIR to test GPT-2 BPE offline")
        monkeypatch.setenv('TIKTOKEN_CACHE_DIR', str(TIKTOKEN_CACHE))


def write_tasks(root):
    """root/tasks: the three local tasks (multiple choice, rolling log-likelihood, generation) and their jsonl."""
    tasks = root / 'tasks'
    tasks.mkdir()
    (tasks / 'swag.jsonl').write_text(''.join(json.dumps(item) + '\n' for item in ITEMS))
    (tasks / 'text.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in TEXTS))
    for name, yaml, data in (('swag', CHOICE_YAML, 'swag'), ('text', ROLLING_YAML, 'text'),
                             ('gen', GENERATE_YAML, 'swag')):
        (tasks / f'{name}.yaml').write_text(yaml.format(path=tasks / f'{data}.jsonl'))
    return tasks


def write_checkpoint(root, **flags):
    """root/out/ckpt.pt: a small GPT on GPT-2's BPE (data/bpe/meta.json), its weights moved off their init so
    the choices' scores differ clearly."""
    (root / 'data' / 'bpe').mkdir(parents=True)
    (root / 'data' / 'bpe' / 'meta.json').write_text(json.dumps({'kind': 'tiktoken', 'encoding': 'gpt2',
                                                                 'vocab_size': 50257}))
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=50304, **flags))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    (root / 'out').mkdir()
    save_checkpoint(new_checkpoint(model, config={'dataset': 'bpe'}), str(root / 'out' / 'ckpt.pt'))
    return model


def run_eval(cwd, *args, monkeypatch, capsys):
    """eval.py in this process: (exit code, stdout, stderr)."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, 'argv', ['eval.py', '--device=cpu', *args])
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)  # pytest keeps its own Ctrl-C
    try:
        runpy.run_path(str(REPO / 'eval.py'), run_name='__main__')
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *fragments):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith('error:'), (code, err)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_scores_equal_the_harness_hf_backend_on_the_exported_weights(tmp_path, bpe, monkeypatch, single_thread):
    """GPT-2's block (export.py's GPT2LMHeadModel; tests/test_export.py checks every family's logits equal ours):
    multiple choice, rolling log-likelihoods past block_size, and greedy generation with the cache."""
    pytest.importorskip('lm_eval')
    import export
    from lm_eval import simple_evaluate

    import eval as nano_eval
    tasks = write_tasks(tmp_path)
    model = write_checkpoint(tmp_path)
    monkeypatch.chdir(tmp_path)
    export.main('out', 'hf')
    names = ['tiny_swag', 'tiny_text', 'tiny_gen']
    manager = nano_eval.task_manager(str(tasks), names)
    lm = nano_eval.harness_lm(model, load_tokenizer('data/bpe/meta.json'), 'cpu', batch_size=3)
    ours = nano_eval.run_tasks(lm, names, manager, log_samples=True)
    theirs = simple_evaluate(model='hf', model_args='pretrained=hf,dtype=float32', device='cpu', batch_size=3,
                             tasks=names, task_manager=manager, log_samples=True)
    for metric in ('acc,none', 'acc_norm,none'):
        assert ours['results']['tiny_swag'][metric] == theirs['results']['tiny_swag'][metric]
    # the log-likelihood of every choice, beyond the accuracies
    choices = [[r[0][0] for s in run['samples']['tiny_swag'] for r in s['resps']] for run in (ours, theirs)]
    assert len(choices[0]) == 4 * len(ITEMS) and len(set(choices[0])) > 1
    assert choices[0] == pytest.approx(choices[1], abs=1e-4)
    for metric in ('word_perplexity,none', 'bits_per_byte,none'):  # rolling windows over texts past block_size
        assert ours['results']['tiny_text'][metric] == pytest.approx(theirs['results']['tiny_text'][metric], rel=1e-5)
    generated = [[s['resps'][0][0] for s in run['samples']['tiny_gen']] for run in (ours, theirs)]
    assert generated[0] == generated[1] and any(generated[0])


def test_cli_writes_the_harness_results(tmp_path, bpe, monkeypatch, capsys, single_thread):
    pytest.importorskip('lm_eval')
    tasks = write_tasks(tmp_path)
    write_checkpoint(tmp_path)
    code, out, err = run_eval(tmp_path, '--out_dir=out', '--tasks=tiny_swag', f'--include_path={tasks}', '--limit=3',
                              '--batch_size=2', '--output=scores.json', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err[-3000:]
    assert 'tiny_swag' in out and 'acc_norm' in out
    results = json.loads((tmp_path / 'scores.json').read_text())
    assert results['results']['tiny_swag']['acc,none'] in (0, 1 / 3, 2 / 3, 1)
    assert results['n-samples']['tiny_swag']['effective'] == 3
    # the same weights as a Hugging Face directory, through GPT.from_pretrained and the directory's tokenizer
    import export
    export.main('out', 'hf')
    code, _, err = run_eval(tmp_path, '--init_from=hf', '--tasks=tiny_swag', f'--include_path={tasks}', '--limit=3',
                            '--output=hf.json', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err[-3000:]
    pretrained = json.loads((tmp_path / 'hf.json').read_text())['results']['tiny_swag']
    assert pretrained['acc_norm,none'] == results['results']['tiny_swag']['acc_norm,none']


@pytest.mark.parametrize('args, fragments', [
    (['--out_dir=out', '--init_from=gpt2'], ['--out_dir=out', '--init_from=gpt2', 'not both']),
    ([], ['--out_dir=DIR', '--init_from=NAME_OR_DIR']),
    (['--out_dir=out', '--include_path=nowhere'], ["include_path 'nowhere'", 'not a directory']),
    (['--out_dir=out', '--tasks=,'], ['tasks must name']),
    (['--out_dir=out', '--limit=0'], ['limit must be at least 1']),
    (['--out_dir=out', '--threads=-1'], ['threads must be >= 0']),
])
def test_bad_settings_are_one_line_before_torch_work(tmp_path, monkeypatch, capsys, args, fragments):
    code, _, err = run_eval(tmp_path, *args, monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, *fragments)


def test_an_unknown_task_is_one_line_with_the_closest(tmp_path, capsys):
    pytest.importorskip('lm_eval')
    import eval as nano_eval
    manager = nano_eval.task_manager(str(write_tasks(tmp_path)), ['tiny_swag'])
    with pytest.raises(SystemExit) as e:
        nano_eval.check_tasks(manager, ['tiny_swag', 'tiny_swg'])
    one_line_error(e.value.code, capsys.readouterr().err, "unknown task 'tiny_swg'", "'tiny_swag'")


def test_without_the_harness_eval_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, 'lm_eval', None)  # as if not installed: importing it raises ImportError
    code, _, err = run_eval(tmp_path, '--out_dir=out', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, 'pip install lm-eval')


# --- a character model, the example task, and what a task's author can get wrong: one line each ----------------

EXAMPLE = REPO / 'examples' / 'eval_task'


def write_char_checkpoint(root, block_size=64):
    """root/out/ckpt.pt: a tiny GPT over the characters of the example task (root/data/chars/meta.json), with
    examples/ linked into root so the example's relative data_files resolve there."""
    from conftest import make_char_dataset
    make_char_dataset(root, 'chars', text=(EXAMPLE / 'shakespeare_cloze.jsonl').read_text())
    vocab = len(json.loads((root / 'data' / 'chars' / 'meta.json').read_text())['chars'])
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=block_size, vocab_size=vocab))
    (root / 'out').mkdir()
    save_checkpoint(new_checkpoint(model, config={'dataset': 'chars'}), str(root / 'out' / 'ckpt.pt'))
    (root / 'examples').symlink_to(REPO / 'examples')
    return model


def test_the_example_task_scores_a_character_model_without_a_false_error(tmp_path, monkeypatch, capsys,
                                                                         single_thread):
    """examples/eval_task (the README's) as a user runs it; a character vocabulary has no end-of-text token, and
    looking for one must not print an error."""
    pytest.importorskip('lm_eval')
    write_char_checkpoint(tmp_path)
    code, out, err = run_eval(tmp_path, '--out_dir=out', '--tasks=shakespeare_cloze', '--include_path=examples/eval_task',
                              '--output=cloze.json', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err[-3000:]
    assert 'error' not in err, err
    results = json.loads((tmp_path / 'cloze.json').read_text())
    items = len((EXAMPLE / 'shakespeare_cloze.jsonl').read_text().splitlines())
    assert results['n-samples']['shakespeare_cloze']['effective'] == items == 12
    assert results['results']['shakespeare_cloze']['acc,none'] * items == pytest.approx(
        round(results['results']['shakespeare_cloze']['acc,none'] * items))


def test_eval_takes_a_thread_count(tmp_path, monkeypatch, capsys, single_thread):
    """--threads as train.py's (tests/test_threads.py has the default's choice)."""
    pytest.importorskip('lm_eval')
    write_char_checkpoint(tmp_path)
    code, _, err = run_eval(tmp_path, '--out_dir=out', '--tasks=shakespeare_cloze', '--include_path=examples/eval_task',
                            '--limit=1', '--threads=2', monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err[-3000:]
    assert torch.get_num_threads() == 2  # single_thread puts the test process's count back


@pytest.mark.parametrize('output, fragment', [
    ('out/ckpt.pt', 'is a checkpoint'),
    ('out/best.pt', 'is a checkpoint'),
    ('linked.json', 'hard link'),
    ('out', 'is a directory'),
    ('nowhere/scores.json', "no directory"),
])
def test_output_never_replaces_a_checkpoint_and_is_checked_before_the_evaluation(tmp_path, monkeypatch, capsys,
                                                                                  output, fragment):
    write_char_checkpoint(tmp_path)
    os.link(tmp_path / 'out' / 'ckpt.pt', tmp_path / 'out' / 'best.pt')
    (tmp_path / 'scores.json').write_text('{"kept": true}')
    os.link(tmp_path / 'scores.json', tmp_path / 'linked.json')  # another run's file under a second name
    before = (tmp_path / 'out' / 'ckpt.pt').read_bytes()
    code, out, err = run_eval(tmp_path, '--out_dir=out', '--tasks=shakespeare_cloze', '--include_path=examples/eval_task',
                              f'--output={output}', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, f'--output={output}', fragment)
    assert 'acc' not in out  # refused before any scoring
    assert (tmp_path / 'out' / 'ckpt.pt').read_bytes() == before == (tmp_path / 'out' / 'best.pt').read_bytes()
    assert (tmp_path / 'scores.json').read_text() == '{"kept": true}'


def broken_task(root, items, yaml_extra=''):
    """root/broken: a multiple-choice task 'broken' over these items."""
    d = root / 'broken'
    d.mkdir()
    (d / 'items.jsonl').write_text(items)
    (d / 'broken.yaml').write_text(CHOICE_TASK_YAML.format(name='broken', path=d / 'items.jsonl') + yaml_extra)
    return d


def item(ctx='To be', endings=(' or not', ' a dog'), label=0):
    return json.dumps({'ctx': ctx, 'endings': list(endings), 'label': label}) + '\n'


@pytest.mark.parametrize('items, args, fragments', [
    (item(endings=(' or not to be' * 6, ' a dog')), [], ["a continuation of 79 tokens", "block_size (64)"]),
    (item(endings=()), [], ['IndexError', 'without choices']),  # the first item: the harness's own check
    (item() + item(endings=()), [], ['item 2 has no choices']),
    (item() + item(label=5), [], ['item 2 has the label 5, not one of its 2 choices']),
    (item() + '{"ctx": "To be", "endings": [\n', [], ['JSON']),
    (item() * 3, ['--num_fewshot=5'], ['num_fewshot=5', 'more examples']),
    (None, [], ["Unable to find", "data_files"]),
])
def test_a_task_that_cannot_be_scored_is_one_line(tmp_path, monkeypatch, capsys, single_thread, items, args, fragments):
    pytest.importorskip('lm_eval')
    write_char_checkpoint(tmp_path)
    tasks = broken_task(tmp_path, items or '')
    if items is None:
        (tasks / 'items.jsonl').unlink()
    code, _, err = run_eval(tmp_path, '--out_dir=out', '--tasks=broken', f'--include_path={tasks}', *args,
                            monkeypatch=monkeypatch, capsys=capsys)
    # the harness's progress bars around it (an exception in this process ends it: no 'error:' line, no exit code)
    errors = [line for line in err.splitlines() if line.startswith('error:')]
    assert code == 2 and len(errors) == 1, err
    one_line_error(code, errors[0], "task broken", *fragments)


def test_a_task_yaml_that_does_not_parse_shows_why(tmp_path, capsys):
    pytest.importorskip('lm_eval')
    from lm_eval.tasks import TaskManager

    import eval as nano_eval
    tasks = broken_task(tmp_path, item(), yaml_extra='  - metric: [unclosed\n')
    with pytest.raises(SystemExit) as e:
        nano_eval.check_tasks(TaskManager(include_path=str(tasks), include_defaults=False), ['broken'])
    one_line_error(e.value.code, capsys.readouterr().err, "unknown task 'broken'", 'broken.yaml', 'does not parse',
                   'line 18')


def test_a_character_checkpoint_away_from_its_vocabulary_is_refused(tmp_path, monkeypatch, capsys):
    """Run from outside the repository (no data/<dataset>/meta.json there), GPT-2's BPE would score another
    vocabulary: refused, as sample.py does."""
    pytest.importorskip('lm_eval')
    write_char_checkpoint(tmp_path / 'repo')
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    code, _, err = run_eval(elsewhere, f'--out_dir={tmp_path / "repo" / "out"}', '--tasks=shakespeare_cloze',
                            f'--include_path={EXAMPLE}', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, "no 'data/chars/meta.json' here", "repository's root", '--tokenizer')


def test_a_tokenizer_larger_than_the_model_is_one_line(tmp_path, bpe, monkeypatch, capsys):
    pytest.importorskip('lm_eval')
    write_char_checkpoint(tmp_path)
    code, _, err = run_eval(tmp_path, '--out_dir=out', '--tasks=shakespeare_cloze', '--include_path=examples/eval_task',
                            '--tokenizer=gpt2', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, '50257 tokens', 'vocab_size', 'leave --tokenizer empty')


def test_the_docs_point_to_the_example_task_and_the_dev_requirements():
    """What a newcomer follows: docs/evaluation.md's example command names the shipped task (after installing the
    dev requirements), and the requirements that run the whole suite (eval.py's tests need lm-eval and accelerate)
    are one file that .ci/run installs too and README's Tests names."""
    readme = (REPO / 'README.md').read_text()
    page = (REPO / 'docs' / 'evaluation.md').read_text()
    command = 'python eval.py --out_dir=out-shakespeare-modern-cpu --tasks=shakespeare_cloze --include_path=examples/eval_task'
    assert command in page
    assert page.index('pip install -r requirements-dev.txt') < page.index(command)
    assert 'out-shakespeare-modern-cpu' in readme  # the quick start trains the model it scores
    assert 'task: shakespeare_cloze' in (EXAMPLE / 'shakespeare_cloze.yaml').read_text()
    dev = (REPO / 'requirements-dev.txt').read_text().splitlines()
    assert {'-r requirements.txt', 'lm-eval==0.4.13', 'accelerate', 'pytest'} <= {line.split('#')[0].strip()
                                                                                for line in dev}
    assert 'pip install --quiet -r requirements-dev.txt' in (REPO / '.ci' / 'run').read_text()
    tests_section = readme.split('## Tests')[1].split('\n## ')[0]
    assert 'pip install -r requirements-dev.txt' in tests_section


def test_an_unwritable_output_directory_is_refused_before_the_evaluation(tmp_path, monkeypatch, capsys):
    write_char_checkpoint(tmp_path)
    (tmp_path / 'readonly').mkdir()
    readonly = str(tmp_path / 'readonly')
    opener = os.open  # as a directory without write permission answers (root may write anywhere: simulated)

    def refusing(path, *args, **kw):
        if os.path.dirname(os.path.abspath(path)) == readonly:
            raise PermissionError(13, 'Permission denied')
        return opener(path, *args, **kw)
    monkeypatch.setattr(os, 'open', refusing)
    code, out, err = run_eval(tmp_path, '--out_dir=out', '--tasks=shakespeare_cloze', '--include_path=examples/eval_task',
                              '--output=readonly/scores.json', monkeypatch=monkeypatch, capsys=capsys)
    one_line_error(code, err, '--output=readonly/scores.json', 'not writable')
    assert 'acc' not in out
