"""StopAgreement + ControlSubscriber against a real ZeroMQ PUB socket, in one process.

* single process (world_size 1): stops at exactly ``stop_at_step``; a late
  message stops at the first step after it arrives; another run's message is
  ignored;
* the agreement rule with a fake collective (max(stop_at_step, step), only on
  ``agree_every`` steps, only rank 0 votes).

The trials of 4 rank processes (tests/rank_worker.py) that must all stop at the
same step, and the control that shows why the agreement exists, are in
tests/e2e/test_stop_agreement_ranks.py; they share this file's worker, publisher
and constants.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

from evald.contracts.wire import ControlState  # noqa: E402
from trainer_hooks.stop_agreement import ControlSubscriber, StopAgreement  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
WORKER = REPO / "tests" / "rank_worker.py"
HANG_EXIT = 3  # tests/rank_worker.py
N_TRIALS = int(os.environ.get("EVALD_STOP_TRIALS", "20"))
WORLD = 4
STEPS = 200
HANG_S = 60.0  # a wait for a control message this long is a hang, not a slow machine


class Publisher:
    """evald's control side: bind PUB, re-publish the sticky state every ``interval_s``."""

    def __init__(self, endpoint: str, interval_s: float = 0.02) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.interval_s = interval_s
        self.state: ControlState | None = None
        self.sent = 0
        self.started_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, state: ControlState, *, delay_s: float = 0.0, after=None) -> None:
        """Publish ``state`` repeatedly, once ``after()`` is true (if given) and ``delay_s`` passed."""

        def run():
            while after is not None and not after():
                if self._stop.wait(0.005):
                    return
            if self._stop.wait(delay_s):
                return
            self.state = state
            self.started_at = time.monotonic()
            while not self._stop.is_set():
                self.sock.send(state.encode())
                self.sent += 1
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sock.close(linger=0)
        self.ctx.term()


def _wait_for_state(sub: ControlSubscriber, timeout_s: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout_s
    while sub.poll() is None and sub.ignored == 0:
        assert time.monotonic() < deadline, "no control message reached the subscriber"
        time.sleep(0.005)


@contextmanager
def _single_process(short_dir: Path, run_id: str) -> Iterator[tuple[Publisher, ControlSubscriber, StopAgreement]]:
    """The publisher, subscriber and world-size-1 agreement the single-process tests set up and close alike."""
    endpoint = f"ipc://{short_dir}/control.sock"
    pub = Publisher(endpoint)
    sub = ControlSubscriber(endpoint, run_id)
    agreement = StopAgreement(rank=0, world_size=1, subscriber=sub)
    try:
        yield pub, sub, agreement
    finally:
        agreement.close()
        pub.close()


# --------------------------------------------------------------- single process


def test_single_process_stops_at_exactly_stop_at_step(short_dir):
    with _single_process(short_dir, "run-a") as (pub, sub, agreement):
        pub.start(ControlState(run_id="run-a", seq=1, stop_at_step=25, reason="plateau"))
        _wait_for_state(sub)  # PUB/SUB slow joiner: the first sends may be lost
        stopped = None
        for step in range(1, 101):
            if agreement.should_stop(step):
                stopped = step
                break
        assert stopped == 25
        assert agreement.reason == "plateau"
        assert sub.ignored == 0


def test_single_process_late_message_stops_at_next_step(short_dir):
    with _single_process(short_dir, "run-a") as (pub, sub, agreement):
        # steps go on until the stop (however long the message takes to arrive); only a hang ends them
        deadline = time.monotonic() + HANG_S
        stopped, step = None, 0
        while stopped is None:
            step += 1
            assert time.monotonic() < deadline, f"no stop after {HANG_S}s ({step} steps)"
            if step == 30:
                pub.start(ControlState(run_id="run-a", seq=1, stop_at_step=10, reason="late"))
            if agreement.should_stop(step):
                stopped = step
            time.sleep(0.002)
        assert stopped >= 30
        assert agreement.agreed_stop_step == 10


def test_stale_run_id_is_ignored(short_dir):
    with _single_process(short_dir, "run-new") as (pub, sub, agreement):
        pub.start(ControlState(run_id="run-old", seq=7, stop_at_step=3, reason="stale"))
        _wait_for_state(sub)
        for step in range(1, 101):
            assert not agreement.should_stop(step), f"stopped at {step} on another run's message"
            time.sleep(0.001)
        assert sub.ignored > 0
        assert sub.latest is None
        assert agreement.agreed_stop_step is None


def test_stale_then_current_run_id(short_dir):
    """A stale decision does not mask the current run's one that follows it."""
    endpoint = f"ipc://{short_dir}/control.sock"
    pub = Publisher(endpoint)
    sub = ControlSubscriber(endpoint, "run-new")
    try:
        pub.start(ControlState(run_id="run-old", seq=9, stop_at_step=3, reason="stale"))
        _wait_for_state(sub)
        pub.close()
        pub = Publisher(endpoint)
        pub.start(ControlState(run_id="run-new", seq=1, stop_at_step=40, reason="x"))
        deadline = time.monotonic() + HANG_S
        while sub.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert sub.latest.stop_at_step == 40 and sub.ignored > 0
    finally:
        sub.close()
        pub.close()


def test_control_state_default_reason_round_trips():
    from evald.contracts.wire import decode

    state = ControlState(run_id="run-a", seq=0)  # what evald.control.ControlPublisher sends first
    assert decode(state.encode()) == state
    stop = ControlState(run_id="run-a", seq=1, stop_at_step=5)
    assert decode(stop.encode()).stop_at_step == 5


# ---------------------------------------------------- agreement rule, fake collective


class _FakeSum:
    """What an all-reduce SUM would return if rank 0 voted ``vote``."""

    def __init__(self, vote):
        self.vote = vote
        self.calls: list[int] = []

    def __call__(self, vector):
        self.calls.append(int(np.asarray(vector).sum()))
        return np.array(self.vote, dtype=np.int64)


def test_agreement_rule_with_fake_collective():
    # rank 1 never votes (no subscriber); it learns the decision only from the SUM.
    fake = _FakeSum([0, 0])
    ag = StopAgreement(rank=1, world_size=4, agree_every=5, reduce_sum=fake)
    assert not any(ag.should_stop(s) for s in range(1, 10))
    assert len(fake.calls) == 1 and fake.calls == [0]  # only at step 5; a zero vote
    fake.vote = [30, 1]  # rank 0's vote: stop at step 30
    stops = [s for s in range(10, 41) if ag.should_stop(s)]
    assert stops[0] == 30 and ag.agreed_stop_step == 30
    assert len(fake.calls) == 2  # step 10 agreed; no collective after the decision

    late = StopAgreement(rank=2, world_size=4, agree_every=5, reduce_sum=_FakeSum([3, 1]))
    assert [s for s in range(1, 12) if late.should_stop(s)][0] == 5  # max(3, 5)

    with pytest.raises(ValueError):
        StopAgreement(rank=0, world_size=2)


# ------------------------------------------------------------ multi-process trials
