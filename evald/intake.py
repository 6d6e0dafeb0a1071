"""Intake: entries of the checkpoint directory become ledger rows, once each.

Whatever found an entry (a ZeroMQ notification, a watchdog event, a rescan), the
entry is judged once (the ledger's ``files`` table remembers it) and one training
step gets one row, read from the most trustworthy file that carries it
(evald.checkpoints.PREFERENCE). A new step is admitted or skipped by the lag policy
in the same transaction that creates its row. The parts of a partitioned snapshot
wait in evald.assembly until the step they make up is complete (one row, read from
all of them), cannot be made up (failed), or times out (skipped: incomplete).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from evald.assembly import Assembled, PartGroups, Unusable
from evald.checkpoints import FOREIGN_SUFFIXES, PART, PARTS, PREFERENCE, Found, Rejected, recognise
from evald.config import EvaldConfig
from evald.contracts import layout
from evald.lag_policy import admit
from evald.ledger import DUPLICATE, QUEUED, REJECTED, Ledger

log = logging.getLogger("evald.intake")


class Intake:
    def __init__(self, ckpt_dir: Path, ledger: Ledger, config: EvaldConfig) -> None:
        self.ckpt_dir = ckpt_dir
        self.ledger = ledger
        self.config = config
        self.final_step: int | None = None  # the run's last step, never skipped by the lag policy
        self.newest_step = max(ledger.step_numbers(), default=0)
        self._judged: set[str] = set()      # names already in the ledger's files table
        self._settling: dict[str, float] = {}  # foreign files still being written: name -> recheck time
        self.parts = PartGroups(config.tuning.parts_timeout_s)  # partitioned steps waiting for their parts
        self.run_id: str | None = None      # the announced run (names the odd one out among mixed parts)

    def found(self, name: str, found_via: str, now: float | None = None) -> bool:
        """An entry appeared (or may have): admit what it carries, once. True if it was new."""
        if name in self._judged or "/" in name:
            return False
        if self.ledger.file_status(name) is not None:
            self._judged.add(name)
            return False
        tuning = self.config.tuning
        verdict = recognise(self.ckpt_dir, name, steps_per_epoch=self.config.foreign_steps_per_epoch,
                            settle_s=tuning.foreign_settle_s, now=now)
        if verdict is None:
            if name.endswith(FOREIGN_SUFFIXES) and not layout.is_temp_name(name) and (self.ckpt_dir / name).exists():
                self._settling[name] = (now or time.time()) + tuning.foreign_settle_s
            return False
        self._settling.pop(name, None)
        self._judged.add(name)
        if isinstance(verdict, Rejected):
            self._reject(verdict)
        elif verdict.kind == PART:
            self._part(verdict, found_via)
        else:
            self._admit(verdict, found_via)
        return True

    def forget_judged(self) -> None:
        """Names forgotten by the ledger (``evald retry``) are judged again when found again."""
        self._judged.clear()

    def recheck_settled(self, now: float | None = None) -> None:
        for unusable in self.parts.expired():
            self._unusable(unusable)
        now = now or time.time()
        for name, due in list(self._settling.items()):
            if now >= due:
                del self._settling[name]
                self.found(name, "rescan", now=now)

    @property
    def settling(self) -> bool:
        return bool(self._settling) or self.parts.waiting

    def _reject(self, verdict: Rejected) -> None:
        status = DUPLICATE if verdict.duplicate else REJECTED
        fail_step = not verdict.duplicate
        self.ledger.note_file(verdict.name, verdict.step, status, verdict.reason, fail_step=fail_step)
        level = logging.INFO if verdict.duplicate else logging.ERROR
        log.log(level, "%s %s: %s", "ignored" if verdict.duplicate else "rejected", verdict.name, verdict.reason,
                extra={"key": verdict.name, "step": verdict.step, "status": status, "reason": verdict.reason})

    def _part(self, part: Found, found_via: str) -> None:
        existing = self.ledger.step(part.step)
        if existing is not None and not self.parts.is_waiting(part.step):
            reason = f"step {part.step} is read from {existing.source} ({existing.state}); one step gets one evaluation"
            self.ledger.note_file(part.name, part.step, DUPLICATE, reason)
            log.info("ignored %s: %s", part.name, reason)
            return
        outcome = self.parts.add(part, found_via, self.run_id)
        if isinstance(outcome, Assembled):
            self._admit(outcome.found, found_via, outcome.members)
        elif isinstance(outcome, Unusable):
            self._unusable(outcome)
        else:
            log.info("found %s; step %d waits for its other parts", part.name, part.step)

    def _unusable(self, unusable: Unusable) -> None:
        """Parts that cannot make up their step: incomplete (skipped) or not fitting (failed), with the reason."""
        step, members = unusable.step, unusable.members
        if self.ledger.step(step) is not None:  # the step is read from another file meanwhile
            for name in members:
                self.ledger.note_file(name, step, DUPLICATE, f"step {step} is read from another file")
        elif unusable.reason.startswith("incomplete"):
            self.ledger.admit(name=unusable.source, step=step, kind=PARTS, found_via=unusable.found_via,
                              run_id=unusable.run_id, commit_time=unusable.commit_time, skip_reason=unusable.reason,
                              also=members)
        else:
            self.ledger.note_file(unusable.source, step, REJECTED, unusable.reason, fail_step=True, also=members)
        log.error("step %d not evaluated: %s (%s)", step, unusable.reason, ", ".join(members))

    def _admit(self, found: Found, found_via: str, members: tuple[str, ...] = ()) -> None:
        existing = self.ledger.step(found.step)
        if existing is None:
            steps = sorted({*self.ledger.step_numbers(), found.step})
            reason = admit(self.config.lag_policy, self.config.effective_every_k, steps.index(found.step),
                           found.step, final_step=self.final_step)
            self.ledger.admit(name=found.name, step=found.step, kind=found.kind, found_via=found_via,
                              run_id=found.run_id, commit_time=found.commit_time, skip_reason=reason, also=members)
            self.newest_step = max(self.newest_step, found.step)
            log.info("found step %d in %s via %s%s", found.step, found.name, found_via,
                     f"; skipped: {reason}" if reason else "",
                     extra={"step": found.step, "key": found.name, "found_via": found_via,
                            "state": "skipped" if reason else QUEUED, "reason": reason})
            return
        if existing.state == QUEUED and found.preference < PREFERENCE.get(existing.kind, 99):
            self.ledger.replace_source(found.step, name=found.name, kind=found.kind, run_id=found.run_id,
                                       commit_time=found.commit_time,
                                       old_reason=f"step {found.step} is read from {found.name} instead", also=members)
            log.info("step %d will be read from %s rather than %s", found.step, found.name, existing.source)
            return
        reason = (f"step {found.step} is read from {existing.source} ({existing.state}); one step gets one "
                  f"evaluation")
        self.ledger.note_file(found.name, found.step, DUPLICATE, reason, also=members)
        log.info("ignored %s: %s", found.name, reason)
