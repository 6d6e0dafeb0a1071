"""The trainer's own pruning, honouring evald's leases: never delete a snapshot evald still needs.

Runs on the snapshot writer's thread, before each snapshot is written (never on the training
thread). With a budget (``keep_last`` snapshots and/or ``max_bytes`` on disk; the best
checkpoint is kept beside it), the oldest snapshots go first, but only those evald released
(evald.contracts.retention: it evaluated, skipped or failed them; it has not released a step it
has not heard of). If the budget is still full, the NEW snapshot is skipped and counted, and an
older one is never deleted in its place. The final snapshot of a run is always written.

evald's state comes from its control channel through this thread's own SUB socket (ZeroMQ
sockets belong to one thread). A state is relied on for ``lease_s`` after evald was last known
alive; when no evald is reachable (none ever heard, or silent for longer), the budget alone
decides, oldest first, as ``keep_last`` always did, and the hook says so once per change.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from evald.contracts import layout
from evald.contracts.auth import SecurityConfig
from evald.contracts.retention import may_delete
from evald.contracts.wire import ControlState, ProtocolError, decode
from trainer_hooks.stop_agreement import ControlSubscriber

log = logging.getLogger("trainer_hooks.retention")

DEFAULT_LEASE_S = 60.0
WAIT_FOR_FRESH_S = 3.0     # evald republishes every second
HEADER_MARGIN = 64 << 10   # a new snapshot's files: its weights plus headers and manifest


@dataclass(frozen=True)
class Snapshot:
    step: int
    path: Path
    nbytes: int


@dataclass
class Plan:
    delete: list[Snapshot] = field(default_factory=list)
    write: bool = True
    held: list[int] = field(default_factory=list)   # kept only because evald has not released them
    over_budget: bool = False                        # the final snapshot, written although it does not fit


def plan(on_disk: Sequence[Snapshot], *, keep_last: int | None, max_bytes: int | None, new_bytes: int,
         deletable: Callable[[int], bool], best: int | None, final: bool = False) -> Plan:
    """Which snapshots to delete, oldest first, so that one more fits; and whether it may be written."""
    kept = sorted((s for s in on_disk if s.step != best), key=lambda s: s.step)

    def fits() -> bool:
        return ((keep_last is None or len(kept) + 1 <= keep_last)
                and (max_bytes is None or sum(s.nbytes for s in kept) + new_bytes <= max_bytes))

    result = Plan()
    for snapshot in list(kept):
        if fits():
            break
        if deletable(snapshot.step):
            kept.remove(snapshot)
            result.delete.append(snapshot)
        else:
            result.held.append(snapshot.step)
    fitted = fits()
    result.write, result.over_budget = fitted or final, final and not fitted
    return result


class _Listener(ControlSubscriber):
    """This run's newest control state, whatever its seq (a restarted evald with a fresh ledger counts
    from 0 again; for leases only the newest word matters), and a bounded wait for the next one."""

    def _accept(self, frame: bytes) -> None:
        try:
            message = decode(frame)
        except ProtocolError:
            self.ignored += 1
            return
        if isinstance(message, ControlState) and message.run_id == self.run_id:
            self.latest = message
        else:
            self.ignored += 1

    def wait(self, timeout_s: float) -> bool:
        before, deadline = self.latest, time.monotonic() + timeout_s
        while self._socket is not None and self.latest is before:
            left = deadline - time.monotonic()
            if left <= 0 or not self._socket.poll(int(left * 1000)):
                break
            self.poll()
        return self.latest is not before


class Retention:
    """The budget and the leases, for one checkpoint directory; every method runs on the writer thread."""

    def __init__(self, ckpt_dir: Path, *, keep_last: int | None = None, max_bytes: int | None = None,
                 control_endpoint: str | None = None, run_id: str | None = None,
                 security: SecurityConfig | None = None) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (or None), got {keep_last!r}")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1 (or None), got {max_bytes!r}")
        self.ckpt_dir, self.keep_last, self.max_bytes = Path(ckpt_dir), keep_last, max_bytes
        self._endpoint, self._run_id, self._security = control_endpoint, run_id, security  # CURVE like the hook's
        self._listener: _Listener | None = None
        self._drained_at: float | None = None   # when the socket was last emptied
        self._alive_at: float | None = None     # evald was alive at or after this time
        self._silent = False                    # a wait for a fresh state came back empty
        self._fallback: bool | None = None
        self._sizes: dict[Path, int] = {}
        self.best_seen: int | None = None       # the last best evald named: kept even in fallback
        self.deleted = 0
        self.skipped = 0
        self.last_skip_reason = ""
        self._held: list[int] = []
        # (step, directory) of the snapshots this writer may delete: its whole ones, or its parts (set by the writer)
        self.list_own: Callable[[], list[tuple[int, Path]]] = lambda: layout.list_committed(self.ckpt_dir)

    def listen(self) -> None:
        """Connect now (on the writer thread), so that evald's state is there by the first snapshot."""
        if self._listener is None and self._endpoint and self._run_id:
            self._listener = _Listener(self._endpoint, self._run_id, self._security)
            self._drained_at = time.monotonic()

    def current(self) -> ControlState | None:
        """evald's state if it may be relied on now, else None (no evald reachable)."""
        self.listen()
        if self._listener is None:
            return None
        before, now = self._listener.latest, time.monotonic()
        self._listener.poll()
        if self._listener.latest is not before:  # sent some time after the previous drain
            self._alive_at, self._silent = self._drained_at, False
        self._drained_at = now
        lease_s = self._lease_s()
        stale = self._alive_at is None or now - self._alive_at > lease_s / 2
        if self._listener.latest is not None and stale and not self._silent:
            # evald republishes every second: a short wait tells "alive" from "gone" (once, until it speaks again)
            if self._listener.wait(min(WAIT_FOR_FRESH_S, lease_s / 2)):
                self._alive_at = now
                self._drained_at = time.monotonic()
            else:
                self._silent = True
        if self._alive_at is None or time.monotonic() - self._alive_at > self._lease_s():
            return None
        return self._listener.latest

    def _lease_s(self) -> float:
        state = self._listener.latest if self._listener else None
        return state.lease_s if state is not None and state.lease_s else DEFAULT_LEASE_S

    def make_room(self, step: int, new_bytes: int, *, final: bool = False) -> bool:
        """Delete what may go so that snapshot ``step`` fits; False (counted, logged) to skip it."""
        state = self.current()
        self._say_mode(state)
        if state is not None:
            self.best_seen = state.best_step if state.best_step is not None else self.best_seen
        deletable = (lambda s: may_delete(state, s)) if state is not None else (lambda s: True)
        chosen = plan(self._on_disk(), keep_last=self.keep_last, max_bytes=self.max_bytes,
                      new_bytes=new_bytes + HEADER_MARGIN, deletable=deletable, best=self.best_seen, final=final)
        for snapshot in chosen.delete:
            shutil.rmtree(snapshot.path, ignore_errors=True)
            self._sizes.pop(snapshot.path, None)
            self.deleted += 1
            why = "released by evald" if state is not None else "no evald reachable: budget alone"
            log.info("removed snapshot %s (%s)", snapshot.path.name, why)
        if not chosen.write:
            self.skipped += 1
            self.last_skip_reason = (
                f"snapshot at step {step} skipped: the disk budget ({self._budget()}) is full of snapshots evald "
                f"still needs (steps {', '.join(map(str, chosen.held))}); they are deleted once evald is done "
                f"with them ({self.skipped} skipped so far)")
            # once per set of held snapshots, not once per step while evald works through them
            log.log(logging.WARNING if chosen.held != self._held else logging.DEBUG, "%s", self.last_skip_reason)
        elif chosen.over_budget:
            log.warning("final snapshot at step %d written beyond the disk budget (%s): evald still needs steps %s "
                        "and evaluates the final checkpoint of every run", step, self._budget(), chosen.held)
        self._held = chosen.held
        return chosen.write

    def _say_mode(self, state: ControlState | None) -> None:
        fallback = state is None
        if fallback != self._fallback and (self.keep_last or self.max_bytes):
            if fallback:
                log.warning("no evald reachable on its control channel: the budget (%s) alone decides which "
                            "snapshots go, oldest first; one evald has not evaluated yet may be deleted",
                            self._budget())
            elif self._fallback is not None:
                log.info("evald reachable again: only snapshots it has released are deleted")
        self._fallback = fallback

    def _budget(self) -> str:
        parts = [f"keep_last {self.keep_last}"] if self.keep_last else []
        return ", ".join(parts + ([f"max_bytes {self.max_bytes}"] if self.max_bytes else []))

    def _on_disk(self) -> list[Snapshot]:
        found = []
        for step, path in self.list_own():
            if path not in self._sizes:
                try:
                    self._sizes[path] = sum(f.bytes for f in layout.read_manifest(path).files) + os.path.getsize(
                        path / layout.MANIFEST_FILE)
                except (OSError, layout.LayoutError):
                    continue  # vanished or not ours to judge: never deleted by us
            found.append(Snapshot(step, path, self._sizes[path]))
        return found

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
