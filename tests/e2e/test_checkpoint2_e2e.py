"""A real evald on MindFormers Checkpoint 2.0 directories written by MindFormers' own writer.

``tests/mindformers_ckpt2_writer.py`` runs ``mindformers.checkpoint.save_checkpoint`` (mindformers
2.0.0, in .venv-mindformers) under a 2-rank ``msrun`` job on CPU: each rank holds a Megatron-style
tensor-parallel half of every 2-D weight of the tiny_lm demo model at ``faults.weights_for_step``.
(Two stand-ins, both said in that file: the layouts are given to MindFormers' ``build_sharded_tensor``
because CPU refuses the semi-auto-parallel compile they normally come from, and its ``barrier_world``
is an AllReduce because ``comm_func.barrier`` is ``Unsupported op [Barrier] on CPU``.)

* evald started before the iterations exist evaluates each committed iteration once, at its
  iteration's step, with the loss of an in-process evaluation of the same weights;
* an iteration MindFormers has not committed (its tracker file names an older one, a rank's shards
  and common.json missing: a save that died) is never evaluated;
* the optimizer's ``-opt-`` files are never read (they are garbage here, and nothing fails).
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from evald.files.recognise import CHECKPOINT2
from tests import faults
from tests.e2e.reference import mean_token_loss
from tests.harness import REPO, scalar_points, wait_for
from tests.mindformers_ckpt2_writer import write

MF_PYTHON = REPO / ".venv-mindformers" / "bin" / "python"
FACTORIES = ("--model-factory", "examples.tiny_lm.model:build_model", "--model-kwargs", '{"seq_len": 64}',
             "--data-factory", "examples.tiny_lm.data:validation_windows", "--data-kwargs", '{"seq_len": 64}',
             "--app-dir", str(REPO))
STEPS = [10, 20]

pytestmark = [pytest.mark.heavy, pytest.mark.skipif(not MF_PYTHON.exists(), reason="needs .venv-mindformers (scripts/setup_mindformers.sh)")]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """OUTPUT/checkpoint as MindFormers' writer leaves it after two saves by a 2-rank job."""
    work = tmp_path_factory.mktemp("mf2")
    write(work / "output" / "checkpoint", STEPS, world=2, work=work)
    return work / "output" / "checkpoint"


def in_process_loss(weights: dict[str, np.ndarray], indices: list[int]) -> float:
    """An independent evaluation: PyNative, float64 log-softmax in numpy, its own batching."""
    import mindspore as ms

    from examples.tiny_lm import data, model

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = model.build_model(seq_len=64)
    params = dict(net.parameters_and_names())
    assert set(params) == set(weights)
    for name, array in weights.items():
        params[name].set_data(ms.Tensor(array))
    return mean_token_loss(net, data.validation_windows(seq_len=64)[np.asarray(indices)], batch_size=7)


def test_committed_iterations_are_evaluated_once_at_their_step_and_a_half_written_one_never(
        tmp_path, procs, written):
    out = tmp_path / "output"
    checkpoint = out / "checkpoint"
    checkpoint.mkdir(parents=True)
    logs = tmp_path / "tensorboard"
    evald = faults.start(tmp_path, out, *FACTORIES, "--lag-policy", "all", "--logdir", str(logs))
    procs.append(evald)
    wait_for(lambda: "evaluation network ready" in evald.output(), 240, "evald up")

    # The iterations arrive before the tracker that commits them (as MindFormers writes them).
    for step in STEPS:
        shutil.copytree(written / f"iteration_{step:08d}", checkpoint / f"iteration_{step:08d}")
    # A save that died at iteration 30: rank 0's files only, no common.json, and the tracker never moved.
    half = checkpoint / "iteration_00000030"
    half.mkdir()
    for f in (written / "iteration_00000020").glob("*-0000000-0000002.safetensors"):
        shutil.copy(f, half / f.name)
    shutil.copy(written / "iteration_00000020" / "metadata.json", half / "metadata.json")
    for opt in checkpoint.glob("iteration_*/*-opt-*.safetensors"):  # never read: garbage does no harm
        opt.chmod(0o600)
        opt.write_bytes(b"not the optimizer" * 100)
    assert faults.ledger_rows(out, logs) == []
    shutil.copy(written / "latest_checkpointed_iteration.txt", checkpoint / "latest_checkpointed_iteration.txt")
    assert (checkpoint / "latest_checkpointed_iteration.txt").read_text() == "20"

    wait_for(lambda: len(faults.ledger_rows(out, logs)) == 2
             and all(r["state"] == "evaluated" for r in faults.ledger_rows(out, logs)), 240,
             "both committed iterations evaluated")
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]

    rows = {r["step"]: r for r in faults.ledger_rows(out, logs)}
    assert {s: (r["key"], r["kind"], r["state"]) for s, r in rows.items()} == {
        s: (f"checkpoint/iteration_{s:08d}", CHECKPOINT2, "evaluated") for s in STEPS}
    files = faults.ledger_files(out, logs)
    assert "checkpoint/iteration_00000030" not in files  # never judged: MindFormers never committed it
    run = faults.run_dir(out, logs)
    indices = json.loads((run / "subset.json").read_text())["indices"]
    losses = {s: v for s, _, v in scalar_points(run, "eval/loss")}
    assert sorted(losses) == STEPS
    for step in STEPS:
        reference = in_process_loss(faults.weights_for_step(step), indices)
        assert losses[step] == pytest.approx(reference, rel=1e-5), (step, losses[step], reference)
    assert "Traceback" not in evald.output()
