"""Health alerts through the real pipeline: train_metrics over a real socket into a real evald,
alerts read back from TensorBoard text events."""

from __future__ import annotations

import time

import zmq

from evald.contracts import wire
from tests import faults
from tests.harness import run_dir, start_evald, text_events, wait_for


def test_alerts_fire_once_per_episode_and_healthy_signals_stay_quiet(tmp_path, endpoints, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt, run_id="r")  # messages count only for the run the directory names
    evald = start_evald(tmp_path, endpoints, ["--ckpt-dir", str(ckpt), "--idle-exit-s", "3"], cpu=None)
    procs.append(evald)
    wait_for(lambda: "listening for notifications" in evald.output(), 60, "evald to bind")
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(endpoints["EVALD_ENDPOINT"])

    records = []
    for step in range(1, 101):
        scalars = {"loss": 3.0 - step * 0.01, "grad_norm": 1.0, "loss_scale": 1024.0}
        if 20 <= step < 25 or 60 <= step < 62:   # two explosion episodes
            scalars["grad_norm"] = 3e5
        if step == 80:
            scalars["loss"] = float("nan")
        records.append({"step": step, "wall_time": time.time(),
                        "scalars": {k: wire.encode_scalar(v) for k, v in scalars.items()}})
    for start in range(0, 100, 10):
        push.send(wire.TrainMetrics(run_id="r", records=tuple(records[start:start + 10])).encode())
    push.close()
    assert evald.wait(120) == 0, evald.output()[-3000:]

    logdir = run_dir(ckpt)
    assert [s for s, _ in text_events(logdir, "health/grad_explosion/text_summary")] == [20, 60]
    [(step, message)] = text_events(logdir, "health/nonfinite_loss/text_summary")
    assert step == 80 and "step 80" in message
    for quiet in ("grad_vanishing", "loss_scale_collapse", "overfitting"):
        assert text_events(logdir, f"health/{quiet}/text_summary") == []
    log = evald.output()
    assert log.count("grad_explosion") >= 2 and "WARNING" in log
