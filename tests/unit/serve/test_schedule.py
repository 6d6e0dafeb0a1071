"""The Runner's rules on evald's main thread: between two evaluation batches nothing is swapped (a request
for another step waits), between evaluations a pinned step is swapped in, the budget bounds each pass."""

from __future__ import annotations

import pytest

ms = pytest.importorskip("mindspore")

from evald.config import ServeOptions  # noqa: E402
from evald.serve.requests import Completion, ModelRef  # noqa: E402
from examples.tiny_lm.model import build_model  # noqa: E402
from tests.unit.serve.rig import Rig, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def rig():
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    net = build_model(seq_len=64, seed=3)
    net.set_train(False)
    r = Rig(net, ServeOptions(listen="127.0.0.1:0", batch_size=4, queue_size=64),
            {10: snapshot(net, 1), 20: snapshot(net, 2)})
    yield r
    r.close()
    ms.set_context(mode=before)


def _request(step: int | None) -> Completion:
    return Completion(ModelRef("unit", step), ((1, 2, 3, 4),), max_tokens=0, temperature=0.0, top_p=1.0, n=1,
                      stop=(), seed=None, logprobs=1, echo=True)


def test_between_batches_a_request_for_another_step_waits_and_nothing_is_swapped(rig):
    rig.swap(10)
    swaps = rig.swaps
    other, same = rig.queue.submit(_request(20)), rig.queue.submit(_request(10))
    assert rig.serve(may_swap=False) == 1
    assert same.future.result(0).served.step == 10
    assert not other.future.done() and rig.swaps == swaps and rig.queue.depth() == 1
    latest = rig.queue.submit(_request(None))   # latest is 20: not held, so it waits too
    rig.serve(may_swap=False)
    assert not latest.future.done() and rig.swaps == swaps
    assert rig.serve(may_swap=True) == 2        # between evaluations: 20 swapped in once, both answered
    assert other.future.result(0).served.step == 20 and latest.future.result(0).served.step == 20
    assert rig.swaps == swaps + 1


def test_the_budget_bounds_a_pass_but_one_pass_always_runs_and_requests_share_it(rig):
    rig.swap(10)
    jobs = [rig.queue.submit(_request(10)) for _ in range(20)]
    passes = rig.scorer.stats.forward_passes
    assert rig.serve(may_swap=False, budget_s=0.0) == 4          # one pass: batch_size (4) one-prompt requests
    assert rig.scorer.stats.forward_passes == passes + 1 and rig.queue.depth() == 16
    while rig.queue.pending():
        rig.serve(may_swap=False, budget_s=10.0)
    answers = [j.future.result(0) for j in jobs]
    alone = rig.queue.submit(_request(10))
    rig.serve(may_swap=False)
    expected = alone.future.result(0).choices[0].prompt_logprobs
    assert all(a.choices[0].prompt_logprobs == expected for a in answers)   # sharing a pass changes no bit


def test_a_step_that_is_not_servable_is_refused_not_swapped(rig):
    rig.swap(10)
    job = rig.queue.submit(_request(30))
    rig.serve(may_swap=True)
    with pytest.raises(Exception) as caught:
        job.future.result(0)
    assert caught.value.status == 404 and "servable steps" in caught.value.message
