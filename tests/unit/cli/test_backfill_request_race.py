"""`evald backfill` beside a running evald (issue 35): both read the ledger's ``backfill_requests``, change the
list and write it back, each in its own transactions, so a request the CLI recorded between the daemon's read
and its write was overwritten without a word. Now each side is one transaction (Ledger.add_backfill_request,
Ledger.take_backfill_requests). Two Ledger objects on one file, the CLI's whole command run at the moment the
daemon has read the requests and not yet written them back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evald.cli.main import main
from evald.daemon import suite_turn
from evald.ledger.ledger import EVALUATED, QUEUED, Ledger, Record
from tests.unit.cli.conftest import admit_steps

STEPS = (10, 20)


@pytest.fixture
def run(tmp_path, new_run):
    """Two evaluated, retained checkpoints; an evald that built suites mc and gen."""
    served = new_run(tmp_path / "ckpt")
    ledger = Ledger(served.ledger)
    admit_steps(ledger, served.ckpt_dir, STEPS)
    for step in STEPS:
        ledger.start(step)
        ledger.finish(step, EVALUATED, metrics={"eval/loss": 1.0}, identity="v" * 64,
                      record=Record("eval", step, 1.0, {"eval/loss": 1.0}, {}))
    ledger.put_state(suite_turn.SINCE_KEY, {"mc": 100, "gen": 100})
    ledger.close()
    return served


class _Suites(dict):
    """The daemon's built suites; the first look at them runs ``hook`` (the CLI, meanwhile)."""

    def __init__(self, suites, hook):
        super().__init__(suites)
        self.hook = hook

    def _fire(self):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()

    def get(self, *args):
        self._fire()
        return super().get(*args)

    def __getitem__(self, key):
        self._fire()
        return super().__getitem__(key)

    def __contains__(self, key):
        self._fire()
        return super().__contains__(key)

    def __iter__(self):
        self._fire()
        return super().__iter__()

    def items(self):
        self._fire()
        return super().items()

    def keys(self):
        self._fire()
        return super().keys()

    def values(self):
        self._fire()
        return super().values()


def test_a_request_recorded_while_the_daemon_takes_the_requests_is_not_lost(run, capsys):
    ckpt = str(run.ckpt_dir)
    assert main(["backfill", "--ckpt-dir", ckpt, "--suite", "mc"]) == 0
    suites = _Suites({"mc": SimpleNamespace(cell_identity="m" * 64), "gen": SimpleNamespace(cell_identity="g" * 64)},
                     hook=lambda: main(["backfill", "--ckpt-dir", ckpt, "--suite", "gen"]))
    daemon = Ledger(run.ledger)          # the running evald's own connection; the CLI opens another
    try:
        queued = suite_turn.take_backfill_requests(daemon, SimpleNamespace(suites=suites, suite_errors={},
                                                                          suites_pending=()))
        assert suites.hook is None, "the CLI did not run"
        # the gen request is either taken now or still recorded for the next turn: never dropped
        queued += suite_turn.take_backfill_requests(daemon, SimpleNamespace(suites=suites, suite_errors={},
                                                                           suites_pending=()))
        assert queued == 4
        assert sorted((c.suite, c.step, c.state) for c in daemon.cells()) == [
            (suite, step, QUEUED) for suite in ("gen", "mc") for step in STEPS]
        assert not daemon.get_state(suite_turn.BACKFILL_KEY)
    finally:
        daemon.close()
    assert "suite gen on 2 retained checkpoint(s)" in capsys.readouterr().out


def test_requests_are_added_and_taken_one_transaction_each(tmp_path):
    cli, daemon = Ledger(tmp_path / "ledger.sqlite"), Ledger(tmp_path / "ledger.sqlite")
    try:
        cli.add_backfill_request("mc", [10, 20])
        cli.add_backfill_request("broken", [10])
        cli.add_backfill_request("nosuch", [20])
        taken = daemon.take_backfill_requests({"mc": "m" * 64}, keep={"broken"})
        assert [(t.suite, t.outcome, t.queued) for t in taken] == [
            ("mc", "queued", (10, 20)), ("broken", "kept", ()), ("nosuch", "dropped", ())]
        assert cli.get_state(suite_turn.BACKFILL_KEY) == [{"suite": "broken", "steps": [10]}]
        cli.add_backfill_request("mc", [10, 30])
        taken = daemon.take_backfill_requests({"mc": "m" * 64, "broken": "b" * 64}, keep=())
        assert [(t.suite, t.outcome, t.queued) for t in taken] == [("broken", "queued", (10,)),
                                                                   ("mc", "queued", (30,))]
        assert daemon.get_state(suite_turn.BACKFILL_KEY) == []
    finally:
        cli.close()
        daemon.close()
