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
                            ('train_gpt2', 'train_gpt2_modern')]:
        a = configure(defaults, [f'config/{vanilla}.py'])
        b = configure(defaults, [f'config/{modern}.py'])
        differing = {k for k in a if a[k] != b[k]}
        assert differing - {'out_dir', 'wandb_run_name'} == swaps, (vanilla, differing)
        assert {k: b[k] for k in swaps} == swap_flags('modern', a), modern
