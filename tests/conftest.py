"""Shared by both layers: the repository on sys.path, and the ``e2e`` marker that scripts/test.sh's stages
select on. The real-process fixtures are in tests/e2e/conftest.py; the in-process ones in tests/unit/conftest.py."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

E2E = REPO / "tests" / "e2e"


def pytest_collection_modifyitems(config, items):
    """Every test under tests/e2e/ is marked ``e2e``: scripts/test.sh's two stages select on it."""
    for item in items:
        if E2E in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def short_dir():
    """A short private directory, removed afterwards: ipc:// paths must fit in sockaddr_un (~107 bytes)."""
    d = tempfile.mkdtemp(prefix="evs-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)
