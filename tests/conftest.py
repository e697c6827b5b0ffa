import importlib
import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.register_assert_rewrite('tiny_models')  # its checks' asserts explain their failures, as a test file's do

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

TINY_TEXT = 'the quick brown fox jumps over the lazy dog. ' * 200

# an lm-evaluation-harness multiple-choice task in HellaSwag's shape (ctx, endings, label) over a local jsonl:
# format with name and path
CHOICE_TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
validation_split: validation
output_type: multiple_choice
doc_to_text: "{{{{ctx}}}}"
doc_to_target: label
doc_to_choice: "{{{{endings}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def make_char_dataset(root, name='tiny', text=TINY_TEXT, chars=None):
    """root/data/<name>/{train,val}.bin and meta.json, as data/shakespeare_char/prepare.py writes them:
    what train.py reads from its working directory. The default text is repetitive, so a tiny model
    learns it within a few steps."""
    chars = sorted(set(text)) if chars is None else chars
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    d = Path(root) / 'data' / name
    d.mkdir(parents=True, exist_ok=True)
    n = int(len(ids) * 0.9)
    ids[:n].tofile(d / 'train.bin')
    ids[n:].tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'kind': 'char', 'vocab_size': len(chars), 'chars': chars}))
    return d


@pytest.fixture(scope='module')
def single_thread():
    """Tiny models run fastest on one thread, and intra-op threads spin badly when the CPUs are shared."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def fresh_interrupt_state():
    """Each test starts as a new process would: no interrupt pending, held or under way in common/errors.py (tests run
    scripts in this process with catch_interrupts, which re-arms it, replaced, and simulate signals)."""
    errors = sys.modules.get('common.errors')
    if errors is not None:
        errors._critical, errors._pending, errors._stopping = 0, None, False
    yield


# ----------------------------------------------------------------------------- ablate.py and ablation/'s tests

ABLATE_PY = str(Path(REPO_ROOT) / 'ablate.py')
TINY_CONFIG = """\
dataset = 'tiny'
device = 'cpu'
compile = False
n_layer = 1
n_head = 2
n_embd = 16
block_size = 16
batch_size = 4
gradient_accumulation_steps = 1
max_iters = 4
eval_interval = 2
eval_iters = 2
log_interval = 1
"""
TWO_VARIANTS = "{'vanilla': {}, 'rope': {'pos': 'rope'}}"


def make_workdir(path):
    """data/tiny (a repetitive text) and a tiny train config: what train.py reads from its working directory."""
    make_char_dataset(path)  # val: 900 tokens, room for 4x block_size in the extrapolation eval
    (path / 'tiny.py').write_text(TINY_CONFIG)
    return path


def ablate_here(workdir, out, *args, monkeypatch, capsys):
    """ablate.py in this process, for what it decides before it starts a run: (exit code, stderr)."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', f'--run_dir={workdir}', f'--train_config={workdir / "tiny.py"}',
                                      f'--out_dir={out}', *args])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(ABLATE_PY, run_name='__main__')
    return e.value.code, capsys.readouterr().err


def report_here(workdir, out, *args, monkeypatch, capsys, run_dir=None):
    """ablate.py --report_only=True in this process on the fixture's runs: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', f'--run_dir={run_dir or workdir}',
                                      f'--train_config={workdir / "tiny.py"}',
                                      f'--out_dir={out}', '--extrapolation_iters=2', '--grid=custom',
                                      f'--custom={TWO_VARIANTS}', '--seeds=2', '--report_only=True', *args])
    code = 0
    try:
        runpy.run_path(ABLATE_PY, run_name='__main__')
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tables(md):
    """Each Markdown table of the report: a list of rows of cells, the header first."""
    out, current = [], None
    for line in md.splitlines() + ['']:
        if line.startswith('|'):
            if current is None:
                current = []
                out.append(current)
            if not set(line) <= set('|-: '):
                current.append([c.strip() for c in line.strip().strip('|').split('|')])
        else:
            current = None
    return out


def table_rows(md):
    """The main table: {variant: cells}."""
    return {cells[0]: cells for cells in tables(md)[0][1:]}


def import_ablate(monkeypatch, *argv):
    """ablate.py as a module, its settings from argv."""
    monkeypatch.setattr(sys, 'argv', ['ablate.py', *argv])
    monkeypatch.syspath_prepend(REPO_ROOT)
    sys.modules.pop('ablate', None)
    module = importlib.import_module('ablate')
    sys.modules.pop('ablate', None)
    return module


def ablate_grid(monkeypatch, *argv):
    """ablate.py's module as these arguments configure it, its base recipe and its grid."""
    from ablation.grid import base_recipe, build_grid
    module = import_ablate(monkeypatch, *argv)
    base = base_recipe(REPO_ROOT, module.settings)
    return module, base, build_grid(base, module.settings)
