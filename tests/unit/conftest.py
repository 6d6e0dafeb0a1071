"""Fixtures of the in-process layer shared across packages."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def graph_mode():
    """MindSpore in Graph mode for one test module (how evald runs its network), the previous mode restored after."""
    ms = pytest.importorskip("mindspore")
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=before)
