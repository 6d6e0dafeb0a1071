"""Regenerate the options table at the end of docs/configuration.md from evald/config.py.

    .venv/bin/python scripts/gen_config_docs.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evald.config import default_of, option_fields  # noqa: E402

MARKER = "## Options\n"


def table() -> str:
    rows = ["| option | environment | default | meaning |", "|---|---|---|---|"]
    for f in option_fields():
        flag = "--metric-plugin" if f.name == "metric_plugins" else "--" + f.name.replace("_", "-")
        default = default_of(f)
        if f.name in ("endpoint", "control_endpoint"):
            default = "ipc:///tmp/evald-<uid>/" + ("notify.sock" if f.name == "endpoint" else "control.sock")
        shown = json.dumps(default) if isinstance(default, (dict, tuple)) else default
        env = f.metadata.get("env")
        rows.append(f"| `{flag}` | {f'`{env}`' if env else ''} | `{shown}` | {f.metadata['help']} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    path = REPO / "docs" / "configuration.md"
    text = path.read_text()
    head = text[: text.index(MARKER) + len(MARKER)]
    path.write_text(head + "\n" + table())


if __name__ == "__main__":
    main()
