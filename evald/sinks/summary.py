"""The run summary, written once per run end: summary.json beside the ledger and one TensorBoard text.

The ledger remembers which run end was summarised, in the same transaction as the
summary's record and the decisions' final state, so a restart writes it again only
if the crash came before that transaction (summary.json is rewritten whole, atomically).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from evald.contracts import layout
from evald.contracts.wire import RunFinished
from evald.decisions.decisions import Decisions
from evald.ledger.ledger import Ledger, Record
from evald.sinks.summary_table import summary_markdown

log = logging.getLogger("evald")


def write_run_summary(ledger: Ledger, decisions: Decisions, run_dir: Path, run_id: str | None,
                      run_end: RunFinished, monitor: str) -> dict[str, Any] | None:
    """The summary of the run that ended with ``run_end``; None if it was written already."""
    if ledger.get_state("summarised") == [run_id, run_end.final_step]:
        return None
    late = decisions.stop_after_end(run_end.final_step, run_end.reason)
    summary = {"run_id": run_id, "final_step": run_end.final_step, "training_end_reason": run_end.reason,
               "monitor": monitor, "best_step": decisions.best_step, "best_value": decisions.best_value,
               "stopped_early": decisions.stop_at_step is not None and late is None, "checkpoints": ledger.counts(),
               "advisory_stop": decisions.advisory_stop or late}
    decisions.finish(summary)
    text = json.dumps(summary, indent=1)
    ledger.disk.retry("summary.json", lambda: layout.atomic_write_text(run_dir / "summary.json", text))
    ledger.add_records([Record("summary", run_end.final_step, time.time(), {},
                               {"evald/summary": summary_markdown(summary)})],
                       kv={"decisions": decisions.state_dict(), "summarised": [run_id, run_end.final_step]})
    log.info("run complete: %s", json.dumps(summary))
    return summary
