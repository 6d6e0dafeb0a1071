"""Issue 2: a real training job with EvaldCallback and a real evald, side by side."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from tests.e2e.reference import mean_token_loss
from tests.harness import (REPO, committed_steps, hook_stats, raw_scalar_steps, run_dir, scalar_points, start_evald,
                           text_events)


@pytest.mark.smoke
def test_trainer_and_evald_side_by_side(side_by_side_run):
    # The session's run (tests/e2e/conftest.py): evald is given no directory and no model, it learns both from
    # the trainer's announcement; a Model.train run of 60 steps, a checkpoint every 20.
    run = side_by_side_run
    ckpt = run.ckpt
    assert run.trainer_code == 0, run.trainer_output[-3000:]
    assert run.evald_code == 0, run.evald_output[-3000:]

    committed = committed_steps(ckpt)
    assert committed == [20, 40, 60]
    points = scalar_points(run_dir(ckpt), "eval/loss")
    assert [step for step, _, _ in points] == committed  # exactly one point per checkpoint
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == committed
    assert all(math.isfinite(value) for _, _, value in points)
    # walltime is the checkpoint's commit time, not the time evald got to it
    from evald.contracts.layout import read_manifest, step_dir_name

    for step, wall_time, _ in points:
        assert wall_time == pytest.approx(read_manifest(ckpt / step_dir_name(step)).commit_time, abs=1e-3)
    for tag in ("eval/perplexity", "eval/accuracy", "sample/greedy/distinct_1", "sample/sampled/rep_2",
                "sample/greedy/topic_consistency", "train/loss", "train/grad_norm", "train/learning_rate",
                "train/step_time_s", "train/samples_per_s", "train/tokens_per_s", "train/eta_s",
                "evald/load_s", "evald/evaluate_s",
                "evald/lag_steps", "evald/lag_s", "evald/queue_depth", "evald/skipped_total"):
        assert scalar_points(run_dir(ckpt), tag), f"{tag} missing"
    for mode in ("greedy", "sampled"):  # a few generated samples as text at every evaluation
        samples = text_events(run_dir(ckpt), f"sample/{mode}/text_summary")
        assert [step for step, _ in samples] == committed and all("->" in text for _, text in samples)
    summary = json.loads((run_dir(ckpt) / "summary.json").read_text())
    assert summary["final_step"] == 60 and summary["checkpoints"] == {"evaluated": 3}


def test_checkpoint_committed_while_evald_was_down_is_evaluated_at_start(tmp_path, endpoints, procs,
                                                                          finished_training):
    ckpt = finished_training.ckpt  # trained while no evald ran (tests/e2e/conftest.py)
    assert committed_steps(ckpt) == [10, 20, 30, 40]

    evald = start_evald(tmp_path, endpoints, ["--ckpt-dir", str(ckpt), "--lag-policy", "all",
                                              "--idle-exit-s", "2", "--endpoint", "none"])
    procs.append(evald)
    assert evald.wait(180) == 0, evald.output()[-3000:]
    assert [s for s, _, _ in scalar_points(run_dir(ckpt), "eval/loss")] == [10, 20, 30, 40]


@pytest.mark.smoke
def test_reported_loss_equals_in_process_evaluation(tmp_path, endpoints, procs, finished_training):
    ckpt = finished_training.ckpt
    evald = start_evald(tmp_path, endpoints, ["--ckpt-dir", str(ckpt), "--idle-exit-s", "2", "--endpoint", "none"],
                        cpu=None)
    procs.append(evald)
    assert evald.wait(180) == 0, evald.output()[-3000:]
    [(step, _, reported)] = scalar_points(run_dir(ckpt), "eval/loss")
    assert step == 40  # the default lag policy, latest: the newest of the four checkpoints

    # Which samples evald used, the documented way: `evald subset --logdir LOGDIR`.
    shown = subprocess.run([sys.executable, "-m", "evald", "subset", "--logdir", str(run_dir(ckpt))],
                           capture_output=True, text=True, check=True, cwd=REPO)
    indices = [int(line) for line in shown.stdout.split()]
    recorded = json.loads((run_dir(ckpt) / "subset.json").read_text())
    assert len(indices) == 64 and indices == recorded["indices"] and recorded["sha256"] in shown.stderr
    [(_, text)] = text_events(run_dir(ckpt), "evald/subset/text_summary")
    assert recorded["sha256"][:12] in text  # the hash is in TensorBoard beside every point
    reference = in_process_loss(ckpt, step, indices)
    assert abs(reported - reference) / reference < 1e-5, (reported, reference)
    # the first 64 samples are not what evald evaluated: without the indices no check can match
    assert abs(in_process_loss(ckpt, step, list(range(64))) - reported) / reported > 1e-3


def in_process_loss(ckpt, step, indices):
    """An independent evaluation: PyNative mode, float64 log-softmax in numpy, its own batching."""
    import mindspore as ms
    from safetensors.numpy import load_file

    from evald.contracts.layout import step_dir_name
    from examples.tiny_lm import data, model

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = model.build_model(seq_len=64)
    weights = load_file(str(ckpt / step_dir_name(step) / "weights.safetensors"))
    params = dict(net.parameters_and_names())
    for name, array in weights.items():
        params[name].set_data(ms.Tensor(array))
    chosen = data.validation_windows(seq_len=64)[np.asarray(indices)]
    return mean_token_loss(net, chosen, batch_size=7)  # a different batch size than evald's on purpose


def test_training_without_evald_finishes_normally(finished_training):
    ckpt = finished_training.ckpt  # the session's run: custom loop, 40 steps, nobody listening; it exited 0
    output = finished_training.output
    assert "Traceback" not in output and " ERROR " not in output
    stats = hook_stats(output)
    assert stats["hook_errors"] == 0 and stats["snapshots_skipped_busy"] == 0
    assert stats["snapshots_written"] == 4
    assert committed_steps(ckpt) == [10, 20, 30, 40]
