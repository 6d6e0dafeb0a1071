"""`evald backfill ... -- EVALD_OPTIONS` run, as a user would, from a directory that holds a folder named ``evald``.

Issue 37, item 3: the backfill started evald as ``python -m evald`` in the caller's directory, whose
``evald/`` folder (the checkout, seen from its parent) shadowed the installed package, and the child
died with "cannot import name '__version__' from 'evald' (unknown location)". evald starts every
Python of its own with ``-P`` (no current directory on ``sys.path``), as the eval group's ranks do
(tests/e2e/test_eval_group_cwd.py). The installed console script is run with no PYTHONPATH, so the
package is found the way a user's is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evald.contracts import layout
from evald.daemon.run_dir import open_run
from evald.ledger.ledger import Ledger
from tests import faults
from tests.harness import REPO

CONSOLE_SCRIPT = Path(sys.executable).parent / "evald"


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="evald is not installed as a console script here")
def test_a_folder_named_evald_in_the_current_directory_does_not_shadow_the_backfills_evald(tmp_path, monkeypatch):
    for name in ("EVALD_CKPT_DIR", "EVALD_LOGDIR", "EVALD_RUN_NAME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "work"
    (home / "evald").mkdir(parents=True)             # e.g. the checkout, seen from its parent
    ckpt = home / "ckpt"
    faults.announce(ckpt)
    run = open_run(ckpt, None, None)                 # a run whose lag policy skipped both checkpoints
    ledger = Ledger(run.ledger)
    for step in (25, 50):
        faults.commit(ckpt, step)
        ledger.admit(name=layout.step_dir_name(step), step=step, kind="evald", found_via="rescan", run_id="faults",
                     commit_time=1.0, skip_reason="superseded by a newer checkpoint (lag policy latest)")
    ledger.close()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(GLOG_v="3", EVALD_SOCKET_DIR=str(tmp_path / "sock"), EVALD_APP_DIR=str(REPO))
    out = subprocess.run([str(CONSOLE_SCRIPT), "backfill", "--ckpt-dir", str(ckpt), "--", *faults.FAST,
                          "--endpoint", "none", "--idle-exit-s", "1"],
                         cwd=home, env=env, capture_output=True, text=True, timeout=900)
    said = out.stdout + out.stderr
    assert "cannot import name" not in said, said[-4000:]
    assert out.returncode == 0, said[-4000:]
    assert "25, 50" in out.stdout and "evaluating them now" in out.stdout, out.stdout
    assert {r["step"]: r["state"] for r in faults.ledger_rows(ckpt)} == {25: "evaluated", 50: "evaluated"}
