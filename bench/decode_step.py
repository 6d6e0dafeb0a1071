"""The cached decode step alone, before and after issue 28's step work, against the full forward (issue 28).

    PYTHONPATH=. .venv/bin/python -m bench.decode_step [--model llm_decoder] [--d-model 256] [--layers 4]
        [--heads 4] [--vocab 8000] [--capacity 1024] [--batches 1,2,8] [--steps 30] [--rounds 3]

One process, Graph mode, random weights. For each batch size B, three arms on the same weights, each
compiled and warmed up first (not timed), alternated ``--rounds`` times:

* **old step**: ``ExtendStep(network, greedy=True)`` at c = 1 on the example model as of commit
  d908ae9 (read from git: a scatter into each layer's slice ``cache[i, 0]`` and a restack of the
  whole cache every step);
* **new step**: the same on the working tree's model (the cache read by one unstack, every layer's
  keys and values written by one scatter at the end);
* **full forward**: ``NextTokenLogits(network, greedy=True)`` on a (B, capacity) buffer, what the
  full-forward fallback runs per new token.

Each round times ``--steps`` decode steps per step arm (one token per row, at positions from the
middle of the cache on, each step's cache fed to the next) and ``--forwards`` full forwards; reported:
the median ms per call of each arm over all rounds, and the ratios old / new and full forward / new
with their range over the rounds. Before timing, the old and new models' logits are compared after
the same prefill and two decode steps (max absolute difference: float rounding only). ``--model``
tiny_lm runs the demo GPT instead (``--d-model`` etc. then size it; ``--capacity`` is its seq_len).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "d908ae9"   # the models before the decode step's rewrite


def _old_model(model: str) -> Any:
    """examples/<model>/model.py as of OLD_COMMIT, imported from a temporary file."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{OLD_COMMIT}:examples/{model}/model.py"],
                            check=True, capture_output=True, text=True).stdout
    name = f"old_{model}_model"
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # Graph mode parses the source of the module it finds there
    spec.loader.exec_module(module)
    return module


def _build(module: Any, args: argparse.Namespace) -> Any:
    if args.model == "tiny_lm":
        return module.build_model(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                                  n_heads=args.heads, seq_len=args.capacity, seed=0)
    return module.build_model(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                              n_heads=args.heads, max_length=args.capacity, seed=0)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("llm_decoder", "tiny_lm"), default="llm_decoder")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--capacity", type=int, default=1024, help="cache positions (and the full forward's length)")
    parser.add_argument("--batches", default="1,2,8", help="rows per step, comma-separated")
    parser.add_argument("--steps", type=int, default=30, help="timed decode steps per arm and round")
    parser.add_argument("--forwards", type=int, default=3, help="timed full forwards per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import importlib

    import mindspore as ms
    import numpy as np

    from evald.pipeline.tasks.generation import ExtendStep, NextTokenLogits, position_index

    ms.set_context(mode=ms.GRAPH_MODE)
    new_net = _build(importlib.import_module(f"examples.{args.model}.model"), args)
    old_net = _build(_old_model(args.model), args)
    ms.load_param_into_net(old_net, {p.name: ms.Parameter(p.data.copy(), p.name) for p in new_net.get_parameters()},
                           strict_load=True)
    for net in (new_net, old_net):
        net.set_train(False)
    report: dict = {"args": vars(args), "old_commit": OLD_COMMIT}

    # the same logits: a prefill of 8 tokens, then two decode steps, on both models
    rng = np.random.default_rng(0)
    b, capacity = 2, args.capacity
    tokens = rng.integers(1, args.vocab, (b, 10)).astype(np.int32)
    diffs = []
    caches = {}
    steps = {"old": ExtendStep(old_net), "new": ExtendStep(new_net)}
    for name, step in steps.items():
        step.set_train(False)
        caches[name] = (old_net if name == "old" else new_net).init_cache(b, capacity)
    for begin, c in ((0, 8), (8, 1), (9, 1)):
        got = {}
        for name, step in steps.items():
            got[name], caches[name] = step(ms.Tensor(tokens[:, begin:begin + c]), ms.Tensor(np.full(b, begin, np.int32)),
                                           ms.Tensor(np.full(b, c - 1, np.int32)), caches[name])
        diffs.append(float(np.max(np.abs(got["old"].asnumpy() - got["new"].asnumpy()))))
    report["max_abs_logit_diff_old_vs_new"] = max(diffs)
    print(json.dumps({"max_abs_logit_diff_old_vs_new": max(diffs)}), flush=True)

    def step_arm(net: Any, rows: int) -> Callable[[int], list[float]]:
        cell = ExtendStep(net, greedy=True)
        cell.set_train(False)
        state = {"cache": net.init_cache(rows, capacity), "position": capacity // 2}
        zeros = ms.Tensor(np.zeros(rows, np.int32))

        def run(n: int) -> list[float]:
            seconds = []
            chosen = np.ones(rows, np.int32)
            for _ in range(n):
                if state["position"] >= capacity:    # keep the positions inside the cache
                    state["position"] = capacity // 2
                begin = time.perf_counter()
                best, state["cache"] = cell(ms.Tensor(chosen.reshape(rows, 1)),
                                            ms.Tensor(np.full(rows, state["position"], np.int32)), zeros,
                                            state["cache"])
                chosen = best.asnumpy().astype(np.int32)
                seconds.append(time.perf_counter() - begin)
                state["position"] += 1
            return seconds
        return run

    def forward_arm(net: Any, rows: int) -> Callable[[int], list[float]]:
        cell = NextTokenLogits(net, greedy=True)
        cell.set_train(False)
        buffer = ms.Tensor(rng.integers(1, args.vocab, (rows, capacity)).astype(np.int32))
        index = ms.Tensor(position_index(np.full(rows, capacity - 1)))

        def run(n: int) -> list[float]:
            seconds = []
            for _ in range(n):
                begin = time.perf_counter()
                cell(buffer, index).asnumpy()
                seconds.append(time.perf_counter() - begin)
            return seconds
        return run

    report["batches"] = {}
    for rows in [int(n) for n in args.batches.split(",")]:
        arms = {"old_step": (step_arm(old_net, rows), args.steps), "new_step": (step_arm(new_net, rows), args.steps),
                "full_forward": (forward_arm(new_net, rows), args.forwards)}
        for run, _ in arms.values():
            run(2)   # compile and warm up, not timed
        times: dict[str, list[float]] = {name: [] for name in arms}
        medians: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, (run, n) in arms.items():
                seconds = run(n)
                times[name] += seconds
                medians[name].append(statistics.median(seconds))
        ms_per = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        row = {f"{name}_ms": round(v, 2) for name, v in ms_per.items()}
        for other in ("old_step", "full_forward"):
            per_round = [o / n for o, n in zip(medians[other], medians["new_step"])]
            row[f"{other}_over_new_step"] = round(ms_per[other] / ms_per["new_step"], 2)
            row[f"{other}_over_new_step_range"] = [round(min(per_round), 2), round(max(per_round), 2)]
        report["batches"][rows] = row
        print(json.dumps({"batch": rows, **row}), flush=True)
    return report


if __name__ == "__main__":
    result = main()
    json.dump(result, sys.stdout, indent=1, default=str)
    print()
