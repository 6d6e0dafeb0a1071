"""Continuing a run that an evald of the flat layout served (evald 0.2 and older).

Then the ledger, the event files and the JSON files sat directly in the log
directory: ``CKPT_DIR/evald/`` by default, or the top of ``--logdir``. When a run
directory has no ledger yet and such a flat ledger exists for the same checkpoint
directory, it is copied (with sqlite's backup API, so a ledger left by a crash copies
whole) into the run directory, and every TensorBoard record of its outbox is marked
unwritten, so the run directory gets the whole history in the new layout: one point
per step, as before. The old event files are left as they were and stay readable
(``tensorboard --logdir`` on the old directory). Nothing in the checkpoint directory
is changed; a flat ledger at the top of the log directory is renamed
``ledger.sqlite.migrated`` so that no other run takes it for its own.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from pathlib import Path

from evald.contracts import layout
from evald.run_dir import LEDGER_FILE, RunDir

log = logging.getLogger("evald")

LEGACY_SUBDIR = layout.EVALD_SUBDIR  # the flat default of evald 0.2: CKPT_DIR/evald
CARRIED_FILES = ("summary.json", "subset.json", "best.json")


def migrate_flat_ledger(run: RunDir) -> Path | None:
    """Copy a flat ledger of this checkpoint directory into ``run``; returns where it came from."""
    if run.ledger.exists():
        return None
    for flat in (run.logdir / LEDGER_FILE, run.ckpt_dir / LEGACY_SUBDIR / LEDGER_FILE):
        if not flat.exists():
            continue
        if flat.parent == run.logdir and not _serves(flat, run.ckpt_dir):
            log.warning("%s is the flat ledger of another checkpoint directory (none of its files is in %s); "
                        "left alone", flat, run.ckpt_dir)
            continue
        _copy_for_reemission(flat, run.ledger)
        for name in CARRIED_FILES:
            if (flat.parent / name).exists() and not (run.path / name).exists():
                shutil.copyfile(flat.parent / name, run.path / name)
        if flat.parent == run.logdir:  # evald's own log directory: mark it taken
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{flat}{suffix}").exists():
                    os.replace(f"{flat}{suffix}", f"{flat}.migrated{suffix}")
        log.warning("continued the run of the flat layout in %s: its ledger is copied to %s and its TensorBoard "
                    "history is written again under %s/{train,eval}; the old event files in %s are left as they "
                    "were (delete them when you no longer need them)", flat.parent, run.ledger, run.path,
                    flat.parent)
        return flat
    return None


def _open(path: Path) -> sqlite3.Connection:
    """Read-only; a ledger closed cleanly (no -wal file) is opened immutable, so nothing is created beside it."""
    mode = "ro" if Path(f"{path}-wal").exists() else "ro&immutable=1"
    return sqlite3.connect(f"file:{path}?mode={mode}", uri=True, timeout=30)


def _serves(flat: Path, ckpt_dir: Path) -> bool:
    db = _open(flat)
    try:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        column, table = ("name", "files") if "files" in tables else ("key", "checkpoints")
        if table not in tables:
            return True
        names = [name for (name,) in db.execute(f"SELECT {column} FROM {table} LIMIT 1000")]
    finally:
        db.close()
    return not names or any((ckpt_dir / name).exists() for name in names)


def _copy_for_reemission(flat: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.migrating-{os.getpid()}")
    source, copy = _open(flat), sqlite3.connect(tmp, isolation_level=None)
    try:
        source.backup(copy)
        if copy.execute("SELECT 1 FROM sqlite_master WHERE name='records'").fetchone():
            copy.execute("UPDATE records SET written=0")
    finally:
        source.close()
        copy.close()
    os.replace(tmp, target)
    layout.fsync_dir(target.parent)
