"""A call that must end within a bound (an issue's "never hangs"), run on a daemon thread so that a hang
fails the test instead of hanging the run. A call stuck opening a FIFO is let go afterwards by opening
the FIFOs it may be blocked on from the other side, so the thread ends too.

A bound on how much work a call does (an issue's "takes well under 2 s") is a bound on the CPU time of the
thread that runs it (``cpu_within``): the same on an idle machine and on a loaded one, where the wall-clock
time of the same call grows with every other process that shares the cores."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def release_fifos(paths: Iterable[Path]) -> None:
    """Open (and close) every FIFO at ``paths`` or below them for writing and for reading, without blocking:
    a reader blocked in open() waits for a writer, a writer for a reader."""
    for path in paths:
        found = [Path(d) / n for d, _, names in os.walk(path) for n in names] if Path(path).is_dir() else [path]
        for fifo in found:
            for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
                try:
                    os.close(os.open(fifo, flags))
                except OSError:
                    pass


def within(seconds: float, call: Callable[[], T], *, release: Iterable[Path] = (),
           what: str = "still running") -> T:
    """``call()``'s result (or its exception, raised here); AssertionError ``what`` if it is still running
    after ``seconds``, once the FIFOs at ``release`` have let it go."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    hung = thread.is_alive()
    release = list(release)
    deadline = time.monotonic() + 30
    while thread.is_alive() and release and time.monotonic() < deadline:
        release_fifos(release)
        thread.join(0.1)
    assert not hung, f"{what} after {seconds}s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


HANG_S = 120.0   # the wall-clock bound of cpu_within: only a hang, never a slow (shared) machine, reaches it


def cpu_within(seconds: float, call: Callable[[], T], *, what: str = "the call") -> T:
    """``call()``'s result; AssertionError if the thread that ran it used more than ``seconds`` of CPU time (or
    it still runs after HANG_S of wall-clock time: a hang)."""
    def timed() -> tuple[T, float]:
        started = time.thread_time()
        value = call()
        return value, time.thread_time() - started

    value, cpu_s = within(HANG_S, timed, what=f"{what} still running")
    assert cpu_s <= seconds, f"{what} used {cpu_s:.2f}s of CPU time, more than {seconds}s"
    return value
