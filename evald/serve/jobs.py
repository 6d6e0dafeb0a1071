"""The bounded queue between the HTTP thread and evald's main thread, and what it counts.

``JobQueue.submit`` (HTTP thread) puts a job in or raises QueueFull (the app answers 429 with
Retry-After); it never blocks. The main thread ``take``s jobs, runs them and sets each job's
``future``; a job whose client gave up (its future cancelled) is skipped. ``wake`` is called on every
submit, so an idle main loop notices at once instead of at its next poll.

``ServeStats`` is shared by both threads under one lock: requests by outcome, waits (queued to
started), run times, tokens, and the longest stretch of serving between two evaluation batches.
``snapshot`` gives consistent numbers for ``evald status`` and the ``serve/*`` TensorBoard scalars.

May import: nothing of evald (the standard library only).
"""

from __future__ import annotations

import collections
import concurrent.futures
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


class QueueFull(Exception):
    """The queue holds ``queue_size`` jobs already."""


@dataclass(eq=False)   # a job is itself: hashable by identity (the runner keeps each started job's rows)
class Job:
    request: Any
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    queued_at: float = field(default_factory=time.monotonic)


class JobQueue:
    def __init__(self, size: int, wake: Callable[[], None] | None = None) -> None:
        self._queue: "queue.Queue[Job]" = queue.Queue(maxsize=size)
        self._deferred: collections.deque[Job] = collections.deque()  # main thread only
        self.size = size
        self.wake = wake or (lambda: None)

    def submit(self, request: Any) -> Job:
        job = Job(request)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull() from None
        self.wake()
        return job

    def depth(self) -> int:
        return self._queue.qsize() + len(self._deferred)

    def pending(self) -> bool:
        return bool(self._deferred) or not self._queue.empty()

    def take(self) -> list[Job]:
        """Every job waiting now (deferred ones first, in order), for the main thread to schedule."""
        jobs = list(self._deferred)
        self._deferred.clear()
        while True:
            try:
                jobs.append(self._queue.get_nowait())
            except queue.Empty:
                return jobs

    def defer(self, jobs: list[Job]) -> None:
        """Jobs that cannot run yet (their step is not in the network): first in line next time."""
        self._deferred.extendleft(reversed(jobs))


class ServeStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.wait_s_total = self.wait_s_max = self.run_s_total = 0.0
        self.tokens_in = self.tokens_out = 0
        self.longest_between_batches_s = 0.0
        self.swaps = 0
        self._recent_waits: collections.deque[float] = collections.deque(maxlen=1000)

    def count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.counts[outcome] += n

    def ran(self, wait_s: float, run_s: float, tokens_in: int, tokens_out: int) -> None:
        with self._lock:
            self.counts["served"] += 1
            self.wait_s_total += wait_s
            self.wait_s_max = max(self.wait_s_max, wait_s)
            self._recent_waits.append(wait_s)
            self.run_s_total += run_s
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out

    def between_batches(self, seconds: float) -> None:
        with self._lock:
            self.longest_between_batches_s = max(self.longest_between_batches_s, seconds)

    def snapshot(self, queue_depth: int) -> dict[str, float]:
        with self._lock:
            served = self.counts["served"]
            waits = sorted(self._recent_waits)
            return {
                "requests": float(sum(self.counts.values())), "served": float(served),
                "refused": float(self.counts["refused"]), "busy": float(self.counts["busy"]),
                "failed": float(self.counts["failed"]), "timed_out": float(self.counts["timed_out"]),
                "queue_depth": float(queue_depth), "swaps": float(self.swaps),
                "wait_s_mean": self.wait_s_total / served if served else 0.0,
                "wait_s_p50": waits[len(waits) // 2] if waits else 0.0,
                "wait_s_max": self.wait_s_max, "run_s_total": self.run_s_total,
                "tokens_in": float(self.tokens_in), "tokens_out": float(self.tokens_out),
                "longest_between_batches_s": self.longest_between_batches_s,
            }
