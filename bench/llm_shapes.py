"""evald's scoring engine at LLM shapes against the compute floor and against the old path (issue 28).

    .venv/bin/python -m bench.llm_shapes [--d-model 512] [--layers 8] [--vocab 32000] [--max-length 2048]
        [--mc-questions 6] [--bpb-sets 10] [--gen-contexts 2] [--gen-tokens 256] [--old-gen-tokens 4]

One process, one LLM-shaped decoder (examples/llm_decoder: LLaMA-style, the transformer layers hold
most FLOPs at d 512, 8 layers, vocabulary 32,000), Graph mode, random weights. Three workloads, each
measured three ways side by side:

* ``mc``: 5-shot multiple choice: ``--mc-questions`` contexts of 650 tokens (five shots and a
  question, random ids), 4 single-token choices each, sent as lm-eval's ``loglikelihood`` requests
  (one (context, choice) pair per request, as EvaldLM sends them);
* ``mcx``: the same with diverging multi-token choices (HellaSwag-like): 4 choices of
  ``--mc-choice-tokens`` tokens each, none a prefix of another (evald forks one prefilled context per
  question; the floor prefills each context once and runs each choice once on a copy of its cache);
* ``bpb``: rolling log-likelihood over ``--bpb-sets`` held-out sets of one 600-token document each,
  cut into windows with lm-eval's own ``get_rolling_token_windows`` + ``make_disjoint_window``
  (as EvaldLM.loglikelihood_rolling does);
* ``gen``: greedy generation of ``--gen-tokens`` tokens after 900-token contexts (no stop, no EOS).

The scorer's bucket lengths are fitted to the rows of the workloads that run (``TokenScorer.plan_rows`` /
``plan_generate`` / ``fit_lengths``), as a suite fits them in its dry run, unless ``--lengths`` names them;
one workload a process measures it as one suite.

For each: **evald** (TokenScorer.score / generate as the adapter calls them; graphs compiled at start,
not timed); the **floor** (the same network, in process: one forward over each distinct context at its
exact length, all in one batch, the head (vocabulary projection, log_softmax, argmax) only at the distinct
positions that are read (``FloorReads``: the network's trunk, ``hidden_states``, then ``apply_head`` at
those positions, evald.pipeline.tasks.generation.HeadSplit), reading the needed log-probabilities on the
device; for diverging choices every choice once on a copy of its context's cache, the head at the choice's
positions; for generation one prefill at the exact context length plus one cached decode step per token,
the head at one position per row, at the exact cache capacity and rows; compiled first, not timed); the **old path** (TokenScorer as of commit 8bf67c1, read from git:
every pair its own row, three fixed buckets, a full forward per new token) on a subset, scaled to the
workload per request (mc, bpb) or per token (gen). Reported: tokens/s, the ratio to the floor, padding
overhead (padded / real tokens run), graphs compiled, and the process's peak resident memory. For mc and bpb
the floor is also run within evald's token budget per forward (``floor_in_budget_s``): the one-forward floor
may take more memory than evald is given, so it mixes evald's cost with the batch shape memory allows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "8bf67c1"   # the engine before issue 28


def _old_scoring():
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{OLD_COMMIT}:evald/pipeline/suites/scoring.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_scoring.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_scoring", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_scoring"] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def floor_reads_cell(network: Any) -> Any:
    """The floor's reader: (B, T) tokens, (P, 2) distinct read positions of (row, position) and (R, 2) reads of
    (index into the positions, token) -> each read's log-probability and the argmax at each position; the
    network's trunk runs at every token, its head (and log_softmax, argmax) only at the P positions."""
    import numpy as np
    from mindspore import nn, ops

    class FloorReads(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.network = network

        def construct(self, tokens, positions, reads):
            hidden = ops.gather_nd(self.network.hidden_states(tokens), positions)     # (P, d)
            logits = self.network.apply_head(hidden).astype(np.float32)             # (P, V)
            logp = ops.log_softmax(logits, -1)
            return ops.gather_nd(logp, reads), ops.argmax(logits, -1)

    cell = FloorReads()
    cell.set_train(False)
    return cell


class Timed(NamedTuple):
    """One timed call of the scorer: its output, wall seconds, and what the scorer's counters moved by."""
    out: Any
    seconds: float
    real: int       # real tokens run
    padded: int     # padded tokens run
    compiled: int   # graphs compiled


def timed(scorer: Any, call: Callable[[], Any]) -> Timed:
    before = (scorer.stats.real_tokens, scorer.stats.padded_tokens, scorer.compiled_graphs)
    begin = time.perf_counter()
    out = call()
    seconds = time.perf_counter() - begin
    return Timed(out, seconds, scorer.stats.real_tokens - before[0], scorer.stats.padded_tokens - before[1],
                 scorer.compiled_graphs - before[2])


def result_row(counted: str, count: int, needed: int, run: Timed, floor: float) -> dict:
    """The row of a scoring workload (mc, mcx, bpb); ``counted`` names what ``count`` counts (requests, windows)."""
    return {counted: count, "needed_tokens": needed, "evald_s": run.seconds, "floor_s": floor,
            "ratio_to_floor": run.seconds / floor, "evald_tokens_per_s": needed / run.seconds,
            "floor_tokens_per_s": needed / floor, "padding_overhead": run.padded / run.real - 1,
            "graphs_compiled_in_run": run.compiled}


def vs_old(old_s: float, evald_s: float) -> dict[str, float]:
    """The old path's time, scaled to the whole workload, and evald's speed-up over it."""
    return {"old_s_scaled": old_s, "speedup_vs_old": old_s / evald_s}


def time_old_subset(old_scorer: Any, subset: list, length: int, total: int, evald_s: float) -> dict[str, float]:
    """The old path scoring ``subset`` (its bucket for ``length`` tokens compiled first, untimed), scaled to
    ``total`` requests, next to evald's ``evald_s`` for all of them."""
    import numpy as np

    zeros = np.zeros((1, old_scorer.bucket_for(length)), np.int32)
    old_scorer._score_batch(zeros, zeros)
    begin = time.perf_counter()
    old_scorer.score(subset)
    return vs_old((time.perf_counter() - begin) * total / len(subset), evald_s)


def time_old_generation(old_scorer: Any, context: list[int], new_tokens: int, evald_out: list[list[int]],
                        evald_s: float) -> dict:
    """The old path generating ``new_tokens`` after ``context`` (its bucket compiled first, untimed), scaled per
    token to all the tokens evald generated (``evald_out``, in ``evald_s``); its tokens against evald's first row."""
    import numpy as np

    from evald.pipeline.engine import GenerateRequest

    n = old_scorer.bucket_for(len(context) + new_tokens)
    old_scorer._next_tokens(np.zeros((1, n), np.int32), np.zeros(1, np.int32))
    begin = time.perf_counter()
    old_out = old_scorer.generate([GenerateRequest(context, new_tokens)])[0]
    per_token = (time.perf_counter() - begin) / len(old_out)
    return {**vs_old(per_token * sum(len(o) for o in evald_out), evald_s),
            "old_tokens_equal": old_out == evald_out[0][:len(old_out)]}


def compare_with_old(mine: list, theirs: list) -> dict:
    """The same numbers? evald's scores of a subset against the old path's scores of it."""
    import numpy as np

    return {"max_rel_diff_vs_old": float(max(np.max(np.abs(a.logprobs - b.logprobs) / np.abs(b.logprobs))
                                             for a, b in zip(mine, theirs))),
            "is_greedy_equal_vs_old": all(a.is_greedy == b.is_greedy for a, b in zip(mine, theirs))}


def emit(report: dict, workload: str, row: dict) -> None:
    """Keep ``row`` in the report under ``workload`` and print it as one JSON line."""
    report[workload] = row
    print(json.dumps({workload: row}), flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--batch-size", default="8", help="TokenScorer batch_size (a number or auto; default: "
                        "a suite's default, 8)")
    parser.add_argument("--lengths", default="", help="bucket lengths, e.g. 768,1024 (default: fitted to the "
                        "workloads' rows, as a suite fits them; the ladder caps their number)")
    parser.add_argument("--mc-questions", type=int, default=6)
    parser.add_argument("--mc-context", type=int, default=650)
    parser.add_argument("--mc-choice-tokens", type=int, default=20)
    parser.add_argument("--bpb-sets", type=int, default=10)
    parser.add_argument("--bpb-doc", type=int, default=600)
    parser.add_argument("--gen-contexts", type=int, default=2)
    parser.add_argument("--gen-context", type=int, default=900)
    parser.add_argument("--gen-tokens", type=int, default=256)
    parser.add_argument("--old-gen-tokens", type=int, default=4, help="new tokens the old path generates")
    parser.add_argument("--workloads", default="mc,mcx,bpb,gen")
    parser.add_argument("--no-old", action="store_true", help="skip the old path")
    args = parser.parse_args(argv)

    import mindspore as ms
    import numpy as np
    from lm_eval import utils as lm_utils

    from evald.pipeline.engine import ForkReads, GenerateRequest, ScoreRequest, TokenScorer
    from evald.pipeline.tasks.generation import ExtendStep
    from examples.llm_decoder.model import build_model

    ms.set_context(mode=ms.GRAPH_MODE)
    net = build_model(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                      max_length=args.max_length, seed=0)
    net.set_train(False)
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(1, args.vocab, n).tolist()  # noqa: E731
    batch_size = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    workloads = args.workloads.split(",")
    report: dict = {"args": vars(args), "model_params": sum(int(np.prod(p.shape)) for p in net.get_parameters())}

    lengths = [int(n) for n in args.lengths.split(",")] if args.lengths else None
    scorer = TokenScorer(net, batch_size=batch_size, lengths=lengths)   # compiles nothing until warm_up
    # the workloads' requests first (in this order: the random ids do not depend on which workloads run), and
    # the rows each would run: as a suite does (SuiteRunner's dry run), the buckets are fitted to them
    planned: list[int] = []
    firsts: list = []   # each workload's first request
    if "mc" in workloads:
        mc_contexts = [ids(args.mc_context) for _ in range(args.mc_questions)]
        mc_choices = [ids(4) for _ in mc_contexts]
        mc_requests = [ScoreRequest(c, [k]) for c, ks in zip(mc_contexts, mc_choices) for k in ks]
        planned += scorer.plan_rows(mc_requests)
        firsts.append(mc_requests[0])
    if "mcx" in workloads:
        m = args.mc_choice_tokens
        mcx_contexts = [ids(args.mc_context) for _ in range(args.mc_questions)]
        mcx_choices = [[ids(m) for _ in range(4)] for _ in mcx_contexts]
        mcx_requests = [ScoreRequest(c, k) for c, ks in zip(mcx_contexts, mcx_choices) for k in ks]
        planned += scorer.plan_rows(mcx_requests)
        firsts.append(mcx_requests[0])
    if "bpb" in workloads:
        windows = []
        for _ in range(args.bpb_sets):
            for context, continuation in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=ids(args.bpb_doc), prefix_token=0, max_seq_len=args.max_length, context_len=1)):
                windows.append(ScoreRequest(context, continuation))
        planned += scorer.plan_rows(windows)
        firsts.append(windows[0])
    if "gen" in workloads:
        gen_contexts = [ids(args.gen_context) for _ in range(args.gen_contexts)]
        gen_requests = [GenerateRequest(c, args.gen_tokens) for c in gen_contexts]
        planned += scorer.plan_generate(gen_requests)
        firsts.append(gen_requests[0])

    started = time.perf_counter()
    scorer.fit_lengths(planned)
    # only the graphs the workloads use (forks for multiple choice, generation graphs for gen); the cached path
    # checked on the workloads' first requests, as a suite's on its own (evald.pipeline.engine.cache_check)
    scorer.warm_up(generate="gen" in workloads, forks="mc" in workloads or "mcx" in workloads,
                   check_rows=[[*r.context, *getattr(r, "continuation", ())] for r in firsts])
    report["warm_up_s"] = time.perf_counter() - started
    report["buckets"] = [list(b) for b in scorer.buckets]
    report["graphs_at_start"] = scorer.compiled_graphs
    print(json.dumps({"warm_up_s": report["warm_up_s"], "graphs": scorer.compiled_graphs}), flush=True)

    reader = floor_reads_cell(net)
    extend = ExtendStep(net, greedy=True)
    extend.set_train(False)

    def floor_call(rows: list[list[int]], reads_per_row: list[list[tuple[int, int]]]) -> tuple:
        """The floor's inputs for ``rows``: the tokens, the distinct (row, position) pairs read, and each read
        as (index into those pairs, token)."""
        positions: dict[tuple[int, int], int] = {}
        reads = [(positions.setdefault((r, p), len(positions)), t) for r, rr in enumerate(reads_per_row)
                 for p, t in rr]
        return (ms.Tensor(np.asarray(rows, np.int32)), ms.Tensor(np.asarray(list(positions), np.int32)),
                ms.Tensor(np.asarray(reads, np.int32)))

    def floor_score(rows: list[list[int]], reads_per_row: list[list[tuple[int, int]]],
                    per_forward: int | None = None) -> float:
        """The rows (equal lengths) at their exact shape: one forward, or forwards of at most ``per_forward`` rows;
        compiled first, then timed."""
        step = per_forward or len(rows)
        calls = [floor_call(rows[i:i + step], reads_per_row[i:i + step]) for i in range(0, len(rows), step)]
        for call in calls:
            reader(*call)[0].asnumpy()
        begin = time.perf_counter()
        for call in calls:
            reader(*call)[0].asnumpy()
        return time.perf_counter() - begin

    def in_budget(rows: list[list[int]], reads_per_row: list[list[tuple[int, int]]], run: Timed) -> dict:
        """The floor again within evald's token budget per forward (``TokenScorer.token_budget``): the one-forward
        floor may use more memory than evald is given; this one does not, so their ratio is evald's own cost."""
        per_forward = max(1, scorer.token_budget // len(rows[0]))
        floor = floor_score(rows, reads_per_row, per_forward)
        return {"floor_in_budget_s": floor, "ratio_to_floor_in_budget": run.seconds / floor}

    old = _old_scoring() if not args.no_old else None
    old_scorer = old.TokenScorer(net, batch_size=1) if old else None

    if "mc" in workloads:
        contexts, choices, requests = mc_contexts, mc_choices, mc_requests
        run = timed(scorer, lambda: scorer.score(requests))
        floor = floor_score(contexts, [[(len(c) - 1, k) for k in ks] for c, ks in zip(contexts, choices)])
        row = result_row("requests", len(requests), sum(len(c) for c in contexts), run, floor)
        row.update(in_budget(contexts, [[(len(c) - 1, k) for k in ks] for c, ks in zip(contexts, choices)], run))
        if old:
            subset = requests[:4]
            row.update(time_old_subset(old_scorer, subset, args.mc_context, len(requests), run.seconds))
            mine = scorer.score(subset)   # scored again on its own (mcx compares the run's own scores)
            row.update(compare_with_old(mine, old_scorer.score(subset)))
        emit(report, "mc", row)

    if "mcx" in workloads:
        contexts, choices, requests = mcx_contexts, mcx_choices, mcx_requests
        run = timed(scorer, lambda: scorer.score(requests))
        # the floor: every context prefilled once in one batch at its exact length (but its last token), then
        # every choice once (the context's last token and the choice but its last) on a copy of its cache
        g = len(contexts)
        fork = ForkReads(net)
        fork.set_train(False)
        prefix = ms.Tensor(np.asarray([c[:-1] for c in contexts], np.int32))
        rows = ms.Tensor(np.repeat(np.arange(g), 4).astype(np.int32))
        chunks = ms.Tensor(np.asarray([[c[-1]] + k[:-1] for c, ks in zip(contexts, choices) for k in ks], np.int32))
        start = ms.Tensor(np.full(4 * g, args.mc_context - 1, np.int32))
        reads = ms.Tensor(np.asarray([(r, j, t) for r, k in enumerate(k for ks in choices for k in ks)
                                      for j, t in enumerate(k)], np.int32))
        zeros = ms.Tensor(np.zeros(g, np.int32))
        for _ in range(2):   # the first round compiles both graphs
            cache = net.init_cache(g, args.mc_context + m)
            begin = time.perf_counter()
            _, cache = extend(prefix, zeros, ms.Tensor(np.full(g, args.mc_context - 2, np.int32)), cache)
            fork(cache, rows, chunks, start, reads)[0].asnumpy()
            floor = time.perf_counter() - begin
        row = result_row("requests", len(requests), g * (args.mc_context - 1) + 4 * g * m, run, floor)
        if old:
            subset = requests[:4]
            row.update(time_old_subset(old_scorer, subset, args.mc_context + m, len(requests), run.seconds))
            row.update(compare_with_old(run.out[:4], old_scorer.score(subset)))
        emit(report, "mcx", row)

    if "bpb" in workloads:
        run = timed(scorer, lambda: scorer.score(windows))
        rows = [(list(w.context) + list(w.continuation))[:-1] for w in windows]
        same = len({len(r) for r in rows}) == 1
        reads = [[(p, t) for p, t in enumerate((list(w.context) + list(w.continuation))[1:])] for w in windows]
        floor = floor_score(rows, reads) if same else float("nan")
        row = result_row("windows", len(windows), sum(len(r) for r in rows), run, floor)
        if same:
            row.update(in_budget(rows, reads, run))
        if old:
            row.update(time_old_subset(old_scorer, windows[:2], len(rows[0]), len(windows), run.seconds))
        emit(report, "bpb", row)

    if "gen" in workloads:
        contexts, requests = gen_contexts, gen_requests
        run = timed(scorer, lambda: scorer.generate(requests))
        # the cached floor: one prefill at the exact context length, one decode step per token, all rows at once
        g, capacity = len(contexts), args.gen_context + args.gen_tokens
        tokens = ms.Tensor(np.asarray(contexts, np.int32))
        zeros, last = ms.Tensor(np.zeros(g, np.int32)), ms.Tensor(np.full(g, args.gen_context - 1, np.int32))
        step = ms.Tensor(np.zeros((g, 1), np.int32))
        for _ in range(2):   # the first round compiles both graphs
            cache = net.init_cache(g, capacity)
            begin = time.perf_counter()
            best, cache = extend(tokens, zeros, last, cache)
            chosen = best.asnumpy()
            for k in range(args.gen_tokens - 1):
                step = ms.Tensor(chosen.reshape(g, 1).astype(np.int32))
                best, cache = extend(step, ms.Tensor(np.full(g, args.gen_context + k, np.int32)), zeros, cache)
                chosen = best.asnumpy()
            floor = time.perf_counter() - begin
        new = sum(len(o) for o in run.out)
        row = {"contexts": g, "new_tokens": new, "evald_s": run.seconds, "cached_floor_s": floor,
               "ratio_to_floor": run.seconds / floor, "evald_new_tokens_per_s": new / run.seconds,
               "padding_overhead": run.padded / run.real - 1, "graphs_compiled_in_run": run.compiled,
               "decoding": scorer.decoding}
        if old:
            row.update(time_old_generation(old_scorer, contexts[0], args.old_gen_tokens, run.out, run.seconds))
        emit(report, "gen", row)

    report["graphs_at_end"] = scorer.compiled_graphs
    report["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps({"graphs_at_end": report["graphs_at_end"], "peak_rss_mb": report["peak_rss_mb"]}), flush=True)
    return report


if __name__ == "__main__":
    result = main()
    json.dump(result, sys.stdout, indent=1, default=str)
    print()
