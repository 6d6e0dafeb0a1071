"""No unresolved merge-conflict markers in what users read (issue 27, item 16: docs/security.md held
``<<<<<<< HEAD`` ... ``>>>>>>> h19-hostile`` in its table of files read from others)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7}|>{7})( |$)|^={7}$", re.MULTILINE)   # git's conflict lines, whole


def _documents() -> list[Path]:
    found = [REPO / "README.md"]
    for folder in ("docs", "deploy"):
        found += sorted(p for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix in (".md", ".yaml", ".yml",
                                                                                            ".sh", ".service", ".toml"))
    return found


def test_no_document_holds_a_merge_conflict_marker():
    marked = []
    for path in _documents():
        text = path.read_text(encoding="utf-8", errors="replace")
        marked += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                   for m in MARKER.finditer(text)]
    assert marked == [], "unresolved merge conflict:\n" + "\n".join(marked)
