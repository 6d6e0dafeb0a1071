"""examples/tiny_lm's trainer (unchanged: either loop) paced by a real evald's events, so that a test of the two
side by side does not depend on which of them the machine runs faster.

    python -m tests.paced_trainer [--control-endpoint EP] PACING TRAIN_ARGS...   (TRAIN_ARGS: examples.tiny_lm.train's)

PACING is one of:

``--lockstep``: before each snapshot after the first, wait until evald is done with the previous one (its control
state on EP names it released or best), so that evald is never more than one checkpoint behind: its decisions
(an early stop at ``newest checkpoint + margin``) reach the trainer before it has trained past them.

``--hold-evald PID --hold-until {skipped,deleted} [--await-release]`` (tests/e2e/test_retention_e2e.py), at the
start of the hook's ``step_end`` calls, in this order:

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

EP defaults to EVALD_CONTROL_ENDPOINT. Each phase is printed ("paced: ..."). A wait longer than ``HANG_S`` is a
hang: exit 3, saying what was awaited. A held evald is always let go again (SIGCONT) before this process exits.
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


class Pacing:
    """What the options above ask for, for one hook; ``at_step_start`` runs first in every ``step_end``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.endpoint, self.lockstep = args.control_endpoint, args.lockstep
        self.evald_pid, self.hold_until, self.await_release = args.hold_evald, args.hold_until, args.await_release
        self.phase = "hear" if self.evald_pid else "done"
        self.stopped = False
        self._subscriber: Any = None

    def at_step_start(self, hook: Any, step: int) -> None:
        if self._subscriber is None:
            from trainer_hooks.stop_agreement import ControlSubscriber

            self._subscriber = ControlSubscriber(self.endpoint, hook.run_id)
        if self.lockstep and step % hook.every_n_steps == 0 and step > hook.every_n_steps:
            previous = step - hook.every_n_steps
            wait(lambda: self._done_with(previous), f"evald to be done with step {previous}")
            say(f"evald done with step {previous} before the snapshot at step {step}")
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
        first = wait(self._subscriber.poll, f"evald's control state for run {run_id} on {self.endpoint}")
        wait(lambda: self._subscriber.poll() is not first, "evald's control state a second time")
        say(f"heard evald's control state for run {run_id}")

    def _done_with(self, step: int) -> bool:
        state = self._subscriber.poll()
        return state is not None and (step in state.released or step == state.best_step)

    def _held_count(self, hook: Any) -> int:
        retention = hook.writer.retention
        return retention.skipped if self.hold_until == "skipped" else retention.deleted

    def _released_on_disk(self, hook: Any) -> list[int]:
        from evald.contracts import layout

        state = self._subscriber.poll()
        on_disk = {step for step, _ in layout.list_committed(hook.ckpt_dir)}
        return sorted(set(state.released) & on_disk) if state is not None else []


def say(text: str) -> None:
    print(f"paced: {text}", flush=True)


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
    p.add_argument("--control-endpoint", default=os.environ.get("EVALD_CONTROL_ENDPOINT"),
                   help="where evald publishes its control state")
    p.add_argument("--lockstep", action="store_true")
    p.add_argument("--hold-evald", type=int, metavar="PID")
    p.add_argument("--hold-until", choices=("skipped", "deleted"))
    p.add_argument("--await-release", action="store_true")
    args, train_args = p.parse_known_args(argv)
    if not args.control_endpoint:
        p.error("no --control-endpoint and no EVALD_CONTROL_ENDPOINT")
    if (args.hold_evald is None) != (args.hold_until is None) or (args.await_release and not args.hold_evald):
        p.error("--hold-evald and --hold-until go together; --await-release needs them")
    if not (args.lockstep or args.hold_evald):
        p.error("no pacing: give --lockstep or --hold-evald")
    return args, train_args


def main(argv: list[str] | None = None) -> int:
    args, train_args = parse_args(argv)
    pacing = Pacing(args)

    import trainer_hooks
    from trainer_hooks import hook as hook_module

    class PacedHook(hook_module.EvaldHook):
        def step_end(self, step: int, **kwargs: Any) -> bool:
            pacing.at_step_start(self, step)
            return super().step_end(step, **kwargs)

        def train_end(self, final_step: int, **kwargs: Any) -> None:
            if pacing.phase == "hold":
                pacing.let_go(f"at the end of training, the hook's {pacing.hold_until} count still 0: {self.stats()}")
            super().train_end(final_step, **kwargs)

    # what train.main's loops use: the custom loop imports trainer_hooks.EvaldHook when it starts, and
    # EvaldCallback (Model.train) trainer_hooks.hook's when it is first imported, which is after this
    hook_module.EvaldHook = trainer_hooks.EvaldHook = PacedHook
    from examples.tiny_lm import train

    try:
        return train.main(train_args)
    finally:
        pacing.let_go("as the trainer exits")


if __name__ == "__main__":
    sys.exit(main())
