"""Benchmark suites on the demo model: throughput against the bare forward passes, graphs, latency, size.

    .venv/bin/python -m bench.benchmarks [--reps 3] [--mc-docs 200]

For the demo's two suites (``next_line``: ``--mc-docs`` 4-way multiple-choice documents; ``bpb``:
bits per byte on 13 held-out standard-library packages), in one process on one network:

* **throughput**: real tokens per second of ``SuiteRunner.run()`` (lm-eval's request building,
  evald's adapter and TokenScorer, lm-eval's metrics), against the SAME forward passes (the exact
  (batch, length) arrays the scorer ran, recorded during the suite) run in-process through the same
  compiled cell, back to back: the ratio bare time / suite time (goal >= 0.9); and bare time / time
  inside evald's ``LM`` methods (what evald adds, lm-eval's own work excluded). Repetitions
  alternate the two. Also the share of the suite's own time spent in those forward passes
  (measured inside the same run, so the machine's load cancels). ``--d-model``/``--layers`` widen the model (a bigger model's forward passes
  weigh more against lm-eval's fixed per-document work).
* **graphs compiled** per suite (TokenScorer.compiled_graphs after warm-up and after every run).
* **per-sample outputs**: bytes per 1,000 documents as JSON in memory, gzipped on disk
  (evald.ledger.samples), and the Python heap their records hold (tracemalloc).
* **commit to last suite point** (``--latency``, default on): a real evald process with both
  suites; after it evaluated a first checkpoint, a second one is committed and the time from its
  commit to the ledger commit of its last suite cell (whose TensorBoard record is written in the
  same turn) is read from the ledger.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _suites(include: str, mc_docs: int):
    from evald.config.options import SuiteOptions

    return {"next_line": SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=mc_docs),
            "bpb": SuiteOptions(tasks=("stdlib_bpb",), include_path=(include,))}


def throughput(include: str, mc_docs: int, reps: int, d_model: int = 96, layers: int = 2) -> dict:
    import mindspore as ms
    import numpy as np

    from evald.pipeline.suites.runner import SuiteRunner
    from evald.pipeline.suites.tokenizer import ByteTokenizer
    from examples.tiny_lm.model import build_model

    ms.set_context(mode=ms.GRAPH_MODE)
    network = build_model(seq_len=64, d_model=d_model, n_layers=layers)
    network.set_train(False)
    out = {}
    for name, options in _suites(include, mc_docs).items():
        runner = SuiteRunner(name, options, network, ByteTokenizer())
        runner.warm_up()   # every graph compiled before any timed run
        compiled_at_start = runner.scorer.compiled_graphs
        recorded: list[tuple[np.ndarray, np.ndarray]] = []
        original = runner.scorer._score_batch

        def recording(inputs, targets, _original=original):
            recorded.append((inputs.copy(), targets.copy()))
            return _original(inputs, targets)

        runner.scorer._score_batch = recording
        result = runner.run()   # the first run also warms lm-eval's caches; not timed
        runner.scorer._score_batch = original
        cell = runner.scorer._score_cell
        suite_s, bare_s, adapter_s = [], [], []
        inside = [0.0]

        def timed(method):
            def wrapper(*a, **k):
                started = time.perf_counter()
                try:
                    return method(*a, **k)
                finally:
                    inside[0] += time.perf_counter() - started
            return wrapper

        for method in ("_loglikelihood_tokens", "loglikelihood_rolling", "generate_until"):
            setattr(runner.lm, method, timed(getattr(runner.lm, method)))
        forward = [0.0]

        def timed_forward(method):
            def wrapper(*a, **k):
                started = time.perf_counter()
                try:
                    return method(*a, **k)
                finally:
                    forward[0] += time.perf_counter() - started
            return wrapper

        runner.scorer._score_batch = timed_forward(runner.scorer._score_batch)
        forward_s = []
        for _ in range(reps):
            inside[0] = forward[0] = 0.0
            started = time.perf_counter()
            result = runner.run()
            suite_s.append(time.perf_counter() - started)
            adapter_s.append(inside[0])
            forward_s.append(forward[0])
            started = time.perf_counter()
            for inputs, targets in recorded:
                [t.asnumpy() for t in cell(ms.Tensor(inputs), ms.Tensor(targets))]
            bare_s.append(time.perf_counter() - started)
        tokens = result.tokens
        docs = sum(t.documents for t in result.tasks.values())
        lines = [json.dumps(s, sort_keys=True, separators=(",", ":")) + "\n"
                 for t in result.tasks.values() for s in t.samples]
        raw = "".join(lines).encode()
        tracemalloc.start()
        held = [json.loads(line) for line in lines]
        heap = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del held
        ratios = [b / s for b, s in zip(bare_s, suite_s)]
        adapter_ratios = [b / a for b, a in zip(bare_s, adapter_s)]
        out[name] = {
            "documents": docs, "requests_forward_passes": len(recorded), "real_tokens": tokens,
            "suite_s_median": statistics.median(suite_s), "bare_s_median": statistics.median(bare_s),
            "suite_tokens_per_s": tokens / statistics.median(suite_s),
            "bare_tokens_per_s": tokens / statistics.median(bare_s),
            "ratio_suite_over_bare_median": statistics.median(ratios), "ratios": ratios,
            "adapter_s_median": statistics.median(adapter_s),
            "forward_share_of_suite_median": statistics.median(f / s for f, s in zip(forward_s, suite_s)),
            "ratio_adapter_over_bare_median": statistics.median(adapter_ratios),
            "compiled_graphs_at_start": compiled_at_start, "compiled_graphs_after_runs": runner.scorer.compiled_graphs,
            "buckets": list(runner.scorer.buckets),
            "samples_json_bytes_per_1000_docs": len(raw) / docs * 1000,
            "samples_gzip_bytes_per_1000_docs": len(gzip.compress(raw, mtime=0)) / docs * 1000,
            "samples_python_heap_bytes_per_1000_docs": heap / docs * 1000,
        }
    return out


def latency(include: str, mc_docs: int, work: Path) -> dict:
    """A real evald: commit of a checkpoint -> commit of its last suite cell, from its ledger."""
    from tests import faults

    ckpt = work / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)
    config = work / "evald.toml"
    config.write_text(f'tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"\n'
                      f'[suites.next_line]\ntasks = ["stdlib_next_line"]\ninclude_path = ["{include}"]\n'
                      f'limit = {mc_docs}\n[suites.bpb]\ntasks = ["stdlib_bpb"]\ninclude_path = ["{include}"]\n')
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), HF_DATASETS_CACHE=str(work / "hf"))
    cmd = [sys.executable, "-m", "evald", "--ckpt-dir", str(ckpt), "--endpoint", "none", "--config", str(config),
           "--lag-policy", "all", "--subset-size", "64", "--batch-size", "16", "--generation", '{"prompts": 0}',
           "--tuning", '{"rescan_interval_s": 0.2}']
    ledger = faults.ledger_path(ckpt)
    with open(work / "evald.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            def cells_done(step: int) -> list:
                if not ledger.exists():
                    return []
                db = sqlite3.connect(ledger, timeout=30)
                try:
                    return db.execute("SELECT finished_at FROM cells WHERE step=? AND state='evaluated'",
                                      (step,)).fetchall()
                except sqlite3.OperationalError:
                    return []
                finally:
                    db.close()
            deadline = time.time() + 900
            while len(cells_done(10)) < 2 and time.time() < deadline:
                time.sleep(0.2)
            faults.commit(ckpt, 20)
            while len(cells_done(20)) < 2 and time.time() < deadline:
                time.sleep(0.2)
            db = sqlite3.connect(ledger, timeout=30)
            commit_time, validated = db.execute("SELECT commit_time, finished_at FROM steps WHERE step=20").fetchone()
            db.close()
            last = max(t for (t,) in cells_done(20))
        finally:
            proc.terminate()
            proc.wait(60)
    return {"commit_to_validation_s": validated - commit_time, "commit_to_last_suite_point_s": last - commit_time}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--mc-docs", type=int, default=200)
    p.add_argument("--no-latency", action="store_true", help="skip the real-evald latency measurement")
    p.add_argument("--d-model", type=int, default=96, help="the demo GPT's width (throughput only)")
    p.add_argument("--layers", type=int, default=2, help="the demo GPT's depth (throughput only)")
    args = p.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="bench-suites-") as tmp:
        os.environ.setdefault("HF_DATASETS_CACHE", str(Path(tmp) / "hf"))
        from examples.tiny_lm.benchmarks import write_benchmarks

        include = write_benchmarks(Path(tmp) / "bench", next_line_count=max(240, args.mc_docs))
        results = {"model": {"d_model": args.d_model, "layers": args.layers, "seq_len": 64},
                   "throughput": throughput(include, args.mc_docs, args.reps, args.d_model, args.layers)}
        if not args.no_latency:
            work = Path(tmp) / "latency"
            work.mkdir()
            results["latency"] = latency(include, args.mc_docs, work)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
