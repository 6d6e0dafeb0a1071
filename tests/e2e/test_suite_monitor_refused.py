"""A real evald: ``--monitor SUITE/TASK/METRIC`` that no configured suite produces is refused at start-up, before
anything is touched (Lightning refuses an unknown monitor too), instead of an evald that never decides."""

from __future__ import annotations

import subprocess
import sys

from tests.harness import REPO


def test_a_suite_monitor_no_configured_suite_produces_exits_2_before_touching_anything(tmp_path):
    ckpt, sockets = tmp_path / "ckpt", tmp_path / "sockets"
    out = subprocess.run([sys.executable, "-m", "evald", "--ckpt-dir", str(ckpt), "--endpoint", "none",
                          "--monitor", "fast/hellaswag/acc_norm", "--idle-exit-s", "1"], capture_output=True,
                         text=True, cwd=REPO, timeout=120,
                         env={"PATH": "/usr/bin", "EVALD_SOCKET_DIR": str(sockets), "PYTHONPATH": str(REPO),
                              "GLOG_v": "3"})
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().startswith("evald: error: --monitor fast/hellaswag/acc_norm: no configured suite "
                                         "'fast' has a task 'hellaswag'")
    assert not ckpt.exists() and not sockets.exists()
