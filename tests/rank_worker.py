"""One stand-in "rank" of a data-parallel job, for tests/unit/trainer_hooks/test_stop_agreement.py.

Run as a separate process per rank. No MindSpore: the AllReduce is replaced by
``FileAllReduce``, a SUM over files in a shared directory that every rank must
reach before any rank can go on, i.e. it blocks like a real collective. A rank
that leaves the collective sequence (stops alone) therefore leaves the others
waiting; after ``--timeout`` seconds they exit with ``HANG_EXIT`` ("hang
detected") instead of hanging the test.

Per step, like real data-parallel training: sleep a per-rank random jitter
(ranks drift in time), one collective standing in for the gradient AllReduce,
then ``StopAgreement.should_stop(step)`` (which runs its own collective every
``--agree-every`` steps through the same ``FileAllReduce``). Only rank 0 gets a
``ControlSubscriber``.

Result (JSON at ``--out``): {"rank", "stopped_at", "reason", "steps_run",
"ignored", "collectives"}; ``stopped_at`` is null when the run completed.

``--mode local`` is the broken design that agreement exists to prevent: rank 0
stops on local receipt of the control message, without a collective.

``--await-stop``: rank 0 starts its last step only once its subscriber has a
stop for this run (the others wait in that step's collective), so that a stop
published at any moment of the run is agreed within it however slowly the
publisher runs beside the ranks; a wait longer than ``--timeout`` / 2 (below the
others' collective timeout) is a hang: rank 0 exits ``HANG_EXIT``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_hooks.stop_agreement import ControlSubscriber, StopAgreement

HANG_EXIT = 3


class CollectiveTimeout(RuntimeError):
    pass


class FileAllReduce:
    """All-reduce SUM across processes through a shared directory.

    Call number ``c`` of rank ``r`` writes ``c_<c>_rank_<r>.npy`` atomically
    (temp file + os.replace), then polls every ``poll_s`` until all
    ``world_size`` files of call ``c`` exist and returns their sum. Every rank
    must make the same sequence of calls, exactly as with a real AllReduce.
    """

    def __init__(self, directory: str | os.PathLike, rank: int, world_size: int,
                 timeout_s: float = 30.0, poll_s: float = 0.001) -> None:
        self.dir = Path(directory)
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.calls = 0

    def _path(self, call: int, rank: int) -> Path:
        return self.dir / f"c_{call:07d}_rank_{rank}.npy"

    def __call__(self, vector: np.ndarray) -> np.ndarray:
        call = self.calls
        self.calls += 1
        mine = self._path(call, self.rank)
        tmp = self.dir / f".tmp_{call:07d}_rank_{self.rank}.npy"
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(vector, dtype=np.int64))
        os.replace(tmp, mine)
        pending = [r for r in range(self.world_size) if r != self.rank]
        deadline = time.monotonic() + self.timeout_s
        while pending:
            pending = [r for r in pending if not self._path(call, r).exists()]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise CollectiveTimeout(
                    f"rank {self.rank}: collective call {call} still waits for ranks {pending} "
                    f"after {self.timeout_s:.1f}s")
            time.sleep(self.poll_s)
        total = np.zeros_like(np.asarray(vector, dtype=np.int64))
        for r in range(self.world_size):
            total += np.load(self._path(call, r))
        # Every rank has written call `call`, so every rank has finished reading
        # call `call - 1`: our file of that call can go.
        if call > 0:
            try:
                self._path(call - 1, self.rank).unlink()
            except FileNotFoundError:
                pass
        return total


def await_stop(agreement: StopAgreement, timeout_s: float) -> None:
    """Return once rank 0's subscriber has a stop for this run; CollectiveTimeout after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while agreement.agreed_stop_step is None and agreement.local_stop_step() is None:
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"rank 0: no stop heard after {timeout_s:.1f}s of --await-stop")
        time.sleep(0.005)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--endpoint", required=True, help="evald control endpoint (SUB, rank 0 only)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--agree-every", type=int, default=1)
    p.add_argument("--out", required=True, help="JSON result path")
    p.add_argument("--collective-dir", required=True, help="shared directory of the FileAllReduce")
    p.add_argument("--step-sleep", type=float, default=0.003,
                   help="max random sleep per step in seconds (uniform, seeded by rank)")
    p.add_argument("--seed", type=int, default=0, help="mixed with the rank into the jitter seed")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a collective may wait before the rank exits as hung")
    p.add_argument("--mode", choices=("agree", "local"), default="agree")
    p.add_argument("--await-stop", action="store_true",
                   help="rank 0 starts the last step only once it has heard a stop (see above)")
    args = p.parse_args(argv)

    rng = random.Random(args.seed * 1000 + args.rank)
    reduce_sum = FileAllReduce(args.collective_dir, args.rank, args.world_size, timeout_s=args.timeout)
    subscriber = ControlSubscriber(args.endpoint, args.run_id) if args.rank == 0 else None
    agreement = StopAgreement(rank=args.rank, world_size=args.world_size, agree_every=args.agree_every,
                              subscriber=subscriber, reduce_sum=reduce_sum)
    result = {"rank": args.rank, "stopped_at": None, "reason": "completed", "steps_run": 0,
              "ignored": 0, "collectives": 0, "error": None}
    rc = 0
    try:
        for step in range(1, args.steps + 1):
            if args.await_stop and subscriber is not None and step == args.steps:
                await_stop(agreement, args.timeout / 2)
            time.sleep(rng.uniform(0.0, args.step_sleep))
            reduce_sum(np.array([args.rank, 1], dtype=np.int64))  # the "gradient AllReduce"
            result["steps_run"] = step
            if args.mode == "local":
                local = agreement.local_stop_step() if args.rank == 0 else None
                stop = local is not None and step >= local
            else:
                stop = agreement.should_stop(step)
            if stop:
                result["stopped_at"] = step
                result["reason"] = agreement.reason
                break
    except CollectiveTimeout as exc:
        result["error"] = str(exc)
        result["reason"] = "hang detected"
        rc = HANG_EXIT
    finally:
        result["collectives"] = reduce_sum.calls
        if subscriber is not None:
            result["ignored"] = subscriber.ignored
        agreement.close()
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, args.out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
