"""The ledger in-process: one transaction per state change, the outbox and recovery."""

from __future__ import annotations

import sqlite3

import pytest

from evald.ledger.ledger import (ADMITTED, DUPLICATE, REPLACED, EVALUATED, EVALUATING, FAILED, QUEUED, REJECTED, SKIPPED, USED, Ledger,
                          Record)


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    yield ledger
    ledger.close()


def admit(ledger, step, name=None, kind="evald", skip=None):
    ledger.admit(name=name or f"step_{step:09d}", step=step, kind=kind, found_via="rescan", run_id="r",
                 commit_time=100.0 + step, skip_reason=skip)


def test_admission_creates_the_step_and_its_file_at_once(ledger):
    admit(ledger, 10)
    admit(ledger, 20, skip="not every-k: checkpoint #2 (lag policy every-k)")
    assert [(s.step, s.state) for s in ledger.steps()] == [(10, QUEUED), (20, SKIPPED)]
    assert ledger.file_status("step_000000010") == USED
    # a skip is reported at its own step, in the same transaction, with the lag at that moment
    [record] = ledger.pending_records()
    assert (record.stream, record.step, dict(record.texts)) == (
        "eval", 20, {"evald/skipped": "not every-k: checkpoint #2 (lag policy every-k)"})
    assert record.scalars["evald/lag_steps"] == 0.0 and record.scalars["evald/lag_s"] > 0
    with pytest.raises(sqlite3.IntegrityError):  # the same step twice is refused, not duplicated
        admit(ledger, 10, name="other-1_10.ckpt")
    assert ledger.file_status("other-1_10.ckpt") is None  # ... and nothing of it was written


def _take(ledger, step, name, kind="evald", preferred=True, skip=None):
    return ledger.take_found(name=name, step=step, kind=kind, found_via="scan", run_id="r", commit_time=1.0,
                             skip_reason_among=lambda steps: skip(steps) if skip else None,
                             replaces=lambda existing: preferred)


def test_a_better_file_replaces_a_queued_steps_source(ledger):
    admit(ledger, 10, name="run-1_10.ckpt", kind="foreign")
    taken = _take(ledger, 10, "step_000000010")
    assert taken.outcome == REPLACED and taken.existing.source == "run-1_10.ckpt"
    assert ledger.step(10).source == "step_000000010" and ledger.step(10).kind == "evald"
    assert dict((n, st) for n, _, st, _ in ledger.files()) == {"run-1_10.ckpt": DUPLICATE, "step_000000010": USED}


def test_a_found_file_is_judged_and_recorded_in_one_transaction(ledger):
    """Admitted (the lag policy sees every step number, the new one included), a duplicate when the step's
    file is kept, and nothing written when the judgement raises."""
    admit(ledger, 10)
    seen = []
    taken = _take(ledger, 30, "step_000000030", skip=lambda steps: seen.append(steps) or "superseded")
    assert seen == [[10, 30]] and taken.outcome == ADMITTED and taken.skip_reason == "superseded"
    assert ledger.step(30).state == SKIPPED
    taken = _take(ledger, 10, "run-1_10.ckpt", kind="foreign", preferred=False)
    assert taken.outcome == DUPLICATE and ledger.file_status("run-1_10.ckpt") == DUPLICATE
    assert "step 10 is read from step_000000010 (queued)" in taken.reason

    def broken(steps):
        raise RuntimeError("policy bug")
    with pytest.raises(RuntimeError):
        _take(ledger, 40, "step_000000040", skip=broken)
    assert ledger.step(40) is None and ledger.file_status("step_000000040") is None


def test_a_rejected_file_fails_its_new_step_with_a_record_but_never_an_existing_one(ledger):
    ledger.note_file("step_000000030", 30, REJECTED, "manifest says step 40", fail_step=True)
    assert ledger.step(30).state == FAILED and ledger.step(30).reason == "manifest says step 40"
    admit(ledger, 40)
    ledger.note_file("bad-1_40.ckpt", 40, REJECTED, "corrupt", fail_step=True)
    assert ledger.step(40).state == QUEUED  # the good file's step is untouched
    texts = [dict(r.texts) for r in ledger.pending_records()]
    assert texts == [{"evald/skipped": "failed: step_000000030: manifest says step 40"}]


def test_pick_skips_and_start_are_one_transaction_and_finish_commits_record_and_state(ledger):
    for step in (10, 20, 30):
        admit(ledger, step)
    ledger.start(30, skips=[(10, "superseded"), (20, "superseded")])
    assert [(s.step, s.state, s.attempts) for s in ledger.steps()] == [(10, SKIPPED, 0), (20, SKIPPED, 0),
                                                                        (30, EVALUATING, 1)]
    ledger.finish(30, EVALUATED, metrics={"eval/loss": 2.5},
                  record=Record("eval", 30, 1.0, {"eval/loss": 2.5}, {}), kv={"decisions": {"best": 2.5}})
    assert ledger.step(30).metrics == {"eval/loss": 2.5} and ledger.get_state("decisions") == {"best": 2.5}
    pending = ledger.pending_records()
    assert [(r.step, r.scalars.get("evald/lag_steps")) for r in pending[:2]] == [(10, 20.0), (20, 10.0)]
    assert [(r.step, dict(r.texts)) for r in pending[:2]] == [(10, {"evald/skipped": "superseded"}),
                                                               (20, {"evald/skipped": "superseded"})]
    assert (pending[2].step, dict(pending[2].scalars)) == (30, {"eval/loss": 2.5})
    ledger.mark_written([r.id for r in pending])
    assert ledger.pending_records() == []


def test_a_failed_finish_leaves_nothing_behind(ledger, monkeypatch):
    admit(ledger, 10)
    ledger.start(10)
    with pytest.raises(TypeError):  # a value sqlite cannot store, mid-transaction
        ledger.finish(10, EVALUATED, metrics={"eval/loss": 1.0}, record=Record("eval", 10, 1.0, {}, {}),
                      kv={"decisions": object()})
    assert ledger.step(10).state == EVALUATING and ledger.pending_records() == []


def test_recovery_requeues_interrupted_steps_and_gives_up_after_max_attempts(ledger):
    admit(ledger, 10)
    admit(ledger, 20)
    ledger.start(10)
    for _ in range(3):
        ledger.start(20)
    ledger.recover_interrupted(max_attempts=3)
    assert ledger.step(10).state == QUEUED and "interrupted" in ledger.step(10).reason
    assert ledger.step(20).state == FAILED and "interrupted 3 times" in ledger.step(20).reason
    [text] = [dict(r.texts)["evald/skipped"] for r in ledger.pending_records()]
    assert text == f"failed: step_000000020: {ledger.step(20).reason}"
