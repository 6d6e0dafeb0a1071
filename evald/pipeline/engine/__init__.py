"""The scoring engine: token log-probabilities and greedy generation on the compiled network, in a fixed set
of shapes, below its clients (the suites' lm-eval adapter, the eval group's scorer, the HTTP endpoint), which
import it; it imports none of them.

Graph mode compiles a graph for every new input shape, so every call runs in one of a small, fixed set of
(rows, length) buckets compiled at start (``warm_up``), and a hot swap (which only writes parameters) never
compiles anything. A module per job:

- ``requests.py``: ``ScoreRequest``, ``TokenScores``, ``GenerateRequest``, ``ScorerStats``
- ``buckets.py``: buckets and planning: the ladder, lengths fitted to a suite's rows, the token budget
- ``rows.py``: a request's row, equal and prefix rows shared, rows packed into buckets and read on the device
- ``forks.py``: diverging continuations scored from one prefilled context (CachedScorer)
- ``decoding.py``: greedy generation (cached, or a full forward per token) and serving's top-k decoding
- ``graphs.py``: the compiled cells, their runs counted; the chunked prefill
- ``scorer.py``: ``TokenScorer``, the one face joining them

API
---
``scorer = TokenScorer(network, max_length=None, batch_size=8, lengths=None, top_k=0, fork_contexts=True,
fork_piece=None, read_widths=None, row_caps=None, cache_caps=None)``
    ``network`` maps int32 tokens (B, T) to logits (B, T, vocab) for any T <= max_length.
    ``max_length`` defaults to the network's ``max_length`` / ``seq_length`` / ``seq_len`` /
    ``max_position_embeddings`` attribute (or its ``config``'s). ``lengths`` are the bucket lengths
    (default: ``length_ladder``, a geometric ladder from max_length/8 (at least 32) to max_length in
    steps of sqrt(2), so a row is padded by less than 42%, 17% on average; ``fit_lengths`` may replace it).
    Every forward runs the same token budget, ``batch_size * max_length`` tokens: a bucket of length n has
    ``batch_size * max_length // n`` rows (``rows_for``). ``batch_size="auto"`` sizes that budget to fit
    memory (``auto_budget``).
    ``top_k`` > 0 also returns the k most likely tokens at each position.
``scorer.score([ScoreRequest(context, continuation), ...]) -> [TokenScores, ...]``
    Per continuation token: its log-probability given everything before it, whether it is the
    argmax (greedy) token, and with ``top_k`` the k best (ids, log-probabilities). Inputs longer than
    ``max_length + 1`` tokens lose context on the left, as lm-eval's HFLM does
    (``(context + continuation)[-(max_length + 1):][:-1]``); ``TokenScores.truncated`` says how many.
    A continuation longer than ``max_length`` is a ValueError.
    Shared contexts: requests whose rows are equal, or one a prefix of the other, run as ONE row (rows.py).
    The graph reads the requested (row, position, token) log-probabilities on the device (``ReadLogProbs``);
    rows are sorted by length and packed into the shortest bucket that holds them. A network that splits its
    head (``HeadSplit``: ``hidden_states``, ``apply_head``) runs the head only at the positions read.
    Diverging continuations (multi-token choices, none a prefix of another) after the same context fork one
    prefilled cache for a network that implements ``CachedScorer`` (forks.py), when that runs fewer tokens
    than a row per choice. ``fork_contexts=False`` turns this off (evald.serve, where a completion is one
    row); ``scorer.forks`` says whether it runs.
``scorer.generate([GenerateRequest(context, max_new_tokens, stop), ...], eos_id=None) -> [[int], ...]``
    Greedy continuation of each context (decoding.py). A network that implements ``CachedDecoder``
    (evald.pipeline.tasks.generation) is prefilled in chunks of ``PREFILL_CHUNK`` tokens into a static
    cache of the bucket's length, then decodes one token per row per step; any other network runs
    a full forward of the bucket per new token (the fallback). ``scorer.decoding`` says which, and
    the log says it once.
``scorer.prefill_top(contexts, capacity)`` / ``scorer.decode_top(tokens, positions, cache)``
    For a CachedDecoder with ``top_k`` > 0 (evald.serve's /v1/completions): up to ``batch_size``
    contexts prefilled into a new cache of a bucket's length, then one token per row per step; each
    returns the next token's top k (ids, float32 log-probabilities, as ``score`` computes them) per row.
``scorer.plan_rows(requests)`` / ``scorer.plan_generate(requests)`` / ``scorer.fit_lengths(row_lengths)``
    The rows a call would run (no forward), and bucket lengths fitted to a suite's rows in place of the ladder
    (``fitted_lengths``: no more buckets, the fewest padded tokens; before any graph compiles). A suite runs
    lm-eval once at build time with ``bucket_plan.PlanningScorer`` to learn its rows. The fit also caps a
    bucket's rows at the suite's rows for it (``row_caps``) and generation's cache at the positions its
    requests need (``cache_caps``); with the head split, the reads a forward gathers (``read_widths``) and the
    fork piece follow the planned rows (what the plan calls saw: ``plan_rows`` records them). An eval group's
    other ranks are given these with the lengths.
``scorer.warm_up()`` compiles every bucket now (at start-up, not at the first checkpoint: per bucket the
scoring graph, for a CachedDecoder a prefill chunk and a decode step, for forks a prefill chunk and a fork; with
``top_decoding=True`` also prefill_top's and decode_top's graphs); ``scorer.warming()`` does it one graph a
step; ``scorer.compiled_graphs`` counts the (graph, shape) pairs compiled so far. Before any number depends
on it, the cached path that will run (decoding, forks) is checked against the full forward on
``check_rows`` (a suite's first rows) in the compiled shapes (cache_check.py): beyond 1e-5 it is turned off
(``scorer.decoding`` ``full-forward``, ``scorer.forks`` False) with one ERROR naming the method and the
difference; the log says a decode step's time against a full forward's;
``scorer.stats`` counts requested, real and padded tokens run, for throughput.

Padding changes no log-probability: rows are right-padded, the network is causal, a row always
lands in the same bucket (the shortest that fits it), and a row's result does not depend on what
the other rows hold (tests/unit/pipeline/test_scoring.py checks this bit for bit on the demo model).
Only per-read results, (R,) or (R, k), leave the device, never (B, T, vocab) logits; generation
brings back one token per row per step.

The old import path, ``evald.pipeline.suites.scoring``, works until the next release with a DeprecationWarning.

May import: within evald.pipeline: tasks.
"""

from evald.pipeline.engine.buckets import (AUTO_MEMORY_SHARE, FIT_STEP, LADDER_RATIO, auto_budget, fitted_lengths,
                                           length_ladder, model_max_length)
from evald.pipeline.engine.forks import FORK_CHUNK, FORK_ROWS
from evald.pipeline.engine.graphs import PREFILL_CHUNK, ExtendTopK, ForkReads, ReadLogProbs
from evald.pipeline.engine.requests import GenerateRequest, ScoreRequest, ScorerStats, TokenScores
from evald.pipeline.engine.rows import shared_rows
from evald.pipeline.engine.scorer import TokenScorer

__all__ = ["AUTO_MEMORY_SHARE", "FIT_STEP", "FORK_CHUNK", "FORK_ROWS", "LADDER_RATIO", "PREFILL_CHUNK", "ExtendTopK",
           "ForkReads", "GenerateRequest", "ReadLogProbs", "ScoreRequest", "ScorerStats", "TokenScorer", "TokenScores",
           "auto_budget", "fitted_lengths", "length_ladder", "model_max_length", "shared_rows"]
