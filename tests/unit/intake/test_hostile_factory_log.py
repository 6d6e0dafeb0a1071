"""Issue 19, kind 9: an announced factory that is not used is said once, as not used, with a count.

A refused factory named in a run announcement of the real run was logged every 30 s (at every
rescan, which re-reads RUN.json) as if it were in use ("the model factory os:system comes from the
run_announced message ..."), while the operator's factories stayed in use and nothing ran."""

from __future__ import annotations

import logging

from evald.cli.main import parse_config
from evald.contracts import layout, wire
from evald.intake import trainer_files, trust

CHANNEL = trust.Source("notification endpoint ipc:///tmp/evald-0/notify.sock", True, "a private local socket")
SYSTEM = wire.FactorySpec("os:system", {"command": "touch /tmp/x"})


def _announce(ckpt, run_id="r1"):
    layout.write_run_file(ckpt, wire.RunAnnounced(run_id=run_id, ckpt_dir=str(ckpt)).encode().decode())
    return wire.RunAnnounced(run_id=run_id, ckpt_dir=str(ckpt), model_factory=SYSTEM, data_factory=SYSTEM)


def _read(ckpt, message, operator, times=5):
    return [trainer_files.read_announcement(ckpt, message, CHANNEL, operator=operator) for _ in range(times)]


def test_an_announced_factory_the_operator_overrides_is_said_once_as_not_used(tmp_path, caplog):
    message = _announce(tmp_path)
    operator = parse_config(["--model-factory", "examples.tiny_lm.model:build_model",
                             "--data-factory", "examples.tiny_lm.data:build_data"], environ={})
    with caplog.at_level(logging.INFO):
        _read(tmp_path, message, operator)
    text = caplog.text
    assert "comes from the run_announced message" not in text
    assert text.count("os:system") == 2, text  # model and data, once each
    assert "not used" in text and "--model-factory" in text


def test_an_announced_factory_refused_by_factory_allow_is_said_once_as_refused(tmp_path, caplog):
    message = _announce(tmp_path)
    operator = parse_config(["--factory-allow", "examples."], environ={})
    with caplog.at_level(logging.INFO):
        _read(tmp_path, message, operator)
    assert "comes from the run_announced message" not in caplog.text
    assert caplog.text.count("os:system") == 2 and "refused" in caplog.text and "--factory-allow" in caplog.text


def test_a_used_announced_factory_is_said_once_not_at_every_rescan(tmp_path, caplog):
    message = _announce(tmp_path)
    with caplog.at_level(logging.INFO):
        _read(tmp_path, message, parse_config([], environ={}))
    assert caplog.text.count("comes from the run_announced message") == 2  # model and data
