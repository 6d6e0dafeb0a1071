"""The run summary as TensorBoard's text tab shows it: a Markdown table (summary.json stays JSON)."""

from __future__ import annotations

import json
from typing import Any, Mapping

LABELS = {"run_id": "run", "final_step": "final step", "training_end_reason": "training ended",
          "monitor": "monitor", "best_step": "best step", "best_value": "best value",
          "stopped_early": "stopped early", "checkpoints": "checkpoints"}


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """``| | |`` rows in a fixed, readable order; unknown keys follow, so nothing is hidden."""
    rows = ["| field | value |", "|---|---|"]
    for key in [*[k for k in LABELS if k in summary], *sorted(k for k in summary if k not in LABELS)]:
        rows.append(f"| **{_cell(LABELS.get(key, key.replace('_', ' ')))}** | {_cell(_value(summary[key]))} |")
    return "\n".join(rows)


def _value(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_value(v)}" for k, v in value.items()) or "–"
    if isinstance(value, (list, tuple)):
        return ", ".join(_value(v) for v in value) or "–"
    return str(value) if isinstance(value, (str, int)) else json.dumps(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
