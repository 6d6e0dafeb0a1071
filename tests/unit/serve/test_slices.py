"""A big request runs in slices of serve.batch_size rows, one slice per turn between evaluation batches
(issue 27 item 6), and slicing changes no answer: a row's tokens depend only on its own seed and prompt."""

from __future__ import annotations

import pytest

ms = pytest.importorskip("mindspore")

from evald.config import ServeOptions  # noqa: E402
from evald.serve import engine  # noqa: E402
from evald.serve.requests import parse_completion  # noqa: E402
from tests.networks import demo_network_in_graph_mode  # noqa: E402
from tests.unit.serve.rig import Rig, snapshot  # noqa: E402

OPTIONS = ServeOptions(listen="127.0.0.1:0", batch_size=4, max_prompts=32, max_n=4, queue_size=8)


@pytest.fixture(scope="module")
def rig():
    with demo_network_in_graph_mode(seed=4) as net:
        r = Rig(net, OPTIONS, {10: snapshot(net, 1)})
        r.swap(10)
        try:
            yield r
        finally:
            r.close()


def test_a_32_by_4_job_runs_one_slice_of_batch_size_rows_per_turn(rig):
    body = {"model": "unit@10", "prompt": [f"def f{i}(x):" for i in range(8)], "n": 4, "max_tokens": 2,
            "echo": True, "logprobs": 1, "temperature": 0.7, "seed": 3}
    request = parse_completion(body, tokenizer=rig.tokenizer, limits=OPTIONS, window=rig.scorer.max_length,
                               run_name="unit")
    whole = engine.run(rig.scorer, rig.tokenizer, request)            # the same request, all rows at once
    job = rig.queue.submit(request)
    rows_per_turn: list[int] = []
    score = rig.scorer.score

    def counting(requests):
        rows_per_turn[-1] += len(requests)
        return score(requests)

    rig.scorer.score = counting
    try:
        while not job.future.done() and len(rows_per_turn) < 100:
            rows_per_turn.append(0)
            rig.serve(may_swap=False, budget_s=0.0)          # between two evaluation batches
    finally:
        del rig.scorer.score
    assert len(rows_per_turn) == 32 // OPTIONS.batch_size, rows_per_turn   # 32 rows, 4 a turn
    assert max(rows_per_turn) <= OPTIONS.batch_size * (body["max_tokens"] + 1)
    answer = job.future.result()
    assert [c.tokens for c in answer.choices] == [c.tokens for c in whole]
    assert [c.prompt_logprobs for c in answer.choices] == [c.prompt_logprobs for c in whole]
    assert answer.served.step == 10


def test_a_sliced_job_whose_weights_change_between_turns_restarts_on_one_snapshot(rig):
    """Between two evaluation batches the network may be swapped (the next evaluation): a job half done
    on step 10 never finishes on other weights; here it finishes on 10, swapped back between evaluations."""
    rig.snapshots[20] = snapshot(rig.network, 2)
    rig.digests[20] = __import__("tests.unit.serve.rig", fromlist=["digest_of"]).digest_of(rig.snapshots[20])
    try:
        rig.swap(10)
        body = {"model": "unit@latest", "prompt": ["ab", "cd", "ef"], "n": 4, "max_tokens": 1, "echo": True,
                "logprobs": 1, "temperature": 0}
        request = parse_completion(body, tokenizer=rig.tokenizer, limits=OPTIONS, window=rig.scorer.max_length,
                                   run_name="unit")
        rig.servable_override = (10,)
        job = rig.queue.submit(request)
        rig.serve(may_swap=False, budget_s=0.0)      # one slice on step 10
        assert not job.future.done()
        rig.swap(20)                                 # an evaluation swapped its checkpoint in
        rig.servable_override = (10, 20)
        for _ in range(20):
            if job.future.done():
                break
            rig.serve(may_swap=False, budget_s=0.0)   # never finished on step 20's weights
            rig.serve(may_swap=True, budget_s=0.0)
        answer = job.future.result(timeout=1)
        rig.swap(answer.served.step)
        again = engine.run(rig.scorer, rig.tokenizer, request)
        assert [c.prompt_logprobs for c in answer.choices] == [c.prompt_logprobs for c in again]
    finally:
        rig.servable_override = None
        del rig.snapshots[20]
