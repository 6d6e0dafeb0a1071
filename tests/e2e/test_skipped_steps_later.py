"""A checkpoint the lag policy skipped is evaluated later (issue 26, item 2): with the default
``latest`` policy and four checkpoints on disk at start only the newest is evaluated; then
``evald retry --step`` plus a restart, and a standalone ``evald backfill -- ...``, evaluate the
skipped ones. Real processes and files."""

from __future__ import annotations

import signal
import subprocess

from tests import faults
from tests.harness import PYTHON, REPO, base_env, wait_for


def evald_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "evald", *args], capture_output=True, text=True, cwd=REPO,
                          env=base_env(), timeout=timeout)


def _states(ckpt) -> dict[int, str]:
    return {row["step"]: row["state"] for row in faults.ledger_rows(ckpt)}


def test_a_skipped_step_is_evaluated_after_retry_and_after_backfill(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (25, 50, 75, 100):
        faults.commit(ckpt, step)
    evald = faults.start(tmp_path, ckpt, "--idle-exit-s", "1")
    procs.append(evald)
    assert evald.wait(300) == 0, evald.output()[-3000:]
    assert _states(ckpt) == {25: "skipped", 50: "skipped", 75: "skipped", 100: "evaluated"}

    assert evald_cli("retry", "--ckpt-dir", str(ckpt), "--step", "999").returncode == 2
    asked = evald_cli("retry", "--ckpt-dir", str(ckpt), "--step", "25")
    assert asked.returncode == 0 and "re-queued 1 step(s): 25" in asked.stdout, asked.stdout + asked.stderr
    again = faults.start(tmp_path, ckpt, "--idle-exit-s", "1", name="restart")
    procs.append(again)
    assert again.wait(300) == 0, again.output()[-3000:]
    assert _states(ckpt) == {25: "evaluated", 50: "skipped", 75: "skipped", 100: "evaluated"}

    filled = evald_cli("backfill", "--ckpt-dir", str(ckpt), "--", *faults.FAST, "--endpoint", "none",
                       "--idle-exit-s", "1")
    assert filled.returncode == 0, filled.stdout[-3000:] + filled.stderr[-3000:]
    assert "50, 75" in filled.stdout
    assert _states(ckpt) == {25: "evaluated", 50: "evaluated", 75: "evaluated", 100: "evaluated"}


def test_a_skipped_step_is_evaluated_by_the_running_evald_after_retry_and_backfill(tmp_path, procs):
    """Issue 26 item 2, beside a running evald: what `retry --step` and `backfill` queue in the ledger is
    evaluated by the evald that skipped it, without a restart."""
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (25, 50, 75, 100):
        faults.commit(ckpt, step)
    evald = faults.start(tmp_path, ckpt)
    procs.append(evald)
    wait_for(lambda: _states(ckpt) == {25: "skipped", 50: "skipped", 75: "skipped", 100: "evaluated"}, 300,
             "the default lag policy's outcome")
    asked = evald_cli("retry", "--ckpt-dir", str(ckpt), "--step", "25")
    assert asked.returncode == 0 and f"evald pid {evald.popen.pid} serves this run" in asked.stdout, asked.stdout
    wait_for(lambda: _states(ckpt)[25] == "evaluated", 300, "25 evaluated by the running evald")
    filled = evald_cli("backfill", "--ckpt-dir", str(ckpt), "--steps", "40:80")
    assert filled.returncode == 0 and "50, 75" in filled.stdout, filled.stdout + filled.stderr
    wait_for(lambda: set(_states(ckpt).values()) == {"evaluated"}, 300, "50 and 75 evaluated by the running evald")
    assert evald.popen.poll() is None   # no restart was needed
    evald.signal(signal.SIGTERM)
    assert evald.wait(120) == 0, evald.output()[-3000:]
