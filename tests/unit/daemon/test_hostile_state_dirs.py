"""Issue 19, kinds 3, 5, 6 and 10: directories and files another user may have created first.

* a run directory (``LOGDIR/RUN_NAME``) or a state file in it that evald's user does not own, or that
  is a link, is refused with an error naming it (exit 2); nothing is created through it;
* a socket directory that is a link owned by another user is refused (evald created its sockets and
  locks in the link's target), and so is one that is a regular file (it was FileExistsError);
* another program's listening unix socket at evald's endpoint path is left alone: evald refuses to
  start, naming it (ZeroMQ's bind silently unlinked it); a stale socket file is replaced;
* an ipc endpoint over the 107-byte limit of a unix socket address is a configuration error.

The tests run as root here: ``os.chown``/``os.lchown`` to uid 12345 stands in for another user.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
from pathlib import Path

import pytest

from evald.cli.main import parse_config
from evald.config.schema import ConfigError
from evald.contracts import wire
from evald.daemon.server import Server

OTHER = 12345
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="simulates another user with chown (root only)")


def _serve(tmp_path: Path, *extra: str) -> int:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    argv = ["--endpoint", "none", "--ckpt-dir", str(ckpt), "--logdir", str(tmp_path / "tb"), "--run-name", "exp",
            "--idle-exit-s", "0.5", *extra]
    return Server(parse_config(argv, environ={})).serve()


@pytest.fixture(autouse=True)
def private_socket_dir(tmp_path, monkeypatch):
    (tmp_path / "sockets").mkdir(mode=0o700)
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sockets"))


@needs_root
def test_a_run_directory_another_user_created_first_is_refused_and_its_ledger_link_not_followed(tmp_path, caplog):
    planted = tmp_path / "tb" / "exp"
    planted.mkdir(parents=True)
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    os.symlink(secret / "ledger.sqlite", planted / "ledger.sqlite")
    os.lchown(planted / "ledger.sqlite", OTHER, OTHER)
    os.chown(planted, OTHER, OTHER)
    with caplog.at_level(logging.ERROR):
        assert _serve(tmp_path) == 2
    assert str(planted) in caplog.text and f"uid {OTHER}" in caplog.text
    assert list(secret.iterdir()) == []  # no database created through the link


@needs_root
def test_a_run_directory_of_another_user_that_claims_this_checkpoint_directory_is_refused(tmp_path, caplog):
    assert _serve(tmp_path) == 0  # a real run directory, then handed to another user
    run = tmp_path / "tb" / "exp"
    for path in [run, *run.rglob("*")]:
        os.lchown(path, OTHER, OTHER)
    with caplog.at_level(logging.ERROR):
        assert _serve(tmp_path) == 2
    assert str(run) in caplog.text and f"uid {OTHER}" in caplog.text


@pytest.mark.parametrize("target", ["text", "dangling"])
def test_a_state_file_that_is_a_link_is_refused_naming_it(tmp_path, caplog, target):
    run = tmp_path / "tb" / "exp"
    assert _serve(tmp_path) == 0
    (run / "ledger.sqlite").unlink()
    for leftover in run.glob("ledger.sqlite-*"):
        leftover.unlink()
    aim = tmp_path / "not-a-database.txt"
    if target == "text":
        aim.write_text("hello")
    os.symlink(aim, run / "ledger.sqlite")
    with caplog.at_level(logging.ERROR):
        assert _serve(tmp_path) == 2  # was a traceback (sqlite3.DatabaseError) or a database made elsewhere
    assert str(run / "ledger.sqlite") in caplog.text and "link" in caplog.text
    assert (aim.read_text() == "hello") if target == "text" else not aim.exists()


@needs_root
def test_a_state_file_of_another_user_is_refused_naming_it(tmp_path, caplog):
    run = tmp_path / "tb" / "exp"
    assert _serve(tmp_path) == 0
    os.chown(run / "best.json" if (run / "best.json").exists() else run / "evald-run.json", OTHER, OTHER)
    with caplog.at_level(logging.ERROR):
        assert _serve(tmp_path) == 2
    assert f"uid {OTHER}" in caplog.text and str(run) in caplog.text


@needs_root
def test_a_socket_directory_that_is_another_users_link_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "evalds-own"
    target.mkdir(mode=0o700)   # private to evald's user: only the link is the other user's
    link = tmp_path / "squatted"
    os.symlink(target, link)
    os.lchown(link, OTHER, OTHER)
    with pytest.raises(wire.SocketDirError, match=f"{link}.*link.*uid {OTHER}"):
        wire.ensure_socket_dir(f"ipc://{link}/notify.sock")
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(link))
    from evald.daemon import channels

    with pytest.raises(wire.SocketDirError):
        channels.bind(parse_config(["--ckpt-dir", str(tmp_path)], environ={}).config, queue.Queue())
    assert list(target.iterdir()) == []  # no lock and no socket in the link's target


def test_a_socket_directory_that_is_a_regular_file_is_a_clear_error_with_exit_2(tmp_path, monkeypatch, caplog):
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "a-file"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with caplog.at_level(logging.ERROR):
        assert Server(parse_config(["--ckpt-dir", str(ckpt), "--idle-exit-s", "0.5"], environ={})).serve() == 2
    assert "not a directory" in caplog.text and str(tmp_path / "a-file") in caplog.text


def test_an_ipc_endpoint_over_the_unix_socket_limit_is_a_configuration_error(tmp_path, monkeypatch, caplog):
    long = "ipc:///tmp/" + "x" * 100 + "/n.sock"
    with pytest.raises(ConfigError, match="107"):
        parse_config(["--endpoint", long], environ={})
    with pytest.raises(ConfigError, match="107"):
        parse_config([], environ={"EVALD_CONTROL_ENDPOINT": long})
    deep = tmp_path / ("d" * 100)
    deep.mkdir(mode=0o700)
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(deep))  # the default endpoints are made from it
    (tmp_path / "ckpt").mkdir()
    with caplog.at_level(logging.ERROR):
        assert Server(parse_config(["--ckpt-dir", str(tmp_path / "ckpt")], environ={})).serve() == 2
    assert "107" in caplog.text


def test_another_programs_listening_socket_is_not_unlinked(tmp_path, caplog):
    from evald.intake.receiver import Receiver

    path = tmp_path / "sockets" / "notify.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    other.listen(1)
    try:
        with pytest.raises(wire.SocketDirError, match=f"{path}.*listening"):
            Receiver(f"ipc://{path}", queue.Queue())
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))  # still there, still the other program's
        probe.close()
    finally:
        other.close()
    # Now nobody listens: a stale socket file (a crashed evald's) is replaced.
    receiver = Receiver(f"ipc://{path}", queue.Queue())
    receiver.close()


def test_a_non_socket_at_the_endpoint_path_is_not_unlinked(tmp_path):
    from evald.sinks.control import ControlPublisher

    path = tmp_path / "sockets" / "control.sock"
    path.write_text("someone's file")
    with pytest.raises(wire.SocketDirError, match="not a socket"):
        ControlPublisher(f"ipc://{path}")
    assert path.read_text() == "someone's file"
