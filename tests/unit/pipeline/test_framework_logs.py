"""evald.pipeline.framework_logs: MindFormers' console lines below WARNING leave evald's log, its files keep them.

MindFormers' logger module is a STAND-IN here (an object in sys.modules with its ``get_logger``), since the
project's venv has no MindFormers; tests/e2e/test_mindformers_recipe.py checks the real one, in its own venv.
"""

from __future__ import annotations

import io
import logging
import sys
import types

import pytest

from evald.pipeline.framework_logs import MINDFORMERS_LOGGER_MODULE, quiet_framework_stdout


@pytest.fixture
def framework_logger(tmp_path, monkeypatch):
    logger = logging.getLogger(f"mindformers{tmp_path}")
    logger.propagate = False
    console, files = logging.StreamHandler(io.StringIO()), logging.FileHandler(tmp_path / "info.log")
    console.setLevel(logging.INFO)
    files.setLevel(logging.INFO)
    logger.handlers[:] = [console, files]
    logger.setLevel(logging.INFO)
    monkeypatch.setitem(sys.modules, MINDFORMERS_LOGGER_MODULE, types.SimpleNamespace(get_logger=lambda: logger))
    monkeypatch.setattr(logging.getLogger("evald"), "level", logging.INFO)
    yield logger, console, files
    files.close()


def test_info_lines_go_to_the_frameworks_files_and_warnings_still_reach_evalds_log(framework_logger, tmp_path):
    logger, console, files = framework_logger
    assert quiet_framework_stdout() == [logger.name]
    logger.info("MoE config is None, use normal FFN")
    logger.warning("a warning the operator must see")
    assert console.stream.getvalue() == "a warning the operator must see\n"
    files.flush()
    assert (tmp_path / "info.log").read_text().splitlines() == [
        "MoE config is None, use normal FFN", "a warning the operator must see"]
    assert quiet_framework_stdout() == []  # once: nothing left to change


def test_with_log_level_debug_nothing_is_changed(framework_logger, monkeypatch):
    logger, console, _ = framework_logger
    monkeypatch.setattr(logging.getLogger("evald"), "level", logging.DEBUG)
    assert quiet_framework_stdout() == [] and console.level == logging.INFO


def test_without_the_framework_nothing_is_imported_or_changed(monkeypatch):
    monkeypatch.delitem(sys.modules, MINDFORMERS_LOGGER_MODULE, raising=False)
    assert quiet_framework_stdout() == []
    assert MINDFORMERS_LOGGER_MODULE not in sys.modules
