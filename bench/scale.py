"""Checkpoint I/O at LLM scale: before/after, side by side with plain numpy/file floors, one run.

    .venv/bin/python -m bench.scale [--sizes 0.25,1,4] [--reps 5] [--dir DIR] [--json OUT]

For each size, two child processes (so that memory is measured cleanly and a 4 GB run fits):
``trainer`` builds a MindSpore network holding that many bytes of fp32 weights in 32
parameters and times, per repetition, interleaved:
  hook    floor np.copyto of the live views into warm arrays | now host_copy_of_weights (fresh
          arrays) | new HostBuffers.copy (reused buffers; steady state, the first call is reported
          apart);
  commit  floor one file, one thread: write + fsync | now the version-1 commit (bench/scale_legacy)
          | new layout.write_checkpoint;
``evald`` builds the same network, compiles it (Graph mode), then times, with the page cache hot
(files just written or read) and cold (evicted with POSIX_FADV_DONTNEED before each arm):
  evald   floor one read (readinto a warm buffer, one thread) of the new checkpoint's files |
          now version-1 verify + load + load_param_into_net | new NetworkWeights.load;
and the peak RSS above idle while loading (VmHWM after resetting it through /proc/self/clear_refs).
Times are medians over the repetitions; a ratio is the median (and range) of arm / floor measured
next to each other in the same repetition, on the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

PARAMS = 32


def _network(total_bytes: int, seed: int | None):
    import mindspore as ms
    from mindspore import nn

    class Weights(nn.Cell):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(seed or 0)
            n = total_bytes // 4 // PARAMS
            self.ws = ms.ParameterTuple([ms.Parameter(ms.Tensor(
                rng.random(n, dtype=np.float32) if seed is not None else np.zeros(n, np.float32)),
                name=f"layers.{i}.weight") for i in range(PARAMS)])

        def construct(self, x):
            out = x
            for w in self.ws:
                out = out + w[0]
            return out
    return Weights()


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _evict(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def trainer(total: int, root: Path, reps: int) -> dict:
    from bench import scale_legacy
    from evald.contracts import layout
    from trainer_hooks.host_copy import HostBuffers, host_copy_of_weights

    net = _network(total, seed=1)
    views = {n: p.asnumpy() for n, p in net.parameters_and_names()}
    unprepared, _ = _timed(lambda: HostBuffers().copy(net)())  # the first copy allocates the buffers
    buffers = HostBuffers()
    prepare, _ = _timed(lambda: buffers.allocate(net))  # what SnapshotWriter.prepare does off the training thread
    first, _ = _timed(lambda: buffers.copy(net)())
    floor_arrays = {n: np.ones_like(v) for n, v in views.items()}  # warm, like the reused buffers
    rows = []
    for rep in range(reps):  # the blocking copy, alone: nothing else disturbs the caches
        row = {}
        row["hook_now"], fresh = _timed(lambda: host_copy_of_weights(net))
        del fresh
        row["hook_floor"], _ = _timed(lambda: [np.copyto(floor_arrays[n], v) for n, v in views.items()])
        row["hook_new"], weights = _timed(lambda: buffers.copy(net)())
        rows.append(row)
    del floor_arrays
    for rep, row in enumerate(rows):
        row["commit_now"], old = _timed(lambda: scale_legacy.write_checkpoint_v1(root / "now", rep, weights))
        row["commit_floor"], _ = _timed(lambda: _write_once(root / "floor.bin", views.values()))
        os.unlink(root / "floor.bin")
        row["commit_new"], new = _timed(lambda: layout.write_checkpoint(root / "new", rep, weights, run_id="b"))
        if rep < reps - 1:
            shutil.rmtree(old)
            shutil.rmtree(new)
    return {"hook_first": first, "hook_unprepared": unprepared, "hook_prepare": prepare, "rows": rows, "files": len(layout.read_manifest(new).files)}


def _write_once(path: Path, arrays) -> None:
    with open(path, "wb", buffering=0) as f:
        for array in arrays:
            f.write(memoryview(array.reshape(-1).view(np.uint8)))
        os.fsync(f.fileno())


def evald(total: int, root: Path, reps: int, arm: str) -> dict:
    """One process per arm, so that the old path's heap growth does not leak into the new one's."""
    import mindspore as ms

    from bench import scale_legacy
    from evald.contracts import layout
    from evald.pipeline.hot_swap import NetworkWeights

    ms.set_context(mode=ms.GRAPH_MODE)
    net = _network(total, seed=None)
    net(ms.Tensor(np.zeros(1, np.float32)))  # compiled once, as evald does
    swap = NetworkWeights(net)
    idle_rss = _status("VmRSS")
    [(_, new_dir)] = layout.list_committed(root / "new")
    [(_, old_dir)] = layout.list_committed(root / "now")
    manifest = layout.read_manifest(new_dir)
    files = [new_dir / f.name for f in manifest.files] if arm == "new" else [old_dir / "weights.safetensors"]
    load = (lambda: swap.load(new_dir, manifest)) if arm == "new" else (
        lambda: scale_legacy.load_and_swap_v1(old_dir, net))
    rows = []
    for rep in range(reps):
        row = {}
        for cache in ("hot", "cold"):
            if arm == "new":  # the floor reads the same files into the same (warm) parameter memory
                if cache == "cold":
                    _evict(files)
                row[f"read_floor_{cache}"], _ = _timed(lambda: _read_once(files, swap.destinations().values()))
            if cache == "cold":
                _evict(files)
            idle = _status("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak (VmHWM) to the current RSS
            row[f"read_{arm}_{cache}"], _ = _timed(load)
            row[f"rss_{arm}_{cache}"] = _status("VmHWM") - idle
        rows.append(row)
    result = {"rows": rows, "idle_rss": idle_rss, "end_rss": _status("VmRSS")}
    if arm == "new":
        from safetensors import safe_open

        with safe_open(str(old_dir / "weights.safetensors"), "np") as f:  # both arms load the same weights
            assert all(np.array_equal(f.get_tensor(n), v) for n, v in swap.destinations().items())
        views = list(swap.destinations().values())
        result["hash_only"] = _timed(lambda: _hash_parallel(views, len(os.sched_getaffinity(0))))[0]
    return result


def _read_once(paths, destinations) -> None:
    """Plain reads, one thread, filling ``destinations`` (byte for byte, headers included) in turn."""
    targets = [memoryview(d.reshape(-1).view(np.uint8)) for d in destinations] + [memoryview(bytearray(1 << 20))]
    current, at = targets.pop(0), 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while True:
                if at == len(current):
                    current, at = (targets.pop(0) if targets else current), 0
                got = f.readinto(current[at:at + (64 << 20)])
                if not got:
                    break
                at += got


def _hash_parallel(arrays, threads: int) -> None:
    groups = [arrays[i::threads] for i in range(threads)]

    def work(group):
        for a in group:
            hashlib.sha256(memoryview(a.reshape(-1).view(np.uint8))).digest()
    workers = [threading.Thread(target=work, args=(g,)) for g in groups]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def _child(role: str, gb: float, root: Path, reps: int) -> dict:
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-m", "bench.scale", "--role", role, "--sizes", str(gb),
                          "--dir", str(root), "--reps", str(reps)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(rows, key):
    return statistics.median(r[key] for r in rows)


GOALS = {"hook": 1.2, "commit": 1.3, "evald": 1.5}


def _ratio(rows, arm, floor) -> str:
    """Median of the per-repetition ratios (each arm against the floor measured next to it), and their range."""
    ratios = [r[arm] / r[floor] for r in rows]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def report(gb: float, total: int, t: dict, e: dict) -> list[str]:
    tr, er = t["rows"], e["rows"]
    lines = [f"### {gb:g} GB ({total / 1e9:.2f} GB of fp32 weights, {PARAMS} parameters, "
             f"{t['files']} files)", "",
             "| step | floor | now | new | now / floor | **new / floor** | goal |", "|---|---|---|---|---|---|---|"]
    arms = [("hook: host copy (blocks training)", tr, "hook_floor", "hook_now", "hook_new", GOALS["hook"]),
            ("commit: write + fsync + hash + manifest", tr, "commit_floor", "commit_now", "commit_new",
             GOALS["commit"])]
    arms += [(f"evald: read + verify + swap, page cache {c}", er, f"read_floor_{c}", f"read_now_{c}",
              f"read_new_{c}", GOALS["evald"]) for c in ("hot", "cold")]
    for label, rows, floor, now, new, goal in arms:
        f, n, w = (_median(rows, k) for k in (floor, now, new))
        lines.append(f"| {label} | {f:.3f} s | {n:.3f} s | {w:.3f} s | {_ratio(rows, now, floor)} "
                     f"| **{_ratio(rows, new, floor)}** | <= {goal} |")
    lines += ["", f"- hook, first snapshot: {t['hook_unprepared']:.3f} s if it allocates the buffers; "
              f"{t['hook_first']:.3f} s after SnapshotWriter.prepare allocated them on the writer thread "
              f"({t['hook_prepare']:.3f} s, not blocking training)",
              f"- sha256 alone of the same bytes in memory, one thread per core: {e['hash_only']:.3f} s",
              f"- evald RSS idle after compiling {e['idle_rss'] / 1e9:.2f} GB; at the end: now "
              f"{e['now']['end_rss'] / 1e9:.2f} GB, new {e['end_rss'] / 1e9:.2f} GB",
              f"- evald peak RSS above idle while loading, as a multiple of the checkpoint size (hot / cold): "
              f"now {_median(er, 'rss_now_hot') / total:.2f} / {_median(er, 'rss_now_cold') / total:.2f}, "
              f"new {_median(er, 'rss_new_hot') / total:.3f} / {_median(er, 'rss_new_cold') / total:.3f} "
              f"(goal <= 1.3)", ""]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="0.25,1,4", help="GB of weights, comma-separated")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="scratch directory on the disk to measure (default: ./.bench-scale)")
    p.add_argument("--json", default=None, help="also write every measurement here")
    p.add_argument("--role", choices=("trainer", "evald-now", "evald-new"), help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    if args.role:
        total = int(sizes[0] * 2**30) // (4 * PARAMS) * 4 * PARAMS
        if args.role == "trainer":
            result = trainer(total, Path(args.dir), args.reps)
        else:
            result = evald(total, Path(args.dir), args.reps, args.role.split("-")[1])
        print(json.dumps(result))
        return 0
    base = Path(args.dir or ".bench-scale").resolve()
    lines, everything = [], {}
    for gb in sizes:
        root = base / f"{gb:g}GB"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        try:
            t = _child("trainer", gb, root, args.reps)
            # The old path grows the heap with every load (4 GB x 10 loads does not fit in 24 GB):
            # a fresh process per repetition.
            runs = [_child("evald-now", gb, root, 1) for _ in range(args.reps)]
            now = dict(runs[-1], rows=[r["rows"][0] for r in runs])
            e = _child("evald-new", gb, root, args.reps)
            e["now"] = now
            for row, other in zip(e["rows"], now["rows"]):
                row.update(other)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        total = int(gb * 2**30) // (4 * PARAMS) * 4 * PARAMS
        everything[gb] = {"trainer": t, "evald": e}
        lines += report(gb, total, t, e)
        print("\n".join(report(gb, total, t, e)), flush=True)
    shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
