"""Stopping together across real rank processes (tests/rank_worker.py), against a real ZeroMQ PUB socket.

* many trials of 4 independent rank processes whose "AllReduce" is a blocking file collective,
  jittered per rank, while a publisher thread (like evald, re-publishing every 20 ms) announces a
  stop at a random step after a random delay: every rank exits 0, all stop at the same step,
  never before the published one;
* control: a rank that stops on local receipt leaves the others hanging (the harness detects
  it), which is why the agreement exists.
The single-process rules: tests/unit/trainer_hooks/test_stop_agreement.py. Trial count: $EVALD_STOP_TRIALS (default 20).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")

from evald.contracts.wire import ControlState  # noqa: E402
from tests.unit.trainer_hooks.test_stop_agreement import (  # noqa: E402
    HANG_EXIT, N_TRIALS, REPO, STEPS, WORKER, WORLD, Publisher)


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
               wall_limit_s: float = 90.0, await_stop: bool = False) -> tuple[list[int], list[dict]]:
    coll = workdir / "coll"
    coll.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), GLOG_v="3")
    procs = []
    for r in range(world):
        cmd = [sys.executable, str(WORKER), "--rank", str(r), "--world-size", str(world),
               "--endpoint", endpoint, "--run-id", run_id, "--steps", str(steps),
               "--agree-every", str(agree_every), "--out", str(workdir / f"rank{r}.json"),
               "--collective-dir", str(coll), "--step-sleep", str(step_sleep),
               "--seed", str(seed), "--timeout", str(timeout), "--mode", mode,
               *(["--await-stop"] if await_stop else [])]
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
            # --await-stop: rank 0 starts the last step once it has heard the stop, so the stop is agreed within
            # the run however far the ranks got before the publisher thread ran (before: a loaded machine could
            # let them finish all STEPS first: "no rank stopped")
            codes, results = _run_ranks(workdir, endpoint, run_id, seed=trial, agree_every=agree_every,
                                        start_publisher=start, await_stop=True)
            wall = time.monotonic() - t0
        finally:
            pub.close()
        where = (f"trial {trial}: stop_at={stop_at} agree_every={agree_every} trigger_call={trigger_call} "
                 f"results={results} codes={codes}")
        assert codes == [0] * WORLD, f"a rank failed or hung; {where}"
        stopped = {r["stopped_at"] for r in results}
        assert len(stopped) == 1, f"ranks stopped at different steps; {where}"
        (stopped_at,) = stopped
        assert stopped_at is not None, f"no rank stopped (stop never agreed, even at the last step); {where}"
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
