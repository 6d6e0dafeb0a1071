"""Lifecycle rules that need evald's Server but not a process of its own: a second evald in the way,
a run_finished message without the trainer's record, --serve-forever after the run's end.

The real Server, its real receiver on private ipc endpoints and real ZeroMQ messages, in this process;
the MindSpore evaluation is a stand-in that reads and verifies the checkpoint and reports its mean weight.
The real processes (signals, exit codes seen by a shell) are in tests/e2e/test_lifecycle.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from evald.config import EvaldConfig, ResolvedConfig
from evald.contracts import layout, wire
from evald.daemon.server import Server
from evald.ledger.ledger import EVALUATED
from evald.pipeline.network import EvalResult
from evald.pipeline.pipeline import Evaluated
from evald.pipeline.subset import SubsetInfo
from tests import faults
from tests.harness import wait_for

RUN_ID = "lifecycle"


class MeanWeightPipeline:
    """Stands in for the MindSpore pipeline (evald.pipeline.pipeline.EvaluationPipeline): reads and verifies
    the real checkpoint files and reports their mean weight as the loss; no suites."""

    validation_identity = "v" * 64

    def __init__(self) -> None:
        self.subset = SubsetInfo.of([0, 1], num_samples=2, requested=2, seed=0)
        self.blocked_reason = None
        self.suites: dict = {}
        self.suite_errors: dict[str, str] = {}
        self.evaluated: list[int] = []

    def ensure_built(self, config) -> bool:
        return True

    def evaluate(self, ckpt_dir: Path, row) -> Evaluated:
        path = ckpt_dir / row.source
        weights = layout.read_checkpoint(path, layout.read_manifest(path))
        self.evaluated.append(row.step)
        return Evaluated(EvalResult({"eval/loss": float(weights["w"].mean())}, {}, 0.0, 0.0))


@pytest.fixture
def sockets(short_dir, monkeypatch) -> Path:
    """Private ipc endpoints, and evald's lock directory beside them."""
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(short_dir))
    return short_dir


@pytest.fixture(autouse=True)
def private_umask():
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)  # startup makes evald's state private with a umask: not this test process's


def _config(tmp_path: Path, sockets: Path | None, **options) -> ResolvedConfig:
    endpoints = ({"endpoint": f"ipc://{sockets}/n.sock", "control_endpoint": f"ipc://{sockets}/c.sock"}
                 if sockets else {"endpoint": "none"})
    options = {"logdir": str(tmp_path / "logdir"), "lag_policy": "all", **endpoints, **options}
    config = dataclasses.replace(EvaldConfig(), **options)
    return ResolvedConfig(config, {})


def _stage(ckpt: Path, *steps: int, final_step: int | None = None) -> Path:
    ckpt.mkdir(parents=True, exist_ok=True)
    layout.write_run_file(ckpt, wire.RunAnnounced(run_id=RUN_ID, ckpt_dir=str(ckpt), every_n_steps=10)
                          .encode().decode())
    for step in steps:
        layout.write_checkpoint(ckpt, step, {"w": np.full(4, step, np.float32)}, run_id=RUN_ID)
    if final_step is not None:
        layout.write_run_end(ckpt, wire.RunFinished(run_id=RUN_ID, ckpt_dir=str(ckpt), final_step=final_step)
                             .encode().decode())
    return ckpt


def _tick_until(server: Server, predicate, what: str, turns: int = 500) -> None:
    for _ in range(turns):
        assert server.on_tick(), f"the loop stopped before {what}"
        if predicate():
            return
    raise AssertionError(f"not reached in {turns} turns: {what}")


def _evaluated(server: Server) -> list[int]:
    return [row.step for row in server.run.ledger.steps(EVALUATED)] if server.run else []


def _refused(server: Server, monkeypatch) -> int:
    """What `evald` would exit with: Server.serve, without touching this process's signal handlers."""
    monkeypatch.setattr(server, "install_signal_handlers", lambda: None)
    return server.serve()


def test_a_second_evald_on_the_same_endpoint_refuses_to_start_and_names_the_first(tmp_path, sockets, monkeypatch,
                                                                                    caplog):
    first = Server(_config(tmp_path, sockets), pipeline=MeanWeightPipeline())  # waits for a trainer's message
    try:
        first.startup()
        second = Server(_config(tmp_path / "second", sockets), pipeline=MeanWeightPipeline())
        with caplog.at_level(logging.ERROR, logger="evald"):
            assert _refused(second, monkeypatch) == 2
        said = caplog.text
        assert f"endpoint ipc://{sockets}/n.sock is in use by evald pid {os.getpid()}" in said, said
        assert "another --endpoint" in said
        # the first still owns the endpoint: a trainer's notification reaches it, not a ghost
        ckpt = _stage(tmp_path / "ckpt", 10)
        faults.push(f"ipc://{sockets}/n.sock", [faults.committed_notice(ckpt, 10, RUN_ID)])
        _tick_until(first, lambda: _evaluated(first) == [10], "step 10 evaluated by the first evald")
    finally:
        first.shutdown()


def test_a_second_evald_on_a_served_directory_refuses_to_start(tmp_path, sockets, monkeypatch, caplog):
    ckpt = _stage(tmp_path / "ckpt")
    first = Server(_config(tmp_path, None, ckpt_dir=str(ckpt)), pipeline=MeanWeightPipeline())
    try:
        first.startup()
        second = Server(_config(tmp_path, None, ckpt_dir=str(ckpt), logdir=str(tmp_path / "elsewhere")),
                        pipeline=MeanWeightPipeline())
        with caplog.at_level(logging.ERROR, logger="evald"):
            assert _refused(second, monkeypatch) == 2
        assert f"checkpoint directory {ckpt} is in use by evald pid {os.getpid()}" in caplog.text, caplog.text
        assert not (tmp_path / "elsewhere").exists() or not any((tmp_path / "elsewhere").rglob("ledger.sqlite"))
    finally:
        first.shutdown()


def test_a_run_finished_message_without_the_trainers_record_ends_nothing(tmp_path, sockets):
    ckpt = _stage(tmp_path / "ckpt", 10)
    server = Server(_config(tmp_path, sockets, ckpt_dir=str(ckpt), idle_exit_s=None), pipeline=MeanWeightPipeline())
    try:
        server.startup()
        _tick_until(server, lambda: _evaluated(server) == [10], "step 10 evaluated")
        received = server.receiver.received
        faults.push(f"ipc://{sockets}/n.sock", [wire.RunFinished(run_id=RUN_ID, ckpt_dir=str(ckpt), final_step=10)])
        wait_for(lambda: server.receiver.received > received, 30, "the run_finished message received")
        for _ in range(20):  # the message is in the queue: these turns handle it
            assert server.on_tick(), "a forged run_finished ended the run"
        assert server.run.run_end is None
        assert not (server.run.run_dir / "summary.json").exists()
    finally:
        server.shutdown()


def test_serve_forever_keeps_running_after_the_run_finished(tmp_path, caplog):
    ckpt = _stage(tmp_path / "ckpt", 10, 20, final_step=20)
    server = Server(_config(tmp_path, None, ckpt_dir=str(ckpt), serve_forever=True, idle_exit_s=None),
                    pipeline=MeanWeightPipeline())
    try:
        with caplog.at_level(logging.INFO, logger="evald"):
            server.startup()
            summary = lambda: (server.run.run_dir / "summary.json").exists()  # noqa: E731
            _tick_until(server, summary, "the run summary")
            for _ in range(30):  # without --serve-forever the loop ends at the first of these turns
                assert server.on_tick(), "evald stopped after the run finished despite --serve-forever"
        assert _evaluated(server) == [10, 20]
        assert caplog.text.count("run complete:") == 1, "the run is summarised once, not on every turn"
    finally:
        server.shutdown()
