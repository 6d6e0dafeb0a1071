"""Shared fixtures of the CLI's in-process tests: a run evald serves, with no environment naming another."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from evald.contracts import layout
from evald.daemon.run_dir import RunDir, open_run
from evald.ledger.ledger import Ledger


@pytest.fixture
def new_run(tmp_path, monkeypatch) -> Callable[[Path], RunDir]:
    """Opens the run of checkpoint directory ``ckpt`` (made here) as evald would, its ledger created, with no
    EVALD_* variable of the caller's environment naming another run."""
    for name in ("EVALD_CKPT_DIR", "EVALD_LOGDIR", "EVALD_RUN_NAME"):
        monkeypatch.delenv(name, raising=False)

    def make(ckpt: Path) -> RunDir:
        ckpt.mkdir(parents=True)
        served = open_run(ckpt, None, None)
        Ledger(served.ledger).close()
        return served

    return make


def admit_steps(ledger: Ledger, ckpt: Path, steps: tuple[int, ...]) -> None:
    """A checkpoint directory for each step, admitted to ``ledger`` as found by a rescan of run ``r``."""
    for step in steps:
        name = layout.step_dir_name(step)
        (ckpt / name).mkdir()
        ledger.admit(name=name, step=step, kind="evald", found_via="rescan", run_id="r", commit_time=1.0)
