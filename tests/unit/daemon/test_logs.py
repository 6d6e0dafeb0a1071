"""``--log-format json``: one JSON object per line with the structured fields of the call
(evald as a process writing JSON is checked in test_status_retry.py)."""

from __future__ import annotations

import io
import json
import logging

from evald.daemon.logs import JsonFormatter, configure


def _emit(**kwargs) -> dict:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("evald.test_logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("step %d: %s", 40, "evaluated", **kwargs)
    finally:
        logger.removeHandler(handler)
    [line] = stream.getvalue().splitlines()
    return json.loads(line)


def test_a_line_holds_time_level_logger_message_and_the_fields_of_the_call():
    entry = _emit(extra={"step": 40, "key": "step_000000040", "evaluate_s": 0.25, "metrics": {"eval/loss": 2.5},
                         "when": object()})
    assert entry["level"] == "WARNING" and entry["logger"] == "evald.test_logs"
    assert entry["message"] == "step 40: evaluated" and entry["time"].endswith("Z") and "T" in entry["time"]
    assert (entry["step"], entry["key"], entry["evaluate_s"]) == (40, "step_000000040", 0.25)
    assert entry["metrics"] == {"eval/loss": 2.5} and entry["when"].startswith("<object")  # as text
    assert "args" not in entry and "msg" not in entry and "levelno" not in entry  # no LogRecord internals


def test_an_exception_is_one_field_of_the_same_line():
    try:
        raise ValueError("bad checkpoint")
    except ValueError:
        entry = _emit(exc_info=True)
    assert "ValueError: bad checkpoint" in entry["exception"] and "Traceback" in entry["exception"]


def test_configure_replaces_the_handlers_and_text_stays_the_default(capsys):
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        configure("INFO", "json")
        logging.getLogger("evald").info("hello", extra={"step": 1})
        configure("INFO")
        logging.getLogger("evald").info("plain")
        err = capsys.readouterr().err.splitlines()
        assert json.loads(err[0])["step"] == 1
        assert err[1].endswith("evald INFO plain") and not err[1].startswith("{")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)
