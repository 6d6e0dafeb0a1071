"""Fixtures shared by the intake tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.harness import private_socket_dir


@pytest.fixture
def socket_dir() -> Iterator[str]:
    """A private short-path dir for both receiver test files' ipc socket (ipc names fit ~107 bytes), removed after."""
    path = private_socket_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
