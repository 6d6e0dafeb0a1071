"""A backfill fleet's throughput: cells per minute with 1, 2 and 3 workers, and snapshot loads per cell.

    .venv/bin/python -m bench.fleet [--checkpoints 8] [--workers 1 2 3] [--limit 16] [--pin]

One run of checkpoints (the demo GPT; RUN.json names its factories) is validated once by a real
evald without the suite; then, for each worker count, a fresh fleet directory and that many
``evald backfill --fleet-dir`` worker processes started at once (real processes, not pinned: the
engine would give each its own device), the wall time from their start to the last one's exit
(start-up, network and suite build, every cell), the cells they wrote, and the snapshot loads their
journals count; from the journals, each worker's build time (start to its first snapshot load: the
network and the suite compiled) and each cell's time (load and score). The machine's load average is printed with each arm: on a shared 2-core machine,
more workers than free cores cannot go faster. ``--pin`` gives worker i core i alone (mod the cores), as a
device of its own would be on a cluster: one worker then runs on one core, not on both, so the arms compare
workers that do not share their compute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_run(root: Path, checkpoints: int, limit: int) -> tuple[Path, Path]:
    """Checkpoints, a validated run (no suite), and the TOML with suite ``mc``; (ckpt_dir, config)."""
    script = f"""
import numpy as np
from pathlib import Path
from evald.contracts import layout, wire
from examples.tiny_lm.model import build_model
from trainer_hooks.host_copy import host_copy_of_weights
ckpt = Path({str(root / 'ckpt')!r})
base = host_copy_of_weights(build_model(seq_len=64))
ckpt.mkdir(parents=True, exist_ok=True)
run = wire.RunAnnounced(run_id="bench", ckpt_dir=str(ckpt),
    model_factory=wire.FactorySpec("examples.tiny_lm.model:build_model", {{"seq_len": 64}}, {str(REPO)!r}),
    data_factory=wire.FactorySpec("examples.tiny_lm.data:validation_windows", {{"seq_len": 64}}, {str(REPO)!r}))
layout.write_run_file(ckpt, run.encode().decode())
for step in range(1, {checkpoints} + 1):
    rng = np.random.default_rng(step)
    layout.write_checkpoint(ckpt, step * 10, {{k: (a + 0.02 * rng.standard_normal(a.shape)).astype(a.dtype)
                                               for k, a in base.items()}}, run_id="bench")
"""
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), HF_HOME=str(root / "hf"))
    subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, check=True, timeout=600)
    from examples.tiny_lm.benchmarks import write_benchmarks

    include = write_benchmarks(root / "bench", next_line_count=max(2 * limit, 24), bpb_docs_per_set=1)
    common = ('tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"\nsubset_size = 16\n'
              'batch_size = 16\n[generation]\nprompts = 0\n')
    (root / "base.toml").write_text(common)
    config = root / "evald.toml"
    config.write_text(common + f'[suites.mc]\ninclude_path = [{json.dumps(include)}]\ntasks = ["stdlib_next_line"]\n'
                               f'limit = {limit}\nbatch_size = 4\n')
    with open(root / "evald.log", "wb") as out:
        subprocess.run([sys.executable, "-m", "evald", "--ckpt-dir", str(root / "ckpt"), "--config",
                        str(root / "base.toml"), "--endpoint", "none", "--lag-policy", "all", "--idle-exit-s", "2"],
                       env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=1800)
    return root / "ckpt", config


def run_fleet(root: Path, ckpt: Path, config: Path, workers: int, pin: bool = False) -> dict:
    from evald.daemon.fleet_cells import cell_files, journal_events

    fleet = root / f"fleet-{workers}"
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), HF_HOME=str(root / "hf"))
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    procs = []
    for index in range(workers):
        out = open(root / f"fleet-{workers}-worker-{index}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "evald", "backfill", "--suite", "mc", "--ckpt-dir", str(ckpt), "--fleet-dir",
             str(fleet), "--config", str(config), "--worker-index", str(index), "--worker-count", str(workers)],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=_on_core(index) if pin else None))   # before MindSpore starts its threads
    codes = [p.wait(timeout=3600) for p in procs]
    wall = time.monotonic() - started
    if any(codes):
        raise SystemExit(f"a worker failed (exit codes {codes}); see {root}/fleet-{workers}-worker-*.log")
    cells = len(cell_files(fleet))
    events = journal_events(fleet)
    loads = sum(1 for e in events if e["event"] == "load")
    starts = {e["pid"]: e["time"] for e in events if e["event"] == "start"}
    first_load = {}
    for e in events:
        if e["event"] == "load":
            first_load.setdefault(e["pid"], e["time"])
    build = sorted(first_load[pid] - starts[pid] for pid in first_load if pid in starts)
    per_cell = sorted(e["seconds"] for e in events if e["event"] == "cell" and "seconds" in e)
    return {"workers": workers, "cells": cells, "wall_s": round(wall, 1),
            "cells_per_min": round(cells / (wall / 60), 2), "loads": loads, "loads_per_cell": round(loads / cells, 3),
            "build_s_median": round(build[len(build) // 2], 1) if build else None,   # network + suite, per worker
            "cell_s_median": round(per_cell[len(per_cell) // 2], 2) if per_cell else None,
            "load_average_before": round(load_before, 1), "load_average_after": round(os.getloadavg()[0], 1)}


def _on_core(index: int):
    cores = sorted(os.sched_getaffinity(0))
    return lambda: os.sched_setaffinity(0, {cores[index % len(cores)]})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", type=int, default=8)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--limit", type=int, default=16, help="documents of the suite's task per cell")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--pin", action="store_true", help="worker i on core i alone: a device of its own")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="evald-bench-fleet-"))
    print(f"# {args.checkpoints} checkpoints, suite mc ({args.limit} documents), in {root}; cores: {os.cpu_count()}"
          f"{'; each worker pinned to a core of its own' if args.pin else ''}", flush=True)
    ckpt, config = make_run(root, args.checkpoints, args.limit)
    rows = []
    for workers in args.workers:
        rows.append(run_fleet(root, ckpt, config, workers, args.pin))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["cells_per_min"]
    for row in rows:
        print(f"{row['workers']} worker(s): {row['cells_per_min']} cells/min ({row['cells']} cells in "
              f"{row['wall_s']} s), x{row['cells_per_min'] / base:.2f} of {rows[0]['workers']}; "
              f"{row['loads_per_cell']} snapshot loads per cell; load average {row['load_average_before']} -> "
              f"{row['load_average_after']}")
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
