"""README.md is the front door and docs/ the manual: every relative link in them resolves, every chapter file has
its page, and each page's flag table is its chapter's Config (issue #43, item 7)."""

import ast
import dataclasses
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / 'README.md'] + sorted((REPO / 'docs').rglob('*.md'))
LINK = re.compile(r'(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)')


def outside_code(text):
    """The text with fenced code blocks and inline code removed (a link inside code is not a link)."""
    text = re.sub(r'^```.*?^```', '', text, flags=re.S | re.M)
    return re.sub(r'`[^`\n]*`', '', text)


def anchors(path):
    """GitHub's anchors of a page's headings: lowercase, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in re.sub(r'^```.*?^```', '', path.read_text(encoding='utf-8'), flags=re.S | re.M).splitlines():
        if line.startswith('#'):
            title = line.lstrip('#').strip().lower()
            found.add(re.sub(r'\s', '-', re.sub(r'[^\w\- ]', '', title)))
    return found


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    """Each relative link (and image) points at a file of the repository, and an anchor at a heading there."""
    broken = []
    for match in LINK.finditer(outside_code(page.read_text(encoding='utf-8'))):
        target = match.group(1) or match.group(2)
        if re.match(r'[a-z]+:', target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition('#')
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == '.md' and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def chapter_names():
    tree = ast.parse((REPO / 'chapters' / '__init__.py').read_text(encoding='utf-8'))
    names = next(node.value.elts for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], 'id', None) == 'CHAPTERS')
    return [name.id for name in names]


def test_every_chapter_has_its_page_and_the_readme_links_every_page():
    """docs/chapters/ mirrors chapters/: one page per chapter file, no page without one; README links every page
    of docs/ (its "Where to read on")."""
    names = chapter_names()
    pages = sorted(p.stem for p in (REPO / 'docs' / 'chapters').glob('*.md'))
    assert pages == sorted(names)
    readme = (REPO / 'README.md').read_text(encoding='utf-8')
    for page in (REPO / 'docs').rglob('*.md'):
        assert f"]({page.relative_to(REPO).as_posix()})" in readme, page


def flag_table(page):
    """{flag: default} of a page's "## Flags" table (or "## Its flags"): rows | `flag` | `default` | ... |."""
    text = page.read_text(encoding='utf-8')
    section = re.split(r'^## (?:Its )?[Ff]lags$', text, flags=re.M)[1].split('\n## ')[0]
    return {m.group(1): ast.literal_eval(m.group(2))
            for m in re.finditer(r'^\| `(\w+)` \| `([^`]*)` \|', section, flags=re.M)}


@pytest.mark.parametrize('name', ['model'] + chapter_names())
def test_each_pages_flag_table_is_its_config(name):
    """Every field of the chapter's Config (model.py's GPTConfig for docs/lesson.md) is a row of its page's flag
    table, with the default the code has, and the table names no other flag."""
    import chapters
    import model
    config = model.GPTConfig if name == 'model' else getattr(chapters, name).Config
    page = REPO / 'docs' / ('lesson.md' if name == 'model' else f'chapters/{name}.md')
    own = [f for f in dataclasses.fields(config) if name == 'model' or f.name in vars(config)['__annotations__']]
    assert flag_table(page) == {f.name: f.default for f in own}


def test_the_readme_stays_the_front_door():
    """What a first hour needs, at most ~300 lines (nanoGPT's is about 230); the rest is docs/'s."""
    lines = (REPO / 'README.md').read_text(encoding='utf-8').count('\n')
    assert lines <= 300, f"README.md has {lines} lines: move the detail to a page of docs/"


def test_readmes_results_table_says_one_short_claim_per_cell_with_its_unit_and_source():
    """README's Results: a first-time reader parses each cell (a 915-character cell once held a whole study); the
    measured cell names its unit, the published one its source (a name and a year); the long readings live in
    docs/results.md."""
    readme = (REPO / 'README.md').read_text(encoding='utf-8')
    section = readme[readme.index('## Results'):readme.index('## Tests')]
    rows = [[cell.strip() for cell in line.strip().strip('|').split(' | ')] for line in section.splitlines()
            if line.startswith('| ')]
    header, rows = rows[0], rows[1:]
    assert header[:3] == ['question', 'measured (3 seeds)', 'published finding (source): ours'] and len(rows) >= 6
    for question, measured, published, command in rows:
        assert max(len(question), len(measured), len(published)) <= 250, question
        assert re.search(r'nats/char|bits/byte|accuracy|bytes/token|tok/s', measured), question
        assert re.search(r'\([^)]*\b(19|20)\d\d', published), question  # (who, year)
        assert command.startswith('`python '), question
