"""Every recipe in config/ loads through the configurator against the settings of the script it is for."""

import ast
from pathlib import Path

import pytest

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
