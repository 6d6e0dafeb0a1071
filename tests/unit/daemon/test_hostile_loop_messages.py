"""Issue 19, kind 2: no message can raise out of evald's loop, whatever its ``ckpt_dir``: a symbolic-link
loop (``Path.resolve()`` raised RuntimeError and killed evald, 3 of 3 runs), an overlong path, a file
as a parent; for checkpoint_committed, run_finished and run_announced; from a trusted or an untrusted
peer; as the first message to an evald started without --ckpt-dir, or to an attached one. Same for a
--ckpt-dir or --logdir of the operator that loops: a clear error and exit 2, no traceback."""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.cli.main import parse_config
from evald.config import EvaldConfig, ResolvedConfig
from evald.contracts import wire
from evald.daemon.run import Run
from evald.daemon.server import Server
from evald.intake.receiver import ZMQ, ZMQ_UNTRUSTED
from tests import faults


class NoPipeline:
    """Stands in for the evaluation pipeline, which these tests never reach (no MindSpore needed)."""

    evaluator = None
    blocked_reason = "no factories in this test"

    def ensure_built(self, config) -> bool:
        return False


def loop_in(tmp_path: Path) -> Path:
    os.symlink(tmp_path / "loop-b", tmp_path / "loop-a")
    os.symlink(tmp_path / "loop-a", tmp_path / "loop-b")
    return tmp_path / "loop-a"


def messages(ckpt_dir: str, run_id: str = "faults") -> list[wire.Message]:
    return [wire.CheckpointCommitted(run_id=run_id, ckpt_dir=ckpt_dir, step=1, path="step_000000001",
                                     commit_time=1.0),
            wire.RunFinished(run_id=run_id, ckpt_dir=ckpt_dir, final_step=1),
            wire.RunAnnounced(run_id=run_id, ckpt_dir=ckpt_dir)]


def test_a_first_message_naming_a_loop_leaves_an_unattached_evald_running(tmp_path, caplog):
    loop = loop_in(tmp_path)
    server = Server(parse_config(["--logdir", str(tmp_path / "tb")], environ={}))
    (tmp_path / "sock").mkdir(mode=0o700)  # a trusted channel: a local socket private to this uid
    server.receiver = SimpleNamespace(endpoint=f"ipc://{tmp_path}/sock/notify.sock", authenticated=False)
    (tmp_path / "file").write_text("x")
    with caplog.at_level(logging.ERROR):
        for text in (str(loop), str(loop / "sub"), "/x" * 3000, str(tmp_path / "file" / "x")):
            for message in messages(text):
                for source in (ZMQ, ZMQ_UNTRUSTED):
                    server.events.put((source, message))
                    server._drain_events(timeout=1)  # must not raise
    assert server.run is None and server.locks == []
    assert "loop of symbolic links" in caplog.text


def _run(tmp_path: Path) -> Run:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    faults.commit(ckpt, 1)
    (tmp_path / "run").mkdir()
    config = dataclasses.replace(EvaldConfig(), lag_policy="all")
    run = Run(ResolvedConfig(config, {}), ckpt, tmp_path / "run", control=None, receiver=None,
              events=queue.Queue(), pipeline=NoPipeline())
    run.start()
    return run


def test_an_attached_evald_ignores_messages_naming_a_loop(tmp_path, caplog):
    loop = loop_in(tmp_path)
    run = _run(tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            for message in messages(str(loop)) + messages(str(loop / "x"), run_id="other"):
                for source in (ZMQ, ZMQ_UNTRUSTED):
                    assert run.handle(source, message) is False
        assert "loop of symbolic links" in caplog.text
    finally:
        run.close()


PATH_PARTS = st.sampled_from(["loop-a", "loop-b", "ckpt", "..", ".", "run", "step_000000001", "x" * 255, "", "é"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(PATH_PARTS, min_size=1, max_size=10), which=st.integers(0, 2), trusted=st.booleans(),
       path=st.sampled_from(["step_000000001", "step_000000001\n", "loop-a", "../x", "a/b/c",
                             "checkpoint_network/rank_0/x.ckpt"]))
def test_no_generated_message_raises_out_of_an_attached_run(tmp_path_factory, parts, which, trusted, path):
    tmp_path = tmp_path_factory.mktemp("gen")
    loop_in(tmp_path)
    os.symlink(tmp_path / "loop-a", tmp_path / "ckpt-loop")
    run = _run(tmp_path)
    try:
        text = str(tmp_path.joinpath(*parts))
        message = messages(text)[which]
        if isinstance(message, wire.CheckpointCommitted):
            message = dataclasses.replace(message, path=path)
        run.handle(ZMQ if trusted else ZMQ_UNTRUSTED, message)
    finally:
        run.close()


@pytest.mark.parametrize("option", ["--ckpt-dir", "--logdir"])
def test_an_operators_path_that_loops_is_a_clear_error_with_exit_2(tmp_path, caplog, option):
    loop = loop_in(tmp_path)
    (tmp_path / "ckpt").mkdir()
    argv = ["--endpoint", "none", "--ckpt-dir", str(tmp_path / "ckpt"), option, str(loop)]
    server = Server(parse_config(argv, environ={"EVALD_SOCKET_DIR": str(tmp_path / "sock")}))
    with caplog.at_level(logging.ERROR):
        assert server.serve() == 2
    assert "loop of symbolic links" in caplog.text and "Traceback" not in caplog.text


def test_an_app_dir_that_loops_is_a_configuration_error_naming_it(tmp_path):
    from evald.config.schema import ConfigError

    loop = loop_in(tmp_path)
    with pytest.raises(ConfigError, match="loop of symbolic links"):
        parse_config(["--app-dir", str(loop)], environ={})
