"""Retention with real processes: a trainer with keep_last=2 snapshotting every 2 steps beside a real evald
(--lag-policy all: every checkpoint is due).

Which of the two is ahead is decided by events, not by the machine's speed (tests/paced_trainer.py): the
trainer first hears evald's control state, then stops evald (SIGSTOP) and trains on until its hook has skipped
(with the leases) or deleted (without them) a snapshot, then lets evald go on.

With evald's leases, no committed checkpoint is deleted before it is evaluated, every one gets exactly one
point, the hook skips (and counts) the snapshots the budget has no room for while evald is held, deletes the
ones evald has evaluated once it released them, and the directory, watched all along, never holds more than the
budget plus the best and the final one. Without them (the hook cannot reach evald's control channel, so
keep_last alone decides, as before), checkpoints are deleted before evald gets to them, and evald says so at
their steps: "deleted before evaluation", whether it had queued them or only seen them appear.
"""

from __future__ import annotations

import re
import threading

import pytest

from evald.contracts import layout
from tests import faults
from tests.harness import hook_stats, raw_scalar_steps, run_dir, start_evald, start_trainer, text_events

KEEP_LAST = 2
# evald exits once the run is over and every checkpoint dealt with (no idle timer: a slow trainer is not idle);
# the trainer relies on the last leases it heard while evald is held, for as long as the hold may take
EVALD_ARGS = ["--lag-policy", "all", "--tuning", '{"lease_s": 600}']


class DirectoryWatch:
    """The most committed snapshots the directory held at once, looked at every few milliseconds."""

    def __init__(self, ckpt):
        self.ckpt, self.most, self._stop = ckpt, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.005):
            self.most = max(self.most, len(layout.list_committed(self.ckpt)))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


def run(tmp_path, endpoints, procs, evald_env, *, hold_until: str, await_release: bool = False
        ) -> tuple[list[int], dict, int, object, str]:
    """evald, and a trainer (100 steps, keep_last 2) that holds it back (tests/paced_trainer.py) from its
    first snapshot until its hook's ``hold_until`` count is 1; (committed steps, hook stats, most snapshots on
    disk at once, checkpoint directory, the trainer's log)."""
    ckpt = tmp_path / "ckpt"
    evald = start_evald(tmp_path, evald_env, EVALD_ARGS)
    procs.append(evald)
    watch = DirectoryWatch(ckpt)
    holder = ["tests.paced_trainer", "--hold-evald", str(evald.popen.pid),
              "--control-endpoint", evald_env["EVALD_CONTROL_ENDPOINT"], "--hold-until", hold_until,
              *(["--await-release"] if await_release else [])]
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=100, every=2, loop="custom",
                            extra=["--keep-last", str(KEEP_LAST)], program=holder)
    procs.append(trainer)
    assert trainer.wait(300) == 0, trainer.output()[-3000:]
    assert evald.wait(300) == 0, evald.output()[-3000:]
    most = watch.stop()
    output = trainer.output()
    committed = sorted(int(s) for s in re.findall(r"committed snapshot step_(\d+)", output))
    return committed, hook_stats(output), most, ckpt, output


def held_phases(trainer_output: str) -> list[str]:
    """What tests/paced_trainer.py did, in order: heard, stopped, continued, released."""
    return re.findall(r"paced: (?:evald (?:\d+ )?)?(heard|stopped|continued|released)", trainer_output)


@pytest.mark.smoke
def test_with_leases_no_due_checkpoint_is_deleted_before_it_is_evaluated(tmp_path, endpoints, procs):
    committed, stats, most, ckpt, output = run(tmp_path, endpoints, procs, endpoints, hold_until="skipped",
                                               await_release=True)
    assert held_phases(output) == ["heard", "stopped", "continued", "released"], output[-3000:]
    rows = {row["step"]: row for row in faults.ledger_rows(ckpt)}
    assert committed and committed[-1] == 100
    assert {step: rows[step]["state"] for step in committed} == {step: "evaluated" for step in committed}
    assert set(rows) == set(committed)                              # nothing evald never heard of
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == committed  # one point each
    assert stats["snapshots_skipped_budget"] > 0   # while evald was held, the budget was full of unevaluated ones
    assert stats["snapshots_deleted"] > 0          # once evald had released evaluated ones
    assert stats["snapshots_written"] == len(committed)
    assert most <= KEEP_LAST + 2, most        # the budget, the best beside it, the final one written regardless
    print(f"RETENTION-REPORT leases: {stats['snapshots_taken']} taken, {len(committed)} committed, all evaluated; "
          f"{stats['snapshots_skipped_budget']} skipped for the budget, {stats['snapshots_deleted']} deleted after "
          f"evaluation; at most {most} on disk")


def test_without_leases_keep_last_deletes_due_checkpoints_and_evald_says_so(tmp_path, endpoints, procs):
    elsewhere = dict(endpoints, EVALD_CONTROL_ENDPOINT=endpoints["EVALD_CONTROL_ENDPOINT"] + ".elsewhere")
    committed, stats, _, ckpt, output = run(tmp_path, endpoints, procs, elsewhere, hold_until="deleted")
    assert held_phases(output) == ["heard", "stopped", "continued"], output[-3000:]
    rows = {row["step"]: row for row in faults.ledger_rows(ckpt)}
    deleted = [step for step, row in rows.items() if row["state"] == "deleted"]
    lost = [step for step in committed if step not in rows]        # deleted before evald even saw them
    assert deleted, "keep_last without leases deleted nothing evald needed: the test proves nothing"
    assert not lost  # the directory watch saw each appear: accounted for, even if gone before evald read it
    assert stats["snapshots_skipped_budget"] == 0
    print(f"RETENTION-REPORT keep_last alone: {len(committed)} committed, {len(deleted)} deleted before evaluation "
          f"(recorded), {len(lost)} deleted before evald saw them, "
          f"{sum(r['state'] == 'evaluated' for r in rows.values())} evaluated")
    skips = dict(text_events(run_dir(ckpt), "evald/skipped/text_summary"))
    for step in deleted:   # each at its own step, with its category, naming the directory (or its file, when the
        # deletion came while evald was reading it)
        named = re.escape(f"deleted before evaluation: {layout.step_dir_name(step)}")
        assert re.match(named + r"(/[^/:]+)?: ", skips[step]), skips[step]
    evaluated = raw_scalar_steps(run_dir(ckpt), "eval/loss")
    assert sorted(evaluated + sorted(skips)) == committed   # exactly one of the two at every committed step
