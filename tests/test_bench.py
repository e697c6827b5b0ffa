"""bench.py end to end on a tiny CPU model, as a subprocess (it is a script of module-level settings)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
HANG_S = 1800  # a limit only a hang reaches, however busy the machine
sys.path.insert(0, str(REPO_ROOT))

from chapters import GPT, GPTConfig  # noqa: E402

TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=65, bias=False)
ARGS = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--bias=False', '--batch_size=2',
        '--train_iters=2', '--warmup_iters=1', '--decode_tokens=10', '--device=cpu', '--peak_flops=1e9']
HEADER = ['variant', 'params (M)', 'active (M)', 'train ms/iter', 'train tok/s', 'MFU %', 'FLOPs/token',
          'torch FLOPs/token', 'decode tok/s cached',
          'decode tok/s uncached', 'cached/uncached decode', 'KV bytes/token', 'cache MB/sequence']


@pytest.fixture(autouse=True)
def own_threads():
    """bench.py run in this process sets its intra-op threads: each test gets this process's back."""
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def bench(*args, cwd):
    return subprocess.run([sys.executable, str(REPO_ROOT / 'bench.py'), *ARGS, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=HANG_S)


def table(stdout):
    """{variant: cells} of the Markdown table, after checking its header."""
    lines = [line for line in stdout.splitlines() if line.startswith('|')]
    assert [c.strip() for c in lines[0].strip('|').split('|')] == HEADER
    assert set(lines[1]) <= set('|-: ')
    rows = [[c.strip() for c in line.strip('|').split('|')] for line in lines[2:]]
    assert all(len(r) == len(HEADER) for r in rows)
    return {r[0]: r for r in rows}


def expect_one_error(result, *fragments):
    assert result.returncode != 0
    assert 'Traceback' not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """One run of three variants with --json, shared by the tests that read its table or its figures."""
    out = tmp_path_factory.mktemp('bench')
    result = bench('--variants=vanilla,gqa,modern', '--json', cwd=out)
    assert result.returncode == 0, result.stderr
    return result, json.loads((out / 'bench.json').read_text())


def test_table_has_the_columns_and_one_row_per_variant(run):
    result, _ = run
    first = result.stdout.splitlines()[0]
    assert 'cpu' in first and 'float32' in first and 'thread' in first
    assert 'peak 0.001 TFLOP/s (from --peak_flops)' in result.stdout
    rows = table(result.stdout)
    assert list(rows) == ['vanilla', 'gqa', 'modern']
    # 1 layer * (k, v) * 2 heads * 16 dims * 4 bytes; a sequence of block_size 16 holds 16 of them
    assert rows['vanilla'][HEADER.index('KV bytes/token')] == '256'
    assert rows['vanilla'][HEADER.index('cache MB/sequence')] == '0.004096'


def test_json_figures(run):
    _, data = run
    assert data['settings']['device'] == 'cpu' and data['peak_flops'] == 1e9
    rows = {r['variant']: r for r in data['rows']}
    for row in rows.values():
        assert row['masked'] is False
        for key, value in row.items():
            if key in BASELINE_KEYS:  # no --baseline: none
                assert value is None
            elif key not in ('variant', 'masked'):
                assert value > 0, (row['variant'], key)
        # our formula and torch's count agree on these (tests/test_flops.py: on every layer kind)
        assert row['torch_flops_per_token'] == pytest.approx(row['flops_per_token'], rel=0.1)
    assert rows['gqa']['kv_bytes_per_token'] * 2 == rows['vanilla']['kv_bytes_per_token']
    swaps = {'vanilla': {}, 'gqa': {'n_kv_head': 1},
             'modern': {'norm': 'rms', 'mlp': 'swiglu', 'n_kv_head': 1, 'pos': 'rope'}}
    for name, swap in swaps.items():
        assert rows[name]['params'] == GPT(GPTConfig(**TINY, **swap)).get_num_params()


BASELINE_KEYS = ('time_vs_baseline', 'flops_vs_baseline', 'cost_per_flop', 'cost_per_flop_formula')


def test_baseline_gives_time_flops_and_cost_per_flop_over_its_steps(tmp_path):
    """--baseline: each variant's steps taken in turn with the baseline's; its time, torch's FLOPs and their
    quotient over the baseline's, in the table and the JSON; a window's row says its count includes the mask."""
    result = bench('--variants=modern,deltanet,local,mla', '--baseline=modern', '--timer=process', '--json=b.json',
                   cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert 'each in turn with modern' in result.stdout.splitlines()[0]
    assert 'CPU seconds of this process' in result.stdout.splitlines()[0]
    lines = [line for line in result.stdout.splitlines() if line.startswith('|')]
    header = [c.strip() for c in lines[0].strip('|').split('|')]
    assert header[8:11] == ['time / base', 'FLOPs / base', 'cost per FLOP / base']
    rows = {r['variant']: r for r in json.loads((tmp_path / 'b.json').read_text())['rows']}
    assert rows['modern']['flops_vs_baseline'] == 1.0  # the same model, counted twice
    for row in rows.values():
        assert row['cost_per_flop'] == pytest.approx(row['time_vs_baseline'] / row['flops_vs_baseline'])
        formula = row['flops_per_token'] / rows['modern']['flops_per_token']
        assert row['cost_per_flop_formula'] == pytest.approx(row['time_vs_baseline'] / formula)
    assert rows['deltanet']['flops_vs_baseline'] == pytest.approx(
        rows['deltanet']['torch_flops_per_token'] / rows['modern']['torch_flops_per_token'])
    assert rows['local']['masked'] and not rows['deltanet']['masked']
    local = next(line for line in lines if line.startswith('| local '))
    assert local.count('(mask)') == 2  # torch's FLOPs and the cost per FLOP
    # within 5% of our formula (MLA's here too: its padded values are a small part of it at this size): no note
    assert not any('(torch +' in line for line in lines)
    assert all(r['torch_flops_per_token'] < 1.05 * r['flops_per_token'] for r in rows.values() if not r['masked'])


def test_a_row_whose_torch_count_is_5_percent_over_ours_says_by_how_much(tmp_path):
    """MLA with a rotated part as wide as the rest of its keys (values half their width), which the fused CPU
    attention takes padded: torch counts the zeros, and its FLOPs and cost per FLOP cells say by how much."""
    result = bench('--variants=mla', '--baseline=mla', '--attn=mla', '--qk_rope_head_dim=16', '--block_size=64',
                   '--timer=process', '--json=m.json', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    row, = json.loads((tmp_path / 'm.json').read_text())['rows']
    more = row['torch_flops_per_token'] / row['flops_per_token'] - 1
    assert more >= 0.05 and not row['masked']
    line = next(line for line in result.stdout.splitlines() if line.startswith('| mla '))
    assert line.count(f'(torch +{more:.0%})') == 2


def test_a_baseline_without_training_steps_or_unknown_is_one_error_line(tmp_path):
    expect_one_error(bench('--variants=modern', '--baseline=mdoern', cwd=tmp_path), "'mdoern'")
    expect_one_error(bench('--variants=modern', '--timer=cpu', cwd=tmp_path), 'timer', "'wall' or 'process'")
    expect_one_error(bench('--variants=modern', '--baseline=modern', '--train_iters=0', cwd=tmp_path),
                     'baseline', 'train_iters')
    # a chapter's setting the variants take and the baseline cannot: one line naming the baseline, no traceback
    expect_one_error(bench('--variants=deltanet', '--baseline=modern', '--linear_chunk_size=16', cwd=tmp_path),
                     "baseline 'modern'", 'linear_chunk_size')


def measured_bench(tmp_path, monkeypatch, capsys, peaks):
    """bench.py in this process, one variant, its matmul 'measured' at the given FLOP/s in turn: (stdout, json)."""
    import runpy
    import common.errors
    import common.hardware
    peaks = iter(peaks)
    monkeypatch.setattr(common.hardware, 'peak_flops', lambda device, dtype='float32': (next(peaks), 'measured fake'))
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)  # pytest keeps its own Ctrl-C
    args = [a for a in ARGS if not a.startswith('--peak_flops')]
    monkeypatch.setattr(sys, 'argv', ['bench.py', *args, '--variants=vanilla', f'--json={tmp_path / "b.json"}'])
    runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
    return capsys.readouterr().out, json.loads((tmp_path / 'b.json').read_text())


def test_a_measured_peak_is_the_best_of_before_and_after(tmp_path, monkeypatch, capsys):
    """A matmul measured slow at the start (another job ran then) does not put MFU over 100%: bench measures
    the peak again after the runs and rescales MFU by the better one."""
    out, data = measured_bench(tmp_path, monkeypatch, capsys, [1e12, 4e12])
    assert ('peak 4 TFLOP/s (measured fake, the best of before and after the runs; 1 and 4 TFLOP/s: the load '
            'changed)') in out
    row = data['rows'][0]
    flops = GPT(GPTConfig(**TINY)).flops_per_token(TINY['block_size']) * 2 * TINY['block_size']  # batch 2
    assert data['peak_flops'] == 4e12
    assert row['mfu'] == pytest.approx(flops / (row['train_ms_per_iter'] / 1000) / 4e12)


@pytest.mark.parametrize('peaks, changed', [([1e12, 4e12], True), ([2e12, 2.1e12], False)])
def test_a_measured_peak_says_mfu_is_not_trustworthy_under_load(tmp_path, monkeypatch, capsys, peaks, changed):
    """A measured peak is no datasheet: the output says MFU is not trustworthy under load, and shows both
    measurements when they disagree (the load changed during the runs); a given --peak_flops says neither."""
    out, _ = measured_bench(tmp_path, monkeypatch, capsys, peaks)
    assert 'not a datasheet: under load' in out and 'MFU is not trustworthy then; give --peak_flops' in out
    assert ('the load changed' in out) == changed
    assert 'not trustworthy' not in run_peak_given(tmp_path, monkeypatch, capsys)


def run_peak_given(tmp_path, monkeypatch, capsys):
    import runpy
    monkeypatch.setattr(sys, 'argv', ['bench.py', *ARGS, '--variants=vanilla', '--decode_tokens=2'])
    runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
    return capsys.readouterr().out


def test_no_mfu_against_a_matmul_slower_than_the_model(tmp_path, monkeypatch, capsys):
    """bf16 on a CPU without bf16 units: the model's own shapes run faster than the square matmul, which is then
    no peak; MFU is left out, and the line says why, instead of showing over 100%."""
    out, data = measured_bench(tmp_path, monkeypatch, capsys, [1e3, 1e3])
    assert data['rows'][0]['mfu'] is None
    assert 'MFU not shown for vanilla: it ran faster than the measured matmul' in out
    assert table(out)['vanilla'][HEADER.index('MFU %')] == '-'


def test_unknown_variant_is_one_error_line():
    result = bench('--variants=vanilla,llama', cwd=REPO_ROOT)
    expect_one_error(result, "'llama'", 'vanilla, rms, swiglu, gqa, rope, modern, mha, mqa, moe, mla, mhc, mla-rebuild')


def test_json_naming_a_directory_is_refused_before_the_minutes_of_timing(tmp_path):
    result = bench(f'--json={tmp_path}', cwd=REPO_ROOT)
    expect_one_error(result, 'is a directory')


def test_moe_and_mla_rows_after_a_long_prompt(tmp_path):
    """MoE's MFU counts only the experts a token uses; MLA's cache is its latent; decoding after a prompt."""
    result = bench('--variants=modern,moe,mla,mla-rebuild', '--n_head=4', '--n_embd=64', '--block_size=48',
                   '--decode_prompt=32', '--decode_tokens=8', '--json=b.json', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {r['variant']: r for r in json.loads((tmp_path / 'b.json').read_text())['rows']}
    assert rows['moe']['active_params'] < rows['moe']['params'] and rows['modern']['active_params'] == rows['modern']['params']
    assert rows['moe']['mfu'] > 0 and rows['mla']['decode_tokens_per_s_cached'] > 0
    assert rows['mla']['kv_bytes_per_token'] == rows['mla-rebuild']['kv_bytes_per_token'] == (4 * 16 + 8) * 4
    assert rows['mla']['kv_bytes_per_token'] < rows['modern']['kv_bytes_per_token'] * 2


def test_per_layer_rows_cache_what_their_layers_keep(tmp_path):
    """A window of block_size/4 = 4: all-local layers keep a quarter of modern's cache, 'LLLG' (3 x 4 + 16) / 64."""
    result = bench('--variants=modern,local,lllg,lg+sinks,gate', '--n_layer=4', '--json=b.json', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {r['variant']: r for r in json.loads((tmp_path / 'b.json').read_text())['rows']}
    modern = rows['modern']['kv_bytes_per_token']
    assert rows['local']['kv_bytes_per_token'] * 4 == modern
    assert rows['lllg']['kv_bytes_per_token'] * 64 == modern * 28
    assert rows['lg+sinks']['kv_bytes_per_token'] * 64 == modern * 40 and rows['gate']['kv_bytes_per_token'] == modern
    assert rows['gate']['params'] > rows['modern']['params'] and rows['lg+sinks']['decode_tokens_per_s_cached'] > 0


def test_deltanet_rows_keep_a_cache_that_does_not_grow(tmp_path):
    """Per sequence, all 'D' keeps per layer its conv inputs (3 x 32 channels x 3 positions) and state (2 heads
    x 16 x 16), whatever the length; 'DDDG' one global layer's K/V plus three of those states."""
    result = bench('--variants=hybrid,deltanet', '--n_layer=4', '--json=b.json', '--decode_uncached=False',
                   cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {r['variant']: r for r in json.loads((tmp_path / 'b.json').read_text())['rows']}
    assert rows['deltanet']['decode_tokens_per_s_cached'] > 0 and rows['hybrid']['train_ms_per_iter'] > 0
    # decode_uncached=False: no uncached decoding, so no speedup either; the table says '-'
    assert rows['deltanet']['decode_tokens_per_s_uncached'] is None and rows['hybrid']['cache_speedup'] is None
    assert table(result.stdout)['hybrid'][HEADER.index('decode tok/s uncached')] == '-'
    per_sequence = {v: rows[v]['kv_bytes_per_sequence'] for v in rows}
    state = (3 * 32 * 3 + 2 * 16 * 16) * 4  # one DeltaNet layer's, fp32
    assert per_sequence['deltanet'] == 4 * state
    # k and v, one K/V head (modern's n_head / 2), block_size positions, head dim, fp32
    assert per_sequence['hybrid'] == 2 * 1 * 16 * 16 * 4 + 3 * state
    assert table(result.stdout)['hybrid'][HEADER.index('cache MB/sequence')] == f"{per_sequence['hybrid'] / 1e6:.4g}"


FAKE_NANOGPT = f'''
import sys
from dataclasses import asdict, dataclass
sys.path.insert(0, {str(REPO_ROOT)!r})
import model as ours


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(ours.GPT):
    """nanoGPT's interface on our vanilla model: no use_cache, and a chatty constructor."""

    def __init__(self, config):
        super().__init__(ours.GPTConfig(**asdict(config)))
        print("number of parameters: ...")

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        return super().generate(idx, max_new_tokens, temperature, top_k, use_cache=False)
'''


def test_nanogpt_dir_adds_a_row(tmp_path):
    (tmp_path / 'model.py').write_text(FAKE_NANOGPT)
    result = bench('--variants=vanilla', f'--nanogpt_dir={tmp_path}', '--json=bench.json', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = table(result.stdout)
    assert list(rows) == ['vanilla', 'nanoGPT']
    assert rows['nanoGPT'][HEADER.index('decode tok/s cached')] == '-' and rows['nanoGPT'][-1] == '-'  # no KV cache
    assert 'number of parameters' not in result.stdout
    data = {r['variant']: r for r in json.loads((tmp_path / 'bench.json').read_text())['rows']}
    assert data['nanoGPT']['params'] == data['vanilla']['params']
    assert data['nanoGPT']['mfu'] > 0 and data['nanoGPT']['decode_tokens_per_s_uncached'] > 0


def test_missing_nanogpt_dir_is_one_error_line(tmp_path):
    result = bench(f'--nanogpt_dir={tmp_path / "nope"}', cwd=REPO_ROOT)
    expect_one_error(result, 'nope', 'model.py')


def test_compare_dtype_times_both_in_turn(tmp_path):
    """bf16 autocast on the CPU, its steps taken in turn with fp32's, as an extra row."""
    result = bench('--variants=vanilla,modern', '--compare_dtype=bfloat16', '--json=b.json', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list(table(result.stdout)) == ['vanilla', 'vanilla (bfloat16)', 'modern', 'modern (bfloat16)']
    data = {r['variant']: r for r in json.loads((tmp_path / 'b.json').read_text())['rows']}
    assert data['modern (bfloat16)']['train_ms_per_iter'] > 0 and data['modern (bfloat16)']['mfu'] > 0
    # each variant's own figures on stderr as it ends (a run stopped by a time limit keeps them)
    assert f"  modern: train {data['modern']['train_ms_per_iter']:.4g} ms/iter" in result.stderr


def test_compiled_training_is_timed(tmp_path):
    result = subprocess.run([sys.executable, str(REPO_ROOT / 'bench.py'), *ARGS, '--variants=modern', '--compile=True'],
                            cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    assert 'compile True' in result.stdout and float(table(result.stdout)['modern'][3]) > 0


@pytest.mark.parametrize('place', ['/proc/nanoswap-bench.json', '/sys/nanoswap-bench.json'])
def test_json_that_cannot_be_written_is_refused_before_the_timing(tmp_path, monkeypatch, capsys, place):
    import runpy
    import common.errors
    import common.hardware
    if not Path(place).parent.is_dir():
        pytest.skip(f'no {Path(place).parent} here')
    monkeypatch.setattr(common.hardware, 'peak_flops', lambda *a, **k: pytest.fail('measured before checking --json'))
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    args = [a for a in ARGS if not a.startswith('--peak_flops')]
    monkeypatch.setattr(sys, 'argv', ['bench.py', *args, '--variants=vanilla', f'--json={place}'])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f'error: cannot write --json={place}')


@pytest.mark.parametrize('name', ['ckpt.pt', 'best.pt', 'notes.txt'])
def test_json_never_replaces_a_checkpoint_or_a_hard_linked_file(tmp_path, monkeypatch, capsys, name):
    """best.pt is a hard link of ckpt.pt (train.py): --json naming either, or any file with a second name, is
    refused before the timing, and both files stay as they were."""
    import runpy
    import common.errors
    import common.hardware
    from common.checkpoints import new_checkpoint, save_checkpoint
    save_checkpoint(new_checkpoint(GPT(GPTConfig(**TINY))), str(tmp_path / 'ckpt.pt'))
    os.link(tmp_path / 'ckpt.pt', tmp_path / 'best.pt')
    (tmp_path / 'notes.txt').write_text('mine')
    os.link(tmp_path / 'notes.txt', tmp_path / 'notes-too.txt')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(common.hardware, 'peak_flops', lambda *a, **k: pytest.fail('measured before checking --json'))
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    args = [a for a in ARGS if not a.startswith('--peak_flops')]
    monkeypatch.setattr(sys, 'argv', ['bench.py', *args, '--variants=vanilla', f'--json={tmp_path / name}'])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f'error: cannot write --json={tmp_path / name}')
    assert ('a checkpoint' if name.endswith('.pt') else 'hard link') in err[0]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_json_is_written_aside_and_switched_in(tmp_path, monkeypatch, capsys):
    """An old bench.json is replaced whole (a new file, not rewritten in place): a reader holding the old one
    keeps it, and no temporary file is left beside it."""
    (tmp_path / 'b.json').write_text('old')
    old = open(tmp_path / 'b.json')
    _, data = measured_bench(tmp_path, monkeypatch, capsys, [1e12, 1e12])
    assert old.read() == 'old' and data['rows'][0]['variant'] == 'vanilla'
    old.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['b.json']


def test_kill_is_one_line_and_exit_143(tmp_path):
    import signal
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / 'bench.py'), *ARGS, '--train_iters=1000000'],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr.readline().startswith('benchmarking')  # the timing has started
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        proc.kill()
    assert proc.returncode == 143 and err.strip() == 'error: interrupted (SIGTERM)', err


def test_decoding_against_hugging_face_on_the_same_weights(tmp_path, monkeypatch, capsys):
    """--vs_hf=True: a row per variant and batch (the Hugging Face class it was exported to), tokens/s of ours eager,
    ours compiled and HF generate with their ratios, and the tokens of all three identical. In this process: a
    subprocess would add only a torch import, and a time limit a busy machine can reach (issue 49.6)."""
    import runpy
    import torch._dynamo
    import common.errors
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'argv', ['bench.py', *ARGS, '--vs_hf=True', '--variants=modern', '--vs_hf_batches=2',
                                      '--vs_hf_repeats=1', '--decode_tokens=4', '--json'])  # one variant: it compiles
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
    finally:
        torch._dynamo.reset()  # the compiled step's graphs stay with this test
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    # the table's settings are not read by this run: said once, not ignored in silence
    assert ('note: --train_iters, --warmup_iters, --batch_size, --peak_flops apply to the training and decoding '
            'table, which --vs_hf=True does not make: ignored') in err.splitlines()
    rows = json.loads((tmp_path / 'bench.json').read_text())['rows']
    assert [(r['variant'], r['hf_class'], r['batch']) for r in rows] == [('modern', 'LlamaForCausalLM', 2)]
    for r in rows:
        assert r['tokens_identical'] and min(r['ours eager'], r['ours compiled'], r['HF generate']) > 0
        assert r['compiled_vs_hf'] == pytest.approx(r['ours compiled'] / r['HF generate'])
        assert f"| {r['variant']} | {r['hf_class']} | float32 | 2 | " in out
    assert '| yes |' in out and '| NO' not in out


def test_vs_hf_batches_that_are_not_ints_are_one_error_line():
    expect_one_error(bench('--vs_hf=True', '--vs_hf_batches=1,x', cwd=REPO_ROOT), 'vs_hf_batches', "'1,x'")


def test_kda_rows_keep_the_deltanets_cache(tmp_path):
    """Kimi Delta Attention keeps what a Gated DeltaNet of the same widths keeps: 'KKKG' the cache of 'DDDG',
    all 'K' four conv inputs and states (3 x 32 channels x 3 positions, 2 heads x 16 x 16), whatever the length."""
    result = bench('--variants=kda-hybrid,kda', '--n_layer=4', '--json=b.json', '--decode_uncached=False', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {r['variant']: r for r in json.loads((tmp_path / 'b.json').read_text())['rows']}
    state = (3 * 32 * 3 + 2 * 16 * 16) * 4
    assert rows['kda']['kv_bytes_per_sequence'] == 4 * state
    assert rows['kda-hybrid']['kv_bytes_per_sequence'] == 2 * 1 * 16 * 16 * 4 + 3 * state  # and one global layer's K/V
    assert rows['kda']['decode_tokens_per_s_cached'] > 0 and rows['kda-hybrid']['train_ms_per_iter'] > 0


def test_mamba2_and_short_convolution_rows_keep_a_cache_that_does_not_grow(tmp_path):
    """mamba2 and shortconv keep the same bytes at 16 and 32 positions, as the model counts them; their 3:1
    hybrids grow by the one global layer's K/V (1 K/V head x 16 wide, fp32) per position."""
    kinds = ('mamba2-hybrid', 'mamba2', 'shortconv-hybrid', 'shortconv')
    rows = {}
    for length in (16, 32):
        result = bench(f"--variants={','.join(kinds)}", '--n_layer=4', f'--block_size={length}', f'--json={length}.json',
                       '--decode_uncached=False', cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        rows[length] = {r['variant']: r for r in json.loads((tmp_path / f'{length}.json').read_text())['rows']}
    for name, letter in (('mamba2', 'S'), ('shortconv', 'V')):
        alone = GPT(GPTConfig(**{**TINY, 'n_layer': 4, 'norm': 'rms', 'mlp': 'swiglu', 'n_kv_head': 1, 'pos': 'rope',
                                 'layers': letter}))
        assert rows[16][name]['kv_bytes_per_sequence'] == rows[32][name]['kv_bytes_per_sequence'] == \
            alone.kv_cache_bytes(1, 16) > 0
        grown = rows[32][f'{name}-hybrid']['kv_bytes_per_sequence'] - rows[16][f'{name}-hybrid']['kv_bytes_per_sequence']
        assert grown == 16 * 2 * 1 * 16 * 4
        assert rows[32][name]['decode_tokens_per_s_cached'] > 0 and rows[32][f'{name}-hybrid']['train_ms_per_iter'] > 0


def test_sparse_attention_rows_keep_the_indexers_keys(tmp_path):
    """dsa and mla+dsa: the modern and MLA caches plus the indexer's key per token (index_head_dim 32), fp32."""
    result = bench('--variants=modern,dsa,mla,mla+dsa', '--json=b.json', '--decode_uncached=False', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {r['variant']: r for r in json.loads((tmp_path / 'b.json').read_text())['rows']}
    assert rows['dsa']['kv_bytes_per_token'] == rows['modern']['kv_bytes_per_token'] + 32 * 4
    assert rows['mla+dsa']['kv_bytes_per_token'] == rows['mla']['kv_bytes_per_token'] + 32 * 4
    assert rows['dsa']['decode_tokens_per_s_cached'] > 0 and rows['mla+dsa']['train_ms_per_iter'] > 0


def test_train_iters_0_times_decoding_only(tmp_path):
    """A long context's decoding without its training steps (minutes each on a CPU): the training columns are '-',
    decoding and the cache are measured as ever; a negative count is one error line."""
    result = bench('--variants=modern', '--train_iters=0', '--json=b.json', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [row] = json.loads((tmp_path / 'b.json').read_text())['rows']
    assert row['train_ms_per_iter'] is row['train_tokens_per_s'] is row['mfu'] is None
    assert row['decode_tokens_per_s_cached'] > 0 and row['kv_bytes_per_sequence'] > 0
    cells = table(result.stdout)['modern']
    assert [cells[HEADER.index(c)] for c in ('train ms/iter', 'train tok/s', 'MFU %')] == ['-', '-', '-']
    assert 'no training steps' in result.stdout.splitlines()[0]
    expect_one_error(bench('--train_iters=-1', cwd=tmp_path), 'train_iters', '-1')


def test_a_setting_the_run_does_not_read_gets_a_note(tmp_path, monkeypatch, capsys):
    """--train_iters=0 --compare_dtype=bfloat16: no training steps, so no bf16 rows, and a note says why (issue
    44.15), where it dropped the comparison without a word; a vs_hf setting without --vs_hf=True, the same."""
    import runpy
    import common.errors
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    for extra, note in ((['--compare_dtype=bfloat16', '--train_iters=0'],
                         'note: compare_dtype=bfloat16 times training steps in that dtype, and train_iters=0 takes '
                         'none: no bfloat16 rows'),
                        (['--vs_hf_batches=2', '--vs_hf_repeats=2'],
                         'note: --vs_hf_batches, --vs_hf_repeats apply to --vs_hf=True only: ignored')):
        monkeypatch.setattr(sys, 'argv', ['bench.py', *ARGS, '--variants=vanilla', '--decode_tokens=2', *extra])
        runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
        out, err = capsys.readouterr()
        assert note in err.splitlines(), err
        assert list(table(out)) == ['vanilla']


def test_threads_are_the_usable_cores_by_default_and_said(tmp_path, monkeypatch, capsys):
    """On a CPU threads=0 is train.py's and sample.py's default (common.threads): the cores this process may use, at
    most torch's default; the first line says how many and why."""
    import runpy
    import torch
    import common.errors
    import common.threads
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0})  # one core usable, torch's default two
    monkeypatch.setattr(common.threads, 'busy_cores', lambda: 0)  # a quiet machine
    torch.set_num_threads(2)  # torch's default on 2 cores (own_threads gives this process's back)
    monkeypatch.setattr(sys, 'argv', ['bench.py', *ARGS, '--variants=vanilla', '--decode_tokens=2'])
    runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
    first = capsys.readouterr().out.splitlines()[0]
    assert torch.get_num_threads() == 1
    assert ', 1 thread (of 1 usable core: --threads sets another count); ' in first, first


def test_a_long_measurement_shows_its_progress_on_a_terminal(tmp_path, monkeypatch, capsys):
    """Only 'benchmarking vanilla ...' for minutes (issue 49.5): on a terminal each phase is a line with the steps done,
    the rate and the time left, even one that reports no width (a progress bar sized to it printed nothing)."""
    import runpy
    import common.errors
    import common.progress
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    monkeypatch.setattr(sys.stderr, 'isatty', lambda: True, raising=False)
    clock = iter(range(10 ** 6))  # a second between looks at the clock: each step shows
    monkeypatch.setattr(common.progress.time, 'monotonic', lambda: float(next(clock)))
    monkeypatch.setattr(sys, 'argv', ['bench.py', *ARGS, '--variants=vanilla'])
    runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
    shown = capsys.readouterr().err.split('\r')
    for phase, total in (('training steps', 3), ('decoding', 10)):
        lines = [s for s in shown if s.startswith(f'{phase} ')]
        assert lines[0].rstrip() == f"{phase} 0/{total}" + (' tokens' if phase == 'decoding' else '')
        assert 'left' in lines[-1], lines


def test_train_profile_shows_where_each_variants_step_goes(run, monkeypatch, capsys):
    """--train_profile=True: each variant's top operators of a training step, forward and backward (torch.profiler),
    before its row: the matmuls FlopCounterMode counts against what it does not (mHC's elementwise mixing)."""
    import runpy
    import common.errors
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)
    monkeypatch.setattr(sys, 'argv', ['bench.py', *ARGS, '--variants=vanilla,mhc', '--decode_tokens=2',
                                      '--train_profile=True', '--threads=1'])
    runpy.run_path(str(REPO_ROOT / 'bench.py'), run_name='__main__')
    out = capsys.readouterr().out
    for name in ('vanilla', 'mhc'):
        table = out.split(f'{name}: the top operators of 3 training steps (forward and backward)\n')[1]
        assert 'Self CPU' in table.splitlines()[1] and 'aten::mm' in table
    assert 'top operators' not in run[0].stdout  # without the flag, no table
