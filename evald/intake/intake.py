"""Intake: entries of the checkpoint directory become ledger rows, once each.

Whatever found an entry (a ZeroMQ notification, a watchdog event, a rescan), the
entry is judged once (the ledger's ``files`` table remembers it) and one training
step gets one row, read from the most trustworthy file that carries it
(evald.files.recognise.PREFERENCE). A new step is admitted or skipped by the lag policy
in the same transaction that creates its row. The parts of a partitioned snapshot
wait in evald.files.parts until the step they make up is complete (one row, read from
all of them), cannot be made up (failed), or times out (skipped: incomplete). An entry
evald's user may not read is kept pending (not judged, not in the ledger) and judged again
every UNREADABLE_RECHECK_S (a change of permissions makes no inotify event that watchdog
reports) and at every rescan.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

from evald.config import EvaldConfig
from evald.contracts import layout
from evald.files import mindformers as mindformers_layout
from evald.files.parts import Assembled, PartGroups, Unusable
from evald.files.recognise import (FOREIGN_SUFFIXES, MAX_STEP, PART, PARTS, PREFERENCE, Found, Pending, Rejected,
                                   recognise, step_from_name)
from evald.intake.lag_policy import admit
from evald.ledger.ledger import ADMITTED, DELETED, DUPLICATE, QUEUED, REJECTED, REPLACED, Ledger

log = logging.getLogger("evald.intake.intake")

UNREADABLE_RECHECK_S = 5.0
FIRST_SOURCES_KEPT = 4096  # entries whose first source is remembered, for the "also via" line
REJECTIONS_LOGGED = 10        # rejections logged in full per window; the others are counted
REJECTION_WINDOW_S = 10.0


class Intake:
    def __init__(self, ckpt_dir: Path, ledger: Ledger, config: EvaldConfig) -> None:
        self.ckpt_dir = ckpt_dir
        self.ledger = ledger
        self.config = config
        self.final_step: int | None = None  # the run's last step, never skipped by the lag policy
        self.newest_step = max(ledger.step_numbers(), default=0)
        self._judged: set[str] = set()      # names already in the ledger's files table
        # Admitted entries: name -> (its step, the source that found it first, when, the sources that reported it).
        self._first: dict[str, tuple[int | None, str, float, set[str]]] = {}
        self._settling: dict[str, float] = {}  # foreign files still being written: name -> recheck time
        self._unreadable: dict[str, str] = {}  # entries evald's user may not read: name -> why
        self._unreadable_due = 0.0
        self.parts = PartGroups(config.tuning.parts_timeout_s)  # partitioned steps waiting for their parts
        self.run_id: str | None = None      # the announced run (names the odd one out among mixed parts)
        self._rejection_window = (float("-inf"), 0)  # (start, lines logged in it)
        self._rejections_unlogged = 0

    def found(self, name: str, found_via: str, now: float | None = None) -> bool:
        """An entry appeared (or may have): admit what it carries, once. True if it was new."""
        if name in self._judged:
            self._also(name, found_via, now)
            return False
        if not mindformers_layout.is_entry_name(name):
            return False
        key = _ledger_key(name)
        if self.ledger.file_status(key) is not None:
            self._judged.add(name)
            return False
        tuning = self.config.tuning
        if key != name:  # sqlite cannot even store it; no producer writes such names
            verdict: Found | Rejected | Pending | None = Rejected(key, None, "its name is not valid UTF-8; not read")
        else:
            verdict = self._recognise(name, now)
        if verdict is None:
            if not (self.ckpt_dir / name).exists():
                if found_via == "watchdog":  # the kernel saw it appear, so it was committed; now it is gone
                    return self._gone(name, "before evald could read it", needs_step=True)
                return False  # a notice of a checkpoint that does not exist leaves no row
            if name.endswith(FOREIGN_SUFFIXES) and not layout.is_temp_name(mindformers_layout.base_name(name)):
                self._settling[name] = (now or time.time()) + tuning.foreign_settle_s
            return False
        self._settling.pop(name, None)
        if isinstance(verdict, Pending):
            if self._unreadable.get(name) != verdict.reason:
                log.error("%s. It stays pending and is judged as soon as evald may read it (looked at again "
                          "every %gs)", verdict.reason, UNREADABLE_RECHECK_S)
            self._unreadable[name] = verdict.reason
            return False
        if self._unreadable.pop(name, None) is not None:
            log.info("%s can be read now", name)
        self._judged.add(name)
        if isinstance(verdict, Rejected):
            self._reject(verdict)
        elif verdict.kind == PART:
            self._part(verdict, found_via)
        else:
            self._admit(verdict, found_via)
        self._first[name] = (verdict.step, found_via, time.time() if now is None else now, {found_via})
        while len(self._first) > FIRST_SOURCES_KEPT:  # oldest first: dicts keep insertion order
            self._first.pop(next(iter(self._first)))
        return True

    def _also(self, name: str, found_via: str, now: float | None) -> None:
        """Another source reported an entry already found: say so once per source, with how much later.
        The trainer renames a snapshot into place, then rings the doorbell, so the watchdog is often first."""
        first = self._first.get(name)
        if first is None or found_via in first[3]:
            return
        step, source, at, told = first
        told.add(found_via)
        later_ms = max(0.0, ((time.time() if now is None else now) - at) * 1000)
        # A rescan sees every entry again, always later: worth a line only when debugging.
        log.log(logging.DEBUG if found_via == "rescan" else logging.INFO, "%s%s: also via %s, %.0f ms after %s found it", "" if step is None else f"step {step} in ", name,
                 found_via, later_ms, source, extra={"key": name, "found_via": found_via, "first": source})

    def _recognise(self, name: str, now: float | None) -> Found | Rejected | Pending | None:
        """What ``name`` is; an error examining it rejects it (once, with the reason), never evald."""
        tuning = self.config.tuning
        try:
            return recognise(self.ckpt_dir, name, steps_per_epoch=self.config.foreign_steps_per_epoch,
                             settle_s=tuning.foreign_settle_s, now=now)
        except Exception as exc:  # noqa: BLE001 - a file must never crash-loop evald (docs/security.md)
            log.exception("examining %r raised unexpectedly; it is rejected", name)
            return Rejected(name, None, f"examining it raised {exc!r:.300}")

    def forget_judged(self) -> None:
        """Names forgotten by the ledger (``evald retry``) are judged again when found again."""
        self._judged.clear()

    def flush_rejection_log(self, force: bool = False) -> None:
        """Say how many rejections were not logged, once their window is over (or now, with ``force``)."""
        if self._rejections_unlogged and (force or time.monotonic() - self._rejection_window[0] >= REJECTION_WINDOW_S):
            log.error("%d more rejected entries were not logged (at most %d such lines every %.0fs); each is in the "
                      "ledger with its reason (evald status)", self._rejections_unlogged, REJECTIONS_LOGGED,
                      REJECTION_WINDOW_S)
            self._rejections_unlogged = 0

    def _log_rejection(self, text: str, *args: object, extra: dict) -> None:
        now = time.monotonic()
        start, logged = self._rejection_window
        if now - start >= REJECTION_WINDOW_S:
            self.flush_rejection_log()
            start, logged = now, 0
        if logged < REJECTIONS_LOGGED:
            log.error(text, *args, extra=extra)
            logged += 1
        else:
            self._rejections_unlogged += 1
        self._rejection_window = (start, logged)

    def recheck_settled(self, now: float | None = None) -> None:
        self.flush_rejection_log()
        for unusable in self.parts.expired():
            self._unusable(unusable)
        now = now or time.time()
        for name, due in list(self._settling.items()):
            if now >= due:
                del self._settling[name]
                if not (self.ckpt_dir / name).exists():
                    self._gone(name, "while evald waited for it to settle", needs_step=False)
                    continue
                self.found(name, "rescan", now=now)
        if self._unreadable and now >= self._unreadable_due:
            self._unreadable_due = now + UNREADABLE_RECHECK_S
            for name in list(self._unreadable):
                self.found(name, "rescan", now=now)

    def _gone(self, name: str, when: str, *, needs_step: bool) -> bool:
        """A checkpoint evald saw appear was deleted before it was read (ModelCheckpoint's keep_checkpoint_max,
        MindFormers' save_total_limit, keep_last without evald): its step, when its name tells it, is
        accounted for as deleted. True if it was recorded."""
        step = layout.parse_step_dir_name(name)
        step = step if step is not None else step_from_name(name, self.config.foreign_steps_per_epoch)
        step = step if step is not None and 0 <= step <= MAX_STEP else None
        if step is None and needs_step:
            return False
        reason = f"{name}: deleted before it could be evaluated (it disappeared {when})"
        self._judged.add(name)
        self.ledger.note_file(name, step, REJECTED, reason, fail_step=step is not None, fail_state=DELETED)
        log.warning("%s", reason, extra={"key": name, "step": step, "state": DELETED, "reason": reason})
        return True

    @property
    def settling(self) -> bool:
        return bool(self._settling) or self.parts.waiting

    @property
    def unreadable(self) -> dict[str, str]:
        """Entries evald's user may not read (name -> why), forgotten when they disappear."""
        for name in [n for n in self._unreadable if not os.path.lexists(self.ckpt_dir / n)]:
            del self._unreadable[name]
        return dict(self._unreadable)

    def _reject(self, verdict: Rejected) -> None:
        # A reason may quote another entry's name, which may not be valid UTF-8: sqlite could not store it.
        verdict = dataclasses.replace(verdict, reason=_ledger_key(verdict.reason))
        status = DUPLICATE if verdict.duplicate else REJECTED
        fail_step = not verdict.duplicate
        self.ledger.note_file(verdict.name, verdict.step, status, verdict.reason, fail_step=fail_step)
        extra = {"key": verdict.name, "step": verdict.step, "status": status, "reason": verdict.reason}
        if verdict.duplicate:
            log.info("ignored %s: %s", verdict.name, verdict.reason, extra=extra)
        else:  # rate-limited: a directory of 5,000 bad entries must not write 5,000 lines
            self._log_rejection("rejected %s: %s", verdict.name, verdict.reason, extra=extra)

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
        def skip_reason(steps: list[int]) -> str | None:
            return admit(self.config.lag_policy, self.config.effective_every_k, steps.index(found.step),
                         found.step, final_step=self.final_step)

        taken = self.ledger.take_found(
            name=found.name, step=found.step, kind=found.kind, found_via=found_via, run_id=found.run_id,
            commit_time=found.commit_time, skip_reason_among=skip_reason, also=members,
            replaces=lambda existing: found.preference < PREFERENCE.get(existing.kind, 99))
        if taken.outcome == ADMITTED:
            reason = taken.skip_reason
            self.newest_step = max(self.newest_step, found.step)
            log.info("found step %d in %s via %s (first)%s", found.step, found.name, found_via,
                     f"; skipped: {reason}" if reason else "",
                     extra={"step": found.step, "key": found.name, "found_via": found_via,
                            "state": "skipped" if reason else QUEUED, "reason": reason})
        elif taken.outcome == REPLACED:
            assert taken.existing is not None
            log.info("step %d will be read from %s rather than %s", found.step, found.name, taken.existing.source)
        else:
            log.info("ignored %s: %s", found.name, taken.reason)


def _ledger_key(name: str) -> str:
    """``name`` itself, or a printable stand-in when it is not valid UTF-8 (os.scandir's surrogates)."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
