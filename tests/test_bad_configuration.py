"""A model factory that cannot be imported is a clear error, not a crash loop: evald keeps the
checkpoints queued, stays responsive, and exits cleanly on SIGTERM."""

from __future__ import annotations

import signal
import sqlite3

from evald.contracts import layout
from tests.harness import start_evald, wait_for


def test_bad_factory_keeps_checkpoints_queued_and_evald_alive(tmp_path, endpoints, procs):
    import numpy as np

    ckpt = tmp_path / "ckpt"
    layout.write_checkpoint(ckpt, 5, {"w": np.ones(3, np.float32)}, run_id="r")
    evald = start_evald(tmp_path, endpoints, ["--ckpt-dir", str(ckpt), "--no-zmq",
                                              "--model-factory", "no_such_package.model:build",
                                              "--data-factory", "examples.tiny_lm.data:validation_windows"],
                        cpu=None)
    procs.append(evald)
    wait_for(lambda: "cannot build the evaluation network" in evald.output(), 60, "the factory error")
    assert "no_such_package" in evald.output() and "--app-dir" in evald.output()
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]
    db = sqlite3.connect(ckpt / "evald" / "ledger.sqlite")
    assert db.execute("SELECT state FROM checkpoints WHERE key='step_000000005'").fetchone() == ("queued",)
