"""One evaluated suite cell's commit, whichever process evaluated it: the live loop (evald.daemon.suite_turn)
and a backfill fleet's worker, taken in by the merge (evald.daemon.fleet_merge), both call ``cell_commit``,
so the two commit the same records for the same result.

``cell_commit`` turns an ``EvaluatedCell`` into a ``CellCommit``: the cell's metrics (SUITE/TASK/METRIC); its
TensorBoard record at the checkpoint's step (those scalars; the bookkeeping points ``evald/suites/SUITE/``
evaluate_s, load_s, compiled_graphs and tokens_per_s; the text of a few documents per task and of the
identity); the Custom Scalars layout update when the cell brings metrics the layout does not cover; and the
provenance (the identity, its hash, the weights'). ``write_layout`` writes that update in its own
transaction before the cell's (writing it twice changes nothing, so a crash between the two loses nothing).
``write_cell_samples`` writes the cell's per-sample files, deterministic and atomic, before either.

May import: ledger, sinks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from evald.ledger.ledger import Ledger, Record
from evald.ledger.samples import SampleFileError, write_samples
from evald.sinks import tensorboard_layout

SAMPLES_SHOWN = 3          # documents per task in the TensorBoard text of a step
TIMING_SHOWN = ("evaluate_s", "load_s", "compiled_graphs")   # drawn as they are; tokens as tokens_per_s


class TaskOutcome(Protocol):
    """One task's result in a cell (evald.pipeline.suites.runner.TaskResult, a fleet file's checked task)."""

    @property
    def metrics(self) -> Mapping[str, float]: ...

    @property
    def samples(self) -> Sequence[Mapping[str, Any]]: ...


@dataclass(frozen=True)
class EvaluatedCell:
    """An evaluated suite cell: the suite's identity and its hash, its SUITE/TASK/METRIC values (``scalars``:
    its tasks' metrics), each task's metrics and per-sample records, what running it took (``timing``:
    evaluate_s, load_s, compiled_graphs, tokens; those known) and the provenance of the weights it ran on."""

    suite: str
    identity: Mapping[str, Any]
    identity_sha256: str
    scalars: Mapping[str, float]
    tasks: Mapping[str, TaskOutcome]       # task name -> its result, in the suite's order
    timing: Mapping[str, float]
    provenance: Mapping[str, Any]


@dataclass(frozen=True)
class CellCommit:
    """What the ledger commits for one evaluated cell (the module's docstring)."""

    metrics: dict[str, float]
    record: Record
    provenance: dict[str, Any]
    layout: tuple[Record, dict] | None      # the layout's record and state, when the cell's metrics are new to it

    @property
    def tokens_per_s(self) -> float | None:
        return next((v for k, v in self.record.scalars.items() if k.endswith("/tokens_per_s")), None)


def cell_commit(cell: EvaluatedCell, *, step: int, cell_identity: str, wall_time: float,
                layout_state: Any) -> CellCommit:
    """``cell``'s commit at ``step`` (``wall_time``: the checkpoint's commit time); ``layout_state``: the
    ledger's Custom Scalars layout state now (tensorboard_layout.LAYOUT_STATE)."""
    suite, scalars = cell.suite, {k: float(v) for k, v in cell.scalars.items()}
    timing = cell.timing
    bookkeeping = {f"evald/suites/{suite}/{key}": float(timing[key]) for key in TIMING_SHOWN if key in timing}
    if "tokens" in timing and "evaluate_s" in timing:
        bookkeeping[f"evald/suites/{suite}/tokens_per_s"] = timing["tokens"] / max(timing["evaluate_s"], 1e-9)
    digest = cell.identity_sha256
    texts = {f"{suite}/samples": samples_text(cell.tasks),
             f"evald/suites/{suite}/identity": f"suite identity `{digest[:12]}` (sha256 `{digest}`), cell "
                                               f"`{cell_identity}`, lm-eval {str(cell.identity.get('lm_eval'))[:64]}"}
    record = Record("eval", step, wall_time, {**scalars, **bookkeeping}, texts)
    return CellCommit(scalars, record, {**cell.provenance, "identity": dict(cell.identity), "identity_sha256": digest},
                      layout_update(layout_state, {f"eval/{k}": v for k, v in scalars.items()}, step, wall_time))


LayoutUpdate = tuple[Record, dict]      # the layout's record and its new state


def layout_update(state: Any, scalars: Mapping[str, float], step: int, wall_time: float) -> LayoutUpdate | None:
    """The Custom Scalars layout's record and state, once ``scalars`` (named as the layout's state names them,
    ``eval/SUITE/TASK/METRIC``) bring metrics it does not cover (a chart per suite); None when it covers them."""
    cover = tensorboard_layout.covered(state, scalars, (state or {}).get("monitor", "eval/loss"))
    if cover == state:
        return None
    return (Record(tensorboard_layout.LAYOUT_STREAM, step, wall_time, {},
                   {tensorboard_layout.LAYOUT_TAG: tensorboard_layout.layout_text(cover)}), cover)


def write_layout(ledger: Ledger, update: LayoutUpdate | None) -> None:
    """A layout update (``CellCommit.layout``), if any, in its own transaction (before the cell's)."""
    if update is not None:
        record, state = update
        ledger.add_records([record], kv={tensorboard_layout.LAYOUT_STATE: state})


class TaskFilesRefused(ValueError):
    """A task's per-sample files cannot be written (evald.ledger.samples refused its name or records)."""

    def __init__(self, task: str, cause: Exception) -> None:
        self.task, self.cause = task, cause
        super().__init__(f"task {task}: its per-sample files are refused ({cause})")


def write_cell_samples(run_dir: Path, cell: EvaluatedCell, *, step: int, cell_identity: str) -> dict[str, Path]:
    """Each task's per-sample files (evald.ledger.samples), before the cell's transaction; task -> its file.
    TaskFilesRefused for a task the files cannot hold."""
    written = {}
    for name, task in cell.tasks.items():
        try:
            written[name] = write_samples(run_dir, suite=cell.suite, task=name, step=step,
                                          identity=dict(cell.identity), identity_sha256=cell.identity_sha256,
                                          cell_identity=cell_identity, metrics=dict(task.metrics),
                                          samples=list(task.samples))
        except (SampleFileError, ValueError) as exc:
            raise TaskFilesRefused(name, exc) from exc
    return written


def samples_text(tasks: Mapping[str, TaskOutcome]) -> str:
    """A handful of documents per task, for TensorBoard's Text page: each task's documents as
    preformatted text (a target such as ``# flake8: noqa`` is not Markdown)."""
    parts = []
    for name, task in tasks.items():
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in task.metrics.items() if not k.endswith("_stderr"))
        parts.append(f"**{name}** ({len(task.samples)} documents; {metrics})")
        docs = [f"doc {sample['doc_id']}: target {str(sample['target'])[:80]!r}, resps {str(sample['resps'])[:200]}, "
                f"metrics {sample['metrics']}" for sample in task.samples[:SAMPLES_SHOWN]]
        if docs:
            parts.append(tensorboard_layout.preformatted("\n".join(docs)))
    return "\n\n".join(parts)
