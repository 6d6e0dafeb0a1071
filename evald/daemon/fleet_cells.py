"""A backfill fleet's hand-over files: one self-checking JSON file per finished cell, and the plan.

Workers on other hosts share only a filesystem with the run, and SQLite over a network filesystem
is unsafe (its locking is unreliable there), so a worker never opens the ledger: it writes each
finished cell as a file, atomically (temporary name, fsync, rename, fsync of the directory), and
``evald backfill --merge`` takes the files into the ledger exactly once (evald.daemon.fleet_merge).
A file carries the HMAC-SHA256 of its own body under the run's fleet key (evald.daemon.fleet_key), so a
torn file, an altered one, or one written by someone without the key is refused, never merged.

Layout (the fleet directory, ``--fleet-dir``)::

    plan.json                                   the cells the fleet covers, fixed by the first worker
    cells/SUITE/step_<STEP>.<CELL12>.json       one finished cell (evaluated or failed)
    workers/worker-<I>.<HOST>.<PID>.jsonl       each worker process's journal: loads and cells

The directory is shared, so whoever else can write it may put anything there. Every file of it is read
under the one rule (evald.contracts.safe_open, the fleet directory as the root: no link below it
followed, a FIFO never waited on, regular files only, bounded), and nesting is measured before a byte is
parsed (the per-sample files' measure, evald.ledger.samples); what a cell says is checked by
evald.daemon.fleet_check before the merge writes anything of it.

May import: contracts, the ledger's samples (its nesting measure), and the daemon's fleet_key.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import math
import os
import re
import secrets
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from evald.contracts.layout import atomic_write_bytes, fsync_dir
from evald.contracts.safe_open import UnsafeFile, kind_of, list_beneath, open_dir_beneath, read_beneath
from evald.daemon.fleet_key import FleetKey
from evald.ledger.samples import MAX_DEPTH as MAX_SAMPLE_DEPTH, nesting_depth

log = logging.getLogger("evald.fleet")

CELL_FORMAT = "evald-fleet-cell/2"     # 2: sealed with the run's fleet key (1: a plain sha256)
PLAN_FORMAT = "evald-fleet-plan/2"
SEAL = "hmac_sha256"
PLAN_FILE = "plan.json"
CELLS_DIR = "cells"
WORKERS_DIR = "workers"
MAX_CELL_BYTES = 256 << 20
MAX_PLAN_BYTES = 64 << 20          # a plan of a million checkpoints is ~100 MB less than this: plenty
MAX_JOURNAL_BYTES = 64 << 20
MAX_ENTRIES = 100_000               # entries of one directory of the fleet (suites, one suite's cells)
MAX_DEPTH = MAX_SAMPLE_DEPTH + 8    # a document's own nesting, in a cell's few levels around it
_CELL_NAME = re.compile(r"step_([0-9]{1,19})\.([0-9a-f]{12})\.json")
_JOURNAL_NAME = re.compile(r"worker-[0-9]{1,9}\..+\.[0-9]{1,10}\.jsonl")


class FleetFileError(ValueError):
    """A fleet file is missing, torn, altered or of another format; the message names it."""


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True).encode("utf-8")


def _atomic_bytes(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, payload)


def sealed(body: Mapping[str, Any], key: FleetKey) -> bytes:
    """``body`` with the HMAC-SHA256 of its canonical JSON under ``key``, as the bytes of a file."""
    return json.dumps({SEAL: key.seal(_canonical(body)), "body": body}, sort_keys=True, indent=1,
                      allow_nan=True).encode("utf-8")


def printable(text: str) -> str:
    """``text`` with what a terminal or log cannot show (an undecodable file name's escapes) spelled out."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def read_file(fleet_dir: Path, relative: str, limit: int, *, single_link: bool = True) -> bytes:
    """The bytes of ``fleet_dir/relative`` under the one rule (module docstring); FleetFileError otherwise."""
    shown = printable(str(Path(fleet_dir) / relative))
    try:
        data, _ = read_beneath(fleet_dir, relative, limit, single_link=single_link)
    except FileNotFoundError:
        raise FleetFileError(f"{shown} does not exist") from None
    except UnsafeFile as exc:
        raise FleetFileError(f"{printable(str(exc))}; not read") from None
    except OSError as exc:
        raise FleetFileError(f"{shown} cannot be read ({exc.strerror or exc})") from None
    return data


def parse(raw: bytes, shown: str) -> Any:
    """``raw`` as JSON: strict UTF-8, nested at most MAX_DEPTH deep (measured before parsing: json's
    decoder recurses once per level). NaN and Infinity are read; fleet_check refuses them where they are."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FleetFileError(f"{shown}: not UTF-8 ({exc.reason} at byte {exc.start}); remove it and rerun the "
                             f"worker that wrote it") from None
    if text.count("[") + text.count("{") > MAX_DEPTH and (depth := nesting_depth(text)) > MAX_DEPTH:
        raise FleetFileError(f"{shown}: nested {depth} levels deep, more than the {MAX_DEPTH} a fleet file may be "
                             f"(a worker writes a few); not a fleet file")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FleetFileError(f"{shown}: not JSON ({str(exc)[:200]}); remove it and rerun the worker that wrote "
                             f"it") from None


def unseal(raw: bytes, shown: str, expected_format: str, key: FleetKey) -> dict[str, Any]:
    """The body of a sealed file's bytes, its seal checked under ``key`` and its format (``shown`` names it)."""
    data = parse(raw, shown)
    if isinstance(data, dict) and isinstance(data.get("body"), dict) and isinstance(data.get("sha256"), str):
        raise FleetFileError(f"{shown}: sealed with a plain sha256 (an evald before the fleet key): anyone can "
                             f"recompute that, so it is not taken; rerun its worker with this evald")
    if not isinstance(data, dict) or not isinstance(data.get("body"), dict) or not isinstance(data.get(SEAL), str):
        raise FleetFileError(f"{shown}: not a sealed fleet file (expected {{{SEAL!r}, 'body'}})")
    body = data["body"]
    if not key.verifies(_canonical(body), data[SEAL]):
        raise FleetFileError(f"{shown}: its seal does not match the fleet's key ({key.where}): torn, altered, or "
                             f"written by someone who does not hold the key; not taken (rerun the worker that should "
                             f"have written it)")
    if body.get("format") != expected_format:
        raise FleetFileError(f"{shown}: format {str(body.get('format'))[:80]!r}, expected {expected_format!r}")
    return body


# ------------------------------------------------------------------------------------ the plan

SUITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")   # as a [suites.NAME] of evald's configuration
MAX_STEP = 2**63 - 1
MAX_INT = 2**63 - 1


def finite_number(value: Any) -> bool:
    """A JSON number the ledger and TensorBoard take: a finite float, or an integer within 64 bits (not a bool)."""
    if type(value) is int:
        return -MAX_INT <= value <= MAX_INT
    return type(value) is float and math.isfinite(value)


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

    @functools.cached_property
    def _cell_set(self) -> frozenset[tuple[str, int]]:
        return frozenset(self.cells())

    def has_cell(self, suite: str, step: int) -> bool:
        return (suite, step) in self._cell_set

    def share(self, index: int, count: int) -> list[Snapshot]:
        """Worker ``index`` of ``count``: every count-th snapshot from its index, so the shares are
        disjoint, cover the plan, and each snapshot (with all its cells) goes to one worker."""
        return [s for position, s in enumerate(self.snapshots) if position % count == index]


def publish_plan(fleet_dir: Path, plan: Plan, key: FleetKey) -> Plan:
    """Write ``plan`` as the fleet's plan unless one exists (first writer wins, by a hard link that
    fails if the name exists, so two workers starting at once agree); the fleet's plan."""
    body = {"format": PLAN_FORMAT, "suites": list(plan.suites), "created_at": time.time(),
            "snapshots": [{"step": s.step, "source": s.source, "kind": s.kind, "commit_time": s.commit_time,
                           "suites": list(s.suites)} for s in plan.snapshots]}
    fleet_dir.mkdir(parents=True, exist_ok=True)
    target = fleet_dir / PLAN_FILE
    if not plan_exists(fleet_dir):
        tmp = fleet_dir / f".{PLAN_FILE}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        _atomic_bytes(tmp, sealed(body, key))
        try:
            os.link(tmp, target)
            fsync_dir(fleet_dir)
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return read_plan(fleet_dir, key)


def plan_exists(fleet_dir: Path) -> bool:
    """Whether anything is at the plan's name (a link or FIFO there too: read_plan then says what it is)."""
    return os.path.lexists(Path(fleet_dir) / PLAN_FILE)


def read_plan(fleet_dir: Path, key: FleetKey) -> Plan:
    """The fleet's plan, every field checked (FleetFileError naming the file and the field)."""
    shown = printable(str(Path(fleet_dir) / PLAN_FILE))
    # a second name for a moment: publish_plan links its temporary to plan.json, then removes the temporary
    body = unseal(read_file(fleet_dir, PLAN_FILE, MAX_PLAN_BYTES, single_link=False), shown, PLAN_FORMAT, key)
    suites, snapshots = body.get("suites"), body.get("snapshots")
    if not isinstance(suites, list) or not suites or not all(isinstance(x, str) and SUITE_NAME.fullmatch(x)
                                                             for x in suites) or len(set(suites)) != len(suites):
        raise FleetFileError(f"{shown}: 'suites' must be a list of distinct suite names (letters, digits, _ and -), "
                             f"got {json.dumps(suites)[:200]}")
    if not isinstance(snapshots, list):
        raise FleetFileError(f"{shown}: 'snapshots' must be a list, got {type(snapshots).__name__}")
    out, seen = [], set()
    for n, s in enumerate(snapshots):
        where = f"{shown}: snapshots[{n}]"
        if not isinstance(s, dict):
            raise FleetFileError(f"{where} must be an object")
        step, source, kind, commit_time, cells = (s.get(k) for k in ("step", "source", "kind", "commit_time",
                                                                     "suites"))
        if type(step) is not int or not 0 <= step <= MAX_STEP or step in seen:
            raise FleetFileError(f"{where}: 'step' must be a distinct whole number in [0, 2**63), got "
                                 f"{json.dumps(step)[:80]}")
        if not isinstance(source, str) or not isinstance(kind, str) or len(source) > 4096 or len(kind) > 64:
            raise FleetFileError(f"{where}: 'source' and 'kind' must be strings (at most 4096 and 64 characters)")
        if commit_time is not None and not finite_number(commit_time):
            raise FleetFileError(f"{where}: 'commit_time' must be a finite number or null, got "
                                 f"{json.dumps(commit_time)[:80]}")
        if not isinstance(cells, list) or not cells or not all(isinstance(x, str) and x in suites for x in cells):
            raise FleetFileError(f"{where}: 'suites' must be a non-empty list of the plan's suites, got "
                                 f"{json.dumps(cells)[:200]}")
        seen.add(step)
        out.append(Snapshot(step, source, kind, None if commit_time is None else float(commit_time),
                            tuple(dict.fromkeys(cells))))
    return Plan(tuple(suites), tuple(out))


# ------------------------------------------------------------------------------------ cells

def cell_relative(suite: str, step: int, cell_identity: str) -> str:
    return f"{CELLS_DIR}/{suite}/step_{int(step)}.{cell_identity[:12]}.json"


def cell_path(fleet_dir: Path, suite: str, step: int, cell_identity: str) -> Path:
    return Path(fleet_dir) / cell_relative(suite, step, cell_identity)


def write_cell(fleet_dir: Path, body: Mapping[str, Any], key: FleetKey) -> Path:
    """One finished cell (keys: suite, step, cell_identity, state, ...), atomically; never through a link
    someone put at its suite's directory."""
    suite = body["suite"]
    path = cell_path(fleet_dir, suite, int(body["step"]), body["cell_identity"])
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(open_dir_beneath(fleet_dir, f"{CELLS_DIR}/{suite}"))
    except UnsafeFile as exc:
        raise FleetFileError(f"{exc}: a cell is not written there") from None
    atomic_write_bytes(path, sealed({"format": CELL_FORMAT, **body}, key))
    return path


def read_cell(fleet_dir: Path, relative: str, key: FleetKey) -> dict[str, Any]:
    """The body of the cell file ``fleet_dir/relative`` (``cells/SUITE/step_<STEP>.<CELL12>.json``), its seal
    checked and its name matching its suite, step and cell identity. What it says is fleet_check's."""
    shown = printable(str(Path(fleet_dir) / relative))
    body = unseal(read_file(fleet_dir, relative, MAX_CELL_BYTES), shown, CELL_FORMAT, key)
    folder, _, name = relative.rpartition("/")
    match = _CELL_NAME.fullmatch(name)
    identity = body.get("cell_identity")
    if (match is None or body.get("step") != int(match.group(1)) or not isinstance(identity, str)
            or not identity.startswith(match.group(2)) or folder != f"{CELLS_DIR}/{body.get('suite')}"):
        raise FleetFileError(f"{shown}: its name does not match its content (suite {str(body.get('suite'))[:80]!r}, "
                             f"step {str(body.get('step'))[:40]}); a fleet file must not be renamed or moved")
    return body


def cell_done(fleet_dir: Path, suite: str, step: int, cell_identity: str, key: FleetKey) -> bool:
    """Whether a valid file of this cell exists (a torn one is evaluated again and replaced)."""
    try:
        read_cell(fleet_dir, cell_relative(suite, step, cell_identity), key)
    except FleetFileError:
        return False
    return True


@dataclass
class CellScan:
    """The fleet directory's cell files (relative paths, sorted) and the entries that are not (what each is)."""

    cells: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)


def scan_cells(fleet_dir: Path) -> CellScan:
    """Every cell file under ``cells/``, listed without following a link; a link, FIFO, device or other
    non-regular entry where a suite's directory or a cell belongs, or a name that is no cell's, is reported."""
    scan = CellScan()
    suites = _listed(fleet_dir, CELLS_DIR, scan)
    for entry in suites or ():
        folder = f"{CELLS_DIR}/{entry.name}"
        shown = printable(str(Path(fleet_dir) / folder))
        if not entry.is_dir:
            scan.bad.append(f"{shown} is {kind_of(entry.mode)}, not a suite's directory of cells; not read")
            continue
        for cell in _listed(fleet_dir, folder, scan) or ():
            if cell.name.startswith("."):     # a worker's temporary (atomic_write_bytes), or the filesystem's
                continue
            where = printable(str(Path(fleet_dir) / folder / cell.name))
            if _CELL_NAME.fullmatch(cell.name) is None:
                scan.bad.append(f"{where}: not a cell file's name (step_<STEP>.<CELL12>.json); not read")
            elif not stat.S_ISREG(cell.mode):
                scan.bad.append(f"{where} is {kind_of(cell.mode)}, not a regular file; not read")
            else:
                scan.cells.append(f"{folder}/{cell.name}")
    return scan


def _listed(fleet_dir: Path, relative: str, scan: CellScan):
    try:
        return list_beneath(fleet_dir, relative, MAX_ENTRIES)
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:
        scan.bad.append(f"{printable(str(exc))}; not read")
    except OSError as exc:
        scan.bad.append(f"{printable(str(Path(fleet_dir) / relative))} cannot be listed ({exc.strerror or exc})")
    return None


def cell_files(fleet_dir: Path) -> list[Path]:
    """The paths of the fleet's cell files (scan_cells; what is not a cell file left out)."""
    return [Path(fleet_dir) / relative for relative in scan_cells(fleet_dir).cells]


# ------------------------------------------------------------------------------------ journals

class Journal:
    """This worker process's own append-only journal (one file per process: appends from several
    hosts to one file are not atomic on a network filesystem)."""

    def __init__(self, fleet_dir: Path, index: int) -> None:
        self.fleet_dir = Path(fleet_dir)
        self.name = f"worker-{index}.{socket.gethostname()}.{os.getpid()}.jsonl"
        self.path = self.fleet_dir / WORKERS_DIR / self.name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.index = index

    def note(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "worker": self.index, "pid": os.getpid(), "time": time.time(), **fields})
        try:    # never through a link, never waiting on a FIFO someone put at its name
            folder = open_dir_beneath(self.fleet_dir, WORKERS_DIR)
            try:
                fd = os.open(self.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                             | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=folder)
            finally:
                os.close(folder)
        except (UnsafeFile, OSError) as exc:
            why = "a link or FIFO is at its name" if isinstance(exc, OSError) and exc.errno in (
                errno.ELOOP, errno.ENXIO) else str(exc)
            raise FleetFileError(f"{printable(str(self.path))}: this worker's journal cannot be written ({why})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise FleetFileError(f"{printable(str(self.path))}: this worker's journal is not a regular file")
            os.write(fd, (line + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)


def journal_events(fleet_dir: Path) -> list[dict[str, Any]]:
    """Every journal line of every worker process (torn last lines skipped), each file read under the one
    rule: a link, FIFO or other non-regular entry is skipped with a warning."""
    try:
        entries = list_beneath(fleet_dir, WORKERS_DIR, MAX_ENTRIES)
    except FileNotFoundError:
        return []
    except (UnsafeFile, OSError) as exc:
        log.warning("the workers' journals are not read: %s", printable(str(exc)))
        return []
    events = []
    for entry in entries:
        if _JOURNAL_NAME.fullmatch(entry.name) is None:
            continue
        try:
            raw = read_file(fleet_dir, f"{WORKERS_DIR}/{entry.name}", MAX_JOURNAL_BYTES)
        except FleetFileError as exc:
            log.warning("%s", exc)
            continue
        for line in raw.decode("utf-8", "replace").splitlines():
            with contextlib.suppress(ValueError, RecursionError):
                if len(line) <= 1 << 20 and nesting_depth(line) <= MAX_DEPTH:
                    event = json.loads(line)
                    if isinstance(event, dict):
                        events.append(event)
    return events
