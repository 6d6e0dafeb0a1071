"""`evald --device 0,1` started, as a user would, from a directory that holds a folder named ``evald``.

Issue 18, item 7: the group's ranks ran ``python -m evald`` in the caller's directory, whose ``evald/``
folder shadowed the installed package (for an editable install, found after ``sys.path``), and every
rank died with "cannot import name '__version__' from 'evald' (unknown location)", while the launcher
said only "a rank failed or died". The installed console script is run with no PYTHONPATH, so the
package is found the way a user's is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import faults
from tests.harness import REPO

CONSOLE_SCRIPT = Path(sys.executable).parent / "evald"


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="evald is not installed as a console script here")
def test_a_folder_named_evald_in_the_current_directory_does_not_shadow_the_ranks(tmp_path):
    home = tmp_path / "work"
    (home / "evald").mkdir(parents=True)             # e.g. the checkout, seen from its parent
    ckpt = home / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(GLOG_v="3", EVALD_SOCKET_DIR=str(tmp_path / "sock"), EVALD_APP_DIR=str(REPO))
    out = subprocess.run([str(CONSOLE_SCRIPT), "--device", "0,1", "--ckpt-dir", str(ckpt), "--endpoint", "none",
                          "--lag-policy", "all", "--subset-size", "32", "--batch-size", "16",
                          "--generation", '{"prompts": 0}', "--idle-exit-s", "5",
                          "--group", f'{{"log_dir": "{tmp_path / "msrun"}"}}'],
                         cwd=home, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "cannot import name" not in (tmp_path / "msrun" / "worker_1.log").read_text(errors="replace")
    evaluated = [r["step"] for r in faults.ledger_rows(ckpt) if r["state"] == "evaluated"]
    assert evaluated == [10]
