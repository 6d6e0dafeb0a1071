"""A backfill fleet's cell checked before the merge writes anything of it: what its body says, against the
fleet's plan and the suite's own identity, and every value of the kind and within the bounds that the
run's ledger, its per-sample files and TensorBoard take.

The fleet directory is input (docs/security.md, "Who may write which directory"): a cell names a suite,
a step and tasks that become paths in the run directory, and metrics that become the run's numbers. So a
cell is taken only when

* its suite is one of the plan's and its step a cell of the plan for that suite (the plan lists retained
  checkpoints of the run's ledger; evald.daemon.fleet_merge checks that the ledger still has the step);
* its identity hashes to its ``identity_sha256``, names its suite, and begins its ``cell_identity``; its
  tasks are exactly the identity's tasks, each a plain name (never a path: no ``/``, ``..``, NUL or
  control character);
* every number anywhere in it is finite and every integer within 64 bits, every string encodable as
  UTF-8 (no lone surrogate), every metric a number (not a string or a bool), its scalars exactly its
  tasks' metrics, and its per-sample records what evald.ledger.samples would read back (samples_of).

Each refusal is a :class:`CellError` naming the file and the field. This module only validates: what a
cell commits is evald.daemon.cell_commit's, the same as for a cell the live daemon evaluates.

May import: contracts, ledger, and the daemon's fleet_cells.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from evald.daemon.fleet_cells import SUITE_NAME, FleetFileError, Plan, finite_number
from evald.ledger.ledger import DELETED, EVALUATED, FAILED
from evald.ledger.samples import MAX_DOCUMENTS, MAX_SIDECAR_METRICS, SampleFileError, identity_digest, samples_of

MAX_NAME = 200                 # characters of a task or metric name
MAX_TASKS = 4096
MAX_TEXT = 4 << 20             # the samples' TensorBoard text (a few documents a task)
MAX_REASON = 64 << 10          # a failed cell's reason
_CELL_IDENTITY = re.compile(r"([0-9a-f]{64})\.[0-9a-f]{16}")   # the suite identity's hash . the network's
_HASH = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
TIMING = ("evaluate_s", "load_s", "compiled_graphs", "tokens")


class CellError(FleetFileError):
    """A cell file that says something the run cannot take; the message names the file and the field."""


@dataclass(frozen=True)
class TaskCell:
    name: str
    metrics: dict[str, float]
    samples: list[dict]


@dataclass(frozen=True)
class CheckedCell:
    """A cell's body once checked: only these values reach the run directory and the ledger."""

    suite: str
    step: int
    cell_identity: str
    state: str
    commit_time: float | None
    reason: str | None = None                       # failed or deleted
    identity: dict | None = None                    # evaluated: the suite's identity, its hash, its tasks ...
    identity_sha256: str | None = None
    tasks: tuple[TaskCell, ...] = ()
    scalars: dict[str, float] | None = None         # SUITE/TASK/METRIC
    timing: dict[str, float] | None = None
    samples_text: str = ""
    provenance: dict | None = None

    @property
    def lm_eval(self) -> str:
        return str((self.identity or {}).get("lm_eval"))[:64]


def check_cell(body: Mapping[str, Any], where: str, plan: Plan) -> CheckedCell:
    """``body`` (a cell file's, as fleet_cells.read_cell gives it) checked against ``plan`` (module docstring);
    CellError naming ``where`` and the field."""
    _plain_values(body, where)
    suite, step, cell_identity, state = (body.get(k) for k in ("suite", "step", "cell_identity", "state"))
    if not isinstance(suite, str) or not SUITE_NAME.fullmatch(suite) or suite not in plan.suites:
        raise CellError(f"{where}: 'suite' {_shown(suite)} is not one of the plan's suites ({', '.join(plan.suites)})")
    if type(step) is not int or not plan.has_cell(suite, step):
        raise CellError(f"{where}: 'step' {_shown(step)} is not a step the plan has for suite {suite} (a fleet "
                        f"evaluates the plan's retained checkpoints only)")
    if not isinstance(cell_identity, str) or not _CELL_IDENTITY.fullmatch(cell_identity):
        raise CellError(f"{where}: 'cell_identity' {_shown(cell_identity)} is not a cell identity (64 hex digits, "
                        f"'.', 16 hex digits)")
    if state not in (EVALUATED, FAILED, DELETED):
        raise CellError(f"{where}: 'state' {_shown(state)} is not evaluated, failed or deleted")
    commit_time = body.get("commit_time")
    if commit_time is not None and not finite_number(commit_time):
        raise CellError(f"{where}: 'commit_time' {_shown(commit_time)} is not a finite number or null")
    commit_time = None if commit_time is None else float(commit_time)
    if state != EVALUATED:
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
            raise CellError(f"{where}: 'reason' must be a string of at most {MAX_REASON} characters")
        return CheckedCell(suite, step, cell_identity, state, commit_time, reason=reason or "failed in a fleet worker")
    identity, digest = body.get("identity"), body.get("identity_sha256")
    if not isinstance(identity, dict) or not isinstance(digest, str) or not _HASH.fullmatch(digest):
        raise CellError(f"{where}: 'identity' must be an object and 'identity_sha256' 64 lowercase hex digits")
    if identity_digest(identity) != digest:
        raise CellError(f"{where}: 'identity' hashes to {identity_digest(identity)[:12]}, not the identity_sha256 it "
                        f"states ({digest[:12]}): edited or damaged after the worker wrote it")
    if identity.get("suite") != suite or not cell_identity.startswith(digest + "."):
        raise CellError(f"{where}: 'identity' is suite {_shown(identity.get('suite'))}'s and its hash begins the "
                        f"cell identity only when it is this cell's ({suite}, {cell_identity[:12]})")
    tasks = _tasks(body.get("tasks"), identity.get("tasks"), where)
    scalars = {f"{suite}/{task.name}/{name}": value for task in tasks for name, value in task.metrics.items()}
    given = body.get("scalars", scalars)
    if given != scalars:
        differ = (f"names {_shown(sorted(set(given) ^ set(scalars)))}" if isinstance(given, dict) and set(given) !=
                  set(scalars) else "values differ" if isinstance(given, dict) else f"not an object: {_shown(given)}")
        raise CellError(f"{where}: 'scalars' are not its tasks' metrics (SUITE/TASK/METRIC): {differ}")
    timing = body.get("timing") or {}
    if not isinstance(timing, dict) or not all(finite_number(timing[k]) and timing[k] >= 0 for k in TIMING
                                               if k in timing):
        raise CellError(f"{where}: 'timing' must be an object of finite non-negative numbers ({', '.join(TIMING)})")
    text, provenance = body.get("samples_text", ""), body.get("provenance") or {}
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise CellError(f"{where}: 'samples_text' must be a string of at most {MAX_TEXT} characters")
    if not isinstance(provenance, dict):
        raise CellError(f"{where}: 'provenance' must be an object, got {type(provenance).__name__}")
    return CheckedCell(suite, step, cell_identity, state, commit_time, identity=identity, identity_sha256=digest,
                       tasks=tasks, scalars={k: float(v) for k, v in scalars.items()},
                       timing={k: float(timing[k]) for k in TIMING if k in timing}, samples_text=text,
                       provenance=provenance)


def task_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a task's name (it becomes a directory: samples/SUITE/TASK), or None."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    if "/" in name or "\\" in name or name in (".", "..") or name.startswith(".") or _CONTROL.search(name):
        return "is not a plain name (no '/', '\\', leading '.', '..' or control character): it names a directory"
    return None


def _tasks(tasks: Any, identified: Any, where: str) -> tuple[TaskCell, ...]:
    if not isinstance(identified, dict) or not identified or len(identified) > MAX_TASKS:
        raise CellError(f"{where}: 'identity.tasks' must be an object of 1 to {MAX_TASKS} tasks")
    for name in identified:
        if (problem := task_name_problem(name)) is not None:
            raise CellError(f"{where}: task name {_shown(name)} in 'identity.tasks' {problem}")
    if not isinstance(tasks, dict) or set(tasks) != set(identified):
        have = set(tasks) if isinstance(tasks, dict) else set()
        raise CellError(f"{where}: 'tasks' must be exactly the suite identity's tasks {_shown(sorted(identified))}; "
                        f"extra {_shown(sorted(have - set(identified)))}, missing {_shown(sorted(set(identified) - have))}")
    out = []
    for name in sorted(tasks):
        result, field = tasks[name], f"tasks[{name!r}]"
        if not isinstance(result, dict) or not isinstance(result.get("metrics"), dict) \
                or not isinstance(result.get("samples"), list):
            raise CellError(f"{where}: {field} must be an object with 'metrics' (an object) and 'samples' (a list)")
        metrics, samples = result["metrics"], result["samples"]
        if not metrics or len(metrics) > MAX_SIDECAR_METRICS or len(samples) > MAX_DOCUMENTS:
            raise CellError(f"{where}: {field} has {len(metrics)} metric(s) and {len(samples)} document(s): 1 to "
                            f"{MAX_SIDECAR_METRICS} metrics and at most {MAX_DOCUMENTS} documents")
        for metric, value in metrics.items():
            if not metric or len(metric) > MAX_NAME or _CONTROL.search(metric):
                raise CellError(f"{where}: {field}.metrics: the name {_shown(metric)} is empty, longer than {MAX_NAME} "
                                f"characters or has a control character")
            if not finite_number(value):
                raise CellError(f"{where}: {field}.metrics[{metric!r}] is {_shown(value)}, not a finite number")
        if not all(isinstance(sample, dict) for sample in samples):
            raise CellError(f"{where}: {field}.samples must be a list of objects (one per document)")
        try:
            samples_of(samples, Path(where))
        except SampleFileError as exc:
            raise CellError(f"{where}: {field}.samples: {str(exc).removeprefix(where).lstrip(': ')}") from None
        out.append(TaskCell(name, {k: float(v) for k, v in metrics.items()}, samples))
    return tuple(out)


def _plain_values(body: Any, where: str) -> None:
    """Every value anywhere in ``body`` is one the ledger stores as strict JSON and a UTF-8 file can hold:
    finite numbers, integers within 64 bits, strings (keys too) without a lone surrogate."""
    stack: list[tuple[Any, tuple]] = [(body, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not _encodable(key):
                    raise CellError(f"{where}: a key in {_field(path)} is not encodable as UTF-8 (a lone surrogate)")
                stack.append((item, (path, key)))
        elif isinstance(value, list):
            stack.extend((item, (path, n)) for n, item in enumerate(value))
        elif isinstance(value, str):
            if not _encodable(value):
                raise CellError(f"{where}: {_field(path)} is not encodable as UTF-8 (a lone surrogate)")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and not finite_number(value):
            what = "an integer beyond 64 bits" if isinstance(value, int) else f"{value}, not a finite number"
            raise CellError(f"{where}: {_field(path)} is {what}")


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _field(path: tuple) -> str:
    keys = []
    while path:
        path, key = path
        keys.append(key)
    if not keys:
        return "the body"
    keys.reverse()
    return _shown(keys[0])[1:-1] + "".join(f"[{k}]" if isinstance(k, int) else f"[{_shown(k)}]" for k in keys[1:])


def _shown(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 120 else text[:120] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
