"""Every recipe in config/ loads through the configurator against the settings of the script it is for."""

import ast
import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

import common.errors
from common.files import release_out_dirs
from configurator import configure, script_defaults
from model import SWAPS, swap_flags

REPO = Path(__file__).resolve().parents[1]


CONFIGS = sorted(p.name for p in (REPO / 'config').glob('*.py'))


@pytest.mark.parametrize('name', CONFIGS)
def test_config_loads(name, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes build on each other with exec(open('config/...'))
    script = 'ablate.py' if name.startswith('ablate') else 'train.py'
    defaults = script_defaults(REPO / script)
    settings = configure(defaults, [f'config/{name}'])
    assert settings != defaults  # the recipe changed something
    if script == 'ablate.py':
        assert (REPO / settings['train_config']).exists()


def test_modern_recipes_differ_from_vanilla_only_in_the_swaps(monkeypatch):
    """The modern recipes are their vanilla recipe with model.SWAPS's modern values: one modern block."""
    monkeypatch.chdir(REPO)
    defaults = script_defaults(REPO / 'train.py')
    swaps = {flag for flag, _, _ in SWAPS.values()}
    for vanilla, modern in [('shakespeare_vanilla', 'shakespeare_modern'),
                            ('shakespeare_vanilla_cpu', 'shakespeare_modern_cpu'),
                            ('train_gpt2', 'train_gpt2_modern'),
                            ('train_gpt2_fineweb', 'train_gpt2_fineweb_modern')]:
        a = configure(defaults, [f'config/{vanilla}.py'])
        b = configure(defaults, [f'config/{modern}.py'])
        differing = {k for k in a if a[k] != b[k]}
        assert differing - {'out_dir', 'wandb_run_name'} == swaps, (vanilla, differing)
        assert {k: b[k] for k in swaps} == swap_flags('modern', a), modern


def test_the_fineweb_recipe_is_build_nanogpts(monkeypatch):
    """2**19 tokens per iteration for one epoch of the 10B-token sample, warmup 715, lr 6e-4 to 6e-5, and
    HellaSwag scored as it trains."""
    monkeypatch.chdir(REPO)
    s = configure(script_defaults(REPO / 'train.py'), ['config/train_gpt2_fineweb.py'])
    tokens_per_iter = s['batch_size'] * s['block_size'] * s['gradient_accumulation_steps']
    assert tokens_per_iter == 2 ** 19 and s['gradient_accumulation_steps'] % 8 == 0  # 8 GPUs share it
    assert abs(s['max_iters'] * tokens_per_iter / 1e10 - 1) < 0.001 and s['lr_decay_iters'] == s['max_iters']
    assert (s['learning_rate'], s['min_lr'], s['warmup_iters']) == (6e-4, 6e-5, 715)
    assert s['dataset'] == 'fineweb_edu' and s['eval_task'] == 'hellaswag'


def test_the_muon_recipes_are_the_modern_ones_with_muon(monkeypatch):
    monkeypatch.chdir(REPO)
    defaults = script_defaults(REPO / 'train.py')
    for modern in ('shakespeare_modern', 'shakespeare_modern_cpu'):
        a = configure(defaults, [f'config/{modern}.py'])
        b = configure(defaults, [f'config/{modern.replace("modern", "modern_muon")}.py'])
        differing = {k for k in a if a[k] != b[k]}
        assert differing - {'out_dir', 'wandb_run_name', 'muon_lr'} == {'optimizer'} and b['optimizer'] == 'muon'


def make_bpe_dataset(root, dataset, sharded):
    """root/data/<dataset> of random GPT-2 token ids with prepare.py's meta.json: train.bin and val.bin, or
    FineWeb-Edu's shards that meta.json lists."""
    d = root / 'data' / dataset
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    splits = {split: rng.integers(0, 50257, n, dtype=np.uint16) for split, n in (('val', 1000), ('train', 4000))}
    meta = {'kind': 'tiktoken', 'encoding': 'gpt2', 'vocab_size': 50257,
            **{f'{split}_tokens': len(ids) for split, ids in splits.items()}}
    if sharded:
        meta.update(complete=True, shards={split: [[f'{dataset}_{split}_{k:06d}.bin', len(ids), 0, 0]]
                                           for k, (split, ids) in enumerate(splits.items())})
    for split, ids in splits.items():
        ids.tofile(d / (meta['shards'][split][0][0] if sharded else f'{split}.bin'))
    (d / 'meta.json').write_text(json.dumps(meta))


@pytest.mark.parametrize('name, dataset, sharded', [('shakespeare_bpe_cpu', 'shakespeare', False),
                                                    ('fineweb_edu_cpu', 'fineweb_edu', True)])
def test_the_bpe_cpu_recipes_train_the_modern_block_on_their_data(name, dataset, sharded, tmp_path, monkeypatch,
                                                                  capsys):
    """The CPU recipes for GPT-2 BPE data: a tiktoken dataset, the modern block, and a step of their own model on
    data laid out as the dataset's prepare.py writes it (FineWeb-Edu: shards, no val.bin)."""
    monkeypatch.chdir(REPO)
    s = configure(script_defaults(REPO / 'train.py'), [f'config/{name}.py'])
    assert s['dataset'] == dataset and 'tiktoken' in (REPO / 'data' / dataset / 'prepare.py').read_text()
    assert (s['device'], s['compile']) == ('cpu', False)
    assert {k: s[k] for k in swap_flags('modern', s)} == swap_flags('modern', s)
    make_bpe_dataset(tmp_path, dataset, sharded)
    (tmp_path / 'config').symlink_to(REPO / 'config')  # recipes exec the ones they build on by relative path
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'argv', ['train.py', f'config/{name}.py', '--max_iters=2', '--eval_interval=2',
                                      '--eval_iters=1', '--warmup_iters=1', '--out_dir=out',
                                      '--peak_flops=1e12'])  # no matmul to measure
    monkeypatch.setattr(common.errors, 'catch_interrupts', lambda: None)  # pytest keeps its own Ctrl-C
    monkeypatch.setenv('WANDB_MODE', 'offline')
    try:
        runpy.run_path(str(REPO / 'train.py'), run_name='__main__')
    finally:
        release_out_dirs()  # as the end of its process would
    out = capsys.readouterr().out
    assert 'step 2: train loss' in out and (tmp_path / 'out' / 'ckpt.pt').exists(), out


def test_every_cpu_recipe_is_in_the_readme():
    """A newcomer finds the CPU recipes in the README's table (its "## Recipes"), the BPE ones and the synthetic
    tasks' with their data's preparation."""
    readme = (REPO / 'README.md').read_text(encoding='utf-8')
    table = readme.split('\n## Recipes\n', 1)[1].split('\n## ', 1)[0]
    for name in (n for n in CONFIGS if n.endswith('_cpu.py')):  # ablate.py's recipes are its to run
        assert f"{'ablate' if name.startswith('ablate_') else 'train'}.py config/{name}" in table, name
    assert 'python data/shakespeare/prepare.py && python train.py config/shakespeare_bpe_cpu.py' in table
    assert 'python data/copy/prepare.py && python train.py config/copy_cpu.py' in table
    assert '--out_dir data/recall_32 && python train.py config/recall_cpu.py' in table
