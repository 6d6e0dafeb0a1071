"""Issue 12, part 1: no message or file can make evald run code it was not told to run.

The hostile factory is ``os:system`` with ``touch CODE-RAN`` (tests/hostile.py ``Bait``); the
marker file existing means the code ran. On commit 1337672 it ran in each of these cases: the
first message to a plain evald, a forged announcement before the first checkpoint, a RUN.json of
another user, an untrusted ``search_path`` (and over TCP for a sender of another user).

The trust rule (evald/trust.py, docs/security.md): factories come from the operator, a RUN.json
of evald's user that nobody else can write, or a run_announced message from a trusted channel (a
private ipc socket; an authenticated CURVE peer once wired). A TCP channel is never trusted today.
Senders "of another user" are real processes forked as uid 65534 (root only).
"""

from __future__ import annotations

import os

import pytest

from evald.contracts import layout, wire
from tests import faults, hostile
from tests.harness import wait_for

other_user = pytest.mark.skipif(not hostile.is_root(), reason="a process of another user needs root here")


def _tcp_env(tmp_path) -> dict[str, str]:
    socket_dir = tmp_path / "sockets"
    socket_dir.mkdir(mode=0o700)
    return {"EVALD_ENDPOINT": f"tcp://127.0.0.1:{hostile.free_tcp_port()}",
            "EVALD_CONTROL_ENDPOINT": f"tcp://127.0.0.1:{hostile.free_tcp_port()}",
            "EVALD_SOCKET_DIR": str(socket_dir), "EVALD_ALLOW_PLAINTEXT": "1"}


def _announcement(bait: hostile.Bait, ckpt_dir, run_id: str) -> bytes:
    return wire.RunAnnounced(run_id=run_id, ckpt_dir=str(ckpt_dir), model_factory=bait.system_factory(),
                             data_factory=bait.evil_factory()).encode()


@other_user
def test_the_first_message_over_tcp_neither_attaches_nor_runs_code(tmp_path, procs):
    """A plain evald (no --ckpt-dir) on TCP: another user's messages name the bait directory, whose
    RUN.json (root's own, so trusted if evald ever read it) names os:system."""
    bait = hostile.Bait.make(tmp_path)
    env = _tcp_env(tmp_path)
    evald = faults.start(tmp_path, None, env=env, zmq=True)
    procs.append(evald)
    wait_for(lambda: "listening for notifications" in evald.output(), 120, "evald listening")
    frames = [_announcement(bait, bait.root, "bait"),
              faults.committed_notice(bait.root, 1, "bait").encode(),
              wire.RunFinished(run_id="bait", ckpt_dir=str(bait.root), final_step=1).encode()]
    assert hostile.push_as_other_user(env["EVALD_ENDPOINT"], frames) == 0
    wait_for(lambda: "refused to serve" in evald.output(), 60, "the refusal")
    log = evald.output()
    assert f"refused to serve {str(bait.root)!r}, named by a run_announced message from notification endpoint " \
           f"{env['EVALD_ENDPOINT']} (a network endpoint without CURVE authentication" in log
    assert bait.untouched() and "serving" not in log
    assert evald.popen.poll() is None


@other_user
def test_a_forged_announcement_over_tcp_names_no_code_and_the_run_goes_on(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)  # the real run's RUN.json: the demo model
    bait = hostile.Bait.make(tmp_path)
    env = _tcp_env(tmp_path)
    evald = faults.start(tmp_path, ckpt, "--idle-exit-s", "5", env=env, zmq=True)
    procs.append(evald)
    wait_for(lambda: "serving" in evald.output(), 120, "evald serving")
    assert hostile.push_as_other_user(env["EVALD_ENDPOINT"], [_announcement(bait, ckpt, "faults")]) == 0
    wait_for(lambda: "refused the model factory" in evald.output(), 60, "the refusal")
    faults.commit(ckpt, 10)
    assert evald.wait(300) == 0, evald.output()[-3000:]
    log = evald.output()
    assert ("refused the model factory 'os:system' (kwargs {'command': 'touch " in log
            and f"named by notification endpoint {env['EVALD_ENDPOINT']} (a network endpoint" in log)
    assert "refused the data factory 'evil:build'" in log
    assert faults.ledger_by_key(ckpt)[layout.step_dir_name(10)]["state"] == "evaluated"
    assert bait.untouched()


@other_user
@pytest.mark.smoke
def test_a_run_json_of_another_owner_names_no_code_and_no_search_path(tmp_path, procs):
    """A real evald process; the same rule for a group- or world-writable RUN.json and for a link runs
    in-process with the real Server and Pipeline (tests/unit/daemon/test_hostile_code_in_process.py)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    bait = hostile.Bait.make(tmp_path)
    text = wire.RunAnnounced(run_id="faults", ckpt_dir=str(ckpt), model_factory=bait.evil_factory(),
                             data_factory=bait.system_factory()).encode().decode()
    run_file = layout.write_run_file(ckpt, text)
    os.chown(run_file, hostile.OTHER_UID, hostile.OTHER_UID)
    os.chmod(run_file, 0o644)
    faults.commit(ckpt, 10)
    evald = faults.start(tmp_path, ckpt, "--idle-exit-s", "3")
    procs.append(evald)
    assert evald.wait(180) == 3, evald.output()[-3000:]  # checkpoints wait that cannot be evaluated
    log = evald.output()
    assert ("refused the model factory 'evil:build' (kwargs {}, search path " + repr(str(bait.root))) in log
    assert "refused the data factory 'os:system'" in log
    assert f"is owned by uid {hostile.OTHER_UID}, not by evald's uid" in log
    assert "importing the" not in log  # nothing was imported, and the bait never reached sys.path
    assert bait.untouched()
    assert faults.ledger_by_key(ckpt)[layout.step_dir_name(10)]["state"] == "queued"


def test_factory_allow_refuses_a_trusted_run_json_naming_other_modules(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    bait = hostile.Bait.make(tmp_path)
    layout.write_run_file(ckpt, wire.RunAnnounced(run_id="faults", ckpt_dir=str(ckpt),
                                                  model_factory=bait.system_factory(),
                                                  data_factory=faults.DATA_FACTORY).encode().decode())
    faults.commit(ckpt, 10)
    evald = faults.start(tmp_path, ckpt, "--factory-allow", "examples.,mypkg", "--idle-exit-s", "3")
    procs.append(evald)
    assert evald.wait(180) == 3, evald.output()[-3000:]
    log = evald.output()
    assert "model factory 'os:system': module 'os' is not under --factory-allow examples.,mypkg; not imported" in log
    assert "importing the" not in log and bait.untouched()


def test_factory_allow_admits_its_modules_and_every_factory_is_named_before_import(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)
    evald = faults.start(tmp_path, ckpt, "--factory-allow", "examples.tiny_lm", "--idle-exit-s", "3")
    procs.append(evald)
    assert evald.wait(180) == 0, evald.output()[-3000:]
    log = evald.output()
    for which, spec in (("model", faults.MODEL_FACTORY), ("data", faults.DATA_FACTORY)):
        assert f"importing the {which} factory {spec.target} (kwargs {dict(spec.kwargs)}, search path " in log
    assert faults.ledger_by_key(ckpt)[layout.step_dir_name(10)]["state"] == "evaluated"


@pytest.mark.parametrize("channel", ["ipc", "tcp"])
def test_a_run_json_under_umask_002_takes_its_factories_only_from_a_trusted_channel(tmp_path, procs, endpoints,
                                                                                      channel):
    """RUN.json mode 0664 (a trainer under umask 002) may not name code; the same announcement on
    the private ipc socket may, on TCP it may not."""
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    os.chmod(ckpt / layout.RUN_FILE, 0o664)
    env = endpoints if channel == "ipc" else _tcp_env(tmp_path)
    evald = faults.start(tmp_path, ckpt, "--idle-exit-s", "4", env=env, zmq=True)
    procs.append(evald)
    wait_for(lambda: "serving" in evald.output(), 120, "evald serving")
    faults.commit(ckpt, 10)
    announcement = wire.RunAnnounced(run_id="faults", ckpt_dir=str(ckpt), model_factory=faults.MODEL_FACTORY,
                                     data_factory=faults.DATA_FACTORY)
    faults.push(env["EVALD_ENDPOINT"], [announcement])
    code = evald.wait(300)
    log = evald.output()
    state = faults.ledger_by_key(ckpt)[layout.step_dir_name(10)]["state"]
    if channel == "ipc":
        assert code == 0 and state == "evaluated", log[-3000:]
        assert f"the model factory {faults.MODEL_FACTORY.target} comes from the run_announced message" in log
    else:
        assert code == 3 and state == "queued", log[-3000:]
        assert "refused the model factory 'examples.tiny_lm.model:build_model'" in log
        assert "a network endpoint without CURVE authentication" in log
