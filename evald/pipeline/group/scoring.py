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

On a tensor-parallel group (``tensor_parallel`` in the payload) every rank holds 1/N of the model, so every
rank runs every request, in the same order and the same batches (the model's own AllReduce needs all of
them in step), and only rank 0's values go into the answer's SUM. ``warm_up`` is a command too (WARM): a
tensor-parallel forward cannot run on rank 0 alone, and on a data-parallel group the ranks that take part
then compile their graphs at start rather than at their first share; its answer carries the vocabulary
(the logits' last dimension) that the tokenizer check needs.

Generation on a group ignores the adapter's stop callables and runs each row to EOS or
``max_new_tokens``; the adapter cuts the text at the first stop string, which is where a single
device stopped (greedy decoding: the tokens before it are the same).

May import: the pipeline's engine and the group's protocol.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from evald.pipeline.group.protocol import ERROR, GENERATE, OK, SCORE, WARM, Group, GroupError
from evald.pipeline.engine import GenerateRequest, ScoreRequest, TokenScorer, TokenScores, shared_rows

log = logging.getLogger("evald.group")


def scorer_settings(scorer: TokenScorer) -> dict:
    return {"max_length": scorer.max_length, "batch_size": scorer.batch_size, "lengths": list(scorer.lengths),
            "top_k": int(getattr(scorer, "top_k", 0)), "fork_contexts": bool(getattr(scorer, "fork_contexts", True)),
            "fork_piece": int(getattr(scorer, "fork_piece", 0)),
            "read_widths": [list(pair) for pair in getattr(scorer, "read_widths", ())],
            "row_caps": [list(pair) for pair in getattr(scorer, "row_caps", ())],
            "cache_caps": [list(pair) for pair in getattr(scorer, "cache_caps", ())]}


def _ranks(group: Group, payload: Mapping[str, Any]) -> Sequence[int]:
    """The ranks that take part: a suite's ``device`` may name some (data parallel); all on a tensor-parallel group."""
    return range(group.size) if payload.get("tensor_parallel") else payload.get("ranks") or range(group.size)


def _only_rank_0(group: Group, payload: Mapping[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Tensor parallel: every rank computed every value; rank 0's alone go into the SUM (one contributor)."""
    if payload.get("tensor_parallel") and group.rank != 0:
        for array in arrays.values():
            array.fill(0)


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
    k = int(payload["scorer"].get("top_k", 0))
    if k:   # serving: each position's k most likely tokens (scoring.TokenScores.top_ids, top_logprobs)
        layout.update({"top_ids": ((total, k), np.dtype(np.int32)), "top_logprobs": ((total, k), np.dtype(np.float32))})
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in layout.items()}
    code, text = OK, ""
    try:
        if scorer is None:
            raise RuntimeError("this rank has no evaluation network (its build failed)")
        ranks = _ranks(group, payload)
        mine = (list(range(len(requests))) if payload.get("tensor_parallel")
                else _mine_by_row(shared_rows(requests, scorer.max_length), group.rank, ranks))
        for i, scores in zip(mine, scorer.score([requests[i] for i in mine])):
            arrays["logprobs"][offsets[i]:offsets[i + 1]] = scores.logprobs
            arrays["greedy"][offsets[i]:offsets[i + 1]] = scores.greedy
            if k:
                arrays["top_ids"][offsets[i]:offsets[i + 1]] = scores.top_ids
                arrays["top_logprobs"][offsets[i]:offsets[i + 1]] = scores.top_logprobs
        _only_rank_0(group, payload, arrays)
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
        mine = (list(range(len(requests))) if payload.get("tensor_parallel")
                else _mine(len(requests), group.rank, _ranks(group, payload)))
        for i, ids in zip(mine, scorer.generate([requests[i] for i in mine], eos_id=payload.get("eos_id"))):
            arrays["tokens"][i, :len(ids)] = ids
            arrays["lengths"][i] = len(ids)
        _only_rank_0(group, payload, arrays)
    except Exception as exc:  # noqa: BLE001 - every rank must answer
        log.exception("rank %d: generating its share of a suite's requests raised", group.rank)
        code, text = ERROR, repr(exc)
    return group.answer(code, text, arrays, layout)


def warm_share(scorer: TokenScorer | None, group: Group, payload: Mapping[str, Any]) -> tuple[list, dict]:
    """Every rank: rank 0 and the ranks that take part compile the scorer's graphs and read the model's
    vocabulary (its own slot of the answer); the others only answer."""
    layout = {"vocab": ((group.size,), np.dtype(np.int64))}
    arrays = {"vocab": np.zeros(group.size, np.int64)}
    code, text = OK, ""
    try:
        if group.rank == 0 or group.rank in _ranks(group, payload):
            if scorer is None:
                raise RuntimeError("this rank has no evaluation network (its build failed)")
            rows = payload.get("check_rows")   # a suite's rows for the check of the cached path, when it has some
            scorer.warm_up(bool(payload.get("generate", True)), forks=bool(payload.get("forks", True)),
                           **({"check_rows": rows} if rows else {}))
            arrays["vocab"][group.rank] = scorer.vocab_size()
    except Exception as exc:  # noqa: BLE001 - every rank must answer
        log.exception("rank %d: compiling a suite's graphs raised", group.rank)
        code, text = ERROR, repr(exc)
    return group.answer(code, text, arrays, layout)


def _check(statuses: list, what: str) -> None:
    failed = [f"rank {rank}: {text}" for rank, (code, text) in enumerate(statuses) if code != OK]
    if failed:
        raise GroupError(f"the eval group could not {what} ({'; '.join(failed)})")


class GroupScorer:
    """Rank 0's TokenScorer for a suite on an eval group: same API (score, generate, max_length)."""

    def __init__(self, group: Group, local: TokenScorer, ranks: Sequence[int] | None = None,
                 tensor_parallel: bool = False) -> None:
        self.group, self.local, self.tensor_parallel = group, local, tensor_parallel
        self.ranks = list(ranks) if ranks is not None else list(range(group.size))  # a suite's ``device``
        if tensor_parallel and sorted(self.ranks) != list(range(group.size)):
            raise ValueError(f"a suite on a tensor-parallel eval group runs on all {group.size} ranks (each holds "
                             f"1/{group.size} of the model); drop the suite's device option")
        self._vocab: int | None = None
        self.max_length, self.batch_size, self.lengths = local.max_length, local.batch_size, local.lengths
        self.stats = local.stats
        self.top_k = int(getattr(local, "top_k", 0))
        # A cache lives across calls, and the group runs each call as one command: /v1/completions on a group
        # generates with a full forward per token (evald.serve.engine reads this), greedy suites as generate does.
        self.cached = False

    @property
    def decoding(self) -> str:
        return "full-forward"

    @property
    def compiled_graphs(self) -> int:
        return self.local.compiled_graphs

    @property
    def buckets(self):
        return self.local.buckets

    def _payload(self, **fields: Any) -> dict:
        return {**fields, "scorer": scorer_settings(self.local), "ranks": self.ranks,
                "tensor_parallel": self.tensor_parallel}

    def plan_rows(self, requests: Sequence[ScoreRequest]) -> list[int]:
        return self.local.plan_rows(requests)

    def plan_generate(self, requests: Sequence[GenerateRequest]) -> list[int]:
        return self.local.plan_generate(requests)

    def fit_lengths(self, row_lengths: Sequence[int]) -> tuple[int, ...]:
        """Rank 0's scorer fits its buckets; every WARM, SCORE and GENERATE carries its lengths to the others."""
        return self.local.fit_lengths(row_lengths)

    def vocab_size(self) -> int:
        if self._vocab is None:
            self.warm_up(generate=False, forks=False)
        assert self._vocab is not None
        return self._vocab

    def warming(self, generate: bool = True, top_decoding: bool = False, forks: bool = True,
                check_rows: Sequence[Sequence[int]] | None = None) -> Iterator[int]:
        """One step: the group compiles every graph at once (one WARM command)."""
        yield self.warm_up(generate, top_decoding, forks, check_rows)

    def warm_up(self, generate: bool = True, top_decoding: bool = False, forks: bool = True,
                check_rows: Sequence[Sequence[int]] | None = None) -> int:
        """Every taking part rank compiles its graphs now (WARM), each checking its cached path on
        ``check_rows`` (the same rows everywhere, so every rank decides alike); rank 0's count of compiled
        graphs. ``top_decoding`` is ignored: serving on a group does not decode with a cache (``cached``)."""
        # no fork graph anywhere when rank 0's plan has no fork (TokenScorer.plans_forks): every rank forks alike
        payload = self._payload(generate=generate, forks=forks and getattr(self.local, "plans_forks", True),
                                check_rows=[[int(t) for t in row] for row in check_rows or ()])
        self.group.command(WARM, payload)
        statuses, combined = warm_share(self.local, self.group, payload)
        _check(statuses, "compile a suite's graphs")
        self._vocab = int(combined["vocab"][0])
        return self.local.compiled_graphs

    def score(self, requests: Sequence[ScoreRequest]) -> list[TokenScores]:
        payload = self._payload(requests=[[list(map(int, r.context)), list(map(int, r.continuation))]
                                          for r in requests])
        self.group.command(SCORE, payload)
        statuses, combined = score_share(self.local, self.group, payload)
        _check(statuses, "score a suite's requests")
        offsets = combined["offsets"]
        out = []
        for i, r in enumerate(requests):
            span = slice(int(offsets[i]), int(offsets[i + 1]))
            whole = len(r.context) + len(r.continuation)
            top = ((combined["top_ids"][span].copy(), combined["top_logprobs"][span].copy()) if self.top_k
                   else (None, None))
            out.append(TokenScores(combined["logprobs"][span].copy(), combined["greedy"][span].astype(bool),
                                   *top, truncated=max(0, whole - (self.max_length + 1))))
        return out

    def generate(self, requests: Sequence[GenerateRequest], eos_id: int | None = None) -> list[list[int]]:
        payload = self._payload(requests=[[list(map(int, r.context)), int(r.max_new_tokens)] for r in requests],
                                eos_id=eos_id)
        self.group.command(GENERATE, payload)
        statuses, combined = generate_share(self.local, self.group, payload)
        _check(statuses, "generate a suite's continuations")
        return [combined["tokens"][i, :int(combined["lengths"][i])].astype(int).tolist()
                for i in range(len(requests))]
