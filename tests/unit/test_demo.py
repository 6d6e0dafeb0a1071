"""The demo's own words (issue 26, item 5 and item 9's first point): it says when it removes a previous
run, and it prints the lag it reached, from the run's ledger."""

from __future__ import annotations

import sqlite3

from evald.ledger.ledger import EVALUATED, Ledger, Record
from examples.demo import fresh_output_dir, lag_reached


def test_a_previous_demo_run_is_removed_with_a_word(tmp_path, capsys):
    out = tmp_path / "runs" / "demo"
    fresh_output_dir(out)
    assert out.is_dir() and capsys.readouterr().out == ""   # nothing to remove, nothing said
    (out / "evald.log").write_text("the previous run")
    fresh_output_dir(out)
    said = capsys.readouterr().out
    assert f"removing the previous demo run in {out}" in said and "--out" in said
    assert out.is_dir() and not any(out.iterdir())


def test_the_lag_it_prints_is_the_ledgers(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    commits = {50: 100.0, 100: 105.0, 150: 110.0, 200: 120.0}     # 200 committed, not yet validated
    finished = {50: 101.2, 100: 140.0, 150: 145.0}
    for step, at in commits.items():
        ledger.admit(name=f"step_{step}", step=step, kind="evald", found_via="watchdog", run_id="r", commit_time=at)
    for step in finished:
        ledger.start(step)
        ledger.finish(step, EVALUATED, metrics={"eval/loss": 1.0}, identity="v" * 64,
                      record=Record("eval", step, 1.0, {"eval/loss": 1.0}, {}))
    ledger.close()
    db = sqlite3.connect(path)
    with db:
        db.executemany("UPDATE steps SET finished_at=? WHERE step=?", [(t, s) for s, t in finished.items()])
    db.close()
    # 50 validated 1.2 s after its commit; 100 validated at 140 s, when 200 was committed: 100 steps behind
    assert lag_reached(path) == ("[demo] lag: the first checkpoint (step 50) was validated 1s after its commit; "
                                 "at most 35s and 100 step(s) behind the newest checkpoint over the run "
                                 "(3 validations)")


def test_no_validation_is_said(tmp_path):
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    assert lag_reached(path) == "[demo] lag: no checkpoint was validated"
