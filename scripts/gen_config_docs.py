"""Regenerate the options table at the end of docs/configuration.md from evald/config/options.py.

    .venv/bin/python scripts/gen_config_docs.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evald.config import default_of, flag_of, option_fields  # noqa: E402

MARKER = "## Options\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(f) -> str:
    kind = f.metadata["kind"]
    if kind in ("table", "suites"):
        return "see below"
    if kind == "device":
        return "`0`"
    if kind == "endpoint":
        return "`ipc:///tmp/evald-<uid>/" + ("notify.sock" if f.name == "endpoint" else "control.sock") + "`"
    value = default_of(f)
    return f"`{json.dumps(value) if kind == 'plugins' else value}`"


def table() -> str:
    rows = ["| option | environment | default | meaning |", "|---|---|---|---|"]
    tables = []
    for f in option_fields():
        flag = "--metric-plugin" if f.name == "metric_plugins" else flag_of(f)
        env = f.metadata.get("env")
        rows.append(f"| `{flag}` | {f'`{env}`' if env else ''} | {_default(f)} | {_cell(f.metadata['help'])} |")
        if f.metadata["kind"] in ("table", "suites"):
            tables.append(f)
    out = "\n".join(rows) + "\n"
    for f in tables:
        shorthand = getattr(f.metadata["table"], "SHORTHAND", None)
        title = f"[{f.name}.NAME]" if f.metadata["kind"] == "suites" else f"[{f.name}]"
        spelled = f"`{flag_of(f)} {shorthand.upper()}` or `{flag_of(f)} JSON`" if shorthand else f"`{flag_of(f)} JSON`"
        out += f"\n### `{title}` ({spelled})\n\n| key | default | meaning |\n|---|---|---|\n"
        for sub in fields(f.metadata["table"]):
            out += f"| `{sub.name}` | `{default_of(sub)}` | {_cell(sub.metadata['help'])} |\n"
    return out


def main() -> None:
    path = REPO / "docs" / "configuration.md"
    text = path.read_text()
    head = text[: text.index(MARKER) + len(MARKER)]
    path.write_text(head + "\n" + table())


if __name__ == "__main__":
    main()
