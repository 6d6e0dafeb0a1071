"""A tensor-parallel eval rank killed mid-evaluation (issue 29, item 4), as a real msrun group on CPU.

The group ends with an error naming the rank that died; nothing is recorded for the step under way
(no point, its row back to be evaluated); a restart evaluates every step exactly once.
"""

from __future__ import annotations

import json

import pytest

from tests import faults
from tests.e2e.test_eval_group import _rank_process
from tests.e2e.test_tensor_parallel_group import FACTORIES, _whole_weights, _write_tp_parts
from tests.harness import raw_scalar_steps, run_dir, wait_for

pytestmark = pytest.mark.heavy  # minutes of several processes: CI's third stage (./scripts/test.sh --long)

GROUP_TIMEOUT_S = 900


def test_a_killed_tensor_parallel_rank_ends_the_group_naming_it_and_a_restart_evaluates_once(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    weights = _whole_weights()
    for step in (10, 20):
        _write_tp_parts(ckpt, step, weights, 2)
    logdir, msrun_logs = tmp_path / "tb", tmp_path / "msrun"
    slow = ["--ckpt-dir", str(ckpt), "--endpoint", "none", "--lag-policy", "all", "--device", "0,1",
            "--tensor-parallel", "2", "--subset-size", "930", "--batch-size", "8", "--generation", '{"prompts": 0}',
            "--logdir", str(logdir), "--group", json.dumps({"log_dir": str(msrun_logs)}), *FACTORIES]
    group = faults.start(tmp_path, None, *slow, "--serve-forever", name="group", fast=False)
    procs.append(group)
    wait_for(lambda: any(r["state"] == "evaluating" for r in faults.ledger_rows(ckpt, logdir)), GROUP_TIMEOUT_S,
             "the first evaluation to start", interval=0.02)
    rank_1 = _rank_process(msrun_logs / "rank0.exit", 1)
    assert rank_1 is not None
    pid = rank_1.pid
    rank_1.kill()
    assert group.wait(GROUP_TIMEOUT_S) == 1, group.output()[-3000:]
    assert f"eval rank 1 (pid {pid}, log worker_1.log) ended first" in group.output(), group.output()[-3000:]
    assert "evaluated" not in [r["state"] for r in faults.ledger_rows(ckpt, logdir)]
    assert raw_scalar_steps(run_dir(ckpt, logdir), "eval/loss") == []  # nothing recorded for the step

    slow = [a for a in slow if a != "--serve-forever"]
    restarted = faults.start(tmp_path, None, *slow, "--idle-exit-s", "3", name="restarted", fast=False)
    procs.append(restarted)
    assert restarted.wait(GROUP_TIMEOUT_S) == 0, restarted.output()[-3000:]
    assert [r["state"] for r in faults.ledger_rows(ckpt, logdir)] == ["evaluated", "evaluated"]
    assert raw_scalar_steps(run_dir(ckpt, logdir), "eval/loss") == [10, 20]  # each exactly once
