"""Retention with real processes: a trainer with keep_last=2 snapshotting faster than a real evald
(--lag-policy all: every checkpoint is due) evaluates them.

With evald's leases, no committed checkpoint is deleted before it is evaluated, every one gets
exactly one point, the hook skips (and counts) the snapshots the budget has no room for, and the
directory, watched all along, never holds more than the budget plus the best and the final one.
Without them (the hook cannot reach evald's control channel, so keep_last alone decides, as
before), checkpoints are deleted before evald gets to them, and evald says so at their steps:
"deleted before evaluation", whether it had queued them or only seen them appear.
"""

from __future__ import annotations

import re
import threading

import pytest

from evald.contracts import layout
from tests import faults
from tests.harness import hook_stats, raw_scalar_steps, run_dir, start_evald, start_trainer, text_events

KEEP_LAST = 2
EVALD_ARGS = ["--lag-policy", "all", "--subset-size", "512", "--idle-exit-s", "20"]  # slower than the snapshots


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


def run(tmp_path, endpoints, procs, evald_env) -> tuple[list[int], dict, int, object]:
    ckpt = tmp_path / "ckpt"
    evald = start_evald(tmp_path, evald_env, EVALD_ARGS)
    procs.append(evald)
    watch = DirectoryWatch(ckpt)
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=100, every=2, loop="custom",
                            extra=["--keep-last", str(KEEP_LAST)])
    procs.append(trainer)
    assert trainer.wait(300) == 0, trainer.output()[-3000:]
    assert evald.wait(300) == 0, evald.output()[-3000:]
    most = watch.stop()
    committed = sorted(int(s) for s in re.findall(r"committed snapshot step_(\d+)", trainer.output()))
    return committed, hook_stats(trainer.output()), most, ckpt


@pytest.mark.smoke
def test_with_leases_no_due_checkpoint_is_deleted_before_it_is_evaluated(tmp_path, endpoints, procs):
    committed, stats, most, ckpt = run(tmp_path, endpoints, procs, endpoints)
    rows = {row["step"]: row for row in faults.ledger_rows(ckpt)}
    assert committed and committed[-1] == 100
    assert {step: rows[step]["state"] for step in committed} == {step: "evaluated" for step in committed}
    assert set(rows) == set(committed)                              # nothing evald never heard of
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == committed  # one point each
    assert stats["snapshots_skipped_budget"] > 0 and stats["snapshots_deleted"] > 0   # evald was the slower one
    assert stats["snapshots_written"] == len(committed)
    assert most <= KEEP_LAST + 2, most        # the budget, the best beside it, the final one written regardless
    print(f"RETENTION-REPORT leases: {stats['snapshots_taken']} taken, {len(committed)} committed, all evaluated; "
          f"{stats['snapshots_skipped_budget']} skipped for the budget, {stats['snapshots_deleted']} deleted after "
          f"evaluation; at most {most} on disk")


def test_without_leases_keep_last_deletes_due_checkpoints_and_evald_says_so(tmp_path, endpoints, procs):
    elsewhere = dict(endpoints, EVALD_CONTROL_ENDPOINT=endpoints["EVALD_CONTROL_ENDPOINT"] + ".elsewhere")
    committed, stats, _, ckpt = run(tmp_path, endpoints, procs, elsewhere)
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
    for step in deleted:   # each at its own step, with its category
        assert skips[step].startswith(f"deleted before evaluation: {layout.step_dir_name(step)}: "), skips[step]
    evaluated = raw_scalar_steps(run_dir(ckpt), "eval/loss")
    assert sorted(evaluated + sorted(skips)) == committed   # exactly one of the two at every committed step
