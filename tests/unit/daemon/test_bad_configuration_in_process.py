"""Factories that cannot work: a clear error, and never a silent evald.

* The operator's own factories are built at start-up: if they cannot be, evald says why and exits 3 at once
  (nothing it could ever evaluate).
* Factories announced by the trainer: evald keeps serving with the checkpoints queued, says why (and repeats
  it), and exits cleanly on a signal, or with 3 on --idle-exit-s.
* A data factory of the wrong shape for the task is named with what was expected and what came.

evald's own Server, its real Pipeline and the command line's own parser, in this process (no signal handler
of this process is touched: the signal handler only sets the flag these tests set).
"""

from __future__ import annotations

import logging
import signal

import pytest

from evald.cli.main import parse_config
from evald.contracts import layout, wire
from evald.daemon.server import Server
from evald.pipeline.pipeline import Pipeline
from tests import faults
from tests.harness import REPO

pytestmark = pytest.mark.usefixtures("private_umask")

PAIRS = "tests.bad_factories:input_label_pairs"


def _server(ckpt, *args: str) -> Server:
    """The real Pipeline, on the device this test process already runs MindSpore on (choosing one again fails
    once the runtime runs kernels; the real processes of tests/e2e choose theirs)."""
    return Server(parse_config([*faults.FAST, "--endpoint", "none", "--ckpt-dir", str(ckpt), *args], environ={}),
                  pipeline=Pipeline(should_abort=lambda: False, device_selected=True))


def _serve(server: Server, monkeypatch, caplog) -> tuple[int, str]:
    monkeypatch.setattr(server, "install_signal_handlers", lambda: None)
    with caplog.at_level(logging.INFO):
        code = server.serve()
    return code, caplog.text


def _announce(ckpt, data_factory: wire.FactorySpec) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    message = wire.RunAnnounced(run_id="faults", ckpt_dir=str(ckpt), model_factory=faults.MODEL_FACTORY,
                                data_factory=data_factory)
    layout.write_run_file(ckpt, message.encode().decode())


def _queued(ckpt) -> list[tuple[int, str]]:
    return [(r["step"], r["state"]) for r in faults.ledger_rows(ckpt)]


def test_operator_factory_that_cannot_be_imported_exits_3_at_start(tmp_path, monkeypatch, caplog):
    ckpt = tmp_path / "ckpt"
    faults.commit(ckpt, 5)
    server = _server(ckpt, "--model-factory", "no_such_package.model:build",
                     "--data-factory", "examples.tiny_lm.data:validation_windows")
    code, log = _serve(server, monkeypatch, caplog)
    assert code == 3, log[-3000:]
    assert "cannot build the evaluation network" in log and "no_such_package" in log and "--app-dir" in log
    assert "fix the configuration and start again" in log


def test_lm_data_of_input_label_pairs_is_named_and_evald_exits_3(tmp_path, monkeypatch, caplog):
    ckpt = tmp_path / "ckpt"
    faults.commit(ckpt, 5)
    server = _server(ckpt, "--model-factory", "examples.tiny_lm.model:build_model", "--model-kwargs",
                     '{"seq_len": 64}', "--data-factory", PAIRS)
    code, log = _serve(server, monkeypatch, caplog)
    assert code == 3, log[-3000:]
    assert "the lm task expects each validation item to be one row of T+1 integer token ids" in log
    assert "got a tuple of 2 (an array of shape (64,)" in log and "(inputs, labels) pairs" in log
    assert "too many values to unpack" not in log and "Traceback" not in log


def test_announced_bad_factory_keeps_checkpoints_queued_and_evald_alive(tmp_path, monkeypatch, caplog):
    ckpt = tmp_path / "ckpt"
    _announce(ckpt, wire.FactorySpec("no_such_package.data:build", {}, str(REPO)))
    faults.commit(ckpt, 5)
    server = _server(ckpt)
    turns = 0

    def on_tick() -> bool:  # the loop body as it is, and a SIGTERM once the reminder has been said
        nonlocal turns
        turns += 1
        if "checkpoint(s) waiting, none can be evaluated" in caplog.text and not server.should_exit:
            server.handle_exit(signal.SIGTERM, None)
        assert turns < 200, "no reminder that the checkpoints cannot be evaluated"
        return Server.on_tick(server)

    monkeypatch.setattr(server, "on_tick", on_tick)
    code, log = _serve(server, monkeypatch, caplog)
    assert code == 0, log[-3000:]
    assert "no_such_package" in log
    assert _queued(ckpt) == [(5, "queued")]


def test_announced_data_of_the_wrong_shape_never_hangs_with_idle_exit(tmp_path, monkeypatch, caplog):
    ckpt = tmp_path / "ckpt"
    _announce(ckpt, wire.FactorySpec(PAIRS, {}, str(REPO)))
    faults.commit(ckpt, 5)
    code, log = _serve(_server(ckpt, "--idle-exit-s", "0.5"), monkeypatch, caplog)
    assert code == 3, log[-3000:]
    assert "(inputs, labels) pairs" in log and "checkpoints are still waiting" in log
    assert _queued(ckpt) == [(5, "queued")]


def test_no_factories_at_all_is_said_and_idle_exit_is_3(tmp_path, monkeypatch, caplog):
    ckpt = tmp_path / "ckpt"
    faults.commit(ckpt, 5)
    code, log = _serve(_server(ckpt, "--idle-exit-s", "0.5"), monkeypatch, caplog)
    assert code == 3, log[-3000:]
    assert "no model or data factory is known" in log
