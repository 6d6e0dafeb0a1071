"""A benchmark suite's requests split over an eval group's ranks, with one rank's numbers, bit for bit.

lm-eval runs on rank 0 only and sees one rank (world size 1: lm-eval imports torch for its gather
otherwise). ``GroupScorer`` stands in for rank 0's TokenScorer: each ``score`` or ``generate`` call
is one command to the group (evald.pipeline.group.protocol) carrying every request; each rank takes
the requests of every n-th shared input row (n: the ranks a suite's ``device`` names, all by default;
generation: every n-th request), runs them on its own TokenScorer (same network, same weights,
same buckets), and the answer sums each rank's rows of full-size arrays, zeros elsewhere. A
request's numbers do not depend on which rows share its batch (tests/unit/pipeline/test_scoring.py),
so the result is the one a single device gives. ``swap`` (GroupEvaluator.load_only) loads a step's
weights on every rank, for cells of a step other than the one just validated.

Generation on a group ignores the adapter's stop callables and runs each row to EOS or
``max_new_tokens``; the adapter cuts the text at the first stop string, which is where a single
device stopped (greedy decoding: the tokens before it are the same).

May import: the suites' scoring and the group's protocol.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

from evald.pipeline.group.protocol import ERROR, GENERATE, OK, SCORE, Group, GroupError
from evald.pipeline.suites.scoring import GenerateRequest, ScoreRequest, TokenScorer, TokenScores, shared_rows

log = logging.getLogger("evald.group")


def scorer_settings(scorer: TokenScorer) -> dict:
    return {"max_length": scorer.max_length, "batch_size": scorer.batch_size, "lengths": list(scorer.lengths)}


def _mine(count: int, rank: int, ranks: Sequence[int]) -> list[int]:
    """This rank's requests: every len(ranks)-th, from its place among the ranks that take part."""
    if rank not in ranks:
        return []
    return list(range(list(ranks).index(rank), count, len(ranks)))


def _mine_by_row(rows: Sequence[int], rank: int, ranks: Sequence[int]) -> list[int]:
    """This rank's requests to score: those of every len(ranks)-th shared input row (``shared_rows``).
    Requests that share a row stay together, so each is read from the row, and in the bucket, one device
    uses for it: a split by request would give a request whose partner went to another rank a shorter row,
    perhaps in another bucket, whose compiled graph need not give the same bits."""
    if rank not in ranks:
        return []
    place = list(ranks).index(rank)
    return [i for i, row in enumerate(rows) if row % len(ranks) == place]


def score_share(scorer: TokenScorer | None, group: Group, payload: Mapping[str, Any]) -> tuple[list, dict]:
    """Every rank: score this rank's share of ``payload``'s requests and exchange the answer."""
    requests = [ScoreRequest(c, t) for c, t in payload["requests"]]
    counts = [len(r.continuation) for r in requests]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(offsets[-1])
    layout = {"logprobs": ((total,), np.dtype(np.float32)), "greedy": ((total,), np.dtype(np.int8))}
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in layout.items()}
    code, text = OK, ""
    try:
        if scorer is None:
            raise RuntimeError("this rank has no evaluation network (its build failed)")
        ranks = payload.get("ranks") or range(group.size)
        mine = _mine_by_row(shared_rows(requests, scorer.max_length), group.rank, ranks)
        for i, scores in zip(mine, scorer.score([requests[i] for i in mine])):
            arrays["logprobs"][offsets[i]:offsets[i + 1]] = scores.logprobs
            arrays["greedy"][offsets[i]:offsets[i + 1]] = scores.greedy
    except Exception as exc:  # noqa: BLE001 - every rank must answer
        log.exception("rank %d: scoring its share of a suite's requests raised", group.rank)
        code, text = ERROR, repr(exc)
    statuses, combined = group.answer(code, text, arrays, layout)
    combined["offsets"] = offsets
    return statuses, combined


def generate_share(scorer: TokenScorer | None, group: Group, payload: Mapping[str, Any]) -> tuple[list, dict]:
    """Every rank: continue this rank's share of ``payload``'s contexts and exchange the answer."""
    requests = [GenerateRequest(c, int(n)) for c, n in payload["requests"]]
    width = max([r.max_new_tokens for r in requests] + [1])
    layout = {"tokens": ((len(requests), width), np.dtype(np.int32)),
              "lengths": ((len(requests),), np.dtype(np.int32))}
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in layout.items()}
    code, text = OK, ""
    try:
        if scorer is None:
            raise RuntimeError("this rank has no evaluation network (its build failed)")
        mine = _mine(len(requests), group.rank, payload.get("ranks") or range(group.size))
        for i, ids in zip(mine, scorer.generate([requests[i] for i in mine], eos_id=payload.get("eos_id"))):
            arrays["tokens"][i, :len(ids)] = ids
            arrays["lengths"][i] = len(ids)
    except Exception as exc:  # noqa: BLE001 - every rank must answer
        log.exception("rank %d: generating its share of a suite's requests raised", group.rank)
        code, text = ERROR, repr(exc)
    return group.answer(code, text, arrays, layout)


def _check(statuses: list, what: str) -> None:
    failed = [f"rank {rank}: {text}" for rank, (code, text) in enumerate(statuses) if code != OK]
    if failed:
        raise GroupError(f"the eval group could not {what} ({'; '.join(failed)})")


class GroupScorer:
    """Rank 0's TokenScorer for a suite on an eval group: same API (score, generate, max_length)."""

    def __init__(self, group: Group, local: TokenScorer, ranks: Sequence[int] | None = None) -> None:
        self.group, self.local = group, local
        self.ranks = list(ranks) if ranks is not None else list(range(group.size))  # a suite's ``device``
        self.max_length, self.batch_size, self.lengths = local.max_length, local.batch_size, local.lengths
        self.stats = local.stats
        self.top_k = 0

    @property
    def compiled_graphs(self) -> int:
        return self.local.compiled_graphs

    @property
    def buckets(self):
        return self.local.buckets

    def vocab_size(self) -> int:
        return self.local.vocab_size()

    def warm_up(self, generate: bool = True) -> int:
        return self.local.warm_up(generate)   # the other ranks compile theirs at their first share

    def score(self, requests: Sequence[ScoreRequest]) -> list[TokenScores]:
        payload = {"requests": [[list(map(int, r.context)), list(map(int, r.continuation))] for r in requests],
                   "scorer": scorer_settings(self.local), "ranks": self.ranks}
        self.group.command(SCORE, payload)
        statuses, combined = score_share(self.local, self.group, payload)
        _check(statuses, "score a suite's requests")
        offsets = combined["offsets"]
        out = []
        for i, r in enumerate(requests):
            span = slice(int(offsets[i]), int(offsets[i + 1]))
            whole = len(r.context) + len(r.continuation)
            out.append(TokenScores(combined["logprobs"][span].copy(), combined["greedy"][span].astype(bool),
                                   truncated=max(0, whole - (self.max_length + 1))))
        return out

    def generate(self, requests: Sequence[GenerateRequest], eos_id: int | None = None) -> list[list[int]]:
        payload = {"requests": [[list(map(int, r.context)), int(r.max_new_tokens)] for r in requests],
                   "eos_id": eos_id, "scorer": scorer_settings(self.local), "ranks": self.ranks}
        self.group.command(GENERATE, payload)
        statuses, combined = generate_share(self.local, self.group, payload)
        _check(statuses, "generate a suite's continuations")
        return [combined["tokens"][i, :int(combined["lengths"][i])].astype(int).tolist()
                for i in range(len(requests))]
