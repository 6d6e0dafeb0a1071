"""examples/tiny_lm's trainer (its custom loop, unchanged) holding a real evald back at a known point, for
tests/e2e/test_retention_e2e.py: which of the two is ahead is decided by events, not by the machine's speed.

    python -m tests.held_evald_trainer --evald-pid PID --control-endpoint EP --hold-until skipped \
        [--await-release] TRAIN_ARGS...    (TRAIN_ARGS: examples.tiny_lm.train's, --loop custom)

At the start of the hook's ``step_end`` calls, in this order:

1. before the first snapshot: wait until evald's control state for this run has been heard twice on EP (evald has
   attached the directory, watches it and publishes; the hook's own subscribers, connected when the hook was
   made, have heard it too, so the first snapshot already obeys evald's leases);
2. SIGSTOP evald: from now on it neither evaluates nor releases anything (the checkpoint notifications and the
   directory watch's inotify events wait in the kernel until it runs again);
3. train on until the hook's retention counter named by ``--hold-until`` is at least 1: ``skipped`` (a snapshot
   skipped because the budget is full of snapshots evald has not released) or ``deleted`` (one deleted by the
   budget: with no evald reachable, one evald has not read);
4. SIGCONT evald;
5. with ``--await-release``, before the next snapshot: wait until evald's state releases a step that is still on
   disk (evaluated, not the best), so that the budget deletes an evaluated snapshot during the rest of the run.

Each phase is printed ("held evald: ..."). A wait longer than ``HANG_S`` is a hang: exit 3, saying what was awaited.
evald is always let go again (SIGCONT) before this process exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, Callable

HANG_S = 200.0   # below the 300 s the tests give the trainer, so that they show what was awaited
HANG_EXIT = 3


class HeldEvald:
    """The phases above, for one hook; ``at_step_start`` runs first in every ``step_end``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.evald_pid, self.endpoint = args.evald_pid, args.control_endpoint
        self.hold_until, self.await_release = args.hold_until, args.await_release
        self.phase = "hear"
        self.stopped = False
        self._subscriber: Any = None

    def at_step_start(self, hook: Any, step: int) -> None:
        if self.phase == "hear":
            self._hear_twice(hook.run_id)
            os.kill(self.evald_pid, signal.SIGSTOP)
            self.stopped, self.phase = True, "hold"
            say(f"evald {self.evald_pid} stopped at step {step}; training on until the hook's "
                f"{self.hold_until} count is 1")
        if self.phase == "hold" and self._held_count(hook) >= 1:
            self.let_go(f"at step {step}: {hook.stats()}")
            self.phase = "release" if self.await_release else "done"
        if self.phase == "release" and step % hook.every_n_steps == 0:
            released = wait(lambda: self._released_on_disk(hook), "evald to release a snapshot still on disk")
            say(f"evald released step(s) {released} (still on disk) before the snapshot at step {step}")
            self.phase = "done"

    def let_go(self, why: str) -> None:
        if not self.stopped:
            return
        self.stopped = False
        try:
            os.kill(self.evald_pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        say(f"evald {self.evald_pid} continued {why}")

    def _hear_twice(self, run_id: str) -> None:
        from trainer_hooks.stop_agreement import ControlSubscriber

        self._subscriber = ControlSubscriber(self.endpoint, run_id)
        first = wait(self._subscriber.poll, f"evald's control state for run {run_id} on {self.endpoint}")
        wait(lambda: self._subscriber.poll() is not first, "evald's control state a second time")
        say(f"heard evald's control state for run {run_id}")

    def _held_count(self, hook: Any) -> int:
        retention = hook.writer.retention
        return retention.skipped if self.hold_until == "skipped" else retention.deleted

    def _released_on_disk(self, hook: Any) -> list[int]:
        from evald.contracts import layout

        state = self._subscriber.poll()
        on_disk = {step for step, _ in layout.list_committed(hook.ckpt_dir)}
        return sorted(set(state.released) & on_disk) if state is not None else []


def say(text: str) -> None:
    print(f"held evald: {text}", flush=True)


def wait(predicate: Callable[[], Any], what: str) -> Any:
    """The first true value of ``predicate``, checked every 50 ms; exits HANG_EXIT after HANG_S (a hang)."""
    deadline = time.monotonic() + HANG_S
    while not (value := predicate()):
        if time.monotonic() > deadline:
            say(f"gave up after {HANG_S:.0f}s waiting for {what}")
            sys.exit(HANG_EXIT)
        time.sleep(0.05)
    return value


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--evald-pid", type=int, required=True)
    p.add_argument("--control-endpoint", required=True, help="where evald publishes its control state")
    p.add_argument("--hold-until", choices=("skipped", "deleted"), required=True)
    p.add_argument("--await-release", action="store_true")
    return p.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, train_args = parse_args(argv)
    held = HeldEvald(args)

    import trainer_hooks
    from examples.tiny_lm import train

    class HeldEvaldHook(trainer_hooks.EvaldHook):
        def step_end(self, step: int, **kwargs: Any) -> bool:
            held.at_step_start(self, step)
            return super().step_end(step, **kwargs)

        def train_end(self, final_step: int, **kwargs: Any) -> None:
            if held.phase == "hold":
                held.let_go(f"at the end of training, the hook's {held.hold_until} count still 0: {self.stats()}")
            super().train_end(final_step, **kwargs)

    trainer_hooks.EvaldHook = HeldEvaldHook  # what train.main imports when it starts
    try:
        return train.main([*train_args, "--loop", "custom"])  # the loop that calls EvaldHook.step_end
    finally:
        held.let_go("as the trainer exits")


if __name__ == "__main__":
    sys.exit(main())
