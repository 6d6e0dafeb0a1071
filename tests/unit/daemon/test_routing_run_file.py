"""RUN.json as the directory's entry (evald.daemon.routing): each rescan sees it again, and it is read again
only when it changed since the last read: its content, or its mode or owner (a chmod that makes a refused
RUN.json trusted must be noticed, though it changes neither the content nor the mtime)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from evald.contracts import layout, wire
from evald.daemon import routing
from evald.daemon.routing import EventRouter
from evald.daemon.turn import Counters
from evald.intake.discovery import RESCAN
from tests.unit.daemon.rig import config


def _router(tmp_path: Path, ckpt: Path) -> EventRouter:
    discovery = SimpleNamespace(reach=lambda path: False)
    intake = SimpleNamespace(run_id=None, final_step=None, newest_step=0)
    decisions = SimpleNamespace(begin_run=lambda run_id: None)
    return EventRouter(ckpt, config(tmp_path, None, ckpt_dir=str(ckpt)), None, intake=intake,  # type: ignore[arg-type]
                       discovery=discovery, decisions=decisions, train=None, counters=Counters())  # type: ignore[arg-type]


def test_a_rescan_reads_run_json_again_only_when_it_changed_or_its_mode_did(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    layout.write_run_file(ckpt, wire.RunAnnounced(run_id="r1", ckpt_dir=str(ckpt)).encode().decode())
    reads = []
    real = routing.read_announcement
    monkeypatch.setattr(routing, "read_announcement", lambda *a, **k: reads.append(1) or real(*a, **k))
    router = _router(tmp_path, ckpt)
    run_file = ckpt / layout.RUN_FILE

    assert router.read_announcement() and router.run_id == "r1"        # the start reads it
    for _ in range(3):
        assert router.handle(RESCAN, str(run_file)) is False          # rescans: unchanged, not read again
    assert len(reads) == 1

    os.chmod(run_file, 0o640)                                         # the mode: read again, nothing new
    assert router.handle(RESCAN, str(run_file)) is False and len(reads) == 2

    layout.write_run_file(ckpt, wire.RunAnnounced(run_id="r2", ckpt_dir=str(ckpt)).encode().decode())
    assert router.handle(RESCAN, str(run_file)) is True and router.run_id == "r2" and len(reads) == 3
