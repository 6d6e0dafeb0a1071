"""Issue 37 item 7: what ``evald status`` calls the last evaluation and the best step.

A retried older step finished after the newest one: status showed it as the "last eval", as if
training had gone back. The last evaluation is the newest step evaluated; a retry or a backfill
finished since is named as such. ``best step 400 (2.46537)`` named no metric: the best line says
which metric, its value and which direction is better, as the decisions committed them.
A real ledger and real Decisions, read by the status command's own reader."""

from __future__ import annotations

import dataclasses

from evald.cli.status import gather, render
from evald.config import EvaldConfig
from evald.daemon.run_dir import LEDGER_FILE
from evald.decisions.decisions import Decisions
from evald.ledger.ledger import EVALUATED, Ledger, Record
from evald.ledger.requeue import RETRY, retry
from evald.sinks.best_pointer import write_best_pointer


def _evaluate(ledger: Ledger, step: int, loss: float, *, kv: dict | None = None) -> None:
    ledger.start(step)
    ledger.finish(step, EVALUATED, metrics={"eval/loss": loss},
                  record=Record("eval", step, 1.0, {"eval/loss": loss}, {}), kv=kv)


def _admit(ledger: Ledger, step: int, found_via: str = "watchdog") -> None:
    ledger.admit(name=f"step_{step:09d}", step=step, kind="evald", found_via=found_via, run_id="r",
                 commit_time=1.0)


def test_a_retried_older_step_is_not_the_last_evaluation(tmp_path):
    ledger = Ledger(tmp_path / LEDGER_FILE)
    for step, loss in ((100, 3.0), (200, 2.5)):
        _admit(ledger, step)
        _evaluate(ledger, step, loss)
    assert retry(ledger, [100], "evald retry --step 100", evaluated_too=True).requeued == (100,)
    _evaluate(ledger, 100, 3.0)          # finished after 200
    ledger.close()

    info = gather(tmp_path)
    assert info["last_evaluation"]["step"] == 200
    assert info["most_recent_evaluation"] == {"step": 100, "why": RETRY}
    shown = render(info)
    assert "last eval    step 200: eval/loss=2.5" in shown
    assert "(evaluated since: step 100, a retry)" in shown


def test_the_last_evaluation_says_nothing_more_when_it_is_the_newest(tmp_path):
    ledger = Ledger(tmp_path / LEDGER_FILE)
    for step in (100, 200):
        _admit(ledger, step)
        _evaluate(ledger, step, 2.0)
    ledger.close()
    info = gather(tmp_path)
    assert info["last_evaluation"]["step"] == 200 and info["most_recent_evaluation"] is None
    assert "evaluated since" not in render(info)


def _best_line(tmp_path, monitor: str, mode: str, values: dict[int, float]) -> str:
    """Status's best line after Decisions with ``monitor``/``mode`` observed ``values``, committed as evald does."""
    decisions = Decisions(dataclasses.replace(EvaldConfig(), monitor=monitor, mode=mode))
    ledger = Ledger(tmp_path / LEDGER_FILE)
    for step, value in values.items():
        _admit(ledger, step)
        decisions.observe_eval(step, {monitor: value, "eval/loss": value}, newest_step=step, every_n_steps=100)
        _evaluate(ledger, step, value, kv={"decisions": decisions.state_dict()})
    ledger.close()
    info = gather(tmp_path)
    return next(line for line in render(info).splitlines() if line.startswith("best"))


def test_the_best_step_names_its_metric_and_direction(tmp_path):
    line = _best_line(tmp_path, "eval/loss", "min", {300: 2.6, 400: 2.46537, 500: 2.5})
    assert line == "best         step 400: eval/loss 2.46537 (lower is better)"


def test_the_best_step_of_a_metric_to_maximise(tmp_path):
    line = _best_line(tmp_path, "eval/accuracy", "max", {100: 0.25, 200: 0.5, 300: 0.4})
    assert line == "best         step 200: eval/accuracy 0.5 (higher is better)"


def test_a_ledger_that_did_not_record_its_monitor(tmp_path):
    """A ledger written before the decisions recorded their metric: best.json's monitor when there is one
    (no direction: it does not say), else the value alone, saying the metric is not recorded (never a guess)."""
    ledger = Ledger(tmp_path / LEDGER_FILE)
    _admit(ledger, 400)
    _evaluate(ledger, 400, 2.46537, kv={"decisions": {"early_stop": {"best": 2.46537, "best_step": 400}}})
    ledger.close()

    def best_line() -> str:
        return next(x for x in render(gather(tmp_path)).splitlines() if x.startswith("best"))

    assert best_line() == "best         step 400: 2.46537 (its metric is not recorded)"
    write_best_pointer(tmp_path, 400, "step_000000400", "eval/loss", 2.46537)
    assert best_line() == "best         step 400: eval/loss 2.46537"
