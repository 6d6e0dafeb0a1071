"""Multi-rank snapshots: per-rank cost with N writer ranks against one writer, side by side, one run.

    .venv/bin/python -m bench.partitions [--sizes 1,2] [--reps 5] [--workers 2] [--dir DIR] [--json OUT]

For each size, an msrun job of ``--workers`` CPU workers (each pinned to its own core), each
holding the same MindSpore network with that many bytes of fp32 weights in 32 parameters (data
parallel: replicated weights), runs two EvaldHooks on two checkpoint directories:

  single  ``writer_ranks=(0,)``: rank 0 copies and writes the whole snapshot (the old default);
  parts   ``writer_ranks="all"``: every rank copies and writes its part (about 1/N of the bytes).

Per repetition, after an AllReduce barrier, each arm in turn (alternating which goes first):
every rank times its ``step_end`` (the blocking host copy; a rank that writes nothing returns at
once) and the time until its writer is idle again (copy + commit); then a barrier. The ratios
are, per repetition, the slowest rank of ``parts`` over rank 0 of ``single`` (the snapshot is
only complete when its slowest part is), as the median and range over the repetitions. The
first snapshot of each arm is a warm-up (buffers prepared, pages touched) and is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
PARAMS = 32


def _worker(args: argparse.Namespace) -> None:
    rank = int(os.environ.get("RANK_ID", "0"))
    os.sched_setaffinity(0, {rank % len(os.sched_getaffinity(0))})
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init

    from trainer_hooks import EvaldHook
    from trainer_hooks.stop_agreement import mindspore_reduce_sum

    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    reduce_sum = mindspore_reduce_sum()

    class Weights(nn.Cell):
        def __init__(self):
            super().__init__()
            n = int(args.size * 1e9) // 4 // PARAMS
            self.ws = ms.ParameterTuple([ms.Parameter(ms.Tensor(np.full(n, i, np.float32)), name=f"layers.{i}.w")
                                         for i in range(PARAMS)])

    net = Weights()
    work = Path(args.dir)
    hooks = {arm: EvaldHook(work / arm, every_n_steps=1, network=net, rank=rank, world_size=world,
                            run_id=f"bench-{arm}", writer_ranks=(0,) if arm == "single" else "all",
                            obey_stop=False, endpoint=f"ipc://{work}/n.sock", control_endpoint=f"ipc://{work}/c.sock")
             for arm in ("single", "parts")}
    results = []
    for hook in hooks.values():                      # the buffers are prepared on the writer threads
        while hook.writer is not None and (hook.writer._preparing or hook.writer._allocating):
            time.sleep(0.01)
    floors = _floors(net, hooks, rank)
    for rep in range(args.reps + 1):                   # rep 0: warm-up
        order = ("single", "parts", "staggered") if rep % 2 else ("staggered", "parts", "single")
        for arm in floors:                             # np.copyto of the same bytes, the same ranks at once
            reduce_sum(np.array([1]))
            started = time.perf_counter()
            for dst, src in floors[arm]:
                np.copyto(dst, src)
            if rep:
                results.append({"rep": rep, "arm": arm, "rank": rank, "blocking_s": time.perf_counter() - started,
                                "commit_s": 0.0, "bytes": sum(d.nbytes for d, _ in floors[arm])})
        for arm in order:
            name = "parts" if arm == "staggered" else arm
            hook = hooks[name]
            # "staggered": the same parts, but the ranks copy in turn, so none shares the memory bus
            # with another while it copies (as ranks on different hosts would not).
            for turn in range(world if arm == "staggered" else 1):
                reduce_sum(np.array([1]))              # barrier: the ranks start together (or in turn)
                if arm != "staggered" or turn == rank:
                    started = time.perf_counter()
                    hook.step_end(rep + 1 + (100000 if arm == "staggered" else 0))
                    blocking = time.perf_counter() - started
            while hook.writer is not None and hook.writer.busy:
                time.sleep(0.001)
            committed = time.perf_counter() - started
            reduce_sum(np.array([1]))
            if rank == 0:                              # outside the timing; keeps the disk free
                for entry in (work / name).glob("step_*"):
                    shutil.rmtree(entry, ignore_errors=True)
            time.sleep(args.settle_s)                  # let the kernel finish freeing and writing back
            reduce_sum(np.array([1]))
            if rep:
                part = hook.writer.partition if hook.writer else None
                results.append({"rep": rep, "arm": arm, "rank": rank, "blocking_s": blocking, "commit_s": committed,
                                "bytes": part.nbytes if part else (PARAMS * 4 * (int(args.size * 1e9) // 4 // PARAMS)
                                                                   if hook.writer else 0)})
    for hook in hooks.values():
        if hook.writer is not None:
            hook.writer.close()
    Path(args.out).joinpath(f"rank_{rank}.json").write_text(json.dumps(results))


def _floors(net, hooks: dict, rank: int) -> dict[str, list]:
    """A plain np.copyto of what each arm copies: the live parameter views into the hook's own warm buffers."""
    views = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    plan = hooks["parts"].writer.rows_for(net)
    single = hooks["single"].writer.buffers.arrays if rank == 0 else {}
    parts = hooks["parts"].writer.buffers.arrays
    return {"floor-single": [(single[n], views[n]) for n in single],
            "floor-parts": [(parts[n], views[n][r[0]:r[1]] if r else views[n]) for n, r in plan.items()]}


def _run_size(size: float, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="evb-", dir=args.dir))
    out = work / "out"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    venv = Path(sys.executable).parent
    msrun = str(venv / "msrun") if (venv / "msrun").exists() else shutil.which("msrun")
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(Path(__file__).resolve().parents[1]),
               PATH=f"{venv}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [msrun, f"--worker_num={args.workers}", f"--local_worker_num={args.workers}", f"--master_port={port}",
           f"--log_dir={work / 'logs'}", "--join=True", "--cluster_time_out=600", str(Path(__file__).resolve()),
           "--as-rank", "--size", str(size), "--reps", str(args.reps), "--settle-s", str(args.settle_s), "--dir", str(work), "--out", str(out)]
    try:
        job = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, timeout=3600,
                             stdout=subprocess.DEVNULL)
        if job.returncode:
            logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted((work / "logs").glob("*.log")))
            raise RuntimeError(f"msrun exited {job.returncode} at {size} GB:\n{logs}")
        rows = [r for path in sorted(out.glob("rank_*.json")) for r in json.loads(path.read_text())]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _summary(size, rows, args.workers)


def _summary(size: float, rows: list[dict], workers: int) -> dict:
    by = {(r["rep"], r["arm"], r["rank"]): r for r in rows}
    reps = sorted({r["rep"] for r in rows})
    single = [by[(rep, "single", 0)] for rep in reps]
    parts = [[by[(rep, "parts", rank)] for rank in range(workers)] for rep in reps]
    staggered = [[by[(rep, "staggered", rank)] for rank in range(workers)] for rep in reps]
    block = [max(p["blocking_s"] for p in ps) / s["blocking_s"] for ps, s in zip(parts, single)]
    alone = [max(p["blocking_s"] for p in ps) / s["blocking_s"] for ps, s in zip(staggered, single)]
    floor_parts = [max(by[(rep, "floor-parts", rank)]["blocking_s"] for rank in range(workers)) for rep in reps]
    floor = [f / by[(rep, "floor-single", 0)]["blocking_s"] for f, rep in zip(floor_parts, reps)]
    over_floor = [max(p["blocking_s"] for p in ps) / f for ps, f in zip(parts, floor_parts)]
    commit = [max(p["commit_s"] for p in ps) / s["commit_s"] for ps, s in zip(parts, single)]
    return {
        "size_gb": size, "workers": workers, "reps": len(reps),
        "single_blocking_s": statistics.median(s["blocking_s"] for s in single),
        "parts_blocking_s": statistics.median(max(p["blocking_s"] for p in ps) for ps in parts),
        "single_commit_s": statistics.median(s["commit_s"] for s in single),
        "parts_commit_s": statistics.median(max(p["commit_s"] for p in ps) for ps in parts),
        "blocking_ratio": statistics.median(block), "blocking_ratio_range": [min(block), max(block)],
        "floor_ratio": statistics.median(floor), "floor_ratio_range": [min(floor), max(floor)],
        "parts_over_floor": statistics.median(over_floor),
        "staggered_blocking_s": statistics.median(max(p["blocking_s"] for p in ps) for ps in staggered),
        "staggered_ratio": statistics.median(alone), "staggered_ratio_range": [min(alone), max(alone)],
        "commit_ratio": statistics.median(commit), "commit_ratio_range": [min(commit), max(commit)],
        "part_bytes": [p["bytes"] for p in parts[0]], "single_bytes": single[0]["bytes"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,2", help="GB of fp32 weights, comma-separated")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir)")
    p.add_argument("--json", default=None)
    p.add_argument("--settle-s", type=float, default=0.5, help="pause between arms (outside the timing)")
    p.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.as_rank:
        _worker(args)
        return 0
    results = [_run_size(float(size), args) for size in args.sizes.split(",")]
    print(f"{args.workers} writer ranks (msrun, CPU workers) vs one writer; median (min-max) of {args.reps} reps")
    print("| size | single writer: blocking / commit | N writers, slowest rank: blocking / commit "
          "| **blocking ratio** (goal <= 0.6) | commit ratio | ranks copying in turn: blocking, ratio "
          "| np.copyto floor ratio | N writers: hook / floor |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        rng = lambda key: f"({r[key][0]:.2f}-{r[key][1]:.2f})"  # noqa: E731
        print(f"| {r['size_gb']:g} GB | {r['single_blocking_s']:.3f} s / {r['single_commit_s']:.3f} s "
              f"| {r['parts_blocking_s']:.3f} s / {r['parts_commit_s']:.3f} s "
              f"| **{r['blocking_ratio']:.2f}** {rng('blocking_ratio_range')} "
              f"| {r['commit_ratio']:.2f} {rng('commit_ratio_range')} "
              f"| {r['staggered_blocking_s']:.3f} s, {r['staggered_ratio']:.2f} {rng('staggered_ratio_range')} "
              f"| {r['floor_ratio']:.2f} {rng('floor_ratio_range')} | {r['parts_over_floor']:.2f} |")
    print("part bytes per rank:", {r["size_gb"]: r["part_bytes"] for r in results})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
