"""The lag policies on a burst of checkpoints, through evald's own loop: which steps are evaluated, which are
skipped with the policy named, and what TensorBoard is told at each step (lag, queue depth, skipped total).

The real Server, ledger, intake and TensorBoard sink in this process; the evaluation is the rig's stand-in.
The policies' pure rules are pinned in tests/unit/decisions/test_lag_policy_and_advice.py.
"""

from __future__ import annotations

import pytest

from evald.daemon.server import Server
from tests import faults
from tests.harness import raw_scalar_steps, run_dir, scalar_points
from tests.unit.daemon.rig import MeanWeightPipeline, config, stage

pytestmark = pytest.mark.usefixtures("private_umask")

STEPS = [10, 20, 30, 40, 50, 60]
EVALD_TAGS = ("evald/lag_steps", "evald/lag_s", "evald/queue_depth", "evald/skipped_total", "evald/failed_total")


@pytest.mark.parametrize("policy, options, evaluated, depth", [
    ("all", {}, [10, 20, 30, 40, 50, 60], [5, 4, 3, 2, 1, 0]),
    ("latest", {}, [60], [0]),                        # latest skips the older queued ones when it picks the newest
    ("every-k", {"every_k": 2}, [20, 40, 60], [2, 1, 0]),  # every-k skips on arrival
])
def test_lag_policy_on_a_burst(tmp_path, policy, options, evaluated, depth):
    ckpt = stage(tmp_path / "ckpt", *STEPS)  # a burst: all committed before evald looks
    server = Server(config(tmp_path, None, ckpt_dir=str(ckpt), logdir=None, lag_policy=policy, idle_exit_s=0.0,
                           **options), pipeline=MeanWeightPipeline())
    try:
        server.startup()
        for _ in range(200):
            if not server.on_tick():
                break
        else:
            raise AssertionError("the loop never went idle")
    finally:
        server.shutdown()
    assert server.exit_code == 0

    rows = faults.ledger_rows(ckpt)
    assert [r["step"] for r in rows] == STEPS
    assert sorted(r["step"] for r in rows if r["state"] == "evaluated") == evaluated
    skipped = [r for r in rows if r["state"] == "skipped"]
    assert len(skipped) == len(STEPS) - len(evaluated)
    assert all(r["reason"] and policy in r["reason"] for r in skipped), skipped
    assert all(r["seen_at"] and r["finished_at"] >= r["seen_at"] for r in rows)
    logdir = run_dir(ckpt)
    assert raw_scalar_steps(logdir, "eval/loss") == evaluated  # one point per evaluated step
    assert sorted(s for s, _, _ in scalar_points(logdir, "eval/loss")) == evaluated
    assert set(EVALD_TAGS) <= set(faults.scalar_tags(logdir))
    lag_steps = {s: v for s, _, v in scalar_points(logdir, "evald/lag_steps")}
    assert {s: lag_steps[s] for s in evaluated} == {s: 60.0 - s for s in evaluated}
    assert sorted(lag_steps) == STEPS  # a skipped step too, with its lag when it was skipped, at its own step
    assert all(v >= 0 for _, _, v in scalar_points(logdir, "evald/lag_s"))
    assert [v for _, _, v in scalar_points(logdir, "evald/skipped_total")][-1] == len(skipped)
    assert [v for _, _, v in scalar_points(logdir, "evald/queue_depth")] == depth
