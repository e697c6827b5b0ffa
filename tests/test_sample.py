"""Tests for sample.py on tiny self-made checkpoints.

sample.py is a flat script; most tests run it in this process (runpy, argv and cwd patched), since a fresh
Python spends seconds importing torch. A few run it as a real subprocess, where exit codes and the absence of
tracebacks on stderr are what a user sees.
"""
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import common.errors
import common.threads
from common.checkpoints import new_checkpoint, save_checkpoint
from conftest import make_char_dataset
from chapters import GPT, GPTConfig, mtp

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / 'sample.py'
TIKTOKEN_CACHE = ROOT.parent / 'shared' / 'data' / 'tiktoken_cache'
SEP = '---------------'
CHARS = sorted(set("\n !',.:;?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
VARIANTS = {'vanilla': {}, 'modern': dict(norm='rms', mlp='swiglu', n_kv_head=2, pos='rope', bias=False)}
REPORT = re.compile(r'generated (\d+) tokens in (\S+) s, (\S+) tokens/s, KV cache ([^;]*)(?:; (.*))?')
HANG_S = 1800  # a limit only a hang reaches, however busy the machine


def write_meta(root, dataset, chars=CHARS):
    (root / 'data' / dataset).mkdir(parents=True, exist_ok=True)
    meta = {'kind': 'char', 'vocab_size': len(chars), 'chars': chars}
    (root / 'data' / dataset / 'meta.json').write_text(json.dumps(meta))


def save_model(model, root, dataset, out='out', **fields):
    (root / out).mkdir(parents=True, exist_ok=True)
    checkpoint = new_checkpoint(model, config={'dataset': dataset}, iter_num=0, best_val_loss=0.0,
                                optimizer={}, scaler={}, rng={})
    checkpoint.update(fields)
    save_checkpoint(checkpoint, str(root / out / 'ckpt.pt'))


def char_checkpoint(root, variant='vanilla', dataset='chars'):
    """A randomly initialised character-level model in root/out, its meta.json in root/data/<dataset>."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=len(CHARS), n_layer=2, n_head=4, n_embd=32,
                          **VARIANTS[variant]))
    save_model(model, root, dataset)
    write_meta(root, dataset)
    return model


def parse_samples(out):
    """The samples printed on stdout: each is followed by a newline and the separator line."""
    parts = out.split(f'\n{SEP}\n')
    assert parts[-1] == '', f"stdout must end with the separator line: {out[-80:]!r}"
    return parts[:-1]


def parse_report(err):
    lines = [m for m in map(REPORT.fullmatch, err.strip().splitlines()) if m]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def sample(tmp_path, monkeypatch, capsys):
    """Run sample.py in this process with cwd tmp_path; return (stdout, stderr), or (code, stderr) on exit."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)  # pytest keeps its own Ctrl-C

    threads = torch.get_num_threads()  # sample.py sets this process's threads: each test gets them back
    monkeypatch.setattr(torch, 'set_num_threads', lambda n: setattr(run, 'threads', n))
    monkeypatch.setattr(torch, 'get_num_threads', lambda: getattr(run, 'threads', threads))

    def run(*args, expect_exit=False):
        monkeypatch.setattr(sys, 'argv', ['sample.py', '--device=cpu', *args])
        if expect_exit:
            with pytest.raises(SystemExit) as e:
                runpy.run_path(str(SAMPLE), run_name='__main__')
            return e.value.code, capsys.readouterr().err
        runpy.run_path(str(SAMPLE), run_name='__main__')
        return capsys.readouterr()
    return run


def run_cli(cwd, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING='utf-8')
    return subprocess.run([sys.executable, str(SAMPLE), '--device=cpu', *args], cwd=cwd, env=env,
                          capture_output=True, text=True, encoding='utf-8', timeout=HANG_S)


def assert_one_line_error(code, err, *fragments):
    assert code not in (0, None), err
    assert len(err.strip().splitlines()) == 1 and err.startswith('error:'), err
    assert 'Traceback' not in err
    for fragment in fragments:
        assert fragment in err, err


# ----------------------------------------------------------------------------- sampling

@pytest.mark.parametrize('variant', VARIANTS)
def test_samples_are_vocabulary_text_continuing_the_prompt(tmp_path, sample, variant):
    char_checkpoint(tmp_path, variant)
    out, _ = sample('--start=To be', '--num_samples=3', '--max_new_tokens=20', '--top_k=10', '--top_p=0.9')
    samples = parse_samples(out)
    assert len(samples) == 3
    for text in samples:
        assert text.startswith('To be') and len(text) == len('To be') + 20  # one character per token
        assert set(text) <= set(CHARS), text
    assert len(set(samples)) > 1  # sampled, not one sequence three times


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('temperature', [1.0, 0.0])
def test_cache_and_no_cache_give_the_same_text_past_block_size(tmp_path, sample, variant, temperature):
    char_checkpoint(tmp_path, variant)
    args = ('--start=Hello', '--num_samples=3', '--max_new_tokens=80', f'--temperature={temperature}', '--seed=7')
    cached, err_cached = sample(*args)
    uncached, err_uncached = sample(*args, '--use_cache=False')
    assert cached == uncached
    samples = parse_samples(cached)
    assert len(samples) == 3 and all(len(s) == len('Hello') + 80 for s in samples)  # 85 > block_size 32
    assert parse_report(err_cached).group(4).endswith(' bytes')
    assert parse_report(err_uncached).group(4).startswith('none')


def test_same_seed_same_text_other_seed_other_text(tmp_path, sample):
    char_checkpoint(tmp_path)
    first, second, other = (sample('--num_samples=2', '--max_new_tokens=30', f'--seed={s}')[0] for s in (1, 1, 2))
    assert first == second != other


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('num_samples,max_new_tokens', [(3, 10), (2, 50), (1, 0)])
def test_report_gives_tokens_per_second_and_cache_bytes(tmp_path, sample, variant, num_samples, max_new_tokens):
    model = char_checkpoint(tmp_path, variant)
    _, err = sample('--start=abc', f'--num_samples={num_samples}', f'--max_new_tokens={max_new_tokens}')
    report = parse_report(err)
    assert int(report.group(1)) == num_samples * max_new_tokens
    seconds, tokens_per_s = float(report.group(2)), float(report.group(3))  # the regex admits negative figures
    assert seconds >= 0 and tokens_per_s >= 0
    assert (tokens_per_s > 0) == (max_new_tokens > 0)
    expected = model.kv_cache_bytes(num_samples, 3 + max_new_tokens, torch.float32) if max_new_tokens else 0
    assert report.group(4) == f'{expected} bytes'


@pytest.mark.parametrize('temperature', [0.0, 0.8])
def test_tokens_per_second_times_the_decoding_not_a_first_forwards_one_time_cost(tmp_path, sample, monkeypatch,
                                                                                 temperature):
    """A first forward's one-time cost (a lazy import: 278 tok/s greedy against 586 top-k on one model) is paid
    before the clock starts: here a clock that jumps 1000 s at the first forward."""
    import time
    char_checkpoint(tmp_path, 'modern')
    clock, forward, jumped = time.perf_counter, GPT.hidden_states, []

    def first_forward_slow(self, *a, **k):
        jumped.append(1000.0 * (not jumped))
        return forward(self, *a, **k)
    monkeypatch.setattr(GPT, 'hidden_states', first_forward_slow)
    monkeypatch.setattr(time, 'perf_counter', lambda: clock() + sum(jumped))
    _, err = sample('--start=abc', '--num_samples=2', '--max_new_tokens=10', f'--temperature={temperature}')
    assert jumped and float(parse_report(err).group(2)) < 1000, err


def test_a_generation_past_block_size_says_so_once(tmp_path, sample):
    """Past block_size the oldest half of the context is dropped, where transformers keeps it: said once."""
    char_checkpoint(tmp_path)
    _, err = sample('--start=abc', '--num_samples=2', '--max_new_tokens=29')  # 3 + 29 = block_size 32
    assert 'block_size' not in err
    _, err = sample('--start=abc', '--num_samples=2', '--max_new_tokens=70')
    assert err.count('note: the prompt and max_new_tokens (3 + 70) outgrow block_size 32: when the context is full '
                     'its oldest half is dropped') == 1, err


def test_one_sample_is_streamed_and_matches_the_batch(tmp_path, sample):
    char_checkpoint(tmp_path, 'modern')
    out, _ = sample('--start=ROMEO:', '--num_samples=1', '--max_new_tokens=100', '--temperature=0')
    assert len(parse_samples(out)) == 1
    batch, _ = sample('--start=ROMEO:', '--num_samples=2', '--max_new_tokens=100', '--temperature=0')
    assert parse_samples(batch) == parse_samples(out) * 2  # greedy: every row is the same text


def test_prompt_from_file(tmp_path, sample):
    char_checkpoint(tmp_path)
    (tmp_path / 'prompt.txt').write_text('KING:\nWhat say you?\n')
    out, _ = sample('--start=FILE:prompt.txt', '--num_samples=1', '--max_new_tokens=5')
    (text,) = parse_samples(out)
    assert text.startswith('KING:\nWhat say you?\n') and len(text) == 20 + 5


@pytest.mark.parametrize('flags, cached_positions', [
    ([], 32),  # the trained block_size: the context shifts at 32
    (['--block_size=64', '--rope_scaling=yarn', '--rope_factor=2'], 61),  # no shift: all 61 positions
    (['--sliding_window=8'], 8),  # a ring of the last 8
])
def test_runtime_flags_change_how_a_trained_model_runs(tmp_path, sample, flags, cached_positions):
    model = char_checkpoint(tmp_path, 'modern')
    out, err = sample('--start=a', '--num_samples=2', '--max_new_tokens=60', '--temperature=0', *flags)
    assert all(len(text) == 61 for text in parse_samples(out))
    unlimited = GPT(GPTConfig(**{**model.config.__dict__, 'block_size': 1024}))
    assert parse_report(err).group(4) == f'{unlimited.kv_cache_bytes(2, cached_positions)} bytes'


def test_runtime_flags_cannot_take_learned_positions_past_their_table(tmp_path, sample):
    char_checkpoint(tmp_path, 'vanilla')
    code, err = sample('--block_size=64', expect_exit=True)
    assert_one_line_error(code, err, 'block_size 64', 'learned positions')


def test_checkpoint_written_by_train_py(tmp_path, sample):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n" * 20
    make_char_dataset(tmp_path, 'tiny', text, CHARS)
    train = subprocess.run([sys.executable, str(ROOT / 'train.py'), '--dataset=tiny', '--device=cpu', '--compile=False',
                            '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
                            '--gradient_accumulation_steps=1', '--max_iters=5', '--eval_interval=5',
                            '--eval_iters=2', '--out_dir=out'],
                           cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE='offline'),
                           capture_output=True, text=True, timeout=HANG_S)
    assert train.returncode == 0, train.stderr
    out, _ = sample('--start=First', '--num_samples=2', '--max_new_tokens=40')
    samples = parse_samples(out)
    assert len(samples) == 2
    assert all(s.startswith('First') and len(s) == 45 and set(s) <= set(CHARS) for s in samples)


def test_cli_streams_and_reports(tmp_path):
    char_checkpoint(tmp_path)
    result = run_cli(tmp_path, '--start=Sing', '--num_samples=1', '--max_new_tokens=50')
    assert result.returncode == 0, result.stderr
    (text,) = parse_samples(result.stdout)
    assert text.startswith('Sing') and len(text) == 54 and set(text) <= set(CHARS)
    assert 'tokens/s' in parse_report(result.stderr).group(0)


# ----------------------------------------------------------------------------- bad input

BAD_SETTINGS = {  # id: (arguments, what the error line must name)
    'temperature': (['--temperature=-0.5'], ['temperature']),
    'temperature_inf': (['--temperature=1e999'], ['temperature must be >= 0 and finite', 'inf']),  # 1e999 reads as inf
    # a model flag that changes weights: the trained model fixes it, which the line says (not 'unknown setting')
    'model_flag': (['--hc_mult=1'], ["'hc_mult' is a model flag", 'checkpoint']),
    'top_k': (['--top_k=0'], ['top_k']),
    'top_p_zero': (['--top_p=0'], ['top_p']),
    'top_p_above_one': (['--top_p=1.5'], ['top_p']),
    'max_new_tokens': (['--max_new_tokens=-1'], ['max_new_tokens']),
    'num_samples': (['--num_samples=0'], ['num_samples']),
    'missing_out_dir': (['--out_dir=missing'], ["'missing'", 'train.py']),
    'missing_checkpoint': (['--out_dir=empty'], ['empty', 'train.py']),
    'missing_prompt_file': (['--start=FILE:nope.txt'], ["'nope.txt'"]),
    'chars_outside_vocab': (['--start=naïve 日本'], ["'ï'", "'日'", "'本'"]),
    'empty_prompt': (['--start='], ['at least one token']),
    'seed_past_64_bits': (['--seed=18446744073709551616'], ['seed', '2**64']),
    'negative_seed': (['--seed=-3'], ['seed']),
}


@pytest.mark.parametrize('case', BAD_SETTINGS)
def test_bad_input_is_one_error_line(tmp_path, sample, case):
    args, fragments = BAD_SETTINGS[case]
    char_checkpoint(tmp_path)
    (tmp_path / 'empty').mkdir()
    code, err = sample(*args, expect_exit=True)
    assert_one_line_error(code, err, *fragments)


def test_settings_are_checked_before_the_model_is_loaded(tmp_path, sample):
    code, err = sample('--out_dir=missing', '--temperature=-1', expect_exit=True)
    assert_one_line_error(code, err, 'temperature')


def test_not_our_checkpoint_is_one_error_line(tmp_path, sample):
    (tmp_path / 'out').mkdir()
    torch.save({'a': 1}, tmp_path / 'out' / 'ckpt.pt')
    code, err = sample(expect_exit=True)
    assert_one_line_error(code, err, 'not a nanoswap checkpoint')


def test_unbuildable_checkpoint_is_one_error_line(tmp_path, sample):
    model = char_checkpoint(tmp_path)
    save_model(model, tmp_path, 'chars', model_args={**vars(model.config), 'n_head': 5})
    code, err = sample(expect_exit=True)
    assert_one_line_error(code, err, 'ckpt.pt')


def test_cli_corrupt_checkpoint_is_one_error_line(tmp_path):
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'ckpt.pt').write_bytes(np.random.default_rng(0).bytes(4096))
    result = run_cli(tmp_path)
    assert_one_line_error(result.returncode, result.stderr, 'ckpt.pt', 'corrupt')


# ----------------------------------------------------------------------------- GPT-2 BPE

@pytest.fixture
def bpe(monkeypatch):
    """GPT-2's BPE offline, from TIKTOKEN_CACHE_DIR or the shared cache; skip when neither is there."""
    cache = os.environ.get('TIKTOKEN_CACHE_DIR') or (str(TIKTOKEN_CACHE) if TIKTOKEN_CACHE.is_dir() else None)
    if cache is None:
        pytest.skip("no tiktoken cache: set TIKTOKEN_CACHE_DIR to test GPT-2 BPE sampling offline")
    monkeypatch.setenv('TIKTOKEN_CACHE_DIR', cache)
    import tiktoken
    return tiktoken.get_encoding('gpt2')


def test_bpe_sampling_without_meta(tmp_path, sample, bpe):
    torch.manual_seed(0)
    save_model(GPT(GPTConfig(block_size=32, vocab_size=50257, n_layer=1, n_head=2, n_embd=16)), tmp_path,
               dataset='webtext_not_prepared_here')
    out, err = sample('--start=Hello, 世界', '--num_samples=2', '--max_new_tokens=10')
    samples = parse_samples(out)
    assert len(samples) == 2 and all(s.startswith('Hello, 世界') for s in samples)
    assert 'GPT-2' in err  # says why it decodes with BPE: no data/<dataset>/meta.json here


def cycle_model(cycle, vocab_size=50304):
    """A model whose greedy choice after cycle[j] is cycle[j+1] (wrapping), every block a no-op; its padded
    ids (>= 50257, which GPT-2's BPE cannot decode) outscore that unless sample.py masks them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=vocab_size, n_layer=1, n_head=2, n_embd=32, bias=False,
                          pos='rope', tie_embeddings=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('c_proj.weight'):
                p.zero_()  # attention and MLP add nothing: the logits depend on the last token alone
        model.transformer.wte.weight.zero_()
        model.lm_head.weight.zero_()
        for j, token in enumerate(cycle):
            model.transformer.wte.weight[token, j] = 10.0
            model.lm_head.weight[cycle[(j + 1) % len(cycle)], j] = 10.0
        model.lm_head.weight[50257:, :len(cycle)] = 20.0
    return model


def test_bpe_stream_holds_back_split_characters_and_never_samples_padding(tmp_path, sample, bpe):
    text = 'Hi 日本語 café 🙂!'
    cycle = bpe.encode(text)  # 日, 本 and 語 are split across tokens; every token differs
    assert len(set(cycle)) == len(cycle) and '\ufffd' in bpe.decode(cycle[1:2])
    save_model(cycle_model(cycle), tmp_path, dataset='no_meta')
    n = 2 * len(cycle)  # twice round, past block_size 16, and back to 'Hi'
    expected = bpe.decode(cycle * 2 + cycle[:1])
    out, _ = sample('--start=Hi', '--num_samples=1', f'--max_new_tokens={n}', '--temperature=0')
    assert parse_samples(out) == [expected]  # a streamed U+FFFD would show here
    out, _ = sample('--start=Hi', '--num_samples=2', f'--max_new_tokens={n}', '--temperature=0', '--use_cache=False')
    assert parse_samples(out) == [expected] * 2


@pytest.mark.parametrize('flags', [['--temperature=1e-300'], ['--top_p=1e-300'], ['--temperature=5e-324', '--top_k=3']])
def test_vanishing_temperature_or_top_p_samples_the_likeliest_token(tmp_path, sample, flags):
    """Probabilities that underflow (to inf or to nothing) still leave the likeliest token: greedy."""
    char_checkpoint(tmp_path, 'modern')
    greedy, _ = sample('--start=ab', '--num_samples=2', '--max_new_tokens=20', '--temperature=0')
    out, _ = sample('--start=ab', '--num_samples=2', '--max_new_tokens=20', *flags)
    assert out == greedy


def test_compiled_sampling_equals_eager_compiles_once_and_times_only_the_steady_tokens(tmp_path, sample, monkeypatch):
    """--compile=True compiles the decoding step (compile_decoding): the same text as eager, past a context shift
    (which prefills again, eagerly), and one graph, not one per layer or per decode length. It compiles before the
    timed generation, and says so with its time: the tokens/s printed is the steady speed."""
    import torch._dynamo
    char_checkpoint(tmp_path, 'modern')
    args = ('--start=abc', '--num_samples=2', '--max_new_tokens=60', '--temperature=0')  # past block_size 32
    eager, _ = sample(*args)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    graphs = torch._dynamo.utils.counters['stats']
    compiled_at_start, generate, stream = [], GPT.generate, GPT.generate_stream

    def warming_up(self, *a, **k):  # the compile's warm-up: torch's known noise and another warning during it
        import warnings
        warnings.warn('TypedStorage is deprecated. It will be removed in the future', UserWarning)
        warnings.warn('something else', UserWarning)
        return generate(self, *a, **k)

    def recording(self, *a, **k):  # the graphs already compiled when the timed generation starts
        compiled_at_start.append(graphs['unique_graphs'])
        return stream(self, *a, **k)
    monkeypatch.setattr(GPT, 'generate', warming_up)
    monkeypatch.setattr(GPT, 'generate_stream', recording)  # two samples: one batch, a step at a time
    import warnings
    monkeypatch.setattr(warnings, 'showwarning', lambda message, category, filename, lineno, file=None, line=None:
                        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno)))  # as outside pytest
    compiled, err = sample(*args, '--compile=True')
    assert compiled == eager
    assert graphs['unique_graphs'] == 1 and not torch._dynamo.utils.counters['graph_break']
    assert compiled_at_start == [1]  # the timed generation compiles nothing
    # the line whole (issue 49.8), the other warning after it, the known noise not at all
    assert re.search(r'^compiling the decoding step \.\.\. compiled in \d+\.\d s$', err, re.M), err
    assert 'TypedStorage' not in err and err.index('compiled in') < err.index('UserWarning: something else')
    assert 'AUTOTUNE' not in err  # inductor's timing tables, at a shape its cache has not seen
    assert parse_report(err).group(1) == '120'  # the samples' tokens, not the warm-up's


# ----------------------------------------------------------------------------- Hugging Face directories

def hf_dir(root, name='hf', with_tokenizer_of=None, **flags):
    """A tiny model saved as export.py saves it (GPT-2's family by default), without a tokenizer unless
    with_tokenizer_of names a character dataset under root/data."""
    pytest.importorskip('transformers')
    from export import to_hf
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=len(CHARS), n_layer=1, n_head=2, n_embd=16, **flags))
    to_hf(model).save_pretrained(root / name)
    if with_tokenizer_of:
        from common.tokenizer import hf_tokenizer
        cwd = os.getcwd()
        os.chdir(root)
        try:
            hf_tokenizer({'dataset': with_tokenizer_of}).save_pretrained(root / name)
        finally:
            os.chdir(cwd)
    return root / name


def error_lines(err):
    """stderr without transformers' progress bars (saving the directory, loading its weights)."""
    return '\n'.join(line for line in err.splitlines() if line.strip() and not re.search(r'\|.*(it/s|\?)\]$', line))


def test_a_directory_without_a_tokenizer_says_so_and_takes_one(tmp_path, sample, bpe):
    """transformers makes an empty tokenizer for a GPT-2 directory that holds none: the prompt is not 'empty', the
    directory has no tokenizer, and --tokenizer gives it one."""
    hf_dir(tmp_path, 'hf-bare')
    write_meta(tmp_path, 'chars')
    hf_dir(tmp_path, 'hf-chars', with_tokenizer_of='chars')
    code, err = sample('--init_from=hf-bare', '--start=Hello', expect_exit=True)
    assert_one_line_error(code, error_lines(err), "'hf-bare' holds no tokenizer", '--tokenizer=')
    out, _ = sample('--init_from=hf-bare', '--tokenizer=hf-chars', '--start=Hello', '--num_samples=1',
                    '--max_new_tokens=5')
    (text,) = parse_samples(out)
    assert text.startswith('Hello') and len(text) == 10 and set(text) <= set(CHARS)


@pytest.mark.parametrize('key, value, fragment', [
    ('n_embd', '"16"', 'n_embd'),  # a string size
    ('n_head', '3', 'n_head (3)'),  # heads that do not divide the width
    ('vocab_size', str(len(CHARS) + 7), 'do not fit its config.json'),  # the weights say otherwise
    (None, '{"model_type": "gpt2", ', 'not a valid JSON'),
], ids=['string-size', 'not-dividing', 'vocab-mismatch', 'not-json'])
def test_a_bad_config_json_is_one_error_line_before_any_tokenizer(tmp_path, sample, monkeypatch, key, value, fragment):
    path = hf_dir(tmp_path) / 'config.json'
    if key is None:
        path.write_text(value)
    else:
        path.write_text(json.dumps({**json.loads(path.read_text()), key: json.loads(value)}))
    monkeypatch.delenv('TIKTOKEN_CACHE_DIR', raising=False)  # GPT-2's BPE cannot load: the config is said first
    code, err = sample('--init_from=hf', '--start=Hello', expect_exit=True)
    assert_one_line_error(code, error_lines(err), "'hf'", fragment)


def test_a_meta_json_without_its_characters_is_one_error_line(tmp_path, sample):
    char_checkpoint(tmp_path)
    (tmp_path / 'data' / 'chars' / 'meta.json').write_text(json.dumps({'kind': 'char', 'vocab_size': len(CHARS)}))
    code, err = sample(expect_exit=True)
    assert_one_line_error(code, err, 'meta.json', "'chars'", 'prepare.py')


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    import signal
    char_checkpoint(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING='utf-8')
    proc = subprocess.Popen([sys.executable, str(SAMPLE), '--device=cpu', '--start=Sing', '--num_samples=1',
                             '--max_new_tokens=10000000'], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, encoding='utf-8')
    try:
        proc.stdout.read(1)  # streaming: the prompt is out
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        proc.kill()
    # the note that the request outgrows block_size comes first; the interruption is the one error, and last
    lines = err.strip().splitlines()
    assert proc.returncode == 130 and lines[-1] == 'error: interrupted (SIGINT)', err
    assert [line for line in lines if not line.startswith('note: ')] == lines[-1:], err


def test_a_mistyped_init_from_is_one_line_with_a_suggestion(tmp_path, sample):
    code, err = sample('--init_from=resum', expect_exit=True)
    assert_one_line_error(code, err, "'resum'", "did you mean 'resume'")


def test_speculative_decoding_prints_greedy_text_and_the_acceptance_rate(tmp_path, sample):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=len(CHARS), n_layer=2, n_head=4, n_embd=32, pos='rope',
                          mtp_depth=2))
    save_model(model, tmp_path, 'chars')
    write_meta(tmp_path, 'chars')
    args = ('--start=Hello', '--num_samples=2', '--max_new_tokens=40', '--temperature=0')
    plain, _ = sample(*args)
    speculative, err = sample(*args, '--speculative=True')
    assert speculative == plain
    assert re.search(r'speculative: \d+ of \d+ drafted tokens accepted \(\d+%\), \d+ forwards for 40 tokens', err)
    assert_one_line_error(*sample(*args[:-1], '--temperature=0.8', '--speculative=True', expect_exit=True),
                          '--temperature=0')
    char_checkpoint(tmp_path)  # no MTP modules
    assert_one_line_error(*sample(*args, '--speculative=True', expect_exit=True), 'mtp_depth >= 1')


@pytest.mark.parametrize('task', ['recall', 'copy'])
def test_a_task_checkpoint_asks_for_its_symbols_not_another_tokenizer(tmp_path, sample, task):
    """A recall (or copy) checkpoint and the default prompt, a newline: the tokenizer is the dataset's own, so the
    line says the prompt needs the task's symbols, with one that works (issue 44.12); that one generates."""
    (tmp_path / 'data' / task).mkdir(parents=True)
    if task == 'recall':
        meta = {'kind': 'recall', 'dataset': 'recall', 'vocab_size': 21, 'example_length': 24,
                'vocabulary': {'filler': 0, 'keys': [1, 11], 'values': [11, 21]}}
    else:
        chars = list('_|abcdefgh')
        meta = {'kind': 'char', 'dataset': 'copy', 'chars': chars, 'vocab_size': len(chars), 'example_length': 33}
    (tmp_path / 'data' / task / 'meta.json').write_text(json.dumps(meta))
    torch.manual_seed(0)
    save_model(GPT(GPTConfig(block_size=32, vocab_size=meta['vocab_size'], n_layer=1, n_head=2, n_embd=16)), tmp_path,
               task)
    code, err = sample(expect_exit=True)
    example = {'recall': 'k1 v2 k1', 'copy': 'abc|'}[task]
    assert_one_line_error(code, err, f'the {task} task', f'--start="{example}"')
    assert 'tokenizer' not in err
    if task == 'recall':  # a prompt of spaces alone: no tokens, and the same advice
        assert_one_line_error(*sample('--start=  ', expect_exit=True), 'no tokens', 'k1 v2 k1')
    out, _ = sample(f'--start={example}', '--num_samples=1', '--max_new_tokens=3')
    assert parse_samples(out)[0].startswith(example)


def test_speculative_decoding_reports_the_cache_it_keeps_and_refuses_a_compile_it_would_not_use(tmp_path, sample):
    """--speculative=True --use_cache=False: speculative decoding keeps a cache all the same (it takes rejected
    drafts back out of it), so the line gives its bytes, not 'none (use_cache=False)' (issue 44.14); and
    --compile=True, which compiles a one-token step it never runs, is one line."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=len(CHARS), n_layer=2, n_head=4, n_embd=32, pos='rope',
                          mtp_depth=1))
    save_model(model, tmp_path, 'chars')
    write_meta(tmp_path, 'chars')
    args = ('--start=Hello', '--num_samples=2', '--max_new_tokens=10', '--temperature=0', '--speculative=True')
    _, err = sample(*args, '--use_cache=False')
    cache = parse_report(err)[4]
    kept = mtp.speculative_cache_bytes(model, 2)  # block_size and room for a round's drafts, a row
    assert kept == 2 * 2 * (32 + 1) * 2 * 32 * 4  # 2 rows, 2 layers, 33 positions, K and V of 32, fp32
    assert cache == f"{kept} bytes (speculative decoding keeps one: use_cache=False does not apply to it)"
    assert parse_report(sample(*args)[1])[4] == f"{kept} bytes"
    assert_one_line_error(*sample(*args, '--compile=True', expect_exit=True), 'compile', 'speculative')


def test_threads_are_the_usable_cores_by_default_and_said(tmp_path, sample, monkeypatch):
    """sample.py's threads, as train.py's (common.threads): --threads=N, or on a CPU the cores this process may use,
    at most torch's default (one thread where taskset leaves one core of two); the report line says how many and
    why."""
    char_checkpoint(tmp_path)
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0})
    monkeypatch.setattr(common.threads, 'busy_cores', lambda: 0)  # a quiet machine
    torch.set_num_threads(2)  # torch's default on 2 cores (the fixture keeps the count)
    args = ('--start=Hi', '--num_samples=2', '--max_new_tokens=4')
    _, err = sample(*args)
    assert torch.get_num_threads() == 1
    assert parse_report(err)[5] == '1 thread (of 1 usable core: --threads sets another count)'
    _, err = sample(*args, '--threads=3')
    assert torch.get_num_threads() == 3 and parse_report(err)[5] == '3 threads (--threads)'
    assert_one_line_error(*sample('--threads=-1', expect_exit=True), 'threads must be >= 0')


@pytest.mark.parametrize('extra', [(), ('--speculative=True',)], ids=['batch', 'speculative'])
def test_a_batch_shows_its_progress_on_a_terminal_only(tmp_path, sample, monkeypatch, extra):
    """10 x 500 tokens printed nothing for minutes (issue 49.5): on a terminal a line on stderr says the tokens every
    sample has, the rate and the time left, and is cleared before the samples; elsewhere (a log, a test) nothing."""
    import common.progress
    torch.manual_seed(0)
    save_model(GPT(GPTConfig(block_size=32, vocab_size=len(CHARS), n_layer=1, n_head=2, n_embd=16, pos='rope',
                             mtp_depth=1)), tmp_path, 'chars')
    write_meta(tmp_path, 'chars')
    args = ('--start=Hi', '--num_samples=2', '--max_new_tokens=40', '--temperature=0', *extra)
    quiet, err = sample(*args)
    assert 'generating' not in err
    monkeypatch.setattr(sys.stderr, 'isatty', lambda: True, raising=False)
    clock = iter(range(10 ** 6))  # a second between looks at the clock: each step shows
    monkeypatch.setattr(common.progress.time, 'monotonic', lambda: float(next(clock)))
    out, err = sample(*args)
    assert out == quiet  # the samples as before, on stdout
    shown = [part for part in err.split('\r') if part.startswith('generating ')]
    assert shown[0].rstrip() == 'generating 0/40 tokens' and 'left' in shown[-1]
    assert parse_report(err)  # the report line after the cleared one
