"""GroupScorer's split in one process: ranks as threads, a thread-barrier SUM standing in for
MindSpore's AllReduce (the real msrun group runs in tests/e2e/test_suites_group.py); each rank's
TokenScorer is a stand-in that 'scores' a request by its own token values, so the test checks the
bookkeeping: every request scored exactly once, by the rank that owns it, reassembled in order."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from evald.pipeline.group.protocol import GENERATE, SCORE, WARM, Group
from evald.pipeline.group.scoring import GroupScorer, generate_share, score_share, warm_share
from evald.pipeline.suites.scoring import GenerateRequest, ScoreRequest, TokenScores, shared_rows


class BarrierSum:
    def __init__(self, size):
        self.size, self.barrier, self.parts, self.lock = size, threading.Barrier(size), [], threading.Lock()

    def make(self):
        def reduce_sum(vector):
            with self.lock:
                self.parts.append(vector.copy())
            self.barrier.wait()
            total = np.sum(self.parts, axis=0, dtype=np.float32)
            self.barrier.wait()
            with self.lock:
                self.parts.clear()
            self.barrier.wait()
            return total
        return reduce_sum


class FakeScorer:
    max_length, batch_size, lengths = 64, 4, (16, 32, 64)

    def __init__(self, rank):
        self.rank, self.seen, self.requests = rank, [], []
        self.stats = None

    def score(self, requests):
        self.seen += [list(r.continuation) for r in requests]
        self.requests += list(requests)
        return [TokenScores(np.asarray(r.continuation, np.float32) / -10, np.asarray(r.continuation) % 2 == 0)
                for r in requests]

    def generate(self, requests, eos_id=None):
        self.seen += [list(r.context) for r in requests]
        return [[t + 1 for t in r.context][: r.max_new_tokens] for r in requests]


def _run(size, ranks, work):
    summer = BarrierSum(size)
    groups = [Group(r, size, summer.make()) for r in range(size)]
    scorers = [FakeScorer(r) for r in range(size)]
    out = {}

    def follower(r):
        op, payload = groups[r].receive()
        (score_share if op == SCORE else generate_share)(scorers[r], groups[r], payload)

    threads = [threading.Thread(target=follower, args=(r,)) for r in range(1, size)]
    for t in threads:
        t.start()
    out["result"] = work(GroupScorer(groups[0], scorers[0], ranks))
    for t in threads:
        t.join(10)
    return out["result"], scorers


def test_scores_are_split_over_the_ranks_and_reassembled_in_order():
    requests = [ScoreRequest([100 + i], list(range(i, i + 1 + i % 3))) for i in range(7)]   # no shared rows
    result, scorers = _run(3, None, lambda g: g.score(requests))
    for r, got in zip(requests, result):
        assert got.logprobs.tolist() == (np.asarray(r.continuation, np.float32) / -10).tolist()
        assert got.greedy.tolist() == [c % 2 == 0 for c in r.continuation]
    assert sorted(len(s.seen) for s in scorers) == [2, 2, 3]
    assert sorted(c for s in scorers for c in map(tuple, s.seen)) == sorted(tuple(r.continuation) for r in requests)


def test_requests_that_share_a_row_are_scored_together_on_one_rank_in_the_row_of_one_device():
    """Multiple-choice questions: the choices of a question share their context's row (one is a prefix of
    another). Split by request, a choice whose partner went to another rank would be read from a shorter row,
    perhaps in another bucket (another compiled graph); split by row, each rank reads it where one device does."""
    questions = [[7, q, q + 1] for q in range(0, 40, 4)]
    requests = [ScoreRequest(context, choice) for context in questions
                for choice in ([1], [2], [3, 4], [3, 4, 5])]     # [3, 4] and [3, 4, 5] share a row
    one_device = shared_rows(requests, FakeScorer.max_length)
    _, scorers = _run(2, None, lambda g: g.score(requests))
    where = {}
    for rank, scorer in enumerate(scorers):
        mine = scorer.requests
        for r in mine:
            where[requests.index(r)] = rank
        # this rank's requests, scored alone, land on rows that hold the same requests as on one device
        alone = shared_rows(mine, FakeScorer.max_length)
        together = [one_device[requests.index(r)] for r in mine]
        assert len(set(zip(alone, together))) == len(set(alone)) == len(set(together))
    assert len(where) == len(requests)
    for i, j in itertools.combinations(range(len(requests)), 2):
        if one_device[i] == one_device[j]:
            assert where[i] == where[j], (requests[i], requests[j])
    assert set(where.values()) == {0, 1}


def test_a_suite_device_list_limits_the_ranks_that_take_part():
    requests = [GenerateRequest([i, i + 1], 2) for i in range(5)]
    result, scorers = _run(3, [0, 2], lambda g: g.generate(requests))
    assert result == [[i + 1, i + 2] for i in range(5)]
    assert [len(s.seen) for s in scorers] == [3, 0, 2]


class ShardScorer(FakeScorer):
    """A tensor-parallel rank: it scores every request (the model's own collectives need every rank), each
    rank's values off by its rank, so a value that came from another rank than 0 shows; warm_up compiles
    and the vocabulary is the logits' (whole on every rank)."""

    def __init__(self, rank):
        super().__init__(rank)
        self.warmed, self.compiled_graphs = [], 0

    def score(self, requests):
        return [TokenScores(s.logprobs + self.rank, s.greedy) for s in super().score(requests)]

    def warm_up(self, generate=True, forks=True):
        self.warmed.append(generate)
        self.compiled_graphs = 6
        return self.compiled_graphs

    def vocab_size(self):
        return 256


def _run_group(size, ops, work, ranks=None, tensor_parallel=False, scorer_class=ShardScorer):
    """Rank 0 does ``work`` on a GroupScorer; the other ranks answer ``ops`` commands, as follow() does."""
    summer = BarrierSum(size)
    groups = [Group(r, size, summer.make()) for r in range(size)]
    scorers = [scorer_class(r) for r in range(size)]
    shares = {SCORE: score_share, GENERATE: generate_share, WARM: warm_share}

    def follower(r):
        for _ in range(ops):
            op, payload = groups[r].receive()
            shares[op](scorers[r], groups[r], payload)

    threads = [threading.Thread(target=follower, args=(r,)) for r in range(1, size)]
    for t in threads:
        t.start()
    result = work(GroupScorer(groups[0], scorers[0], ranks, tensor_parallel=tensor_parallel))
    for t in threads:
        t.join(10)
    return result, scorers


def test_on_a_tensor_parallel_group_every_rank_runs_every_request_and_rank_0s_values_are_the_answer():
    requests = [ScoreRequest([100 + i], list(range(i, i + 1 + i % 3))) for i in range(7)]
    generate = [GenerateRequest([i, i + 1], 2) for i in range(5)]

    def work(scorer):
        return scorer.warm_up(), scorer.vocab_size(), scorer.score(requests), scorer.generate(generate)

    (graphs, vocab, scores, tokens), scorers = _run_group(3, 3, work, tensor_parallel=True)
    assert (graphs, vocab) == (6, 256)
    assert all(s.warmed == [True] for s in scorers)                   # every rank compiled, in step
    assert all(len(s.requests) == len(requests) for s in scorers)     # every rank ran every request
    for r, got in zip(requests, scores):
        assert got.logprobs.tolist() == (np.asarray(r.continuation, np.float32) / -10).tolist()   # rank 0's
    assert tokens == [[i + 1, i + 2] for i in range(5)]


def test_warm_up_is_a_command_on_a_data_parallel_group_too_and_the_ranks_that_take_part_compile():
    (graphs, vocab), scorers = _run_group(3, 1, lambda s: (s.warm_up(generate=False), s.vocab_size()), ranks=[2])
    assert (graphs, vocab) == (6, 256)
    assert [s.warmed for s in scorers] == [[False], [], [False]]      # rank 0 (lm-eval's) and rank 2


class NoForkPlanned(ShardScorer):
    """Rank 0's suite planned no context fork (TokenScorer.plans_forks); each rank records the forks it is told."""
    plans_forks = False

    def warm_up(self, generate=True, forks=True):
        self.told_forks = forks
        return super().warm_up(generate, forks)


def test_no_rank_compiles_fork_graphs_when_rank_0s_plan_has_no_fork():
    _, scorers = _run_group(2, 1, lambda s: s.warm_up(generate=False, forks=True), tensor_parallel=True,
                            scorer_class=NoForkPlanned)
    assert [s.told_forks for s in scorers] == [False, False]


def test_a_suite_on_a_tensor_parallel_group_cannot_name_some_of_its_ranks():
    with pytest.raises(ValueError, match="runs on all 2 ranks"):
        GroupScorer(Group(0, 2, lambda v: v), ShardScorer(0), [0], tensor_parallel=True)


class ServingShard(ShardScorer):
    """A serving scorer's shard: with top_k, each position's k best tokens (rank-dependent, as above)."""
    top_k = 2

    def score(self, requests):
        out = []
        for s in super().score(requests):
            n = len(s.logprobs)
            ids = np.tile(np.arange(2, dtype=np.int32), (n, 1)) + 10 * self.rank
            out.append(TokenScores(s.logprobs, s.greedy, ids, np.full((n, 2), -1.0 - self.rank, np.float32)))
        return out


def test_a_serving_scorer_on_a_tensor_parallel_group_gives_rank_0s_top_k():
    summer = BarrierSum(2)
    groups = [Group(r, 2, summer.make()) for r in range(2)]
    scorers = [ServingShard(r) for r in range(2)]
    follower = threading.Thread(target=lambda: score_share(scorers[1], groups[1], groups[1].receive()[1]))
    follower.start()
    scorer = GroupScorer(groups[0], scorers[0], tensor_parallel=True)
    [got] = scorer.score([ScoreRequest([5], [1, 2, 3])])
    follower.join(10)
    assert scorer.top_k == 2 and len(scorers[1].requests) == 1
    assert got.top_ids.tolist() == [[0, 1]] * 3 and got.top_logprobs.tolist() == [[-1.0, -1.0]] * 3
