"""A real evald beside a real ``sqlite3`` shell holding ``BEGIN EXCLUSIVE`` on its ledger (issue 27, High 2):
evald says it waits, a checkpoint committed meanwhile is evaluated once the shell commits, and evald exits 0
when told to. On main evald died with ``sqlite3.OperationalError: database is locked`` after ~30 s, having
logged "evald stopped (exit code 0)"."""

from __future__ import annotations

import shutil
import signal
import subprocess

import pytest

from evald.contracts import layout
from tests import faults
from tests.harness import wait_for


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs the sqlite3 shell")
def test_a_ledger_held_locked_by_an_sqlite3_shell_is_waited_out(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all")
    procs.append(evald)
    state = lambda step: faults.ledger_by_key(ckpt).get(layout.step_dir_name(step), {}).get("state")  # noqa: E731
    wait_for(lambda: state(10) == "evaluated", 240, "step 10 evaluated")

    shell = subprocess.Popen(["sqlite3", str(faults.ledger_path(ckpt))], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        shell.stdin.write("BEGIN EXCLUSIVE;\nSELECT 'held';\n")
        shell.stdin.flush()
        assert shell.stdout.readline().strip() == "held"
        faults.commit(ckpt, 20)
        wait_for(lambda: "is locked by another process" in evald.output(), 120, "evald saying it waits")
        assert evald.popen.poll() is None, evald.output()[-3000:]
        shell.stdin.write("COMMIT;\n.quit\n")
        shell.stdin.flush()
        assert shell.wait(30) == 0
    finally:
        if shell.poll() is None:
            shell.kill()
    wait_for(lambda: state(20) == "evaluated", 240, "step 20, committed during the lock, evaluated")
    assert "carrying on" in evald.output()
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]
    log = evald.output()
    assert "Traceback" not in log and log.rstrip().endswith("evald stopped (exit code 0)"), log[-3000:]
