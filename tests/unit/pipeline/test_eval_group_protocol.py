"""The eval group in process: a split evaluation put together is bit for bit the one-device outputs, and
the group's protocol (commands, answers, exact limbs) with a thread-barrier SUM standing in for
MindSpore's AllReduce so that it runs in milliseconds (the real msrun group: tests/e2e/test_eval_group.py).
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from evald.files.recognise import EVALD
from evald.pipeline.group.protocol import (BUILD, DELETED, EVALUATE, EXIT, NOOP, OK, Group, GroupForged, from_limbs,
                                          to_limbs)
from tests import faults

def test_the_parts_put_together_are_the_one_device_outputs_bit_for_bit(tmp_path, graph_mode):
    from evald.pipeline.network import Evaluator
    from evald.pipeline.tasks.generation import SampleGenerator

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


KEY = bytes(range(32))


def run_ranks(size: int, body, keys=None, tamper=None) -> list:
    """``body(group)`` on ``size`` threads, one Group each (with ``keys[rank]``; ``tamper(rank, vector)``
    changes what a rank adds to a SUM, as a stranger in the collective could); each rank's result, or
    the exception it raised."""
    summer, results, errors = ThreadSum(size), [None] * size, []

    def run(rank: int) -> None:
        reduce_sum = summer.for_rank(rank)
        if tamper is not None:
            inner = reduce_sum
            reduce_sum = lambda vector: inner(tamper(rank, np.array(vector, np.float32)))  # noqa: E731
        try:
            results[rank] = body(Group(rank, size, reduce_sum, key=keys[rank] if keys else None))
        except Exception as exc:  # surfaced below
            results[rank] = exc
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a rank is still waiting in a collective"
    if keys is None and tamper is None:
        assert not errors, errors
    return results


@pytest.mark.parametrize("array", [np.array([1.5, -0.0, np.nan, np.inf, -1e-300, 1 / 3]),
                                   np.array([-(2**63), 2**63 - 1, 0, 7], dtype=np.int64),
                                   np.arange(7, dtype=np.uint8), np.zeros((0, 3))])
def test_limbs_carry_any_array_exactly(array):
    back = from_limbs(to_limbs(array), array.dtype, array.shape)
    assert back.dtype == array.dtype and back.tobytes() == array.tobytes()


@pytest.mark.parametrize("keyed", [False, True], ids=["in-process", "with the group's key"])
def test_commands_reach_every_rank_and_answers_combine_disjoint_rows_exactly(keyed):
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

    for received, statuses, combined in run_ranks(3, body, keys=[KEY] * 3 if keyed else None):
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


# --- a stranger in msrun's group (docs/security.md, "The eval group's channel") ----------------

COMMAND_ERRORS: dict[int, Exception] = {}


def _build_then_answer(group: Group):
    """Rank 0 sends a BUILD naming a factory, every rank answers: what each rank received, and the answer.
    A command refused is noted in COMMAND_ERRORS (a real rank stops there; this one answers anyway, to keep
    the test's ranks in step)."""
    received = None
    try:
        if group.rank == 0:
            group.command(BUILD, {"model": "examples.tiny_lm.model:build_model"})
        else:
            received = group.receive()
    except GroupForged as exc:
        COMMAND_ERRORS[group.rank] = exc
    return received, group.answer(OK, f"rank {group.rank}")


def test_a_rank_without_the_groups_key_cannot_answer_for_a_rank():
    """A process that took rank 1's place (its own key, not the group's) is refused by every rank at the
    first answer: its status slot does not authenticate."""
    COMMAND_ERRORS.clear()
    results = run_ranks(3, _build_then_answer, keys=[KEY, bytes(32), KEY])
    assert set(COMMAND_ERRORS) == {1}  # the stranger cannot read the command's tag either
    for rank in (0, 2):
        assert isinstance(results[rank], GroupForged), results[rank]
        assert "rank 1's answer" in str(results[rank]) and "without the eval group's key" in str(results[rank])


def test_a_stranger_that_adds_to_a_command_is_refused_before_the_command_is_used():
    """A stranger's SUM contribution that changes the BUILD payload (a different factory to import): every
    rank refuses the command (rank 0 checks it as the others got it), and the tampered answer after it."""
    def tamper(rank, vector):
        if rank == 1 and vector.size > 2:  # the payload's (and the answer's) limbs, not the header
            vector[0] += 1.0
        return vector
    COMMAND_ERRORS.clear()
    results = run_ranks(3, _build_then_answer, keys=[KEY] * 3, tamper=tamper)
    assert set(COMMAND_ERRORS) == {0, 1, 2}
    assert all("command build" in str(exc) for exc in COMMAND_ERRORS.values())
    assert all(isinstance(result, GroupForged) for result in results)


def test_without_tampering_the_keyed_build_reaches_every_rank():
    COMMAND_ERRORS.clear()
    results = run_ranks(3, _build_then_answer, keys=[KEY] * 3)
    assert not COMMAND_ERRORS
    assert results[1][0] == results[2][0] == (BUILD, {"model": "examples.tiny_lm.model:build_model"})
    assert results[0][1][0] == [(OK, "rank 0"), (OK, "rank 1"), (OK, "rank 2")]
