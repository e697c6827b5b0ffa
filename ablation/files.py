"""The files an ablation reads: where this repository and its train.py are, a run's JSON (done.json, its caches)
and a dataset's meta.json, each whole or one error line."""

import json
import os

from common.errors import die

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(REPO, 'train.py')


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        die(f"cannot read '{path}' ({type(e).__name__}): delete it to rerun that run")


def data_meta(cwd, dataset):
    """data/<dataset>/meta.json under cwd, {} when there is none."""
    meta_path = os.path.join(cwd, 'data', dataset, 'meta.json')
    return read_json(meta_path) if os.path.exists(meta_path) else {}
