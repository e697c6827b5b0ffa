import json
import sys
from pathlib import Path

import numpy as np
import pytest

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
