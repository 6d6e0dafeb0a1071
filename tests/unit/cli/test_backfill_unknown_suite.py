"""``evald backfill --suite nosuch`` beside a running evald exited 0 and its request stayed in the ledger
forever, never logged (issue 27, Low 18). Now an unknown suite is refused at backfill (exit 2, naming the
suites the run knows), and a request for a suite the daemon does not have is logged and dropped."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from evald.cli.commands import run as command
from evald.daemon import suite_turn
from evald.daemon.locks import Lock
from evald.ledger.ledger import Ledger


def _run(tmp_path, suites=("mc",)):
    run_dir = tmp_path / "tb" / "exp"
    run_dir.mkdir(parents=True)
    ledger = Ledger(run_dir / "ledger.sqlite")
    ledger.put_state(suite_turn.SINCE_KEY, {name: 0 for name in suites})   # what an evald that built them records
    ledger.close()
    return run_dir


def test_backfill_of_a_suite_the_running_evald_does_not_have_exits_2_naming_the_known_ones(tmp_path, capsys):
    run_dir = _run(tmp_path, suites=("mc", "gen"))
    running = Lock(run_dir / "evald.lock", f"run directory {run_dir}", "")   # an evald serving the run
    try:
        assert command("backfill", ["--run-dir", str(run_dir), "--ckpt-dir", str(tmp_path), "--suite",
                                    "nosuch"]) == 2
    finally:
        running.release()
    err = capsys.readouterr().err
    assert "nosuch" in err and "gen, mc" in err
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert ledger.get_state(suite_turn.BACKFILL_KEY) is None    # nothing recorded
    ledger.close()


def test_backfill_of_a_suite_the_given_options_do_not_configure_exits_2(tmp_path, capsys):
    run_dir = _run(tmp_path, suites=())
    config = tmp_path / "evald.toml"
    config.write_text('[suites.mc]\ntasks = ["t"]\n')
    assert command("backfill", ["--run-dir", str(run_dir), "--ckpt-dir", str(tmp_path), "--suite", "nosuch",
                                "--config", str(config)]) == 2
    assert "the known suites are mc" in capsys.readouterr().err


def test_backfill_of_a_known_suite_is_recorded(tmp_path, capsys):
    run_dir = _run(tmp_path)
    assert command("backfill", ["--run-dir", str(run_dir), "--ckpt-dir", str(tmp_path), "--suite", "mc"]) == 0
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert ledger.get_state(suite_turn.BACKFILL_KEY) == [{"suite": "mc", "steps": []}]
    ledger.close()


def test_the_daemon_logs_and_drops_a_request_for_a_suite_it_does_not_have(tmp_path, caplog):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    pipeline = SimpleNamespace(suites={"mc": SimpleNamespace(cell_identity="m" * 64)}, suite_errors={"broken": "x"},
                               suites_pending=("later",))
    requests = [{"suite": "nosuch", "steps": [10]}, {"suite": "broken", "steps": [10]},
                {"suite": "later", "steps": [10]}]
    ledger.put_state(suite_turn.BACKFILL_KEY, requests)
    with caplog.at_level(logging.ERROR):
        assert suite_turn.take_backfill_requests(ledger, pipeline) == 0
    assert "nosuch" in caplog.text and "mc" in caplog.text
    # a configured suite that could not be built keeps its request until it is fixed, and one not built
    # yet (suites are built after the first validation) until it is
    assert ledger.get_state(suite_turn.BACKFILL_KEY) == [{"suite": "broken", "steps": [10]},
                                                         {"suite": "later", "steps": [10]}]
    ledger.close()


def test_a_request_before_any_evald_built_suites_is_recorded_for_the_next_evald(tmp_path):
    """A validation-only run, no evald running, no options given: nothing tells which suites the next evald
    has, so the request is kept (that evald drops it, logged, if it has no such suite)."""
    run_dir = _run(tmp_path, suites=())
    assert command("backfill", ["--run-dir", str(run_dir), "--ckpt-dir", str(tmp_path), "--suite", "later"]) == 0


def test_a_fleet_merge_needs_no_suite_and_a_fleet_worker_does(tmp_path, capsys):
    """The Slurm recipe's merge step (deploy/fleet/backfill_array.sbatch merge) gives no --suite: the fleet
    directory's plan names them. Since --suite became optional (the validation's backfill), the merge was
    refused ('a fleet backfills suites: give --suite', exit 2) and the fleet e2e tests failed."""
    from evald.daemon.fleet_cells import Plan, publish_plan
    from evald.daemon.fleet_key import fleet_key

    run_dir = _run(tmp_path)
    fleet = tmp_path / "fleet"
    publish_plan(fleet, Plan(("mc",), ()), fleet_key(run_dir, None, create=True))   # as a first worker leaves it
    code = command("backfill", ["--run-dir", str(run_dir), "--ckpt-dir", str(tmp_path), "--fleet-dir", str(fleet),
                                "--merge"])
    assert code == 0 and "0 cell(s) taken in" in capsys.readouterr().out   # an empty fleet: nothing to take in
    with pytest.raises(SystemExit) as refused:   # argparse's error: usage and the reason, exit 2
        command("backfill", ["--run-dir", str(run_dir), "--ckpt-dir", str(tmp_path), "--fleet-dir", str(fleet)])
    assert refused.value.code == 2 and "give --suite" in capsys.readouterr().err
