"""Evaluation time with 1 and with 2 eval ranks (``evald --device 0`` vs ``--device 0,1``), side by side.

    .venv/bin/python -m bench.eval_ranks [--reps 3] [--checkpoints 4] [--d-model 256] [--layers 4]

One run of checkpoints (the demo GPT, widened; RUN.json and RUN_END.json written, so each
evald evaluates them all and exits) is evaluated by a one-device evald and by a two-rank
eval group, alternately, ``reps`` times, each with a fresh log directory. The one-rank
evald is pinned to core 0, the group's ranks to cores 0 and 1 (``--cpu-affinity 0-1``).
Reported, per arm: the median per-checkpoint evaluation time (load + evaluate, from the
ledger's TensorBoard records), the process wall time (start, compile, all checkpoints),
and the ratios 2 ranks / 1 rank, paired within each repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_checkpoints(ckpt_dir: Path, count: int, d_model: int, layers: int) -> None:
    """Run in a child: the model's weights plus seeded noise per step, in evald's layout."""
    import numpy as np

    from evald.contracts import layout, wire
    from examples.tiny_lm.model import build_model
    from trainer_hooks.host_copy import host_copy_of_weights

    kwargs = {"seq_len": 64, "d_model": d_model, "n_layers": layers}
    base = host_copy_of_weights(build_model(**kwargs))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    run = wire.RunAnnounced(run_id="bench", ckpt_dir=str(ckpt_dir),
                            model_factory=wire.FactorySpec("examples.tiny_lm.model:build_model", kwargs, str(REPO)),
                            data_factory=wire.FactorySpec("examples.tiny_lm.data:validation_windows",
                                                          {"seq_len": 64}, str(REPO)))
    layout.write_run_file(ckpt_dir, run.encode().decode())
    for step in range(1, count + 1):
        rng = np.random.default_rng(step)
        weights = {k: (a + 0.02 * rng.standard_normal(a.shape)).astype(a.dtype) for k, a in base.items()}
        layout.write_checkpoint(ckpt_dir, step * 10, weights, run_id="bench")
    end = wire.RunFinished(run_id="bench", ckpt_dir=str(ckpt_dir), final_step=count * 10, reason="completed")
    layout.write_run_end(ckpt_dir, end.encode().decode())


def evaluate_times(logdir: Path) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    load = {e.step: e.value for e in acc.Scalars("evald/load_s")}
    return [load[e.step] + e.value for e in acc.Scalars("evald/evaluate_s")]


def run_evald(ckpt_dir: Path, logdir: Path, devices: str, cpus: str, args: argparse.Namespace) -> tuple[float, list]:
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), EVALD_SOCKET_DIR=str(logdir.parent / "sockets"))
    cmd = [sys.executable, "-m", "evald", "--device", devices, "--cpu-affinity", cpus, "--ckpt-dir", str(ckpt_dir),
           "--logdir", str(logdir), "--run-name", "bench", "--endpoint", "none", "--lag-policy", "all", "--subset-size",
           str(args.subset_size), "--batch-size", str(args.batch_size), "--generation",
           json.dumps({"prompts": args.prompts, "new_tokens": 16})]
    started = time.monotonic()
    with open(logdir.parent / f"{logdir.name}.log", "wb") as out:
        subprocess.run(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=1800)
    return time.monotonic() - started, evaluate_times(logdir / "bench" / "eval")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--checkpoints", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--subset-size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--make-checkpoints", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.make_checkpoints:
        make_checkpoints(Path(args.make_checkpoints), args.checkpoints, args.d_model, args.layers)
        return 0
    work = Path(tempfile.mkdtemp(prefix="evald-bench-ranks-"))
    ckpt = work / "ckpt"
    subprocess.run([sys.executable, "-m", "bench.eval_ranks", "--make-checkpoints", str(ckpt), "--checkpoints",
                    str(args.checkpoints), "--d-model", str(args.d_model), "--layers", str(args.layers)],
                   cwd=REPO, env=dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO)), check=True)
    arms = {"1 rank": ("0", "0"), "2 ranks": ("0,1", "0-1")}
    results: dict[str, dict[str, list[float]]] = {arm: {"eval": [], "wall": []} for arm in arms}
    for rep in range(args.reps):
        for arm, (devices, cpus) in arms.items():
            wall, evals = run_evald(ckpt, work / f"{arm.replace(' ', '')}-{rep}", devices, cpus, args)
            results[arm]["eval"].append(statistics.median(evals))
            results[arm]["wall"].append(wall)
            print(f"rep {rep} {arm}: per-checkpoint evaluation {statistics.median(evals):.3f} s "
                  f"(all: {', '.join(f'{e:.3f}' for e in evals)}); process {wall:.1f} s", flush=True)
    one, two = results["1 rank"], results["2 ranks"]
    eval_ratio = [b / a for a, b in zip(one["eval"], two["eval"])]
    wall_ratio = [b / a for a, b in zip(one["wall"], two["wall"])]
    print(json.dumps({"args": vars(args), "results": results}, indent=1))
    print("\n| figure | 1 rank | 2 ranks | 2 / 1 |\n|---|---|---|---|")
    print(f"| evaluation per checkpoint (median of reps) | {statistics.median(one['eval']):.3f} s | "
          f"{statistics.median(two['eval']):.3f} s | {statistics.median(eval_ratio):.2f} "
          f"({min(eval_ratio):.2f}-{max(eval_ratio):.2f}) |")
    print(f"| evald process, start to exit | {statistics.median(one['wall']):.1f} s | "
          f"{statistics.median(two['wall']):.1f} s | {statistics.median(wall_ratio):.2f} "
          f"({min(wall_ratio):.2f}-{max(wall_ratio):.2f}) |")
    print(f"\nwork directory: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
