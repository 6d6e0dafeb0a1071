"""Building the evaluation network blocks evald's loop for seconds (its graphs compile), so the build calls
``keep_alive`` between its steps; evald's server uses it to republish its control state (found by CI: a
trainer that subscribed during a 6.7 s build heard no evald and its budget deleted 13 snapshots before they
were evaluated). The server's own keep-alive ticks the control publisher."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from evald.pipeline.network import Evaluator
from evald.pipeline.tasks.generation import SampleGenerator
from tests import faults


def test_the_build_calls_keep_alive_between_its_steps(graph_mode):  # graph_mode: tests/unit/conftest.py
    calls = []
    Evaluator(task="lm", model=faults.MODEL_FACTORY, data=faults.DATA_FACTORY, subset_size=16, subset_seed=3,
              batch_size=8, generation=SampleGenerator(prompts=2, prompt_len=16, new_tokens=4),
              keep_alive=lambda: calls.append(1))
    # before and after the evaluation graph's compile, and before each generation step (two modes x 4 tokens:
    # the first of each compiles the prefill, the second the decode step)
    assert len(calls) >= 2 + 2 * 4


def test_the_server_keeps_its_control_state_published_while_the_network_builds():
    from evald.daemon.server import Server

    ticks = []

    class Publisher:
        def tick(self):
            ticks.append(1)

    server = Server.__new__(Server)   # only the keep-alive's wiring: no sockets, no run directory
    server.control, server.run = Publisher(), object()
    server._keep_alive()
    assert ticks == [1]
