"""A chapter uses only the lesson and the chapters before it (chapters/__init__.py's reading order): it imports no
later chapter and reads no later chapter's config field; where two compose, the later one says how (it refuses
the pair, or adapts the earlier one through a derived property or a registry)."""

import ast
import dataclasses
from pathlib import Path

import pytest

import chapters
import model

REPO = Path(__file__).resolve().parent.parent
ORDER = [chapter.__name__.rsplit('.', 1)[1] for chapter in chapters.CHAPTERS]
LESSON_FIELDS = {f.name for f in dataclasses.fields(model.GPTConfig)}
# the project's modules a chapter may import besides model.py and earlier chapters: the decoding engine (mtp.py's
# speculative decoding), which imports no chapter itself
ENGINE = {'generate'}


def field_owners():
    """{config field: the chapter whose Config declares it} for every chapter's own fields."""
    owners = {}
    for name in ORDER:
        for f in dataclasses.fields(getattr(chapters, name).Config):
            if f.name not in LESSON_FIELDS:
                owners.setdefault(f.name, name)
    return owners


def project_imports(tree):
    """(line, module) for each import of a project module: chapters.X, model or another top-level file."""
    local = {p.stem for p in REPO.glob('*.py')} | {p.name for p in REPO.iterdir() if (p / '__init__.py').exists()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [f'chapters.{a.name}' for a in node.names] if node.module == 'chapters' else [node.module]
        else:
            continue
        for module in modules:
            if module.split('.')[0] in local:
                yield node.lineno, module


def field_reads(tree):
    """(line, name) for each attribute read (config.x, c.x) and each getattr/hasattr of a constant name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.Call) and getattr(node.func, 'id', None) in ('getattr', 'hasattr') \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            yield node.lineno, node.args[1].value


@pytest.mark.parametrize('name', ORDER)
def test_a_chapter_reads_only_the_lesson_and_earlier_chapters(name):
    tree = ast.parse((REPO / 'chapters' / f'{name}.py').read_text(encoding='utf-8'))
    earlier = ORDER[:ORDER.index(name)]
    wrong = [f"line {line}: imports {module}" for line, module in project_imports(tree)
             if module not in ENGINE | {'model'} and not (module.startswith('chapters.')
                                                          and module.split('.')[1] in earlier)]
    owners = field_owners()
    wrong += [f"line {line}: reads {field}, {owners[field]}.py's field" for line, field in field_reads(tree)
              if field in owners and owners[field] not in earlier + [name]]
    assert not wrong, f"chapters/{name}.py, in reading order after {earlier[-1:] or ['the lesson']}: {wrong}"


def test_the_engine_a_chapter_may_import_imports_no_chapter():
    for module in ENGINE:
        tree = ast.parse((REPO / f'{module}.py').read_text(encoding='utf-8'))
        assert [m for _, m in project_imports(tree) if m.startswith('chapters')] == []


def test_the_check_finds_a_later_chapters_field_and_import():
    """The scan itself: a chapter that read hyper_connections' hc_mult, as speedrun.py and engram.py once did, or
    imported a later chapter, is caught."""
    tree = ast.parse("from chapters.engram import Engram\nx = getattr(c, 'hc_mult', 1) + c.engram_dim\n")
    assert ('chapters.engram', 1) == next((m, line) for line, m in project_imports(tree))
    assert {(2, 'hc_mult'), (2, 'engram_dim')} <= set(field_reads(tree))
    assert field_owners()['hc_mult'] == 'hyper_connections' and field_owners()['engram_dim'] == 'engram'
