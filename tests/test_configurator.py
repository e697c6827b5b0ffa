"""Tests for configurator.configure / settings_of."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from configurator import ConfigError, configure, settings_of  # noqa: E402

DEFAULTS = {
    'batch_size': 12,
    'learning_rate': 6e-4,
    'min_lr': 6e-5,
    'compile': True,
    'device': 'auto',
    'init_from': 'scratch',
    'start': '\n',
    'n_kv_head': None,
    'n_layer': 12,
    'extra': None,  # no annotation in train.py or GPTConfig: any literal
}


def run(argv, defaults=DEFAULTS):
    return configure(defaults, argv, prog='train.py')


def expect_error(capsys, argv, *fragments):
    """Run configure expecting a user error; return the single stderr line."""
    with pytest.raises(SystemExit) as exc:
        run(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert 'Traceback' not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith('error: ')
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---- overrides -----------------------------------------------------------------

def test_empty_argv_returns_equal_new_dict():
    out = run([])
    assert out == DEFAULTS
    assert out is not DEFAULTS


def test_defaults_not_mutated(tmp_path):
    before = dict(DEFAULTS)
    cfg = write(tmp_path, 'c.py', 'n_layer = 3\n')
    out = run([cfg, '--batch_size=4'])
    assert DEFAULTS == before
    assert out['batch_size'] == 4 and out['n_layer'] == 3


def test_int_override():
    out = run(['--batch_size=32'])
    assert out['batch_size'] == 32 and type(out['batch_size']) is int


def test_float_override():
    assert run(['--learning_rate=1e-3'])['learning_rate'] == 1e-3


def test_int_accepted_for_float_becomes_float():
    out = run(['--learning_rate=1'])
    assert out['learning_rate'] == 1.0 and type(out['learning_rate']) is float


@pytest.mark.parametrize('text,expected', [
    ('false', False), ('FALSE', False), ('False', False),
    ('true', True), ('TRUE', True), ('True', True), ('tRuE', True),
])
def test_bool_override_any_case(text, expected):
    out = run([f'--compile={text}'])
    assert out['compile'] is expected


def test_str_overrides_keep_raw_text():
    out = run(['--device=cpu', '--init_from=gpt2', '--start=123'])
    assert out['device'] == 'cpu'
    assert out['init_from'] == 'gpt2'
    assert out['start'] == '123' and type(out['start']) is str


def test_str_quoted_literal_is_unquoted():
    assert run(["--device='cuda:1'"])['device'] == 'cuda:1'


def test_value_may_contain_equals():
    assert run(['--start=a=b'])['start'] == 'a=b'


def test_none_default_accepts_int_and_none():
    assert run(['--n_kv_head=2'])['n_kv_head'] == 2
    assert run(['--n_kv_head=2', '--n_kv_head=None'])['n_kv_head'] is None


@pytest.mark.parametrize('text,expected', [('yarn', 'yarn'), ('1.25', 1.25), ('"4"', '4'), ('3', 3), ('None', None)])
def test_unannotated_none_default_accepts_any_literal(text, expected):
    value = run([f'--extra={text}'])['extra']
    assert value == expected and type(value) is type(expected)


def test_unannotated_none_default_takes_true_false_in_any_case():
    assert run(['--extra=false'])['extra'] is False
    assert run(['--extra=TRUE'])['extra'] is True


OPTIONAL = {'compile': None, 'vocab_size': None, 'n_kv_head': None, 'rope_scaling': None, 'rope_factor': None}


@pytest.mark.parametrize('arg, expected', [
    ('--compile=false', False), ('--compile=TRUE', True), ('--compile=None', None), ('--vocab_size=65', 65),
    ('--rope_scaling=yarn', 'yarn'), ('--rope_factor=4', 4.0), ('--n_kv_head=None', None)])
def test_an_annotated_none_default_takes_its_type_or_none(arg, expected):
    # train.py's `compile: Optional[bool] = None`; GPTConfig's `rope_factor: Optional[float] = None`
    value = configure(OPTIONAL, [arg], prog='train.py')[arg[2:].split('=')[0]]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize('arg, fragments', [
    ('--compile=maybe', ["'compile' expects bool or None", "'maybe'"]),
    ('--compile=1', ["'compile' expects bool or None"]),
    ('--vocab_size=1.5', ["'vocab_size' expects int or None"]),
    ('--n_kv_head=yarn', ["'n_kv_head' expects int or None"]),
    ('--rope_factor=x', ["'rope_factor' expects float or None"]),
])
def test_an_annotated_none_default_refuses_other_types(capsys, arg, fragments):
    with pytest.raises(SystemExit) as e:
        configure(OPTIONAL, [arg], prog='train.py')
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('error: ') and all(f in line for f in fragments), line


def test_an_annotated_none_default_is_checked_in_config_files(tmp_path, capsys):
    cfg = write(tmp_path, 'c.py', "compile = 'maybe'\n")
    with pytest.raises(SystemExit):
        configure(OPTIONAL, [cfg], prog='train.py')
    assert "'compile' expects bool or None" in capsys.readouterr().err


@pytest.mark.parametrize('annotation, kind', [
    ('Optional[int]', int), ('int | None', int), ('None | float', float), ('bool', bool), ('typing.Optional[str]', str),
    ('list[int]', None), ('int | str', None)])
def test_annotations_name_a_settings_type(annotation, kind):
    import ast

    from configurator import _annotated_type
    assert _annotated_type(ast.parse(annotation, mode='eval').body) is kind


@pytest.mark.parametrize('script', ['train.py', 'sample.py', 'bench.py', 'export.py', 'ablate.py'])
def test_every_none_default_of_the_scripts_has_a_type(script):
    """A None default without an annotation would take any literal (`--compile=maybe` trained)."""
    from configurator import _read_settings, script_defaults
    defaults = script_defaults(REPO_ROOT / script)
    if script == 'export.py':  # its settings live under `if __name__ == '__main__':`
        defaults = {'out_dir': 'out', 'hf_dir': ''}
    if script == 'sample.py':
        from configurator import model_flags
        defaults.update(model_flags(runtime_only=True))
    types = _read_settings(script)[1]
    untyped = [k for k, v in defaults.items() if v is None and k not in types]
    assert untyped == [], untyped
    if script in ('train.py', 'bench.py'):  # an annotated assignment is a setting like any other
        assert defaults['compile'] is None and types['compile'] is bool


def test_help_says_a_runtime_flag_defaults_to_the_models(capsys):
    with pytest.raises(SystemExit):
        configure({'block_size': 1024, 'top_k': None, 'seed': 1}, ['--help'], prog='sample.py',
                  from_model={'block_size': 1024})
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if '--block_size' in line)
    assert "default: the model's" in line and '1024' not in line, line
    assert '--top_k=None' in out and '(int or None)' in out and '--seed=1' in out


def test_later_argument_wins():
    assert run(['--batch_size=1', '--batch_size=2'])['batch_size'] == 2


# ---- config files --------------------------------------------------------------

def test_config_file_then_cli_override_wins(tmp_path):
    cfg = write(tmp_path, 'c.py', '# small model\nn_layer = 6\nbatch_size = 8\ndevice = "cpu"\n')
    out = run([cfg, '--batch_size=64'])
    assert out['n_layer'] == 6
    assert out['device'] == 'cpu'
    assert out['batch_size'] == 64


def test_config_file_reads_earlier_value(tmp_path):
    cfg = write(tmp_path, 'c.py', 'min_lr = learning_rate / 10\n')
    out = run(['--learning_rate=1e-2', cfg])
    assert out['min_lr'] == pytest.approx(1e-3)


def test_config_file_with_import_and_helpers(tmp_path):
    cfg = write(tmp_path, 'c.py', 'import math\n'
                                  'def half(x):\n    return x / 2\n'
                                  'learning_rate = half(math.sqrt(4) * 1e-3)\n'
                                  '_scratch = 5\n')
    out = run([cfg])
    assert out['learning_rate'] == pytest.approx(1e-3)
    assert set(out) == set(DEFAULTS)


def test_config_file_int_for_float_and_none(tmp_path):
    cfg = write(tmp_path, 'c.py', 'learning_rate = 1\nn_kv_head = 4\n')
    out = run([cfg])
    assert type(out['learning_rate']) is float and out['n_kv_head'] == 4


# ---- errors --------------------------------------------------------------------

def test_unknown_cli_key_suggests(capsys):
    line = expect_error(capsys, ['--lerning_rate=1e-3'], "'lerning_rate'", 'did you mean')
    assert "'learning_rate'" in line


def test_unknown_key_without_close_match(capsys):
    line = expect_error(capsys, ['--zzzzqqq=1'], "unknown setting 'zzzzqqq'")
    assert 'did you mean' not in line


def test_unknown_key_in_config_file(capsys, tmp_path):
    cfg = write(tmp_path, 'c.py', 'n_layer = 4\nbatch_sise = 8\n')
    expect_error(capsys, [cfg], cfg, "'batch_sise'", "did you mean 'batch_size'")


@pytest.mark.parametrize('argv, written', [
    (['--prenorm=False'], '--norm_position=post'),
    (['--prenorm=true'], '--norm_position=pre'),
    (['CONFIG'], "norm_position = 'post'"),
], ids=['cli-false', 'cli-true', 'config-file'])
def test_a_renamed_setting_says_what_replaced_it(capsys, tmp_path, argv, written):
    argv = [write(tmp_path, 'c.py', 'prenorm = False\n') if a == 'CONFIG' else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        configure({**DEFAULTS, 'norm_position': 'pre'}, argv, prog='train.py')
    lines = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2 and len(lines) == 1
    assert "setting 'prenorm' was renamed" in lines[0] and lines[0].endswith(written), lines[0]


def test_a_renamed_setting_where_its_new_name_is_no_setting_is_just_unknown(capsys):
    line = expect_error(capsys, ['--prenorm=False'], "unknown setting 'prenorm'")  # DEFAULTS has no norm_position
    assert 'renamed' not in line


@pytest.mark.parametrize('arg,setting', [
    ('--batch_size=abc', 'batch_size'),
    ('--batch_size=1.5', 'batch_size'),
    ('--batch_size=True', 'batch_size'),
    ('--learning_rate=fast', 'learning_rate'),
    ('--learning_rate=False', 'learning_rate'),
    ('--compile=1', 'compile'),
    ('--compile=yes', 'compile'),
    ('--n_kv_head=[1, 2]', 'n_kv_head'),
])
def test_wrong_type_names_setting(capsys, arg, setting):
    expect_error(capsys, [arg], f"setting '{setting}' expects")


def test_wrong_type_message_format(capsys):
    line = expect_error(capsys, ['--batch_size=abc'])
    assert line == "error: setting 'batch_size' expects int, got 'abc' (str)"


def test_wrong_type_in_config_file(capsys, tmp_path):
    cfg = write(tmp_path, 'c.py', 'device = 3\n')
    expect_error(capsys, [cfg], cfg, "setting 'device' expects str")


def test_config_path_is_a_directory(capsys, tmp_path):
    expect_error(capsys, [str(tmp_path)], f"config file '{tmp_path}'")


def test_missing_config_file(capsys, tmp_path):
    missing = str(tmp_path / 'nope.py')
    expect_error(capsys, [missing], f"config file '{missing}' not found")


def test_syntax_error_in_config(capsys, tmp_path):
    cfg = write(tmp_path, 'c.py', 'n_layer = 6\n\nbatch_size = = 3\n')
    expect_error(capsys, [cfg], cfg, 'line 3')


def test_exception_inside_config(capsys, tmp_path):
    cfg = write(tmp_path, 'c.py', 'n_layer = 6\nbatch_size = undefined_name\n')
    expect_error(capsys, [cfg], cfg, 'line 2', 'NameError')


@pytest.mark.parametrize('arg', ['--batch_size', '-x', '--=3', '-b=3'])
def test_malformed_argument(capsys, arg):
    expect_error(capsys, [arg], f"malformed argument '{arg}'", 'expected --key=value')


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


# ---- help ----------------------------------------------------------------------

@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_help_lists_every_setting_and_exits_0(capsys, flag):
    with pytest.raises(SystemExit) as exc:
        configure(DEFAULTS, ['--batch_size=3', flag], prog='train.py', doc='Train a model.')
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert 'usage: python train.py [config_file.py ...] [--key=value ...]' in out
    assert 'Train a model.' in out
    for key, value in DEFAULTS.items():
        shown = repr(value) if key == 'start' else value  # a bare newline would be invisible
        assert f'--{key}={shown}' in out
    # settings appear in the dict's order
    positions = [out.index(f'--{key}=') for key in DEFAULTS]
    assert positions == sorted(positions)
    # one line per setting, the type hints in one aligned column
    setting_lines = [line for line in out.splitlines() if line.startswith('  --')]
    assert len(setting_lines) == len(DEFAULTS)
    assert len({line.index('(') for line in setting_lines}) == 1


# ---- settings_of ---------------------------------------------------------------

def test_settings_of_filters_namespace():
    class Model:
        pass

    namespace = {
        'batch_size': 12, 'lr': 1e-3, 'compile': False, 'device': 'cpu', 'n_kv_head': None,
        '_private': 1, '__doc__': 'doc', 'math': math, 'os': os,
        'configure': configure, 'Model': Model, 'sizes': [1, 2],
    }
    assert settings_of(namespace) == {
        'batch_size': 12, 'lr': 1e-3, 'compile': False, 'device': 'cpu', 'n_kv_head': None,
    }


# ---- as a real script ------------------------------------------------------------

def test_script_with_bad_argument_exits_2_one_line(tmp_path):
    script = write(tmp_path, 'script.py',
                   'import sys\n'
                   'batch_size = 12\n'
                   'learning_rate = 6e-4\n'
                   'from configurator import configure, settings_of\n'
                   "globals().update(configure(settings_of(globals()), sys.argv[1:], prog='script.py'))\n"
                   'print(batch_size)\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + ([os.environ['PYTHONPATH']] if os.environ.get('PYTHONPATH') else [])))
    ok = subprocess.run([sys.executable, script, '--batch_size=7'],
                        capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.strip() == '7'
    bad = subprocess.run([sys.executable, script, '--batch_sise=7'],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 2
    assert 'Traceback' not in bad.stderr
    assert len(bad.stderr.splitlines()) == 1
    assert "did you mean 'batch_size'" in bad.stderr


# ---- model flags: GPTConfig is the only list ---------------------------------------

def test_model_flags_are_gptconfig_fields_with_their_defaults_and_a_description():
    from dataclasses import fields

    from chapters import GPTConfig
    from configurator import _descriptions, model_flags
    assert model_flags() == {f.name: f.default for f in fields(GPTConfig)}
    descriptions = _descriptions('model.py')
    assert [f.name for f in fields(GPTConfig) if not descriptions.get(f.name)] == [], "a field without a comment"


@pytest.mark.parametrize('script', ['train.py', 'bench.py'])
def test_every_model_flag_is_a_setting_of_the_scripts_that_build_models(script):
    from configurator import model_flags, script_defaults
    defaults = script_defaults(REPO_ROOT / script)
    assert set(model_flags()) <= set(defaults)


def readme_chapter():
    """The code block of README.md's "Adding a chapter", as written there."""
    section = (REPO_ROOT / 'README.md').read_text(encoding='utf-8').split('## Adding a chapter', 1)[1]
    return section.split('```python\n', 1)[1].split('```', 1)[0]


# In the copy, after training with the chapter: cached decoding is uncached decoding's, the cache and the FLOPs are
# the model's without the skip (elementwise work is not counted, as torch's counter does not count it), and the
# gains moved off zero (the skip trained).
CHAPTER_CHECKS = """
import torch
from chapters import GPT, GPTConfig
from common.checkpoints import load_checkpoint, model_from_checkpoint
model = model_from_checkpoint(load_checkpoint('out/ckpt.pt'), 'out/ckpt.pt').eval()
assert model.embed_skip_gains.abs().max() > 0
prompt = torch.randint(0, model.config.vocab_size, (2, 3), generator=torch.Generator().manual_seed(0))
cached = model.generate(prompt, 12, temperature=0)
assert torch.equal(cached, model.generate(prompt, 12, temperature=0, use_cache=False))
plain = GPT(GPTConfig(**{**vars(model.config), 'embed_skip': False}))
assert model.kv_cache_bytes(2, 8) == plain.kv_cache_bytes(2, 8)
assert model.flops_per_token(8) == plain.flops_per_token(8)
print('checked')
"""


def test_the_readmes_chapter_added_as_written_reaches_every_script(tmp_path):
    """README's "Adding a chapter" followed in a copy of the project, model.py untouched: its block saved as
    chapters/embed_skip.py and its name added to the import and to CHAPTERS. The new flag shows in --help, is set
    from the command line, trains, is saved in model_args, decodes through the cache as without it, counts its
    cache bytes and FLOPs, and export refuses it in one line."""
    import shutil

    import torch

    from conftest import make_char_dataset
    for path in REPO_ROOT.glob('*.py'):
        shutil.copy(path, tmp_path)
    for init in REPO_ROOT.glob('*/__init__.py'):  # the packages the scripts import (chapters/, common/, hf/, ...)
        shutil.copytree(init.parent, tmp_path / init.parent.name, ignore=shutil.ignore_patterns('__pycache__'))
    (tmp_path / 'chapters' / 'embed_skip.py').write_text(readme_chapter())
    init = (tmp_path / 'chapters' / '__init__.py').read_text()
    imports = [line for line in init.splitlines() if line.startswith('from chapters import ')][-1]  # the last
    assert '\nCHAPTERS = (' in init
    init = init.replace(imports, imports.replace('  # noqa', ', embed_skip  # noqa'))
    init = init.replace('\nCHAPTERS = (', '\nCHAPTERS = (embed_skip, ')
    (tmp_path / 'chapters' / '__init__.py').write_text(init)
    assert (tmp_path / 'model.py').read_text() == (REPO_ROOT / 'model.py').read_text()
    make_char_dataset(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, env=env)
    for script in ('train.py', 'bench.py'):
        out = run(script, '--help').stdout
        assert '--embed_skip=False' in out and 'the first block' in out, out
    train = run('train.py', '--dataset=tiny', '--device=cpu', '--compile=False', '--n_layer=2', '--n_head=2',
                '--n_embd=16', '--block_size=8', '--batch_size=4', '--max_iters=20', '--eval_interval=20',
                '--eval_iters=1', '--learning_rate=1e-2', '--embed_skip=True', '--out_dir=out')
    assert train.returncode == 0, train.stderr
    assert 'embed_skip=True' in train.stdout  # the model was built with it
    assert torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=True)['model_args']['embed_skip'] is True
    checks = run('-c', CHAPTER_CHECKS)
    assert checks.returncode == 0 and checks.stdout.startswith('checked'), checks.stderr
    refused = run('train.py', '--dataset=tiny', '--device=cpu', '--embed_skip=True', '--norm_position=post')
    assert refused.returncode == 2 and 'embed_skip=True adds to the stream' in refused.stderr
    bench = run('bench.py', '--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=8', '--batch_size=2',
                '--train_iters=1', '--warmup_iters=0', '--decode_tokens=2', '--device=cpu', '--embed_skip=True')
    assert bench.returncode == 0, bench.stderr
    export = run('export.py', '--out_dir=out', '--hf_dir=hf-out')
    assert export.returncode == 2 and not (tmp_path / 'hf-out').exists()
    (line,) = export.stderr.strip().splitlines()
    assert line.startswith('error:') and 'embed_skip=True' in line, line
