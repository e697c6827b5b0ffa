"""Every recipe in config/ loads through the configurator against the settings of the script it is for."""

import ast
from pathlib import Path

import pytest

from configurator import configure

REPO = Path(__file__).resolve().parents[1]


def script_defaults(script):
    """A flat script's settings: its top-level `name = constant expression` assignments, e.g. `5 * 8`
    (what settings_of collects), read without running the script."""
    defaults = {}
    for node in ast.parse((REPO / script).read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = eval(compile(ast.Expression(node.value), script, 'eval'), {'__builtins__': {}})
            except Exception:  # an expression of other names: not a setting
                continue
            if not node.targets[0].id.startswith('_') and isinstance(value, (bool, int, float, str, type(None))):
                defaults[node.targets[0].id] = value
    return defaults


CONFIGS = sorted(p.name for p in (REPO / 'config').glob('*.py'))


@pytest.mark.parametrize('name', CONFIGS)
def test_config_loads(name, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes build on each other with exec(open('config/...'))
    script = 'ablate.py' if name.startswith('ablate') else 'train.py'
    defaults = script_defaults(script)
    settings = configure(defaults, [f'config/{name}'])
    assert settings != defaults  # the recipe changed something
    if script == 'ablate.py':
        assert (REPO / settings['train_config']).exists()


def test_modern_recipes_differ_from_vanilla_only_in_the_swaps(monkeypatch):
    monkeypatch.chdir(REPO)
    defaults = script_defaults('train.py')
    swaps = {'norm', 'mlp', 'n_kv_head', 'pos'}
    for vanilla, modern in [('shakespeare_vanilla', 'shakespeare_modern'),
                            ('shakespeare_vanilla_cpu', 'shakespeare_modern_cpu'),
                            ('train_gpt2', 'train_gpt2_modern')]:
        a = configure(defaults, [f'config/{vanilla}.py'])
        b = configure(defaults, [f'config/{modern}.py'])
        differing = {k for k in a if a[k] != b[k]}
        assert differing - {'out_dir', 'wandb_run_name'} == swaps, (vanilla, differing)
        assert (b['norm'], b['mlp'], b['pos']) == ('rms', 'swiglu', 'rope') and b['n_head'] % b['n_kv_head'] == 0
