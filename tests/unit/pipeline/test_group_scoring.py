"""GroupScorer's split in one process: ranks as threads, a thread-barrier SUM standing in for
MindSpore's AllReduce (the real msrun group runs in tests/e2e/test_suites_group.py); each rank's
TokenScorer is a stand-in that 'scores' a request by its own token values, so the test checks the
bookkeeping: every request scored exactly once, by the rank that owns it, reassembled in order."""

from __future__ import annotations

import itertools
import threading

import numpy as np

from evald.pipeline.group.protocol import SCORE, Group
from evald.pipeline.group.scoring import GroupScorer, generate_share, score_share
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
