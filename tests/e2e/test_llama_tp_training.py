"""The LLaMA-style example trained by a real 4-rank tensor-parallel msrun job on CPU, with EvaldHook
writing parts (issue 29, item 2), then evaluated by 1, 2 and 4 tensor-parallel ranks.

* every rank's training loss equals a single-device replay of the same training (the only
  collective is AllReduce SUM, with Megatron's f/g backward rules);
* the parts of each snapshot, assembled, equal the replay's whole snapshot of the same step;
* ``evald --device 0,1[,2,3] --tensor-parallel N`` (N = 2, 4; and one device) reads only each rank's slices
  from the TP-4 parts; eval/loss, a suite's per-sample log-likelihoods and a served completion are equal
  across the three and equal to one device's network in process on the assembled weights
  (tests/e2e/test_tensor_parallel_group.evaluate_at_degrees).
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evald.contracts import layout
from evald.contracts.partition import group_name
from evald.files.recognise import EVALD, PARTS
from evald.pipeline.swap.tp_load import stored_params
from evald.files.slices import plan_reads, read_region
from tests.e2e.test_tensor_parallel_group import evaluate_at_degrees
from tests.harness import REPO, base_env

pytestmark = pytest.mark.heavy  # minutes of several processes: CI's third stage (./scripts/test.sh --long)

TRAIN = REPO / "examples" / "llama_tp" / "train.py"
STEPS, EVERY, WORKERS = 6, 3, 4
MODEL = {"vocab": 256, "hidden": 64, "layers": 2, "heads": 4, "ffn": 128, "seq_len": 64}


def _losses(text: str) -> dict[tuple[int, int], float]:
    return {(int(r), int(s)): float(v) for r, s, v in re.findall(r"rank (\d+) of \d+: step (\d+) loss (\S+)", text)}


def _whole(path: Path, kind: str) -> dict[str, np.ndarray]:
    out = {}
    for name, param in stored_params(path, kind).items():
        want = tuple((0, d) for d in param.shape)
        out[name] = read_region(plan_reads(param.pieces, want, np.dtype(param.dtype).itemsize), want,
                                np.dtype(param.dtype))[0]
    return out


def test_a_tp4_training_job_is_evaluated_by_one_two_and_four_tensor_parallel_ranks(tmp_path, procs):
    env = base_env({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    msrun = Path(sys.executable).parent / "msrun"
    job = subprocess.run([str(msrun), f"--worker_num={WORKERS}", f"--local_worker_num={WORKERS}",
                          f"--master_port={port}", f"--log_dir={tmp_path / 'train'}", "--join=True",
                          "--cluster_time_out=600", str(TRAIN), str(tmp_path / "tp"), "--steps", str(STEPS),
                          "--every", str(EVERY)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=1800)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((tmp_path / "train").glob("worker_*.log")))
    assert job.returncode == 0, logs[-4000:]
    replay = subprocess.run([sys.executable, str(TRAIN), str(tmp_path / "one"), "--steps", str(STEPS), "--every",
                             str(EVERY)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert replay.returncode == 0, replay.stderr[-3000:]

    tp, one = _losses(logs), _losses(replay.stdout)
    assert sorted({r for r, _ in tp}) == list(range(WORKERS)) and len(one) == STEPS
    for (rank, step), loss in tp.items():
        assert math.isclose(loss, one[(0, step)], rel_tol=1e-5), (rank, step, loss, one[(0, step)])

    for step in range(EVERY, STEPS + 1, EVERY):
        parts = _whole(tmp_path / "tp" / group_name(step, WORKERS), PARTS)
        whole = _whole(tmp_path / "one" / layout.step_dir_name(step), EVALD)
        assert parts.keys() == whole.keys()
        for name in whole:
            np.testing.assert_allclose(parts[name], whole[name], rtol=1e-4, atol=1e-6, err_msg=name)

    # evaluated by 1, 2 and 4 tensor-parallel ranks: loss, a suite and a served completion (the last step's)
    steps = list(range(EVERY, STEPS + 1, EVERY))
    evaluate_at_degrees(tmp_path, procs, tmp_path / "tp", steps,
                        _whole(tmp_path / "tp" / group_name(steps[-1], WORKERS), PARTS), factories=())
