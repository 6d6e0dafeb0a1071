"""`evald --device 0,1`: one evaluation on several devices, as a real msrun group on CPU.

* the numbers equal a one-device evald on the same checkpoints (acceptance: eval/loss within
  1e-6, the same subset hash; here every metric, generation included, is compared);
* a rank that dies mid-evaluation ends the group, and the step is evaluated after a restart,
  exactly once in TensorBoard; a SIGTERM ends the group cleanly after the current evaluation;
* in process (tests/unit/pipeline/test_eval_group_protocol.py): the parts put together are the
  one-device outputs bit for bit, and the group's protocol with a stand-in collective.
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest

from tests import faults
from tests.harness import raw_scalar_steps, run_dir, scalar_points, start_evald, wait_for

GROUP_TIMEOUT_S = 600


def ledger_metrics(ckpt: Path, logdir: Path) -> dict[int, dict[str, float]]:
    return {row["step"]: json.loads(row["metrics"]) for row in faults.ledger_rows(ckpt, logdir)
            if row["state"] == "evaluated"}


def group_args(log_dir: Path) -> list[str]:
    return ["--group", json.dumps({"log_dir": str(log_dir)})]


# --- real msrun groups --------------------------------------------------------------------------

@pytest.mark.smoke
def test_two_eval_ranks_give_exactly_the_numbers_of_one(tmp_path, endpoints, procs, finished_training):
    ckpt = finished_training.ckpt  # a real training run's checkpoints 10 to 40 (tests/e2e/conftest.py)
    common = ["--ckpt-dir", str(ckpt), "--endpoint", "none", "--lag-policy", "all",
              "--generation", '{"prompts": 3, "new_tokens": 8}']  # 3 prompts: split 2 + 1 (padded)
    one = start_evald(tmp_path, endpoints, ["--device", "0", "--logdir", str(tmp_path / "one"), *common],
                      name="one", cpu=None)
    procs.append(one)
    assert one.wait(GROUP_TIMEOUT_S) == 0, one.output()[-3000:]
    two = start_evald(tmp_path, endpoints, ["--device", "0,1", "--logdir", str(tmp_path / "two"), *common,
                                            *group_args(tmp_path / "msrun")], name="two", cpu="0-1")
    procs.append(two)
    assert two.wait(GROUP_TIMEOUT_S) == 0, two.output()[-3000:]

    runs = {d: run_dir(ckpt, tmp_path / d) for d in ("one", "two")}
    single, group = ledger_metrics(ckpt, tmp_path / "one"), ledger_metrics(ckpt, tmp_path / "two")
    assert sorted(single) == sorted(group) == [10, 20, 30, 40]
    for step in single:
        assert set(single[step]) == set(group[step]) and any(k.startswith("sample/") for k in single[step])
        for key, value in single[step].items():
            assert math.isclose(group[step][key], value, rel_tol=1e-6, abs_tol=1e-12), (step, key)
    subsets = [json.loads((runs[d] / "subset.json").read_text())["sha256"] for d in ("one", "two")]
    assert subsets[0] == subsets[1]
    losses = [[v for _, _, v in scalar_points(runs[d], "eval/loss")] for d in ("one", "two")]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    worker_1 = (tmp_path / "msrun" / "worker_1.log").read_text(errors="replace")
    assert "eval rank 1 of 2" in worker_1 and "rank 0 ended the group" in worker_1
    assert "rank 0 evaluates 2 of 4 batches" in two.output()


def _rank_process(exit_file: Path, rank: int):
    import psutil

    for process in psutil.process_iter():
        try:
            env = process.environ()
        except psutil.Error:
            continue
        if (env.get("EVALD_GROUP_EXIT_FILE") == str(exit_file) and env.get("MS_ROLE") == "MS_WORKER"
                and env.get("RANK_ID") == str(rank) and "evald" in process.cmdline()):
            return process
    return None


@pytest.mark.slow  # a long fault/load run: ./scripts/test.sh -m slow
def test_a_rank_that_dies_ends_the_group_and_the_step_is_evaluated_after_a_restart(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20):
        faults.commit(ckpt, step)
    slow = ["--device", "0,1", "--subset-size", "930", "--generation", '{"prompts": 8, "new_tokens": 32}',
            "--lag-policy", "all"]
    group = faults.start(tmp_path, ckpt, *slow, "--serve-forever", *group_args(tmp_path / "msrun"), name="group")
    procs.append(group)
    exit_file = tmp_path / "msrun" / "rank0.exit"
    wait_for(lambda: any(r["state"] == "evaluating" for r in faults.ledger_rows(ckpt)), GROUP_TIMEOUT_S,
             "the first evaluation to start", interval=0.02)
    rank_1 = _rank_process(exit_file, 1)
    assert rank_1 is not None
    rank_1.kill()
    assert group.wait(GROUP_TIMEOUT_S) == 1, group.output()[-3000:]
    assert "a rank failed or died" in group.output()
    rows = faults.ledger_rows(ckpt)
    assert [r["state"] for r in rows] in (["evaluating", "queued"], ["queued", "evaluating"])
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == []  # nothing half-counted
    restarted = faults.start(tmp_path, ckpt, *slow, "--idle-exit-s", "3", name="restarted")
    procs.append(restarted)
    assert restarted.wait(GROUP_TIMEOUT_S) == 0, restarted.output()[-3000:]
    assert [r["state"] for r in faults.ledger_rows(ckpt)] == ["evaluated", "evaluated"]
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == [10, 20]  # each exactly once


@pytest.mark.slow  # a long fault/load run: ./scripts/test.sh -m slow
def test_a_sigterm_ends_the_group_after_the_current_evaluation(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)
    group = faults.start(tmp_path, ckpt, "--device", "0,1", "--serve-forever", *group_args(tmp_path / "msrun"),
                         name="group")
    procs.append(group)
    wait_for(lambda: [r["state"] for r in faults.ledger_rows(ckpt)] == ["evaluated"], GROUP_TIMEOUT_S,
             "step 10 evaluated")
    os.kill(group.popen.pid, signal.SIGTERM)  # the launcher only: as systemd's KillMode=mixed does
    assert group.wait(GROUP_TIMEOUT_S) == 0, group.output()[-3000:]
    worker_1 = (tmp_path / "msrun" / "worker_1.log").read_text(errors="replace")
    assert "rank 0 ended the group" in worker_1
    assert (tmp_path / "msrun" / "rank0.exit").read_text().strip() == "0"


# --- the split, in one process ------------------------------------------------------------------
