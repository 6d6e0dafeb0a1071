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
overhead (padded / real tokens run), graphs compiled, and the process's peak resident memory.

evald and the floor are timed alike, side by side: ``--rounds`` rounds (default 3) of evald's call then the
floor's, each round after a hot swap of the same weights (as a checkpoint arrives); each arm's time is the median
of its rounds (every round is in the row), after its graphs are compiled (evald's at warm-up, the floor's in an
untimed first call). Each row also compares evald's numbers with the floor's, another computation of the same
network at exact shapes: the largest relative difference of a log-probability and whether the greedy flags are
equal (mc, mcx, bpb), whether the greedy tokens are (gen). For mc and bpb
the floor is also run within evald's token budget per forward (``floor_in_budget_s``): the one-forward floor
may take more memory than evald is given, so it mixes evald's cost with the batch shape memory allows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
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
    """The floor's reader (``FloorReads``) of ``network``, in inference mode."""
    cell = _floor_reads_class()(network)
    cell.set_train(False)
    return cell


def _floor_reads_class() -> type:
    """FloorReads: (B, T) tokens, (P, 2) distinct read positions of (row, position) and (R, 2) reads of (index into
    the positions, token) -> each read's log-probability and the argmax at each position; the network's trunk runs
    at every token, its head (and log_softmax, argmax) only at the P positions. Made on first use: MindSpore is
    imported lazily (``--help`` needs none)."""
    import numpy as np
    from mindspore import nn, ops

    class FloorReads(nn.Cell):
        def __init__(self, network: Any) -> None:
            super().__init__()
            self.network = network

        def construct(self, tokens, positions, reads):
            hidden = ops.gather_nd(self.network.hidden_states(tokens), positions)     # (P, d)
            logits = self.network.apply_head(hidden).astype(np.float32)             # (P, V)
            logp = ops.log_softmax(logits, -1)
            return ops.gather_nd(logp, reads), ops.argmax(logits, -1)

    return FloorReads


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


def swap_same_weights(net: Any) -> None:
    """Load the network's own weights back into it, as evald hot-swaps a checkpoint's before evaluating it
    (``load_param_into_net``; no graph recompiles), so that every round is timed as a checkpoint's would be."""
    import mindspore as ms

    ms.load_param_into_net(net, {p.name: ms.Parameter(p.asnumpy().copy(), p.name) for p in net.get_parameters()})


class Rounds(NamedTuple):
    """evald and the floor timed side by side: round k runs evald, then the floor (each round after a hot swap)."""
    evald: list[Timed]
    floor_s: list[float]
    floor_out: Any   # the floor's numbers (its last round)

    @property
    def evald_s(self) -> float:
        return statistics.median(run.seconds for run in self.evald)

    @property
    def floor_median_s(self) -> float:
        return statistics.median(self.floor_s)


def side_by_side(scorer: Any, net: Any, evald_call: Callable[[], Any], floor_call: Callable[[], Any],
                 rounds: int) -> Rounds:
    """``rounds`` rounds of evald's call then the floor's, interleaved so that the machine's load falls on both
    alike; the floor's graphs are compiled first (an untimed call), evald's were at warm-up, as a suite's are."""
    floor_call()
    runs, floors, floor_out = [], [], None
    for _ in range(rounds):
        swap_same_weights(net)
        runs.append(timed(scorer, evald_call))
        begin = time.perf_counter()
        floor_out = floor_call()
        floors.append(time.perf_counter() - begin)
    return Rounds(runs, floors, floor_out)


def result_row(counted: str, count: int, needed: int, rounds: Rounds) -> dict:
    """The row of a scoring workload (mc, mcx, bpb); ``counted`` names what ``count`` counts (requests, windows).
    Times are the medians of the rounds (each round's in ``*_rounds_s``)."""
    evald, floor = rounds.evald_s, rounds.floor_median_s
    real, padded = sum(r.real for r in rounds.evald), sum(r.padded for r in rounds.evald)
    return {counted: count, "needed_tokens": needed, "evald_s": evald, "floor_s": floor,
            "ratio_to_floor": evald / floor, "evald_tokens_per_s": needed / evald,
            "floor_tokens_per_s": needed / floor, "padding_overhead": padded / real - 1,
            "graphs_compiled_in_run": sum(r.compiled for r in rounds.evald),
            "evald_rounds_s": [r.seconds for r in rounds.evald], "floor_rounds_s": list(rounds.floor_s)}


def compare_with_floor(mine: list, floor_logprobs: Any, floor_greedy: Any) -> dict:
    """The same numbers as the floor? evald's log-probabilities and greedy flags, flattened in request order,
    against the floor's of the same reads (another computation of the same network: exact shapes, no padding)."""
    import numpy as np

    got = np.concatenate([np.asarray(a.logprobs, np.float64) for a in mine])
    want = np.asarray(floor_logprobs, np.float64)
    return {"max_rel_diff_vs_floor": float(np.max(np.abs(got - want) / np.abs(want))),
            "is_greedy_equal_vs_floor": bool(np.concatenate([a.greedy for a in mine]).tolist()
                                             == np.asarray(floor_greedy, bool).tolist())}


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
    parser.add_argument("--rounds", type=int, default=3, help="rounds of evald then the floor, each after a hot "
                        "swap of the same weights; times are their medians (default 3)")
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

    def floor_runner(rows: list[list[int]], reads_per_row: list[list[tuple[int, int]]],
                     per_forward: int | None = None) -> Callable[[], tuple[Any, Any]]:
        """The floor over ``rows`` (equal lengths) at their exact shape, one forward or forwards of at most
        ``per_forward`` rows: a call gives each read's log-probability and whether its token is the argmax there,
        in the order of ``reads_per_row``. Inputs are made once, outside the timed calls."""
        step = per_forward or len(rows)
        calls = []
        for i in range(0, len(rows), step):
            positions: dict[tuple[int, int], int] = {}
            reads = np.asarray([(positions.setdefault((r, p), len(positions)), t)
                                for r, rr in enumerate(reads_per_row[i:i + step]) for p, t in rr], np.int32)
            calls.append((ms.Tensor(np.asarray(rows[i:i + step], np.int32)),
                          ms.Tensor(np.asarray(list(positions), np.int32)), ms.Tensor(reads), reads))

        def run() -> tuple[Any, Any]:
            logps, greedy = [], []
            for tokens, positions, reads, host in calls:
                logp, best = reader(tokens, positions, reads)
                logps.append(logp.asnumpy())
                greedy.append(best.asnumpy()[host[:, 0]] == host[:, 1])
            return np.concatenate(logps), np.concatenate(greedy)
        return run

    def in_budget(rows: list[list[int]], reads_per_row: list[list[tuple[int, int]]], evald_s: float) -> dict:
        """The floor again within evald's token budget per forward (``TokenScorer.token_budget``): the one-forward
        floor may use more memory than evald is given; this one does not, so their ratio is evald's own cost."""
        run = floor_runner(rows, reads_per_row, max(1, scorer.token_budget // len(rows[0])))
        run()   # compiles
        seconds = []
        for _ in range(args.rounds):
            begin = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - begin)
        floor = statistics.median(seconds)
        return {"floor_in_budget_s": floor, "ratio_to_floor_in_budget": evald_s / floor}

    old = _old_scoring() if not args.no_old else None
    old_scorer = old.TokenScorer(net, batch_size=1) if old else None

    if "mc" in workloads:
        contexts, choices, requests = mc_contexts, mc_choices, mc_requests
        reads = [[(len(c) - 1, k) for k in ks] for c, ks in zip(contexts, choices)]
        rounds = side_by_side(scorer, net, lambda: scorer.score(requests), floor_runner(contexts, reads), args.rounds)
        row = result_row("requests", len(requests), sum(len(c) for c in contexts), rounds)
        row.update(compare_with_floor(rounds.evald[-1].out, *rounds.floor_out))
        row.update(in_budget(contexts, reads, rounds.evald_s))
        if old:
            subset = requests[:4]
            row.update(time_old_subset(old_scorer, subset, args.mc_context, len(requests), rounds.evald_s))
            mine = scorer.score(subset)   # scored again on its own (mcx compares the run's own scores)
            row.update(compare_with_old(mine, old_scorer.score(subset)))
        emit(report, "mc", row)

    if "mcx" in workloads:
        contexts, choices, requests = mcx_contexts, mcx_choices, mcx_requests
        # the floor: every context prefilled once in one batch at its exact length (but its last token), then
        # every choice once (the context's last token and the choice but its last) on a copy of its cache
        g = len(contexts)
        fork = ForkReads(net)
        fork.set_train(False)
        prefix = ms.Tensor(np.asarray([c[:-1] for c in contexts], np.int32))
        rows = ms.Tensor(np.repeat(np.arange(g), 4).astype(np.int32))
        chunks = ms.Tensor(np.asarray([[c[-1]] + k[:-1] for c, ks in zip(contexts, choices) for k in ks], np.int32))
        start = ms.Tensor(np.full(4 * g, args.mc_context - 1, np.int32))
        host_reads = np.asarray([(r, j, t) for r, k in enumerate(k for ks in choices for k in ks)
                                 for j, t in enumerate(k)], np.int32)
        reads = ms.Tensor(host_reads)
        zeros = ms.Tensor(np.zeros(g, np.int32))
        last = ms.Tensor(np.full(g, args.mc_context - 2, np.int32))

        def floor_forks() -> tuple[Any, Any]:
            cache = net.init_cache(g, args.mc_context + m)
            _, cache = extend(prefix, zeros, last, cache)
            logp, best = fork(cache, rows, chunks, start, reads)[:2]
            return logp.asnumpy(), best.asnumpy() == host_reads[:, 2]

        rounds = side_by_side(scorer, net, lambda: scorer.score(requests), floor_forks, args.rounds)
        row = result_row("requests", len(requests), g * (args.mc_context - 1) + 4 * g * m, rounds)
        row.update(compare_with_floor(rounds.evald[-1].out, *rounds.floor_out))
        if old:
            subset = requests[:4]
            row.update(time_old_subset(old_scorer, subset, args.mc_context + m, len(requests), rounds.evald_s))
            row.update(compare_with_old(rounds.evald[-1].out[:4], old_scorer.score(subset)))
        emit(report, "mcx", row)

    if "bpb" in workloads:
        rows = [(list(w.context) + list(w.continuation))[:-1] for w in windows]
        same = len({len(r) for r in rows}) == 1
        reads = [[(p, t) for p, t in enumerate((list(w.context) + list(w.continuation))[1:])] for w in windows]
        floor = floor_runner(rows, reads) if same else (lambda: (np.zeros(0), np.zeros(0, bool)))
        rounds = side_by_side(scorer, net, lambda: scorer.score(windows), floor, args.rounds)
        row = result_row("windows", len(windows), sum(len(r) for r in rows), rounds)
        if same:
            # the floor reads every position of a window; evald's numbers are its continuation's (the last ones)
            ends = np.cumsum([len(r) for r in reads])
            read = np.concatenate([np.arange(end - len(w.continuation), end) for end, w in zip(ends, windows)])
            logp, greedy = rounds.floor_out
            row.update(compare_with_floor(rounds.evald[-1].out, logp[read], greedy[read]))
            row.update(in_budget(rows, reads, rounds.evald_s))
        else:
            row["floor_s"] = row["ratio_to_floor"] = row["floor_tokens_per_s"] = float("nan")   # no one-shape floor
        if old:
            row.update(time_old_subset(old_scorer, windows[:2], len(rows[0]), len(windows), rounds.evald_s))
        emit(report, "bpb", row)

    if "gen" in workloads:
        contexts, requests = gen_contexts, gen_requests
        # the cached floor: one prefill at the exact context length, one decode step per token, all rows at once
        # into a cache of exactly the positions needed
        g, capacity = len(contexts), args.gen_context + args.gen_tokens
        tokens = ms.Tensor(np.asarray(contexts, np.int32))
        zeros, last = ms.Tensor(np.zeros(g, np.int32)), ms.Tensor(np.full(g, args.gen_context - 1, np.int32))
        positions = [ms.Tensor(np.full(g, args.gen_context + k, np.int32)) for k in range(args.gen_tokens - 1)]

        def floor_generate() -> list[list[int]]:
            cache = net.init_cache(g, capacity)
            best, cache = extend(tokens, zeros, last, cache)
            chosen = [best.asnumpy()]
            for k in range(args.gen_tokens - 1):
                best, cache = extend(ms.Tensor(chosen[-1].reshape(g, 1).astype(np.int32)), positions[k], zeros, cache)
                chosen.append(best.asnumpy())
            return np.stack(chosen, 1).tolist()

        rounds = side_by_side(scorer, net, lambda: scorer.generate(requests), floor_generate, args.rounds)
        new = sum(len(o) for o in rounds.evald[-1].out)
        real, padded = sum(r.real for r in rounds.evald), sum(r.padded for r in rounds.evald)
        row = {"contexts": g, "new_tokens": new, "evald_s": rounds.evald_s, "cached_floor_s": rounds.floor_median_s,
               "ratio_to_floor": rounds.evald_s / rounds.floor_median_s,
               "evald_new_tokens_per_s": new / rounds.evald_s, "padding_overhead": padded / real - 1,
               "graphs_compiled_in_run": sum(r.compiled for r in rounds.evald), "decoding": scorer.decoding,
               "evald_rounds_s": [r.seconds for r in rounds.evald], "floor_rounds_s": list(rounds.floor_s),
               "tokens_equal_vs_floor": [list(o) for o in rounds.evald[-1].out] == rounds.floor_out}
        if old:
            row.update(time_old_generation(old_scorer, contexts[0], args.old_gen_tokens, rounds.evald[-1].out,
                                           rounds.evald_s))
        emit(report, "gen", row)

    report["graphs_at_end"] = scorer.compiled_graphs
    report["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps({"graphs_at_end": report["graphs_at_end"], "peak_rss_mb": report["peak_rss_mb"]}), flush=True)
    return report


if __name__ == "__main__":
    result = main()
    json.dump(result, sys.stdout, indent=1, default=str)
    print()
