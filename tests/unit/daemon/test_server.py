"""The server's lifecycle, in-process: the loop body, the signal flags, a dead background thread.

The real Server, with a real notification receiver on a private ipc endpoint; no MindSpore.
"""

from __future__ import annotations

import dataclasses
import signal

import pytest
import zmq

from evald.config import EvaldConfig, ResolvedConfig
from evald.daemon.server import BackgroundThreadDied, Server
from evald.intake.receiver import Receiver
from tests.harness import wait_for


class NothingToEvaluate:
    """Stands in for the MindSpore pipeline: no checkpoint reaches it in these tests."""

    subset = None
    blocked_reason = "no factories in this test"
    validation_identity = None
    suites: dict = {}
    suite_errors: dict = {}
    suites_pending: tuple = ()

    def ensure_built(self, config):
        return False

    def build_next_suite(self):
        return False

    def evaluate(self, ckpt_dir, row):
        raise AssertionError("nothing is evaluated here")


def _server(tmp_path, **options) -> Server:
    sockets = tmp_path / "sock"
    config = dataclasses.replace(EvaldConfig(), endpoint=f"ipc://{sockets}/notify.sock",
                                 control_endpoint=f"ipc://{sockets}/control.sock", **options)
    return Server(ResolvedConfig(config, {}), pipeline=NothingToEvaluate())


def test_a_signal_only_sets_flags_and_the_second_one_forces(tmp_path):
    server = _server(tmp_path)
    server.handle_exit(signal.SIGTERM, None)
    assert (server.should_exit, server.force_exit) == (True, False)
    assert server.on_tick() is False  # the loop ends at its next turn; nothing else happened
    server.handle_exit(signal.SIGTERM, None)
    assert server.force_exit is True


def test_on_tick_is_the_loop_body_and_says_when_to_stop(tmp_path, private_umask, monkeypatch):
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sock"))
    server = _server(tmp_path, idle_exit_s=0.0)
    try:
        server.startup()
        assert server.receiver is not None and server.receiver.is_alive()
        assert server.on_tick() is True     # no run yet: waiting for the first notification
    finally:
        server.shutdown()


def test_a_dead_receiver_thread_stops_evald_naming_it(tmp_path, private_umask, monkeypatch):
    """Orbax's rule: a background thread's death is raised in the main loop, never left silent."""
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sock"))

    def die(self):
        raise SystemExit("killed in this test")  # the one thing the receiver's loop does not survive

    monkeypatch.setattr(Receiver, "_read_frames", die)
    server = _server(tmp_path)
    try:
        server.startup()
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(server.receiver.endpoint)
        push.send(b"x")
        wait_for(lambda: not server.receiver.is_alive(), 10, "the receiver thread to die")
        with pytest.raises(BackgroundThreadDied, match="notification receiver thread died.*SystemExit"):
            server.on_tick()
        push.close()
        context.term()
    finally:
        server.shutdown()


def test_serve_turns_a_dead_thread_into_exit_code_3(tmp_path, private_umask, monkeypatch):
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sock"))
    server = _server(tmp_path)
    monkeypatch.setattr(server, "install_signal_handlers", lambda: None)  # pytest keeps its own

    def startup_then_kill():
        Server.startup(server)
        server.receiver._thread = None  # as if it had died before the first turn
        server.receiver._failure = "RuntimeError: stand-in death"

    monkeypatch.setattr(server, "startup", startup_then_kill)
    assert server.serve() == 3


class BuiltAtStartup(NothingToEvaluate):
    """Stands in for a pipeline whose factories the operator named: built before any run exists."""

    def __init__(self):
        from evald.pipeline.subset import SubsetInfo

        self.subset = None
        self._subset = SubsetInfo.of([1, 4, 9], num_samples=10, requested=3, seed=5)

    def ensure_built(self, config):
        self.subset = self._subset
        return True


def test_the_subset_is_recorded_when_the_network_was_built_before_the_run(tmp_path, private_umask, monkeypatch):
    """With --model-factory and --data-factory, the network is built at start-up, before the run
    directory is opened; LOGDIR/RUN/subset.json must still name the samples (docs/metrics.md)."""
    import json

    from evald.daemon.run_dir import default_logdir, default_run_name

    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sock"))
    ckpt = tmp_path / "train" / "ckpt"
    ckpt.mkdir(parents=True)
    config = dataclasses.replace(EvaldConfig(), endpoint="none", ckpt_dir=str(ckpt), model_factory=None,
                                 idle_exit_s=0.0)
    sources = {"model_factory": "command line --model-factory", "data_factory": "command line --data-factory",
               "ckpt_dir": "command line --ckpt-dir", "endpoint": "command line --endpoint"}
    pipeline = BuiltAtStartup()
    server = Server(ResolvedConfig(config, sources), pipeline=pipeline)
    try:
        server.startup()
    finally:
        server.shutdown()
    recorded = json.loads((default_logdir(ckpt) / default_run_name(ckpt) / "subset.json").read_text())
    assert recorded["indices"] == [1, 4, 9] and recorded["seed"] == 5
