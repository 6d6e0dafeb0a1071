"""`evald --device 0,1`: one evaluation on several devices, as a real msrun group on CPU.

* the numbers equal a one-device evald on the same checkpoints (acceptance: eval/loss within
  1e-6, the same subset hash; here every metric, generation included, is compared);
* a rank that dies mid-evaluation ends the group, and the step is evaluated after a restart,
  exactly once in TensorBoard; a SIGTERM ends the group cleanly after the current evaluation;
* the parts of a split evaluation put together are bit for bit the one-device outputs (in process);
* the group's protocol (commands, answers, exact limbs), with a thread-barrier SUM standing in
  for MindSpore's AllReduce so that it runs in milliseconds (the real collective runs above).
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from evald.files.recognise import EVALD
from evald.pipeline.group_protocol import BUILD, DELETED, EVALUATE, EXIT, NOOP, OK, Group, from_limbs, to_limbs
from tests import faults
from tests.harness import raw_scalar_steps, run_dir, scalar_points, start_evald, start_trainer, wait_for

GROUP_TIMEOUT_S = 600


def ledger_metrics(ckpt: Path, logdir: Path) -> dict[int, dict[str, float]]:
    return {row["step"]: json.loads(row["metrics"]) for row in faults.ledger_rows(ckpt, logdir)
            if row["state"] == "evaluated"}


def group_args(log_dir: Path) -> list[str]:
    return ["--group", json.dumps({"log_dir": str(log_dir)})]


# --- real msrun groups --------------------------------------------------------------------------

def test_two_eval_ranks_give_exactly_the_numbers_of_one(tmp_path, endpoints, procs):
    ckpt = tmp_path / "ckpt"
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=40, every=20, loop="custom", cpu=None)
    procs.append(trainer)
    assert trainer.wait(300) == 0, trainer.output()[-2000:]
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
    assert sorted(single) == sorted(group) == [20, 40]
    for step in single:
        assert set(single[step]) == set(group[step]) and any(k.startswith("sample/") for k in single[step])
        for key, value in single[step].items():
            assert math.isclose(group[step][key], value, rel_tol=1e-6, abs_tol=1e-12), (step, key)
    subsets = [json.loads((runs[d] / "subset.json").read_text())["sha256"] for d in ("one", "two")]
    assert subsets[0] == subsets[1]
    losses = [[v for _, _, v in scalar_points(runs[d], "eval/loss")] for d in ("one", "two")]
    assert losses[0] == losses[1] and len(losses[0]) == 2
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

def test_the_parts_put_together_are_the_one_device_outputs_bit_for_bit(tmp_path):
    pytest.importorskip("mindspore")
    import mindspore as ms

    from evald.pipeline.network import Evaluator
    from evald.pipeline.tasks.generation import SampleGenerator

    ms.set_context(mode=ms.GRAPH_MODE)
    path = faults.commit(tmp_path / "ckpt", 10)
    entry_kind = EVALD  # evald's own layout, as the ledger records it

    def evaluator(part):
        return Evaluator(task="lm", model=faults.MODEL_FACTORY, data=faults.DATA_FACTORY, subset_size=40,
                         subset_seed=3, batch_size=16, generation=SampleGenerator(prompts=3, new_tokens=6), part=part)
    whole = evaluator((0, 1))
    single = whole.evaluate(path, entry_kind)
    parts = [evaluator((rank, 3)) for rank in range(3)]  # 3 batches (16, 16, 8 real rows): one each
    answers = [p.evaluate_part(path, entry_kind) for p in parts]
    summed = {name: sum(a.arrays[name] for a in answers) for name in whole.layout}
    full = whole.evaluate_part(path, entry_kind).arrays
    # every rank proved its own swap, of the same weights
    assert {a.provenance["weights_sha256"] for a in answers} == {single.provenance["weights_sha256"]}
    for name in whole.layout:
        assert np.array_equal(summed[name], full[name]), name
    metrics, texts = whole.metrics_of(summed)
    assert metrics == single.metrics and texts == single.texts


# --- the protocol, with a thread-barrier SUM standing in for AllReduce --------------------------

class ThreadSum:
    """A blocking SUM over N threads: every rank must arrive before any rank gets the result."""

    def __init__(self, size: int) -> None:
        self.size, self.inputs = size, {}
        self.barrier = threading.Barrier(size, action=self._sum, timeout=20)

    def _sum(self) -> None:
        self.total = sum(self.inputs.values())

    def for_rank(self, rank: int):
        def reduce_sum(vector: np.ndarray) -> np.ndarray:
            self.inputs[rank] = np.asarray(vector, np.float32).copy()
            self.barrier.wait()
            result = self.total.copy()
            self.barrier.wait()  # nobody starts the next SUM before everyone read this one
            return result
        return reduce_sum


def run_ranks(size: int, body) -> list:
    summer, results, errors = ThreadSum(size), [None] * size, []

    def run(rank: int) -> None:
        try:
            results[rank] = body(Group(rank, size, summer.for_rank(rank)))
        except Exception as exc:  # surfaced below
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


@pytest.mark.parametrize("array", [np.array([1.5, -0.0, np.nan, np.inf, -1e-300, 1 / 3]),
                                   np.array([-(2**63), 2**63 - 1, 0, 7], dtype=np.int64),
                                   np.arange(7, dtype=np.uint8), np.zeros((0, 3))])
def test_limbs_carry_any_array_exactly(array):
    back = from_limbs(to_limbs(array), array.dtype, array.shape)
    assert back.dtype == array.dtype and back.tobytes() == array.tobytes()


def test_commands_reach_every_rank_and_answers_combine_disjoint_rows_exactly():
    layout = {"nll": ((5,), np.dtype(np.float64)), "tokens": ((5, 2), np.dtype(np.int64))}
    rows = {0: [0, 3], 1: [1, 4], 2: [2]}
    expected_nll = np.array([1 / 3, math.pi, -2.5e-8, 1e300, -0.0])

    def body(group: Group):
        if group.rank == 0:
            group.command(NOOP)
            group.command(EVALUATE, {"path": "/ckpt/step_1", "kind": "evald"})
            received = (EVALUATE, {"path": "/ckpt/step_1", "kind": "evald"})
        else:
            assert group.receive() == (NOOP, None)
            received = group.receive()
        mine = rows[group.rank]
        arrays = {"nll": np.zeros(5), "tokens": np.zeros((5, 2), np.int64)}
        arrays["nll"][mine] = expected_nll[mine]
        arrays["tokens"][mine] = np.array(mine)[:, None] * 10 + 1
        code = DELETED if group.rank == 2 else OK
        statuses, combined = group.answer(code, f"rank {group.rank} says ü", arrays, layout)
        if group.rank == 0:
            group.close()
        else:
            assert group.receive() == (EXIT, None)
        return received, statuses, combined

    for received, statuses, combined in run_ranks(3, body):
        assert received == (EVALUATE, {"path": "/ckpt/step_1", "kind": "evald"})
        assert statuses == [(OK, "rank 0 says ü"), (OK, "rank 1 says ü"), (DELETED, "rank 2 says ü")]
        rows_2 = [0, 1, 3, 4]  # rank 2 failed: its row stays zero, the others are exact
        assert combined["nll"][rows_2].tobytes() == expected_nll[rows_2].tobytes() and combined["nll"][2] == 0
        assert combined["tokens"][:, 0].tolist() == [1, 11, 0, 31, 41]


def test_rank_0_owes_no_exit_while_an_answer_is_due_and_heartbeats_only_when_idle(monkeypatch):
    sent = []
    group = Group(0, 2, reduce_sum=lambda v: np.asarray(v, np.float32))
    monkeypatch.setattr(group, "_exchange_command", lambda op, data: sent.append(op) or (op, data))
    group.heartbeat()
    assert sent == []  # just made: not idle long enough
    group._last = time.monotonic() - 60
    group.heartbeat()
    assert sent == [NOOP]
    group.command(BUILD, {"task": "lm"})
    group._last = time.monotonic() - 60
    group.heartbeat()
    group.close()  # an answer is owed: sending EXIT now would mismatch the other ranks' collective
    assert sent == [NOOP, BUILD] and group.closed
