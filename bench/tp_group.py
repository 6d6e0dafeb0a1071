"""A real tensor-parallel eval group on this CPU machine: each eval rank's peak host memory and the time
from a checkpoint's commit to the group's first point, against its share of the model (issue 29 goals).

    .venv/bin/python -m bench.tp_group [--hidden 1024] [--layers 6] [--vocab 8192] [--heads 8] [--degrees 1 2]
                                       [--baseline-hidden 32] [--reads 3] [--json OUT] [--keep]

LLaMA-shaped fp32 weights with examples/llama_tp's names and shapes (bench.reshard_read.llama_weights,
~376 MB at the defaults) are written as evald's partitioned snapshot at TP 2 (bench.reshard_read.write_tp:
one part per training rank, each with its slices' layouts), with RUN.json naming the factories
(``examples.llama_tp.model:build_model``, ``examples.tiny_lm.data:validation_windows``). For each eval
degree, in one run, side by side:

* ``evald --device 0`` (degree 1) or ``evald --device 0,1 --tensor-parallel 2`` (an msrun group) is
  started on a checkpoint directory holding only RUN.json. Once the network is built and compiled
  ("evaluation network ready" / "tensor-parallel eval group of 2 ranks ready"), every eval rank's peak
  RSS is reset (``/proc/PID/clear_refs`` 5; its peak so far, the build's, is kept), then the step is
  committed (``layout.write_checkpoint``, atomic, as the trainer's hook writes it). Measured: each eval
  rank's VmRSS before the commit and its VmHWM (sampled from /proc with psutil every 50 ms, the last
  value read before the process exits), its bytes read (its "rank R of D: read N bytes" log line; for
  one device, where that line does not exist, the growth of /proc/PID/io rchar), and evald's own
  ``evald/lag_s`` (commit_time to the eval/loss point being recorded) with load/verify/evaluate times.
* The process baseline: the same run (same vocabulary, layers, heads, sequence length, data, subset,
  degree) with ``--baseline-hidden`` instead of ``--hidden``, whose weights are ~1-2 MiB: its peak
  after the commit is the process without the model's bytes (interpreter, MindSpore, the compiled
  graph, the data, the activations of the full vocabulary's logits). RSS just before the commit is
  also reported, but it already holds the parameters once, so it is not the baseline.
* The time one rank takes to read its share: ``evald.pipeline.swap.tp_load.read_rank`` on the same
  files in this process after the group has exited (page cache warm, as in the group's read), the
  median of ``--reads``: its slices, and its share of the files verified (``share=(rank, degree)``), as a
  rank of the group does.

Goals (issue 29): (peak - baseline) / share <= 1.3 for every eval rank; commit-to-point <= 1.3 x the
time one rank takes to read its share. Prints a markdown table and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.reshard_read import llama_shapes, llama_weights, write_tp  # noqa: E402
from evald.contracts import layout, wire  # noqa: E402
from evald.contracts.partition import group_name  # noqa: E402
from evald.files.recognise import PARTS  # noqa: E402
from evald.ledger.schema import FINAL_STATES  # noqa: E402
from evald.pipeline.swap import tp_load  # noqa: E402
from tests.faults import ledger_rows  # noqa: E402
from tests.harness import PYTHON, Proc, base_env, run_dir, scalar_points  # noqa: E402

STEP = 10
WRITTEN_TP = 2          # the snapshot's training layout: evald's parts at TP 2
RUN_ID = "bench"        # write_tp's run id
MiB = 2 ** 20
READY = {1: "evaluation network ready", 2: "tensor-parallel eval group of 2 ranks ready"}
READ_LINE = re.compile(r"rank (\d+) of (\d+): read (\d+) bytes of")


def model_kwargs(args: argparse.Namespace, hidden: int) -> dict[str, int]:
    ffn = hidden * 11 // 4 // 8 * 8  # llama_shapes' default, passed to the factory explicitly
    return {"vocab": args.vocab, "hidden": hidden, "layers": args.layers, "heads": args.heads, "ffn": ffn,
            "seq_len": args.seq_len}


def shapes_of(kwargs: dict[str, int]) -> dict[str, tuple[tuple[int, ...], int | None]]:
    return llama_shapes(kwargs["hidden"], kwargs["layers"], kwargs["vocab"], ffn=kwargs["ffn"],
                        seq_len=kwargs["seq_len"], example_names=True)


def local_shape(shape: tuple[int, ...], cut: int | None, degree: int) -> tuple[int, ...]:
    if cut is None or degree == 1:
        return tuple(shape)
    return tuple(s // degree if d == cut else s for d, s in enumerate(shape))


def share_bytes(shapes: dict, degree: int) -> int:
    """The bytes of what one eval rank of ``degree`` holds (fp32): its slice of each cut weight, every
    replicated one whole (the same for every rank: the cuts are equal)."""
    return sum(math.prod(local_shape(s, c, degree)) * 4 for s, c in shapes.values())


def make_weights(kwargs: dict[str, int], seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, int | None]]:
    """llama_weights with the example's names, scaled by 1/sqrt(fan-in) in place (a finite, sane loss)."""
    weights, cuts = llama_weights(kwargs["hidden"], kwargs["layers"], kwargs["vocab"], seed, ffn=kwargs["ffn"],
                                  seq_len=kwargs["seq_len"], example_names=True)
    for array in weights.values():
        if array.ndim == 2:
            array *= np.float32(1.0 / math.sqrt(array.shape[1]))
    return weights, cuts


def announce(ckpt: Path, kwargs: dict[str, int], seq_len: int) -> None:
    """RUN.json naming the factories, as a trainer's EvaldCallback writes it: evald needs no factory flags."""
    ckpt.mkdir(parents=True, exist_ok=True)
    run = wire.RunAnnounced(run_id=RUN_ID, ckpt_dir=str(ckpt),
                            model_factory=wire.FactorySpec("examples.llama_tp.model:build_model", kwargs, str(REPO)),
                            data_factory=wire.FactorySpec("examples.tiny_lm.data:validation_windows",
                                                          {"seq_len": seq_len}, str(REPO)))
    layout.write_run_file(ckpt, run.encode().decode())


# --- the eval ranks' memory, from /proc --------------------------------------------------------------

def _status_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _rchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


class RankWatch(threading.Thread):
    """Every 50 ms: VmRSS and VmHWM of each eval rank of the evald ``root`` (itself with one device; its
    descendants whose environment has MS_ROLE=MS_WORKER, by RANK_ID, in a group). The last values read
    before a rank exits are kept."""

    def __init__(self, root: int, degree: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.degree, self.interval = psutil.Process(root), degree, interval
        self.pids: dict[int, int] = {}
        self.last: dict[int, dict[str, int]] = {}
        self.max_rss: dict[int, int] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def find(self) -> dict[int, int]:
        if self.degree == 1:
            return {0: self.root.pid}
        found = {}
        for child in self.root.children(recursive=True):
            try:
                env, cmd = child.environ(), child.cmdline()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if env.get("MS_ROLE") == "MS_WORKER" and "evald" in cmd and "-m" in cmd:
                found[int(env["RANK_ID"])] = child.pid
        return found

    def run(self) -> None:
        while not self.stopped.is_set():
            if len(self.pids) < self.degree:
                with self.lock:
                    self.pids.update(self.find())
            for rank, pid in list(self.pids.items()):
                try:
                    status = _status_kib(pid)
                except (FileNotFoundError, ProcessLookupError):
                    continue
                if "VmHWM" not in status:  # exited, not yet reaped: its memory is gone
                    continue
                with self.lock:
                    self.last[rank] = status
                    self.max_rss[rank] = max(self.max_rss.get(rank, 0), status.get("VmRSS", 0))
            self.stopped.wait(self.interval)

    def reset_peaks(self) -> dict[int, dict[str, int]]:
        """Each rank's RSS, peak so far (the build's) and rchar now; then its peak is reset to its RSS."""
        before = {}
        with self.lock:
            for rank, pid in sorted(self.pids.items()):
                status = _status_kib(pid)
                before[rank] = {"rss": status["VmRSS"], "build_hwm": status["VmHWM"], "rchar": _rchar(pid)}
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
                self.max_rss[rank] = 0
        return before

    def rchar(self) -> dict[int, int]:
        return {rank: _rchar(pid) for rank, pid in self.pids.items()}


# --- one evald run ---------------------------------------------------------------------------------

def wait_until(predicate, timeout: float, what: str, proc: Proc, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.popen.poll() is not None:
            raise RuntimeError(f"evald exited ({proc.popen.returncode}) before {what}:\n{proc.output()[-3000:]}")
        time.sleep(interval)
    raise RuntimeError(f"no {what} in {timeout:.0f} s:\n{proc.output()[-3000:]}")


def run_once(work: Path, name: str, degree: int, kwargs: dict[str, int], weights: dict, cuts: dict,
             args: argparse.Namespace) -> dict:
    """Start evald on a directory with only RUN.json, wait for its network, commit the step, measure."""
    ckpt, logdir, msrun_logs = work / name / "ckpt", work / name / "tb", work / name / "msrun"
    announce(ckpt, kwargs, args.seq_len)
    sockets = Path(tempfile.mkdtemp(prefix="evtp"))
    cmd = [PYTHON, "-m", "evald", "--device", ",".join(str(d) for d in range(degree)), "--ckpt-dir", str(ckpt),
           "--logdir", str(logdir), "--endpoint", "none", "--lag-policy", "all", "--subset-size",
           str(args.subset_size), "--batch-size", str(args.batch_size), "--generation", '{"prompts": 0}']
    if degree > 1:
        cmd += ["--tensor-parallel", str(degree), "--group", json.dumps({"log_dir": str(msrun_logs)})]
    started = time.monotonic()
    proc = Proc(cmd, base_env({"EVALD_SOCKET_DIR": str(sockets)}), work / f"{name}.log")
    watch = RankWatch(proc.popen.pid, degree)
    watch.start()
    try:
        wait_until(lambda: READY[degree] in proc.output(), args.timeout, READY[degree], proc, interval=0.5)
        ready_s = time.monotonic() - started
        wait_until(lambda: len(watch.pids) == degree, 60, f"{degree} eval rank processes", proc)
        time.sleep(args.settle)
        before = watch.reset_peaks()
        write_started = time.time()
        write_tp(ckpt, STEP, weights, cuts, WRITTEN_TP)  # each part committed atomically; the last one commits the step
        committed = time.time()
        row = wait_until(lambda: next((r for r in ledger_rows(ckpt, logdir) if r["state"] in FINAL_STATES
                                       and r["step"] == STEP), None), args.timeout, f"step {STEP} evaluated", proc,
                         interval=0.05)
        seen = time.time()
        if row["state"] != "evaluated":
            raise RuntimeError(f"step {STEP} {row['state']}: {row['reason']}\n{proc.output()[-3000:]}")
        rchar_after = watch.rchar()
        at_point = {rank: dict(s) for rank, s in watch.last.items()}
        end = wire.RunFinished(run_id=RUN_ID, ckpt_dir=str(ckpt), final_step=STEP, reason="completed")
        layout.write_run_end(ckpt, end.encode().decode())
        try:
            code = proc.wait(args.timeout)
        except AssertionError as exc:
            raise RuntimeError(str(exc)) from None
        if code != 0:
            raise RuntimeError(f"evald exited {code}:\n{proc.output()[-3000:]}")
    finally:
        watch.stopped.set()
        watch.join()
        if proc.popen.poll() is None:
            proc.kill()
        shutil.rmtree(sockets, ignore_errors=True)
    run = run_dir(ckpt, logdir)
    scalars = {tag: scalar_points(run, tag)[0][2] for tag in
               ("eval/loss", "evald/lag_s", "evald/load_s", "evald/verify_s", "evald/evaluate_s")}
    logs = proc.output() + "".join(p.read_text(errors="replace") for p in sorted(msrun_logs.glob("worker_*.log")))
    read_logged = {int(m[1]): int(m[3]) for m in READ_LINE.finditer(logs) if int(m[2]) == degree}
    ranks = []
    for rank in range(degree):
        ranks.append({"rank": rank, "rss_before_commit": before[rank]["rss"], "build_peak": before[rank]["build_hwm"],
                      "peak": watch.last[rank]["VmHWM"], "peak_at_point": at_point[rank]["VmHWM"],
                      "max_sampled_rss": watch.max_rss[rank], "bytes_read_logged": read_logged.get(rank),
                      "rchar_delta": rchar_after[rank] - before[rank]["rchar"]})
    return {"name": name, "degree": degree, "model": kwargs, "ready_s": ready_s, "write_s": committed - write_started,
            "commit_time": row["commit_time"], "committed_wall": committed, "seen_wall": seen,
            "admitted_at": row["seen_at"], "started_at": row["started_at"], "finished_at": row["finished_at"],
            "scalars": scalars, "ranks": ranks, "work": str(work / name)}


def time_reads(ckpt: Path, shapes: dict, degree: int, reps: int) -> list[dict]:
    """tp_load.read_rank of each rank's share from the snapshot, in this process (page cache warm)."""
    specs = {n: (local_shape(s, c, degree), np.dtype(np.float32)) for n, (s, c) in shapes.items()}
    out = []
    for rank in range(degree):
        times, nbytes = [], 0
        for _ in range(reps):
            begun = time.perf_counter()
            read = tp_load.read_rank(ckpt / group_name(STEP, WRITTEN_TP), PARTS, specs, degree, rank,
                                     share=(rank, degree))   # its slices and its share of the files' digests
            times.append(time.perf_counter() - begun)
            nbytes = read.bytes_read
            del read
        out.append({"rank": rank, "read_s": statistics.median(times), "read_s_all": times, "bytes_read": nbytes})
    return out


# --- the table -------------------------------------------------------------------------------------

def table(results: list[dict]) -> tuple[str, dict]:
    head = ("| TP | rank | share MiB | read MiB | peak RSS MiB | baseline MiB | (peak - baseline) / share | "
            "RSS before commit MiB | (peak - RSS before) / share | build peak MiB | commit to point s | "
            "read s (one rank) | ratio |\n|" + "---|" * 13)
    lines, worst_mem, worst_time = [head], 0.0, 0.0
    for r in results:
        big, tiny = r["run"], r["baseline"]
        for rank in big["ranks"]:
            base = tiny["ranks"][rank["rank"]]["peak"]
            read = r["reads"][rank["rank"]]
            mem = (rank["peak"] - base) / r["share"]
            lag = big["scalars"]["evald/lag_s"]
            ratio = lag / read["read_s"]
            worst_mem, worst_time = max(worst_mem, mem), max(worst_time, ratio)
            logged = rank["bytes_read_logged"]
            read_mib = (f"{logged / MiB:.1f}" if logged is not None else
                        f"{rank['rchar_delta'] / MiB:.1f} (rchar)")
            lines.append(f"| {big['degree']} | {rank['rank']} | {r['share'] / MiB:.1f} | {read_mib} | "
                         f"{rank['peak'] / MiB:.0f} | {base / MiB:.0f} | **{mem:.2f}** | "
                         f"{rank['rss_before_commit'] / MiB:.0f} | "
                         f"{(rank['peak'] - rank['rss_before_commit']) / r['share']:.2f} | "
                         f"{rank['build_peak'] / MiB:.0f} | {lag:.2f} | {read['read_s']:.3f} | **{ratio:.1f}** |")
    return "\n".join(lines), {"worst_memory_ratio": worst_mem, "worst_time_ratio": worst_time}


def breakdown(results: list[dict]) -> str:
    lines = ["| TP | commit to seen s | seen to started s | load s | verify s | evaluate s | finished to point s* | "
             "commit to point s (evald/lag_s) | seen by the bench s | eval/loss | network ready s |",
             "|" + "---|" * 11]
    for r in results:
        big = r["run"]
        s = big["scalars"]
        commit = big["commit_time"]
        work = s["evald/load_s"] + s["evald/verify_s"] + s["evald/evaluate_s"]
        lines.append(f"| {big['degree']} | {big['admitted_at'] - commit:.2f} | {big['started_at'] - big['admitted_at']:.2f} | "
                     f"{s['evald/load_s']:.2f} | {s['evald/verify_s']:.2f} | {s['evald/evaluate_s']:.2f} | "
                     f"{s['evald/lag_s'] - (big['started_at'] - commit) - work:.2f} | {s['evald/lag_s']:.2f} | "
                     f"{big['seen_wall'] - big['committed_wall']:.2f} | {s['eval/loss']:.4f} | {big['ready_s']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tp_group", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--degrees", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    p.add_argument("--baseline-hidden", type=int, default=32)
    p.add_argument("--subset-size", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--reads", type=int, default=3)
    p.add_argument("--settle", type=float, default=3.0, help="seconds after the network is ready, before the commit")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, snapshots)")
    args = p.parse_args(argv)

    load_before = os.getloadavg()
    began = time.time()
    work = Path(tempfile.mkdtemp(prefix="evald-bench-tp-", dir=args.dir))
    big_kwargs, tiny_kwargs = model_kwargs(args, args.hidden), model_kwargs(args, args.baseline_hidden)
    big_shapes, tiny_shapes = shapes_of(big_kwargs), shapes_of(tiny_kwargs)
    weights, cuts = make_weights(big_kwargs)
    tiny_weights, tiny_cuts = make_weights(tiny_kwargs)
    total = sum(a.nbytes for a in weights.values())
    print(f"model: {len(weights)} tensors, {total / MiB:.1f} MiB fp32 ({big_kwargs}); baseline model "
          f"{sum(a.nbytes for a in tiny_weights.values()) / MiB:.2f} MiB (hidden {args.baseline_hidden}); "
          f"snapshot: evald's parts at TP {WRITTEN_TP}; work directory {work}", flush=True)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in load_before)}", flush=True)
    results = []
    try:
        for degree in args.degrees:
            tiny = run_once(work, f"tp{degree}-baseline", degree, tiny_kwargs, tiny_weights, tiny_cuts, args)
            print(f"TP {degree} baseline run: peaks {[round(r['peak'] / MiB) for r in tiny['ranks']]} MiB", flush=True)
            big = run_once(work, f"tp{degree}", degree, big_kwargs, weights, cuts, args)
            reads = time_reads(Path(big["work"]) / "ckpt", big_shapes, degree, args.reads)
            results.append({"run": big, "baseline": tiny, "reads": reads, "share": share_bytes(big_shapes, degree),
                            "baseline_share": share_bytes(tiny_shapes, degree)})
            print(f"TP {degree}: commit to point {big['scalars']['evald/lag_s']:.2f} s, peaks "
                  f"{[round(r['peak'] / MiB) for r in big['ranks']]} MiB, reads "
                  f"{[round(r['read_s'], 3) for r in reads]} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    text, worst = table(results)
    print()
    print(text)
    print()
    print(breakdown(results))
    print("\n* finished to point: what evald/lag_s holds beyond commit-to-started and load + verify + evaluate "
          "(the group's answer, the ledger and TensorBoard writes)")
    print(f"\nmodel bytes {total} ({total / MiB:.1f} MiB); run {time.strftime('%Y-%m-%d %H:%M', time.gmtime(began))}"
          f"-{time.strftime('%H:%M', time.gmtime())} UTC; load average before "
          f"{' '.join(f'{v:.2f}' for v in load_before)}, after {' '.join(f'{v:.2f}' for v in load_after)}")
    mem_ok, time_ok = worst["worst_memory_ratio"] <= 1.3, worst["worst_time_ratio"] <= 1.3
    print(f"goal (peak - baseline) / share <= 1.3: worst {worst['worst_memory_ratio']:.2f} -> "
          f"{'met' if mem_ok else 'NOT met'}")
    print(f"goal commit to point <= 1.3 x one rank's read: worst {worst['worst_time_ratio']:.1f} -> "
          f"{'met' if time_ok else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "model_bytes": total,
                                         "load_before": load_before, "load_after": load_after, "results": results,
                                         **worst}, indent=1))
    return 0 if mem_ok and time_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
