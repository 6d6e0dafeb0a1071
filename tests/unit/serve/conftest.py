"""Fixtures shared by the serve tests (the served network's rig itself is in rig.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def network(request):
    """The demo network in Graph mode for one test module, built with the module's ``NETWORK_SEED``
    (which each module that uses this fixture names: its expected values follow from it)."""
    from tests.networks import demo_network_in_graph_mode   # mindspore: imported only by modules that use it

    with demo_network_in_graph_mode(seed=request.module.NETWORK_SEED) as net:
        yield net
