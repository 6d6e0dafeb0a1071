"""Issue 12, part 6: NaN weights, a full disk, and binding every interface.

* NaN weights (every float weight NaN, a real checkpoint): the evaluation is a recorded result, the
  eval/loss point is written as NaN (a legal TensorBoard value, read back with TensorBoard's own
  reader), and --check-finite (the default) publishes a stop; with generation on and off. On commit
  1337672 generation raised ValueError('probabilities contain NaN') so the stop never fired, and
  with generation off the stop fired but the step had no eval/loss point.
* A full disk under the ledger and events: a real tmpfs of a few MB (root only) is filled while
  evald runs. evald logs, waits and retries; once there is room every checkpoint is evaluated
  with exactly one point; a SIGTERM while it waits exits 1 and the restart redoes the lost step.
  On commit 1337672 evald died with sqlite3.OperationalError.
* ``tcp://*``: evald says loudly that it binds every interface (and that the channel is plaintext).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from evald.contracts import layout
from tests import faults, hostile
from tests.harness import raw_scalar_steps, run_dir, scalar_points, wait_for
from trainer_hooks.stop_agreement import ControlSubscriber


@pytest.mark.parametrize("generation", ["on", "off"])
def test_nan_weights_give_a_nan_point_and_a_stop(tmp_path, endpoints, procs, generation):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    nan = {name: np.full_like(a, np.nan) if a.dtype.kind == "f" else a for name, a in faults.demo_weights().items()}
    faults.commit(ckpt, 10, nan)
    prompts = '{"prompts": 2, "new_tokens": 4}' if generation == "on" else '{"prompts": 0}'
    evald = faults.start(tmp_path, ckpt, "--subset-size", "32", "--batch-size", "16", "--generation", prompts,
                         env=endpoints, zmq=True, fast=False)
    procs.append(evald)
    wait_for(lambda: faults.ledger_by_key(ckpt).get(layout.step_dir_name(10), {}).get("state") == "evaluated",
             240, "the NaN checkpoint evaluated")
    subscriber = ControlSubscriber(endpoints["EVALD_CONTROL_ENDPOINT"], "faults")
    try:
        state = wait_for(lambda: subscriber.poll(), 30, "the control state")
    finally:
        subscriber.close()
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]
    assert state.stop_at_step is not None and "not finite" in state.reason, state
    points = scalar_points(run_dir(ckpt), "eval/loss")
    assert [s for s, _, _ in points] == [10] and math.isnan(points[0][2]), points
    decisions = [t for s, tag, t in faults.tb_texts(run_dir(ckpt)) if tag == "evald/decision"]
    assert decisions and decisions[0].startswith("STOP: eval/loss = nan at step 10 is not finite"), decisions
    assert "Traceback" not in evald.output()


def _fill(directory) -> object:
    """Take every free byte of the filesystem holding ``directory``; returns the filler's path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (65536, 4096, 512, 1):  # big chunks, then the crumbs
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def tiny_filesystem(tmp_path):
    if not hostile.is_root():
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "state"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow  # a long fault/load run: ./scripts/test.sh -m slow
def test_a_full_disk_makes_evald_wait_and_lose_nothing(tmp_path, procs, tiny_filesystem):
    ckpt, logdir = tmp_path / "ckpt", tiny_filesystem / "tensorboard"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)
    args = ("--logdir", str(logdir), "--lag-policy", "all")
    evald = faults.start(tmp_path, ckpt, *args)
    procs.append(evald)
    wait_for(lambda: faults.ledger_by_key(ckpt, logdir).get(layout.step_dir_name(10), {}).get("state") ==
             "evaluated", 240, "step 10 evaluated")
    filler = _fill(tiny_filesystem)
    for step in (20, 30, 40):
        faults.commit(ckpt, step)
    wait_for(lambda: "cannot be written" in evald.output(), 120, "evald noticing the full disk")
    time.sleep(3)  # it keeps waiting, alive
    assert evald.popen.poll() is None, evald.output()[-3000:]
    filler.unlink()
    wait_for(lambda: [r["state"] for r in faults.ledger_rows(ckpt, logdir)] == ["evaluated"] * 4, 240,
             "every checkpoint evaluated once there is room")
    wait_for(lambda: raw_scalar_steps(run_dir(ckpt, logdir), "eval/loss") == [10, 20, 30, 40], 60, "one point per step")

    # a SIGTERM while it waits: exit 1 (abandoned), and the restart redoes what was not written
    filler = _fill(tiny_filesystem)
    faults.commit(ckpt, 50)
    wait_for(lambda: evald.output().count("cannot be written") >= 2, 120, "the second wait")
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 1, evald.output()[-3000:]
    log = evald.output()
    assert "Traceback" not in log, log[-3000:]
    filler.unlink()
    again = faults.start(tmp_path, ckpt, *args, "--idle-exit-s", "3", name="evald2")
    procs.append(again)
    assert again.wait(240) == 0, again.output()[-3000:]
    assert [r["state"] for r in faults.ledger_rows(ckpt, logdir)] == ["evaluated"] * 5
    assert raw_scalar_steps(run_dir(ckpt, logdir), "eval/loss") == [10, 20, 30, 40, 50]


def test_tensorboard_records_wait_in_the_outbox_while_the_disk_is_full(tmp_path, tiny_filesystem):
    """The sink alone (in-process, real files): the ledger on a roomy disk, the events on a full one."""
    from evald.ledger.ledger import Ledger, Record
    from evald.sinks.tensorboard import TensorBoardSink

    ledger = Ledger(tmp_path / "ledger.sqlite")
    sink = TensorBoardSink(tiny_filesystem, ledger)
    ledger.add_records([Record("eval", 1, time.time(), {"eval/loss": 1.0}, {})])
    assert sink.drain() == 1
    filler = _fill(tiny_filesystem)
    big = "x" * 200_000  # larger than any crumb left: the write must fail part way
    ledger.add_records([Record("eval", s, time.time(), {"eval/loss": float(s)}, {"note": big}) for s in (2, 3)])
    assert sink.drain() == 0 and len(ledger.pending_records()) == 2
    filler.unlink()
    time.sleep(1.1)  # the sink retries a failed file after a second
    assert sink.drain() == 2 and not ledger.pending_records()
    sink.close()
    ledger.close()
    assert raw_scalar_steps(tiny_filesystem, "eval/loss") == [1, 2, 3]  # each once; no torn record counted
    for path in tiny_filesystem.rglob("events.out.tfevents.*"):
        assert faults.event_file_records(path)[1] == 0, path  # every file ends on a whole record


def test_binding_every_interface_is_said_loudly(tmp_path, procs):
    socket_dir = tmp_path / "sockets"
    socket_dir.mkdir(mode=0o700)
    port, control = hostile.free_tcp_port(), hostile.free_tcp_port()
    env = {"EVALD_ENDPOINT": f"tcp://*:{port}", "EVALD_CONTROL_ENDPOINT": f"tcp://127.0.0.1:{control}",
           "EVALD_SOCKET_DIR": str(socket_dir), "EVALD_ALLOW_PLAINTEXT": "1"}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    evald = faults.start(tmp_path, ckpt, "--idle-exit-s", "2", env=env, zmq=True)
    procs.append(evald)
    assert evald.wait(120) == 0, evald.output()[-3000:]
    log = evald.output()
    assert f"!!! tcp://*:{port} binds ALL network interfaces" in log and "anyone who can route to this host" in log
    assert f"!!! PLAINTEXT on tcp://*:{port}" in log and f"!!! PLAINTEXT on tcp://127.0.0.1:{control}" in log
    assert run_dir(ckpt).exists()
