"""Shared fixtures: real processes (a MindSpore trainer, evald) on private loopback endpoints."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness import Proc  # noqa: E402


@pytest.fixture
def endpoints(tmp_path_factory):
    """Unique ipc endpoints (short paths: ipc names are limited to ~107 bytes)."""
    d = Path(tempfile_dir())
    return {"EVALD_ENDPOINT": f"ipc://{d}/n.sock", "EVALD_CONTROL_ENDPOINT": f"ipc://{d}/c.sock",
            "EVALD_SOCKET_DIR": str(d)}


def tempfile_dir() -> str:
    import tempfile

    path = tempfile.mkdtemp(prefix="evt")
    os.chmod(path, 0o700)
    return path


@pytest.fixture
def procs():
    """Processes started by a test; all killed at teardown, whatever happened."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()
