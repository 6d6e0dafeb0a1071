"""Issue 37, item 9: the docs have an index, and the README's table lists each page once.

docs/ was one flat list of 14 files, the README's "Where to read next" table listed serving.md twice
and performance.md not at all. docs/README.md groups every page by what a user wants to do, each page
exactly once; the README's table names each page once, every docs page among them, and points to the
index. Every link of the index leads to a file that exists.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
INDEX = DOCS / "README.md"


def _pages() -> set[str]:
    return {p.name for p in DOCS.glob("*.md") if p.name != INDEX.name}


def _index_links() -> list[str]:
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", INDEX.read_text())


def _readme_table() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Where to read next", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def test_every_docs_page_is_in_the_index_exactly_once():
    counted = Counter(Path(link).name for link in _index_links() if not link.startswith(("../", "http")))
    assert {page: n for page, n in counted.items() if n != 1} == {}
    assert set(counted) == _pages(), (sorted(_pages() - set(counted)), sorted(set(counted) - _pages()))


def test_the_index_is_grouped_and_its_links_lead_somewhere():
    headings = re.findall(r"^## (.+)$", INDEX.read_text(), re.M)
    assert headings == ["Start", "Train with evald", "Evaluate at scale", "Benchmarks", "Serve",
                        "Operate and troubleshoot", "Security", "Reference"]
    for link in _index_links():
        assert (DOCS / link).resolve().exists(), link


def test_the_readmes_table_names_each_page_once_and_points_to_the_index():
    listed = _readme_table()
    assert [name for name, n in Counter(listed).items() if n > 1] == []
    assert {Path(name).name for name in listed if name.startswith("docs/")} == _pages()
    assert all((REPO / name).exists() for name in listed), listed
    assert "(docs/README.md)" in (REPO / "README.md").read_text().split("## Where to read next", 1)[1]
