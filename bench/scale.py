"""Checkpoint I/O at LLM scale: each step beside plain floors on the same bytes, both integrity checks.

    .venv/bin/python -m bench.scale [--sizes 1,2,4] [--reps 3] [--dir DIR] [--json OUT]

For each size, two child processes (so that memory is measured cleanly and a 4 GB run fits):
``trainer`` builds a MindSpore network holding that many bytes of fp32 weights in 32
parameters and times, per repetition:
  hook    floor np.copyto of the live views into warm arrays | HostBuffers.copy (the reused
          buffers EvaldHook's SnapshotWriter copies into; the first call is reported apart);
  commit  floor one file, one thread: write + fsync | floor the commit's own files, as many
          threads as the commit uses: write + fsync | layout.write_checkpoint with sha256 |
          with xxh3-128 (the default); for each commit, the time in its files (write, hash, fsync)
          and the rest (manifest, rename, directory fsyncs);
``evald`` builds the same network, compiles it (Graph mode), then times, with the page cache hot
(files just read) and cold (evicted with POSIX_FADV_DONTNEED before each arm):
  evald   floor one thread reading the files into the (warm) parameter memory | floor the same
          reads on as many threads as the load uses | NetworkWeights.load of the sha256 snapshot |
          of the xxh3-128 snapshot (read + verify + swap);
and the peak RSS above idle while loading (VmHWM after resetting it through /proc/self/clear_refs).
The arms of a repetition run one after the other in an order that rotates between repetitions.
Every time is given as its median (min-max) over the repetitions; a ratio is the median (and
range) of arm / floor measured in the same repetition, on the same bytes. A floor whose slowest
repetition took more than ERRATIC (2) times its fastest is marked erratic, and a goal measured
against it is reported as not shown rather than met. The load average is recorded before and
after each size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

PARAMS = 32
CHECKS = ("sha256", "xxh3-128")
ERRATIC = 2.0      # max / min of a floor's repetitions beyond which a ratio against it proves nothing
GOALS = {"hook": 1.2, "commit": 1.3, "evald": 1.5, "rss": 0.05}


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


def _rotated(arms: list, rep: int) -> list:
    k = rep % len(arms)
    return arms[k:] + arms[:k]


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))


# ---------------------------------------------------------------- trainer side


def trainer(total: int, root: Path, reps: int) -> dict:
    from evald.contracts import layout, parallel_io
    from trainer_hooks.host_copy import HostBuffers

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
        for arm in _rotated(["hook_floor", "hook"], rep):
            if arm == "hook_floor":
                row[arm], _ = _timed(lambda: [np.copyto(floor_arrays[n], v) for n, v in views.items()])
            else:
                row[arm], weights = _timed(lambda: buffers.copy(net)())
        rows.append(row)
    floor_arrays.clear()  # the floor's copies are not needed past here
    plan = layout.plan_files(weights)
    threads = parallel_io.default_threads(len(plan))
    spent = {}
    real_write_files = parallel_io.write_files

    def write_files(*args, **kwargs):  # the commit's files: written, hashed, fsynced (the rest is the tail)
        start = time.perf_counter()
        try:
            return real_write_files(*args, **kwargs)
        finally:
            spent["files"] = time.perf_counter() - start
    parallel_io.write_files = write_files
    kept = {}
    for rep, row in enumerate(rows):
        for arm in _rotated(["write_floor_1", "write_floor_n", *CHECKS], rep):
            if arm == "write_floor_1":
                row[arm], _ = _timed(lambda: _write_one_file(root / "floor.bin", views.values()))
                os.unlink(root / "floor.bin")
            elif arm == "write_floor_n":
                row[arm], _ = _timed(lambda: _write_files(root / "floor", plan, threads))
                shutil.rmtree(root / "floor")
            else:
                row[f"commit_{arm}"], path = _timed(lambda: layout.write_checkpoint(
                    root / arm, rep, weights, run_id="b", hash_algorithm=arm))
                row[f"commit_files_{arm}"] = spent["files"]
                row[f"commit_tail_{arm}"] = row[f"commit_{arm}"] - spent["files"]
                if arm in kept:
                    shutil.rmtree(kept[arm])
                kept[arm] = path
    return {"hook_first": first, "hook_unprepared": unprepared, "hook_prepare": prepare, "rows": rows,
            "files": len(plan), "threads": threads}


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


def _write_one_file(path: Path, arrays) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for array in arrays:
            _write_all(fd, _bytes(array))
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_files(directory: Path, plan, threads: int) -> None:
    """The commit's files with its thread count, each written whole and fsynced: no hash, no header."""
    directory.mkdir()

    def one(item):
        name, tensors = item
        _write_one_file(directory / name, [a for _, a in tensors])
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, plan))


# ---------------------------------------------------------------- evald side


def evald(total: int, root: Path, reps: int) -> dict:
    import mindspore as ms

    from evald.contracts import layout, parallel_io
    from evald.pipeline.swap.hot_swap import NetworkWeights

    ms.set_context(mode=ms.GRAPH_MODE)
    net = _network(total, seed=None)
    net(ms.Tensor(np.zeros(1, np.float32)))  # compiled once, as evald does
    swap = NetworkWeights(net)
    idle_rss = _status("VmRSS")
    snapshots = {}
    for check in CHECKS:
        [(_, path)] = layout.list_committed(root / check)
        snapshots[check] = (path, layout.read_manifest(path))
    floor_dir, floor_manifest = snapshots["xxh3-128"]
    files = [floor_dir / f.name for f in floor_manifest.files]
    threads = parallel_io.default_threads(len(files))
    destinations = swap.destinations()
    jobs = [(floor_dir / f.name, [destinations[p.name] for p in sorted(
        (p for p in floor_manifest.params if p.file == f.name), key=lambda p: p.offset)])
        for f in floor_manifest.files]
    rows = []
    for rep in range(reps):
        row = {}
        for cache in ("hot", "cold"):
            for arm in _rotated(["read_floor_1", "read_floor_n", *CHECKS], rep):
                if arm.startswith("read_floor"):
                    if cache == "cold":
                        _evict(files)
                    read = _read_one_thread if arm == "read_floor_1" else (lambda j: _read_threads(j, threads))
                    row[f"{arm}_{cache}"], _ = _timed(lambda: read(jobs))
                    continue
                path, manifest = snapshots[arm]
                if cache == "cold":
                    _evict([path / f.name for f in manifest.files])
                idle = _status("VmRSS")
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # reset the peak (VmHWM) to the current RSS
                row[f"load_{arm}_{cache}"], _ = _timed(lambda: swap.load(path, manifest))
                row[f"rss_{arm}_{cache}"] = _status("VmHWM") - idle
        rows.append(row)
    from safetensors import safe_open

    with safe_open(str(files[-1]), "np") as f:  # what was loaded is what was written
        assert all(np.array_equal(f.get_tensor(n), destinations[n]) for n in f.keys())
    views = list(destinations.values())
    cores = len(os.sched_getaffinity(0))
    hash_only = {check: _timed(lambda: _hash_parallel(views, cores, check))[0] for check in CHECKS}
    return {"rows": rows, "idle_rss": idle_rss, "end_rss": _status("VmRSS"), "hash_only": hash_only,
            "threads": threads, "files": len(files)}


def _read_into(path: Path, targets) -> None:
    """One file, plain reads: its header into scratch, then each tensor's bytes into its destination."""
    with open(path, "rb", buffering=0) as f:
        header = int.from_bytes(f.read(8), "little")
        f.readinto(memoryview(bytearray(header)))
        for target in targets:
            view, at = _bytes(target), 0
            while at < len(view):
                got = f.readinto(view[at:at + (64 << 20)])
                if not got:
                    raise EOFError(path)
                at += got


def _read_one_thread(jobs) -> None:
    for path, targets in jobs:
        _read_into(path, targets)


def _read_threads(jobs, threads: int) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda job: _read_into(*job), jobs))


def _hash_parallel(arrays, threads: int, check: str) -> None:
    from evald.contracts import safetensors_io as sio

    def work(group):
        for a in group:
            h = sio.HASHES[check]()
            data = _bytes(a)
            for i in range(0, len(data), sio.CHUNK_BYTES):
                h.update(data[i:i + sio.CHUNK_BYTES])
            h.hexdigest()
    workers = [threading.Thread(target=work, args=(arrays[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


# ---------------------------------------------------------------- report


def _child(role: str, gb: float, root: Path, reps: int) -> dict:
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-m", "bench.scale", "--role", role, "--sizes", str(gb),
                          "--dir", str(root), "--reps", str(reps)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spread(rows, key) -> tuple[float, float, float]:
    values = [r[key] for r in rows]
    return statistics.median(values), min(values), max(values)


def _time(rows, key) -> str:
    med, lo, hi = _spread(rows, key)
    return f"{med:.3f} s ({lo:.3f}–{hi:.3f})"


def _erratic(rows, key) -> bool:
    _, lo, hi = _spread(rows, key)
    return hi > ERRATIC * lo


def _ratio(rows, arm, floor) -> tuple[float, str]:
    ratios = [r[arm] / r[floor] for r in rows]
    med = statistics.median(ratios)
    return med, f"{med:.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _verdict(ratio: float, goal: float, floor_erratic: bool) -> str:
    if ratio > goal:
        return "**no** (against an erratic floor)" if floor_erratic else "**no**"
    return "not shown: erratic floor" if floor_erratic else "yes"


def report(gb: float, total: int, t: dict, e: dict, load: dict) -> list[str]:
    tr, er = t["rows"], e["rows"]
    n = t["threads"]
    lines = [f"### {gb:g} GB ({total / 1e9:.2f} GB of fp32 weights, {PARAMS} parameters, "
             f"{_n(t['files'], 'file')}, {_n(n, 'thread')})", "",
             f"Load average (1 min) before {load['before']:.2f}, after {load['after']:.2f}.", "",
             "| step | time: median (min–max) | / 1-thread floor | / best floor | goal | met? |",
             "|---|---|---|---|---|---|"]

    def floor_row(label, rows, key):
        mark = " **erratic**" if _erratic(rows, key) else ""
        lines.append(f"| *floor: {label}* | {_time(rows, key)}{mark} | | | | |")

    def arm_row(label, rows, key, one, best, goal=None, against="one"):
        text_best = _ratio(rows, key, best)[1] if best else "–"
        verdict = ""
        if goal:
            floor = one if against == "one" else best
            verdict = _verdict(_ratio(rows, key, floor)[0], goal, _erratic(rows, floor))
        lines.append(f"| {label} | {_time(rows, key)} | {_ratio(rows, key, one)[1]} | {text_best} | "
                     f"{f'<= {goal}' if goal else ''} | {verdict} |")

    floor_row("`np.copyto` into warm arrays", tr, "hook_floor")
    arm_row("hook: host copy (blocks training)", tr, "hook", "hook_floor", None, GOALS["hook"], "one")
    floor_row("write + fsync, one file, 1 thread", tr, "write_floor_1")
    floor_row(f"write + fsync, the commit's {_n(t['files'], 'file')}, {_n(n, 'thread')}", tr, "write_floor_n")
    best_write = min(("write_floor_1", "write_floor_n"), key=lambda k: _spread(tr, k)[0])
    for check in CHECKS:
        arm_row(f"commit, {check}", tr, f"commit_{check}", "write_floor_1", best_write, GOALS["commit"], "best")
        arm_row(f"&nbsp;&nbsp;its files (write, {check}, fsync)", tr, f"commit_files_{check}", "write_floor_1",
                best_write)
        lines.append(f"| &nbsp;&nbsp;its manifest, rename, directory fsyncs | {_time(tr, f'commit_tail_{check}')} "
                     f"| | | | |")
    for cache in ("hot", "cold"):
        floor_row(f"read, page cache {cache}, 1 thread", er, f"read_floor_1_{cache}")
        floor_row(f"read, page cache {cache}, {_n(e['threads'], 'thread')} (as the load)", er, f"read_floor_n_{cache}")
        best_read = min((f"read_floor_1_{cache}", f"read_floor_n_{cache}"), key=lambda k: _spread(er, k)[0])
        for check in CHECKS:
            arm_row(f"evald load, {cache}, {check}", er, f"load_{check}_{cache}", f"read_floor_1_{cache}",
                    best_read, GOALS["evald"], "one")
    rss_max = max(r[f"rss_{c}_{cache}"] for r in er for c in CHECKS for cache in ("hot", "cold")) / total
    lines += ["", f"- best write floor here: {'1 thread' if best_write == 'write_floor_1' else _n(n, 'thread')}; "
              f"the commit goal is judged against it (against the other: see the ratio columns)",
              f"- hook, first snapshot: {t['hook_unprepared']:.3f} s if it allocates the buffers; "
              f"{t['hook_first']:.3f} s after SnapshotWriter.prepare allocated them on the writer thread "
              f"({t['hook_prepare']:.3f} s, not blocking training)",
              "- each check alone over the same bytes in memory, one thread per core: " + ", ".join(
                  f"{c} {e['hash_only'][c]:.3f} s" for c in CHECKS),
              f"- evald RSS idle after compiling {e['idle_rss'] / 1e9:.2f} GB, at the end {e['end_rss'] / 1e9:.2f} GB; "
              "peak RSS above idle while loading, as a multiple of the checkpoint (hot / cold): " + ", ".join(
                  f"{c} {_spread(er, f'rss_{c}_hot')[2] / total:.3f} / {_spread(er, f'rss_{c}_cold')[2] / total:.3f}"
                  for c in CHECKS) + f" (largest of the repetitions; goal <= {GOALS['rss']}: "
              f"{'yes' if rss_max <= GOALS['rss'] else '**no**'})", ""]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,2,4", help="GB of weights, comma-separated")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None, help="scratch directory on the disk to measure (default: ./.bench-scale)")
    p.add_argument("--json", default=None, help="also write every measurement here")
    p.add_argument("--role", choices=("trainer", "evald"), help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    if args.role:
        total = int(sizes[0] * 2**30) // (4 * PARAMS) * 4 * PARAMS
        runner = trainer if args.role == "trainer" else evald
        print(json.dumps(runner(total, Path(args.dir), args.reps)))
        return 0
    base = Path(args.dir or ".bench-scale").resolve()
    everything = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "sizes": {}}
    for gb in sizes:
        root = base / f"{gb:g}GB"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        load = {"before": os.getloadavg()[0]}
        try:
            t = _child("trainer", gb, root, args.reps)
            e = _child("evald", gb, root, args.reps)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        load["after"] = os.getloadavg()[0]
        total = int(gb * 2**30) // (4 * PARAMS) * 4 * PARAMS
        everything["sizes"][gb] = {"trainer": t, "evald": e, "loadavg": load}
        print("\n".join(report(gb, total, t, e, load)), flush=True)
    everything["ended"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"run {everything['started']} to {everything['ended']}", flush=True)
    shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
