"""ablation/grid.py: the grid of several groups, each flag set run once under its first name, names fit for
directories."""

import os

import pytest

from conftest import ablate_grid


def test_grid_runs_each_flag_set_once(monkeypatch, capsys):
    # the CPU recipe: 4 heads
    _, _, variants = ablate_grid(monkeypatch, '--grid=default,leave_one_out,norm_position,mlp,kv',
                                 '--n_kv_heads=1,2', "--custom={'x y': {}}")
    assert list(variants)[:6] == ['vanilla', 'vanilla+rms', 'vanilla+swiglu', 'vanilla+gqa', 'vanilla+rope', 'modern']
    assert variants['modern'] == {'norm': 'rms', 'mlp': 'swiglu', 'n_kv_head': 2, 'pos': 'rope'}
    assert variants['modern-rope'] == {**variants['modern'], 'pos': 'learned'}
    assert variants['modern+postnorm'] == {**variants['modern'], 'norm_position': 'post'}
    assert variants['kv=1']['n_kv_head'] == 1
    # mlp=gelu is vanilla, mlp=swiglu is vanilla+swiglu, kv=2 is modern: each runs once
    assert 'mlp=gelu' not in variants and 'mlp=swiglu' not in variants and 'kv=2' not in variants
    assert {'mlp=relu', 'mlp=geglu', 'vanilla+postnorm', 'modern-rms', 'modern-gqa'} <= set(variants)
    assert 'runs once, as vanilla' in capsys.readouterr().out
    assert all(os.sep not in name and ' ' not in name for name in variants)


def test_members_keep_the_named_variants_in_grid_order(monkeypatch):
    _, _, variants = ablate_grid(monkeypatch, '--grid=speedrun', '--members=+bigram, modern+muon')
    assert list(variants) == ['modern+muon', '+bigram']
    assert variants['+bigram'] == {**variants['modern+muon'], 'bigram_vocab': 4096}


def test_a_member_the_grid_lacks_is_one_line(monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        ablate_grid(monkeypatch, '--grid=default', '--members=modern,+bigram')
    assert e.value.code != 0
    err = capsys.readouterr().err.strip()
    assert "members '+bigram' are not in the grid; its variants are vanilla, vanilla+rms" in err and '\n' not in err
