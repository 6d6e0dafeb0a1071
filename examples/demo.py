"""The demo: train the tiny byte-level GPT for a minute or two with evald evaluating beside it.

    ./scripts/demo.sh [--steps 400] [--every 50] [--out runs/demo]

evald is started first with no knowledge of the run: it learns the checkpoint
directory, the model and the validation data from the trainer's announcement.
The two processes are pinned to different cores (DEVELOPERS.md: two
MindSpore processes on two cores must be pinned).

Two benchmark suites run on every evaluated checkpoint beside the loss
(docs/benchmarks.md), built offline at start from standard-library sources the
model never trained on (examples/tiny_lm/benchmarks.py): ``next_line``, a
4-way multiple choice "which line really follows this one" (acc, acc_norm),
and ``bpb``, bits per byte on 13 held-out standard-library packages.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--out", default="runs/demo")
    return p


def checkpoint_steps(steps: int, every: int) -> list[int]:
    """The steps the demo's run has checkpoints of: every ``every``-th, and the last (the hook's final snapshot)."""
    return sorted(set(range(every, steps + 1, every)) | {steps})


def main() -> int:
    args = parser().parse_args()

    out = (REPO / args.out).resolve()
    fresh_output_dir(out)
    sockets = out / "sockets"
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               EVALD_SOCKET_DIR=str(sockets),  # private endpoints for this demo
               HF_DATASETS_CACHE=str(out / "datasets-cache"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    two_cores = len(os.sched_getaffinity(0)) >= 2
    config = write_suites(out)
    evald_cmd = [sys.executable, "-m", "evald", "--device", "0", "--lag-policy", "all", "--config", str(config)]
    trainer_cmd = [sys.executable, "-m", "examples.tiny_lm.train", "--ckpt-dir", str(out / "ckpt"),
                   "--steps", str(args.steps), "--every", str(args.every)]
    if two_cores:
        evald_cmd += ["--cpu-affinity", "1"]
        trainer_cmd += ["--cpu", "0"]

    print(f"[demo] starting evald: {' '.join(evald_cmd[1:])}", flush=True)
    with open(out / "evald.log", "wb") as evald_log:
        evald = subprocess.Popen(evald_cmd, env=env, cwd=REPO, stdout=evald_log, stderr=subprocess.STDOUT)
        print(f"[demo] training {args.steps} steps, a snapshot every {args.every} (evald log: {out}/evald.log)",
              flush=True)
        started = time.time()
        trainer = subprocess.run(trainer_cmd, env=env, cwd=REPO)
        print(f"[demo] training exited with {trainer.returncode} after {time.time() - started:.0f}s; "
              f"waiting for evald to evaluate the final checkpoint", flush=True)
        try:
            evald_rc = evald.wait(timeout=300)
        except subprocess.TimeoutExpired:
            evald.terminate()
            evald_rc = evald.wait(timeout=30)
    print("[demo] evald's evaluations:")
    for line in (out / "evald.log").read_text(errors="replace").splitlines():
        if " step " in line and ("loss=" in line or " suite " in line):
            print("   ", line.split(" INFO ", 1)[-1])
    from evald.daemon.run_dir import default_logdir, find_run

    ckpt = out / "ckpt"
    logdir = default_logdir(ckpt)  # beside the checkpoint directory; several runs can share it
    run = find_run(ckpt, logdir)
    where = f" (run {run.name!r}: {run.name}/train and {run.name}/eval, loss on one chart)" if run else ""
    if run is not None:
        print(lag_reached(run.path / "ledger.sqlite"))
    print(f"\n[demo] TensorBoard events are in {logdir}{where}")
    print(f"[demo] view them with:  .venv/bin/tensorboard --logdir {logdir} --host 127.0.0.1")
    print(f"[demo] the run's state:  .venv/bin/evald status --ckpt-dir {ckpt}")
    return trainer.returncode or evald_rc


def fresh_output_dir(out: Path) -> None:
    """A demo starts from scratch: a previous run in ``out`` is removed, saying so (the user may have
    wanted to keep it)."""
    if out.exists():
        print(f"[demo] removing the previous demo run in {out} (use --out DIR to keep it)", flush=True)
        shutil.rmtree(out)
    out.mkdir(parents=True)


def lag_reached(ledger_path: Path) -> str:
    """How far behind training the validations were: the first checkpoint's, and the worst."""
    import sqlite3

    db = sqlite3.connect(f"file:{ledger_path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT step, commit_time, finished_at FROM steps WHERE state='evaluated' AND "
                          "commit_time IS NOT NULL ORDER BY step").fetchall()
        newest = [(finished, step) for step, _, finished in rows]
        commits = db.execute("SELECT step, commit_time FROM steps WHERE commit_time IS NOT NULL").fetchall()
    finally:
        db.close()
    if not rows:
        return "[demo] lag: no checkpoint was validated"
    first_step, first_commit, first_done = rows[0]

    def steps_behind(finished: float, step: int) -> int:  # checkpoints committed by then, beyond this one
        return max([s for s, t in commits if t <= finished] + [step]) - step

    worst_s = max(done - commit for _, commit, done in rows)
    worst_steps = max(steps_behind(finished, step) for finished, step in newest)
    return (f"[demo] lag: the first checkpoint (step {first_step}) was validated {first_done - first_commit:.0f}s "
            f"after its commit; at most {worst_s:.0f}s and {worst_steps} step(s) behind the newest checkpoint "
            f"over the run ({len(rows)} validations)")


def write_suites(out: Path) -> Path:
    """The demo's benchmark data (generated here, offline) and the evald TOML that names its suites."""
    from examples.tiny_lm.benchmarks import write_benchmarks

    include = write_benchmarks(out / "benchmarks")
    config = out / "evald.toml"
    config.write_text(f"""# evald's configuration for the demo (docs/benchmarks.md)
tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"

[suites.next_line]
tasks = ["stdlib_next_line"]
include_path = ["{include}"]
limit = 200

[suites.bpb]
tasks = ["stdlib_bpb"]
include_path = ["{include}"]
every_k = 2
""")
    return config


if __name__ == "__main__":
    sys.exit(main())
