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


class EvaluatingPipeline:
    """What Serving and the Server need of the pipeline while an evaluation runs on step 10: the rig's network
    and the step it holds, never swapped (between two evaluation batches nothing may be)."""

    tensor_parallel = False

    def __init__(self, rig) -> None:
        self.rig, self.network = rig, rig.network

    def held(self):
        return self.rig._held

    def swap_in(self, ckpt_dir, row):
        raise AssertionError("a swap between two evaluation batches")

    def group_scorer(self, scorer):
        return scorer


def test_a_big_request_runs_one_slice_between_two_batches_of_an_evaluation_through_the_server(rig, monkeypatch):
    """Issue 35 (the large request, by behaviour and order): through evald's own Server._should_abort, the
    hook every evaluation batch calls, a request of 32 prompts x n 4 with echo and logprobs runs as 32 slices
    of serve.batch_size (4) rows, one slice after each of 32 consecutive batches (serve.budget_s 0), each after
    the control state's keep-alive; the main thread returns to the evaluation after each slice, and the
    answer is the request's answer run whole."""
    import json

    from evald.cli.main import parse_config
    from evald.daemon.server import Server
    from evald.daemon.serving import Serving

    resolved = parse_config(["--serve", json.dumps({"listen": "127.0.0.1:0", "budget_s": 0, "batch_size": 4,
                                                    "max_prompts": 32, "max_n": 4})], {})
    pipeline = EvaluatingPipeline(rig)
    server = Server(resolved, pipeline=pipeline)
    serving = server.serving = Serving(resolved.config, pipeline, server.events)
    order: list[str] = []
    try:
        serving.scorer, serving._steps = rig.scorer, (10,)
        server.run = object()          # _should_abort keeps the control state alive only for a run
        server.control = type("Control", (), {"tick": lambda self: order.append("keep-alive")})()
        slicing = serving.runner._slice
        monkeypatch.setattr(serving.runner, "_slice", lambda group: order.append("slice") or slicing(group))
        body = {"model": "unit@latest", "prompt": [f"def f{i}(x):" for i in range(32)], "n": 4, "max_tokens": 1,
                "echo": True, "logprobs": 2, "temperature": 0.7, "seed": 5}
        request = parse_completion(body, tokenizer=rig.tokenizer, limits=resolved.config.serve,
                                   window=rig.scorer.max_length, run_name="unit")
        job = serving.queue.submit(request)
        for batch in range(40):        # an evaluation of 40 batches, the hook after each one
            order.append(f"batch {batch}")
            assert server._should_abort() is False
        assert order[:6] == ["batch 0", "keep-alive", "slice", "batch 1", "keep-alive", "slice"], order[:6]
        assert order.count("slice") == 32 and job.future.done()
        between = " ".join(order).split("batch")
        assert all(gap.count("slice") <= 1 for gap in between), order
        assert order[order.index("batch 31"):order.index("batch 32")] == ["batch 31", "keep-alive", "slice"]
        assert "slice" not in order[order.index("batch 32"):]   # done after 32 batches, not before, not later
        whole = engine.run(rig.scorer, rig.tokenizer, request)
        answer = job.future.result()
        assert [c.prompt_logprobs for c in answer.choices] == [c.prompt_logprobs for c in whole]
        assert [c.tokens for c in answer.choices] == [c.tokens for c in whole]
    finally:
        serving.http.sock.close()
