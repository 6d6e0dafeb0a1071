"""Lifecycle rules that need evald's Server but not a process of its own: a second evald in the way,
a run_finished message without the trainer's record, --serve-forever after the run's end.

The real Server, its real receiver on private ipc endpoints and real ZeroMQ messages, in this process;
the MindSpore evaluation is a stand-in that reads and verifies the checkpoint and reports its mean weight.
The real processes (signals, exit codes seen by a shell) are in tests/e2e/test_lifecycle.py.
"""

from __future__ import annotations

import logging
import os

import pytest

from evald.contracts import wire
from evald.daemon.server import Server
from evald.sinks.counters import MessageCounts, read_counts
from tests import faults
from tests.unit.daemon.rig import RUN_ID, MeanWeightPipeline, config, evaluated, refused, stage, tick_until

pytestmark = pytest.mark.usefixtures("private_umask")


def test_a_second_evald_on_the_same_endpoint_refuses_to_start_and_names_the_first(tmp_path, sockets, monkeypatch,
                                                                                    caplog):
    first = Server(config(tmp_path, sockets), pipeline=MeanWeightPipeline())  # waits for a trainer's message
    try:
        first.startup()
        second = Server(config(tmp_path / "second", sockets), pipeline=MeanWeightPipeline())
        with caplog.at_level(logging.ERROR, logger="evald"):
            assert refused(second, monkeypatch) == 2
        said = caplog.text
        assert f"endpoint ipc://{sockets}/n.sock is in use by evald pid {os.getpid()}" in said, said
        assert "another --endpoint" in said
        # the first still owns the endpoint: a trainer's notification reaches it, not a ghost
        ckpt = stage(tmp_path / "ckpt", 10)
        faults.push(f"ipc://{sockets}/n.sock", [faults.committed_notice(ckpt, 10, RUN_ID)])
        tick_until(first, lambda: evaluated(first) == [10], "step 10 evaluated by the first evald")
    finally:
        first.shutdown()


def test_a_second_evald_on_a_served_directory_refuses_to_start(tmp_path, sockets, monkeypatch, caplog):
    ckpt = stage(tmp_path / "ckpt")
    first = Server(config(tmp_path, None, ckpt_dir=str(ckpt)), pipeline=MeanWeightPipeline())
    try:
        first.startup()
        second = Server(config(tmp_path, None, ckpt_dir=str(ckpt), logdir=str(tmp_path / "elsewhere")),
                        pipeline=MeanWeightPipeline())
        with caplog.at_level(logging.ERROR, logger="evald"):
            assert refused(second, monkeypatch) == 2
        assert f"checkpoint directory {ckpt} is in use by evald pid {os.getpid()}" in caplog.text, caplog.text
        assert not (tmp_path / "elsewhere").exists() or not any((tmp_path / "elsewhere").rglob("ledger.sqlite"))
    finally:
        first.shutdown()


def test_a_run_finished_message_without_the_trainers_record_ends_nothing(tmp_path, sockets):
    ckpt = stage(tmp_path / "ckpt", 10)
    server = Server(config(tmp_path, sockets, ckpt_dir=str(ckpt), idle_exit_s=None), pipeline=MeanWeightPipeline())
    try:
        server.startup()
        tick_until(server, lambda: evaluated(server) == [10], "step 10 evaluated")
        faults.push(f"ipc://{sockets}/n.sock", [wire.RunFinished(run_id=RUN_ID, ckpt_dir=str(ckpt), final_step=10)])
        # counters.json says the loop handled it; the same turn asked whether the run is complete
        tick_until(server, lambda: (read_counts(server.run.run_dir) or MessageCounts()).handled == 1,
                   "the run_finished message handled")
        assert server.on_tick(), "a forged run_finished ended the run"
        assert server.run.run_end is None
        assert not (server.run.run_dir / "summary.json").exists()
        assert read_counts(server.run.run_dir) == MessageCounts(handled=1, ignored=0, bad_frames=0)
    finally:
        server.shutdown()


def test_serve_forever_keeps_running_after_the_run_finished(tmp_path, caplog):
    ckpt = stage(tmp_path / "ckpt", 10, 20, final_step=20)
    server = Server(config(tmp_path, None, ckpt_dir=str(ckpt), serve_forever=True, idle_exit_s=None),
                    pipeline=MeanWeightPipeline())
    try:
        with caplog.at_level(logging.INFO, logger="evald"):
            server.startup()
            summary = lambda: (server.run.run_dir / "summary.json").exists()  # noqa: E731
            tick_until(server, summary, "the run summary")
            for _ in range(30):  # without --serve-forever the loop ends at the first of these turns
                assert server.on_tick(), "evald stopped after the run finished despite --serve-forever"
        assert evaluated(server) == [10, 20]
        assert caplog.text.count("run complete:") == 1, "the run is summarised once, not on every turn"
    finally:
        server.shutdown()
