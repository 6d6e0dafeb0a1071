"""StopAgreement + ControlSubscriber against a real ZeroMQ PUB socket.

* single process (world_size 1): stops at exactly ``stop_at_step``; a late
  message stops at the first step after it arrives; another run's message is
  ignored;
* the agreement rule with a fake collective (max(stop_at_step, step), only on
  ``agree_every`` steps, only rank 0 votes);
* many trials of 4 independent rank processes (tests/rank_worker.py) whose
  "AllReduce" is a blocking file collective, jittered per rank, while a
  publisher thread (like evald, re-publishing every 20 ms) announces a stop at
  a random step after a random delay: every rank exits 0, all stop at the same
  step, never before the published one;
* control: a rank that stops on local receipt leaves the others hanging (the
  harness detects it), which is why the agreement exists.

Trial count: $EVALD_STOP_TRIALS (default 20).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

from evald.contracts.wire import ControlState  # noqa: E402
from trainer_hooks.stop_agreement import ControlSubscriber, StopAgreement  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "rank_worker.py"
HANG_EXIT = 3  # tests/rank_worker.py
N_TRIALS = int(os.environ.get("EVALD_STOP_TRIALS", "20"))
WORLD = 4
STEPS = 200


@pytest.fixture
def short_dir():
    """A short private directory: ipc:// paths must fit in sockaddr_un (~107 bytes)."""
    d = tempfile.mkdtemp(prefix="evs-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


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


def _wait_for_state(sub: ControlSubscriber, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sub.poll() is None and sub.ignored == 0:
        assert time.monotonic() < deadline, "no control message reached the subscriber"
        time.sleep(0.005)


# --------------------------------------------------------------- single process


def test_single_process_stops_at_exactly_stop_at_step(short_dir):
    endpoint = f"ipc://{short_dir}/control.sock"
    pub = Publisher(endpoint)
    sub = ControlSubscriber(endpoint, "run-a")
    agreement = StopAgreement(rank=0, world_size=1, subscriber=sub)
    try:
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
    finally:
        agreement.close()
        pub.close()


def test_single_process_late_message_stops_at_next_step(short_dir):
    endpoint = f"ipc://{short_dir}/control.sock"
    pub = Publisher(endpoint)
    sub = ControlSubscriber(endpoint, "run-a")
    agreement = StopAgreement(rank=0, world_size=1, subscriber=sub)
    try:
        stopped = None
        for step in range(1, 2001):
            if step == 30:
                pub.start(ControlState(run_id="run-a", seq=1, stop_at_step=10, reason="late"))
            if agreement.should_stop(step):
                stopped = step
                break
            time.sleep(0.002)
        assert stopped is not None and stopped >= 30
        assert agreement.agreed_stop_step == 10
    finally:
        agreement.close()
        pub.close()


def test_stale_run_id_is_ignored(short_dir):
    endpoint = f"ipc://{short_dir}/control.sock"
    pub = Publisher(endpoint)
    sub = ControlSubscriber(endpoint, "run-new")
    agreement = StopAgreement(rank=0, world_size=1, subscriber=sub)
    try:
        pub.start(ControlState(run_id="run-old", seq=7, stop_at_step=3, reason="stale"))
        _wait_for_state(sub)
        for step in range(1, 101):
            assert not agreement.should_stop(step), f"stopped at {step} on another run's message"
            time.sleep(0.001)
        assert sub.ignored > 0
        assert sub.latest is None
        assert agreement.agreed_stop_step is None
    finally:
        agreement.close()
        pub.close()


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
        deadline = time.monotonic() + 5
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


def _max_call(collective_dir: Path) -> int:
    best = -1
    for name in os.listdir(collective_dir):
        m = re.match(r"c_(\d+)_rank_", name)
        if m:
            best = max(best, int(m.group(1)))
    return best


def _run_ranks(workdir: Path, endpoint: str, run_id: str, *, seed: int, agree_every: int,
               steps: int = STEPS, world: int = WORLD, step_sleep: float = 0.003,
               timeout: float = 30.0, mode: str = "agree", start_publisher=None,
               wall_limit_s: float = 90.0) -> tuple[list[int], list[dict]]:
    coll = workdir / "coll"
    coll.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), GLOG_v="3")
    procs = []
    for r in range(world):
        cmd = [sys.executable, str(WORKER), "--rank", str(r), "--world-size", str(world),
               "--endpoint", endpoint, "--run-id", run_id, "--steps", str(steps),
               "--agree-every", str(agree_every), "--out", str(workdir / f"rank{r}.json"),
               "--collective-dir", str(coll), "--step-sleep", str(step_sleep),
               "--seed", str(seed), "--timeout", str(timeout), "--mode", mode]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    if start_publisher is not None:
        start_publisher(coll)
    deadline = time.monotonic() + wall_limit_s
    codes, logs = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            pytest.fail(f"rank processes still running after {wall_limit_s}s (hung)")
        codes.append(p.returncode)
        logs.append(out.decode(errors="replace"))
    results = []
    for r in range(world):
        path = workdir / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result (rc {codes[r]}):\n{logs[r]}"
        results.append(json.loads(path.read_text()))
    return codes, results


def test_ranks_agree_on_stop_step_over_many_trials(short_dir):
    summary = []
    for trial in range(N_TRIALS):
        rng = random.Random(1000 + trial)
        agree_every = rng.choice([1, 1, 2, 5])
        stop_at = rng.randint(5, 180)
        trigger_call = rng.randint(0, 150)  # publish once the ranks reach this collective...
        delay = rng.uniform(0.0, 0.05)      # ...plus a random delay
        workdir = short_dir / f"t{trial}"
        workdir.mkdir()
        endpoint = f"ipc://{workdir}/control.sock"
        run_id = f"run-{trial}"
        pub = Publisher(endpoint)
        try:
            def start(coll, pub=pub):
                pub.start(ControlState(run_id=run_id, seq=trial + 1, stop_at_step=stop_at, reason=f"t{trial}"),
                          delay_s=delay, after=lambda: _max_call(coll) >= trigger_call)
            t0 = time.monotonic()
            codes, results = _run_ranks(workdir, endpoint, run_id, seed=trial, agree_every=agree_every,
                                        start_publisher=start)
            wall = time.monotonic() - t0
        finally:
            pub.close()
        where = (f"trial {trial}: stop_at={stop_at} agree_every={agree_every} trigger_call={trigger_call} "
                 f"results={results} codes={codes}")
        assert codes == [0] * WORLD, f"a rank failed or hung; {where}"
        stopped = {r["stopped_at"] for r in results}
        assert len(stopped) == 1, f"ranks stopped at different steps; {where}"
        (stopped_at,) = stopped
        assert stopped_at is not None, f"no rank stopped (stop never agreed within {STEPS} steps); {where}"
        assert stop_at <= stopped_at <= STEPS, where
        # Agreement is reached at a multiple of agree_every; after that, stop at max(S, that step).
        assert stopped_at == stop_at or stopped_at % agree_every == 0, where
        assert len({r["collectives"] for r in results}) == 1, f"collective counts differ; {where}"
        assert results[0]["reason"] == f"t{trial}"
        summary.append((trial, stop_at, stopped_at, agree_every, round(wall, 2)))
        shutil.rmtree(workdir, ignore_errors=True)
    exact = sum(1 for _, s, got, _, _ in summary if got == s)
    print(f"\n{len(summary)} trials, {exact} stopped exactly at stop_at_step, "
          f"{len(summary) - exact} later (decision arrived after it): {summary}")
    assert len(summary) == N_TRIALS


def test_ranks_ignore_other_run_id(short_dir):
    endpoint = f"ipc://{short_dir}/control.sock"
    pub = Publisher(endpoint)
    try:
        def start(coll):
            pub.start(ControlState(run_id="an-earlier-run", seq=3, stop_at_step=2, reason="stale"))
        codes, results = _run_ranks(short_dir, endpoint, "this-run", seed=7, agree_every=1, steps=100,
                                    start_publisher=start)
    finally:
        pub.close()
    assert codes == [0] * WORLD, results
    assert all(r["stopped_at"] is None and r["steps_run"] == 100 for r in results), results
    assert results[0]["ignored"] > 0, results


def test_control_stop_on_local_receipt_hangs_other_ranks(short_dir):
    """Why the agreement exists: rank 0 stopping alone leaves the others in the collective.

    Also shows the harness does detect a hang (the other ranks exit HANG_EXIT).
    """
    endpoint = f"ipc://{short_dir}/control.sock"
    pub = Publisher(endpoint)
    try:
        def start(coll):
            pub.start(ControlState(run_id="r", seq=1, stop_at_step=20, reason="x"), after=lambda: _max_call(coll) >= 4)
        codes, results = _run_ranks(short_dir, endpoint, "r", seed=3, agree_every=1, steps=STEPS,
                                    timeout=1.5, mode="local", start_publisher=start)
    finally:
        pub.close()
    assert codes[0] == 0 and results[0]["stopped_at"] is not None
    assert codes[1:] == [HANG_EXIT] * (WORLD - 1), (codes, results)
    assert all(r["reason"] == "hang detected" for r in results[1:])
