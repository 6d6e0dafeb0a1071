"""Fixtures of the in-process layer shared across packages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import mindspore as ms

    from evald.ledger.ledger import Ledger


@pytest.fixture(scope="module")
def graph_mode():
    """MindSpore in Graph mode for one test module (how evald runs its network), the previous mode restored after."""
    ms = pytest.importorskip("mindspore")
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=before)


@pytest.fixture(scope="module")
def network(request: pytest.FixtureRequest) -> Iterator[ms.nn.Cell]:
    """The demo network in Graph mode for a serve or pipeline test module, seeded by its ``NETWORK_SEED``."""
    from tests.networks import demo_network_in_graph_mode   # mindspore: imported only by modules that use it

    with demo_network_in_graph_mode(seed=request.module.NETWORK_SEED) as net:
        yield net


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, Ledger]]:
    """An empty checkpoint directory and a fresh ledger, closed after: the intake and partition tests both start so."""
    from evald.ledger.ledger import Ledger

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    yield ckpt, ledger
    ledger.close()
