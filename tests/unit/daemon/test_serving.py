"""The daemon's wiring of --serve: between evaluation batches the runner may never swap; between turns it may;
a dead HTTP thread stops evald like any background thread."""

from __future__ import annotations

import queue

import pytest

from evald.cli.main import parse_config
from tests.networks import NoNetworkYet
from evald.daemon.serving import WAKE, Serving
from evald.serve.requests import Completion, ModelRef


@pytest.fixture
def serving():
    config = parse_config(["--serve", "127.0.0.1:0"], {}).config
    events: queue.Queue = queue.Queue()
    s = Serving(config, NoNetworkYet(), events)
    s.start()
    yield s, events
    s.close()


def _job(s: Serving) -> None:
    s.queue.submit(Completion(ModelRef("r", None), ((1, 2),), max_tokens=0, temperature=0.0, top_p=1.0, n=1,
                              stop=(), seed=None, logprobs=None, echo=True))


def test_between_batches_never_swaps_and_between_turns_may(serving, monkeypatch):
    s, events = serving
    calls: list[bool] = []
    monkeypatch.setattr(s.runner, "run", lambda budget_s, may_swap: calls.append(may_swap) or 0)
    s.scorer = object()   # as if the network were built
    _job(s)
    assert events.get_nowait() == (WAKE, None)      # the idle loop is woken once, not once per request
    _job(s)
    assert events.empty()
    s.between_batches()
    s.on_tick()
    assert calls == [False, True]


def test_a_dead_http_thread_is_reported(serving):
    s, _ = serving
    assert s.check_alive() is None and s.http.is_alive()
    s.http.stop()
    assert not s.http.is_alive() and s.check_alive()


def test_an_address_in_use_or_an_open_token_file_refuses_to_start(tmp_path):
    import os
    import socket

    from evald.serve.http_thread import ServeError

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ServeError, match="cannot listen there"):
            Serving(parse_config(["--serve", f"127.0.0.1:{port}"], {}).config, NoNetworkYet(), queue.Queue())
    finally:
        taken.close()
    token = tmp_path / "token"
    token.write_text("a-token-long-enough-1234")
    os.chmod(token, 0o644)
    config = parse_config(["--serve", json_table(listen="127.0.0.1:0", token_file=str(token))], {}).config
    with pytest.raises(ServeError, match="chmod 600"):
        Serving(config, NoNetworkYet(), queue.Queue())


def json_table(**keys) -> str:
    import json

    return json.dumps(keys)


def test_a_tensor_parallel_network_serves_between_turns_only(serving, monkeypatch):
    """Its other ranks are inside the evaluation's collectives between two batches: a request's forward,
    the whole group's, would wait for them forever."""
    s, _ = serving
    calls: list[bool] = []
    monkeypatch.setattr(s.runner, "run", lambda budget_s, may_swap: calls.append(may_swap) or 0)
    monkeypatch.setattr(s, "scorer", object())
    _job(s)
    monkeypatch.setattr(s.pipeline, "tensor_parallel", True)
    s.between_batches()
    assert calls == []
    monkeypatch.setattr(s.pipeline, "tensor_parallel", False)
    s.between_batches()
    assert calls == [False]
