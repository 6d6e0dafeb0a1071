"""A backfill fleet's hand-over files: one self-checking JSON file per finished cell, and the plan.

Workers on other hosts share only a filesystem with the run, and SQLite over a network filesystem
is unsafe (its locking is unreliable there), so a worker never opens the ledger: it writes each
finished cell as a file, atomically (temporary name, fsync, rename, fsync of the directory), and
``evald backfill --merge`` takes the files into the ledger exactly once (evald.daemon.fleet_merge).
A file carries the sha256 of its own body, so a torn or altered file is refused, never merged.

Layout (the fleet directory, ``--fleet-dir``)::

    plan.json                                   the cells the fleet covers, fixed by the first worker
    cells/SUITE/step_<STEP>.<CELL12>.json       one finished cell (evaluated or failed)
    workers/worker-<I>.<HOST>.<PID>.jsonl       each worker process's journal: loads and cells

May import: contracts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from evald.contracts.layout import atomic_write_bytes, fsync_dir

CELL_FORMAT = "evald-fleet-cell/1"
PLAN_FORMAT = "evald-fleet-plan/1"
PLAN_FILE = "plan.json"
CELLS_DIR = "cells"
WORKERS_DIR = "workers"
MAX_CELL_BYTES = 256 << 20
_CELL_NAME = re.compile(r"step_(\d{1,19})\.([0-9a-f]{12})\.json")


class FleetFileError(ValueError):
    """A fleet file is missing, torn, altered or of another format; the message names it."""


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True).encode("utf-8")


def _atomic_bytes(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, payload)


def sealed(body: Mapping[str, Any]) -> bytes:
    """``body`` with the sha256 of its canonical JSON, as the bytes of a file."""
    return json.dumps({"sha256": hashlib.sha256(_canonical(body)).hexdigest(), "body": body}, sort_keys=True,
                      indent=1, allow_nan=True).encode("utf-8")


def unseal(path: Path, expected_format: str) -> dict[str, Any]:
    """The body of a sealed file, its hash and format checked."""
    try:
        if path.stat().st_size > MAX_CELL_BYTES:
            raise FleetFileError(f"{path}: larger than {MAX_CELL_BYTES} bytes; not a fleet file")
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise FleetFileError(f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise FleetFileError(f"{path}: unreadable or not JSON ({exc}); remove it and rerun the worker that "
                             f"wrote it") from None
    if not isinstance(data, dict) or not isinstance(data.get("body"), dict) or not isinstance(data.get("sha256"), str):
        raise FleetFileError(f"{path}: not a sealed fleet file (expected {{'sha256', 'body'}})")
    body = data["body"]
    if hashlib.sha256(_canonical(body)).hexdigest() != data["sha256"]:
        raise FleetFileError(f"{path}: its content does not match its sha256 (torn or altered); remove it and "
                             f"rerun the worker that wrote it")
    if body.get("format") != expected_format:
        raise FleetFileError(f"{path}: format {body.get('format')!r}, expected {expected_format!r}")
    return body


# ------------------------------------------------------------------------------------ the plan

@dataclass(frozen=True)
class Snapshot:
    """One retained checkpoint the fleet evaluates, and the suites it lacks."""

    step: int
    source: str
    kind: str
    commit_time: float | None
    suites: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    suites: tuple[str, ...]
    snapshots: tuple[Snapshot, ...]     # by step

    def cells(self) -> list[tuple[str, int]]:
        return [(suite, s.step) for s in self.snapshots for suite in s.suites]

    def share(self, index: int, count: int) -> list[Snapshot]:
        """Worker ``index`` of ``count``: every count-th snapshot from its index, so the shares are
        disjoint, cover the plan, and each snapshot (with all its cells) goes to one worker."""
        return [s for position, s in enumerate(self.snapshots) if position % count == index]


def publish_plan(fleet_dir: Path, plan: Plan) -> Plan:
    """Write ``plan`` as the fleet's plan unless one exists (first writer wins, by a hard link that
    fails if the name exists, so two workers starting at once agree); the fleet's plan."""
    body = {"format": PLAN_FORMAT, "suites": list(plan.suites), "created_at": time.time(),
            "snapshots": [{"step": s.step, "source": s.source, "kind": s.kind, "commit_time": s.commit_time,
                           "suites": list(s.suites)} for s in plan.snapshots]}
    fleet_dir.mkdir(parents=True, exist_ok=True)
    target = fleet_dir / PLAN_FILE
    if not target.exists():
        tmp = fleet_dir / f".{PLAN_FILE}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        _atomic_bytes(tmp, sealed(body))
        try:
            os.link(tmp, target)
            fsync_dir(fleet_dir)
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return read_plan(fleet_dir)


def read_plan(fleet_dir: Path) -> Plan:
    body = unseal(fleet_dir / PLAN_FILE, PLAN_FORMAT)
    try:
        snapshots = tuple(Snapshot(int(s["step"]), str(s["source"]), str(s["kind"]),
                                   None if s["commit_time"] is None else float(s["commit_time"]),
                                   tuple(str(x) for x in s["suites"])) for s in body["snapshots"])
        return Plan(tuple(str(x) for x in body["suites"]), snapshots)
    except (KeyError, TypeError, ValueError) as exc:
        raise FleetFileError(f"{fleet_dir / PLAN_FILE}: malformed plan ({exc!r})") from None


# ------------------------------------------------------------------------------------ cells

def cell_path(fleet_dir: Path, suite: str, step: int, cell_identity: str) -> Path:
    return fleet_dir / CELLS_DIR / suite / f"step_{step}.{cell_identity[:12]}.json"


def write_cell(fleet_dir: Path, body: Mapping[str, Any]) -> Path:
    """One finished cell (keys: suite, step, cell_identity, state, ...), atomically."""
    path = cell_path(fleet_dir, body["suite"], int(body["step"]), body["cell_identity"])
    _atomic_bytes(path, sealed({"format": CELL_FORMAT, **body}))
    return path


def read_cell(path: Path) -> dict[str, Any]:
    body = unseal(path, CELL_FORMAT)
    match = _CELL_NAME.fullmatch(path.name)
    if (match is None or int(match.group(1)) != body.get("step") or not str(body.get("cell_identity", ""))
            .startswith(match.group(2)) or path.parent.name != body.get("suite")):
        raise FleetFileError(f"{path}: its name does not match its content (suite {body.get('suite')!r}, step "
                             f"{body.get('step')!r}); a fleet file must not be renamed or moved")
    return body


def cell_done(fleet_dir: Path, suite: str, step: int, cell_identity: str) -> bool:
    """Whether a valid file of this cell exists (a torn one is evaluated again and replaced)."""
    try:
        read_cell(cell_path(fleet_dir, suite, step, cell_identity))
    except FleetFileError:
        return False
    return True


def cell_files(fleet_dir: Path) -> list[Path]:
    root = fleet_dir / CELLS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("*/step_*.json") if _CELL_NAME.fullmatch(p.name))


# ------------------------------------------------------------------------------------ journals

class Journal:
    """This worker process's own append-only journal (one file per process: appends from several
    hosts to one file are not atomic on a network filesystem)."""

    def __init__(self, fleet_dir: Path, index: int) -> None:
        self.path = fleet_dir / WORKERS_DIR / f"worker-{index}.{socket.gethostname()}.{os.getpid()}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.index = index

    def note(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "worker": self.index, "pid": os.getpid(), "time": time.time(), **fields})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def journal_events(fleet_dir: Path) -> list[dict[str, Any]]:
    """Every journal line of every worker process (torn last lines skipped)."""
    events = []
    for path in sorted((fleet_dir / WORKERS_DIR).glob("worker-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events
