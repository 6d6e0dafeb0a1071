"""The snippets of a docs page: its fenced blocks, the Python files it names (``# mypkg/x.py`` as a block's
first line), and its ``evald`` command lines; for the tests that check and run docs/mindformers.md."""

from __future__ import annotations

import re
import shlex
from pathlib import Path


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block."""
    return [(m.group(1).strip().lower(), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def python_files(text: str) -> dict[str, str]:
    """The Python blocks that open with ``# path/to/file.py``: {path: code}."""
    found = {}
    for language, code in blocks(text):
        first = code.splitlines()[0] if code else ""
        match = re.fullmatch(r"# ([\w/]+\.py)", first.strip())
        if language == "python" and match:
            found[match.group(1)] = code
    return found


def evald_commands(text: str) -> list[list[str]]:
    commands = []
    for language, code in blocks(text):
        if language not in ("bash", "sh", "console"):
            continue
        for line in code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "evald":
                commands.append(words[1:])
    return commands


def write_python_files(text: str, root: Path, under: str = "") -> list[str]:
    """Write the page's named Python files (those under ``under``) into ``root``, as the page names them."""
    written = []
    for path, code in python_files(text).items():
        if path.startswith(under):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(code)
            written.append(path)
    return written


def run_python_file(text: str, path: str) -> dict:
    """The namespace of the page's Python file ``path``, run as it stands (the page's own snippet)."""
    namespace: dict = {}
    exec(python_files(text)[path], namespace)  # noqa: S102 - the page's own snippet
    return namespace
