"""Fleet files are sealed with the run's key (issue 35): a plain sha256 of the body, as they were sealed
before, anyone who can write the fleet directory can recompute, so a cell with a changed metric and a
recomputed seal was merged. Now the seal is an HMAC-SHA256 under RUN_DIR/fleet.key (created by the first
worker, private to the run's user, found by the merge), or under the file --fleet-key names."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading

import pytest

from evald.cli.main import main
from evald.daemon.fleet_cells import FleetFileError, Plan, Snapshot, publish_plan, read_plan, write_cell
from evald.daemon.fleet_key import KEY_FILE, FleetKeyError, fleet_key
from evald.daemon.fleet_merge import merge
from evald.ledger.ledger import Ledger
from tests.unit.daemon.fleet_files import SUITE, body, make_run, run_key

PLAN = Plan((SUITE,), tuple(Snapshot(s, f"step_{s}", "evald", None, (SUITE,)) for s in (10, 20, 30)))


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True).encode("utf-8")


def _cells(run):
    ledger = Ledger(run / "ledger.sqlite")
    try:
        return [(c.step, c.metrics) for c in ledger.cells(suite=SUITE)]
    finally:
        ledger.close()


def test_a_cell_altered_and_resealed_without_the_key_is_not_taken(tmp_path):
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    publish_plan(fleet, PLAN, key)
    for step in (10, 20):
        path = write_cell(fleet, body(step, 0.25), key)
        forged = json.loads(path.read_text())["body"]
        forged["tasks"]["t"]["metrics"]["acc"] = forged["scalars"]["mc/t/acc"] = 0.99
        if step == 10:     # the old seal: a sha256 anyone can recompute
            sealed = {"sha256": hashlib.sha256(_canonical(forged)).hexdigest(), "body": forged}
        else:              # an HMAC, under a key the forger made up
            sealed = {"hmac_sha256": hmac.new(b"guess" * 8, _canonical(forged), "sha256").hexdigest(), "body": forged}
        path.write_text(json.dumps(sealed))
    write_cell(fleet, body(30, 0.5), key)
    report = merge(fleet, run, key)
    assert report.taken == [(SUITE, 30)] and len(report.bad) == 2, report
    assert "step_10" in report.bad[0] and "plain sha256" in report.bad[0]
    assert "step_20" in report.bad[1] and "seal does not match the fleet's key" in report.bad[1]
    assert _cells(run) == [(30, {"mc/t/acc": 0.5, "mc/t/acc_stderr": 0.1})]


def test_a_seal_that_is_not_hex_is_refused_not_a_traceback(tmp_path):
    """hmac.compare_digest raises TypeError for a str with non-ASCII characters: a seal of 'é' would have
    ended the merge in a traceback."""
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    publish_plan(fleet, PLAN, key)
    path = write_cell(fleet, body(10), key)
    data = json.loads(path.read_text())
    data["hmac_sha256"] = "\u00e9" * 64
    path.write_text(json.dumps(data))
    report = merge(fleet, run, key)
    assert not report.taken and len(report.bad) == 1 and "seal does not match" in report.bad[0]


def test_a_plan_written_without_the_key_is_refused(tmp_path):
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    publish_plan(fleet, PLAN, key)
    data = json.loads((fleet / "plan.json").read_text())
    data["body"]["snapshots"].append({"step": 40, "source": "x", "kind": "evald", "commit_time": None,
                                      "suites": [SUITE]})
    data["hmac_sha256"] = hmac.new(b"guess" * 8, _canonical(data["body"]), "sha256").hexdigest()
    (fleet / "plan.json").write_text(json.dumps(data))
    with pytest.raises(FleetFileError, match="plan.json: its seal does not match"):
        merge(fleet, run, key)


def test_the_runs_key_is_made_once_private_and_found_by_the_merge(tmp_path):
    run = make_run(tmp_path)
    with pytest.raises(FleetKeyError, match="fleet.key does not exist"):
        fleet_key(run, None, create=False)                    # the merge never makes one
    made = []
    threads = [threading.Thread(target=lambda: made.append(fleet_key(run, None, create=True))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({key.secret for key in made}) == 1 and len(made[0].secret) == 64   # eight workers at once agree
    assert fleet_key(run, None, create=False).secret == made[0].secret
    assert oct((run / KEY_FILE).stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in run.iterdir() if "fleet.key" in p.name] == [KEY_FILE]     # no temporary left
    assert made[0].secret.decode() not in repr(made[0])                                 # never in a log line


def test_a_runs_key_others_can_read_or_a_link_is_refused(tmp_path):
    run = make_run(tmp_path)
    run_key(run)
    os.chmod(run / KEY_FILE, 0o644)
    with pytest.raises(FleetKeyError, match="others may read or write it"):
        fleet_key(run, None, create=False)
    (run / KEY_FILE).unlink()
    other = tmp_path / "other.key"
    other.write_text("a" * 64)
    os.chmod(other, 0o600)
    os.symlink(other, run / KEY_FILE)
    with pytest.raises(FleetKeyError, match="symbolic link"):
        fleet_key(run, None, create=True)


def test_a_key_file_given_with_fleet_key_seals_and_opens_the_fleet(tmp_path):
    run, fleet, secret = make_run(tmp_path), tmp_path / "fleet", tmp_path / "secret" / "key"
    secret.parent.mkdir()
    secret.write_text("f0" * 32 + "\n")
    os.chmod(secret, 0o640)
    mounted = tmp_path / "mounted-key"
    os.symlink(secret, mounted)           # a Kubernetes Secret's volume shows its files through links
    key = fleet_key(run, str(mounted), create=True)
    assert key.secret == b"f0" * 32 and not (run / KEY_FILE).exists()
    publish_plan(fleet, PLAN, key)
    assert read_plan(fleet, fleet_key(run, str(secret), create=False)) == PLAN
    with pytest.raises(FleetFileError, match="seal does not match"):
        read_plan(fleet, run_key(run))                            # the run's own key is another key
    os.chmod(secret, 0o644)
    with pytest.raises(FleetKeyError, match="others may read"):
        fleet_key(run, str(secret), create=False)
    os.chmod(secret, 0o600)
    secret.write_text("short\n")
    with pytest.raises(FleetKeyError, match="does not hold a secret"):
        fleet_key(run, str(secret), create=False)


def test_a_merge_without_the_runs_key_takes_nothing_and_says_why(tmp_path, capsys):
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    argv = ["backfill", "--run-dir", str(run), "--ckpt-dir", str(tmp_path), "--fleet-dir", str(fleet), "--merge"]
    assert main(argv) == 2
    assert "fleet.key does not exist" in capsys.readouterr().err and not (run / KEY_FILE).exists()
