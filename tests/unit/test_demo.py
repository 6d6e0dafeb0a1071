"""The demo's own words (issue 26, item 5 and item 9's first point): it says when it removes a previous
run, and it prints the lag it reached, from the run's ledger. And what the docs say of the demo's run
exists in it (issue 37, item 2): every ``demo@STEP`` they show is a step the demo has a checkpoint of."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from evald.daemon.run_dir import default_run_name
from evald.ledger.ledger import EVALUATED, Ledger, Record
from examples.demo import checkpoint_steps, fresh_output_dir, lag_reached, parser

REPO = Path(__file__).resolve().parents[2]


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


def test_every_demo_model_the_docs_and_examples_show_is_a_step_the_demo_has():
    """docs/serving.md and the serving examples showed ``demo@20``: the demo's checkpoints are 50, 100, ...,
    400, so lm-eval got a 404 (after 100 s of tokenizing, issue 37 item 2)."""
    defaults = parser().parse_args([])
    run = default_run_name(REPO / defaults.out / "ckpt")
    steps = checkpoint_steps(defaults.steps, defaults.every)
    assert run == "demo" and steps == [50, 100, 150, 200, 250, 300, 350, 400]
    places = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
              *sorted((REPO / "examples" / "serving").glob("*.py"))]
    shown = {(str(path.relative_to(REPO)), match) for path in places
             for match in re.findall(r"(?<![\w@])demo@(\w+)", path.read_text())}
    assert {where for where, _ in shown} >= {"docs/serving.md", "examples/serving/lm_eval_local_completions.py"}
    unknown = sorted((where, step) for where, step in shown if step != "latest" and
                     not (step.isdigit() and int(step) in steps))
    assert unknown == [], f"steps the demo does not have (it has {steps} and latest): {unknown}"
