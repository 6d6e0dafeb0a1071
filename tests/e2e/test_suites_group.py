"""A benchmark suite on an eval group (`--device 0,1`, a real msrun group on CPU) gives the numbers of
one device, bit for bit: the per-sample files of both are byte-identical. The group's cells are
backfilled, so every rank also loads each step's weights on command (SWAP) before scoring its share."""

from __future__ import annotations

import json
import subprocess

from examples.tiny_lm.benchmarks import write_benchmarks
from tests import faults
from tests.harness import PYTHON, REPO, base_env, run_dir, scalar_points

TIMEOUT_S = 900


def test_a_suite_on_two_eval_ranks_gives_the_per_sample_bytes_of_one(tmp_path, procs):
    include = write_benchmarks(tmp_path / "bench", next_line_count=30, bpb_docs_per_set=2)
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20):
        faults.commit(ckpt, step)
    config = tmp_path / "evald.toml"
    config.write_text(f'[suites.mc]\ntasks = ["stdlib_next_line"]\ninclude_path = ["{include}"]\nbatch_size = 4\n'
                      f'[suites.bpb]\ntasks = ["bpb_email", "bpb_http"]\ninclude_path = ["{include}"]\n')
    env = {"HF_DATASETS_CACHE": str(tmp_path / "hf")}
    one = faults.start(tmp_path, ckpt, "--config", str(config), "--lag-policy", "all", "--idle-exit-s", "3",
                       "--logdir", str(tmp_path / "one"), env=env, name="one")
    procs.append(one)
    assert one.wait(TIMEOUT_S) == 0, one.output()[-3000:]

    # the group's run: validation first (one device), then both suites backfilled on two ranks
    two = tmp_path / "two"
    first = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "3", "--logdir", str(two),
                         env=env, name="two-validation")
    procs.append(first)
    assert first.wait(TIMEOUT_S) == 0, first.output()[-3000:]
    for suite in ("mc", "bpb"):
        out = subprocess.run([PYTHON, "-m", "evald", "backfill", "--suite", suite, "--ckpt-dir", str(ckpt),
                              "--logdir", str(two)], cwd=REPO, env=base_env(env), capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0 and "2 retained checkpoint(s)" in out.stdout, out.stdout + out.stderr
    group = faults.start(tmp_path, ckpt, "--config", str(config), "--device", "0,1", "--lag-policy", "all",
                         "--idle-exit-s", "3", "--logdir", str(two), "--group",
                         json.dumps({"log_dir": str(tmp_path / "msrun")}), env=env, name="two")
    procs.append(group)
    assert group.wait(TIMEOUT_S) == 0, group.output()[-3000:]

    runs = {name: run_dir(ckpt, tmp_path / name) for name in ("one", "two")}
    files = {name: sorted(p.relative_to(runs[name]) for p in (runs[name] / "samples").rglob("*.jsonl.gz"))
             for name in runs}
    assert files["one"] == files["two"] and len(files["one"]) == 2 * 3   # 2 steps x (1 + 2 tasks)
    for rel in files["one"]:
        assert (runs["one"] / rel).read_bytes() == (runs["two"] / rel).read_bytes(), rel
    for tag in ("eval/mc/stdlib_next_line/acc", "eval/bpb/bpb_email/bits_per_byte"):
        values = [sorted((s, v) for s, _, v in scalar_points(runs[name], tag)) for name in runs]  # backfill: newest first
        assert values[0] == values[1] and len(values[0]) == 2, tag
    worker_1 = (tmp_path / "msrun" / "worker_1.log").read_text(errors="replace")
    assert "rank 0 ended the group" in worker_1
