"""Fixtures of the in-process daemon tests (the rig they drive the Server with is tests/unit/daemon/rig.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def sockets(short_dir, monkeypatch) -> Path:
    """Private ipc endpoints, and evald's lock directory beside them."""
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(short_dir))
    return short_dir


@pytest.fixture
def private_umask():
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)  # startup makes evald's state private with a umask: not this test process's
