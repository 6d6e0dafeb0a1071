"""MindFormers 2.0's checkpoint layout, written by MindSpore's own ``save_checkpoint``.

MindFormers is not in the project's .venv (tests/e2e/test_mindformers_recipe.py runs the real
one, in .venv-mindformers), so for the other tests these files are written the way its
``CheckpointMonitor`` writes them (mindformers/core/callback/callback.py, 2.0.0), with
the same calls, names, contents and permissions:

* ``OUT/checkpoint/rank_0/<prefix>_rank_0-<E>_<S>.<fmt>``: ``save_checkpoint`` of the train
  cell: the weights, Adam's moments (``adam_m.*``, ``adam_v.*``), the optimizer's
  ``global_step``, the loss-scale state (``scale_sense``, ``loss_scaling_manager.*``), and
  ``append_dict`` ``{epoch_num, step_num, global_step, loss_scale}``;
  ``OUT/checkpoint/rank_0/meta.json``: ``{"last_epoch", "last_step", "last_ckpt_file"}``, 0640;
* ``OUT/checkpoint_network/rank_0/<prefix>_rank_0-network-<E>_<S>.<fmt>``: the weights only;
* directories 0750; ``save_checkpoint`` leaves every checkpoint file 0400 itself.

The weights at global step G are ``tests.faults.weights_for_step(G)`` in both files.
``python -m tests.mindformers_fixtures SPEC.json --weights W.npz`` (one mindspore import
for many files); ``write`` runs it from a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import faults  # noqa: E402
from tests.harness import PYTHON, base_env  # noqa: E402

PREFIX = "llama"
DIR_MODE, META_MODE = 0o750, 0o640


def full_name(epoch: int, step: int, fmt: str = "ckpt", prefix: str = PREFIX) -> str:
    return f"checkpoint/rank_0/{prefix}_rank_0-{epoch}_{step}.{fmt}"


def network_name(epoch: int, step: int, fmt: str = "ckpt", prefix: str = PREFIX) -> str:
    return f"checkpoint_network/rank_0/{prefix}_rank_0-network-{epoch}_{step}.{fmt}"


def save(out: Path, epoch: int, step: int, global_step: int, *, fmt: str = "ckpt", full: bool = True,
         network: bool = True, step_num: bool = True) -> dict[str, Any]:
    """One save of CheckpointMonitor, as a spec for ``write``."""
    return {"out": str(out), "epoch": epoch, "step": step, "global": global_step, "fmt": fmt, "full": full,
            "network": network, "step_num": step_num}


def write(saves: list[dict[str, Any]], work_dir: Path) -> None:
    """Write every save (one subprocess: MindSpore is imported once)."""
    faults.demo_weights()
    spec = Path(work_dir) / f"mindformers-saves-{time.time_ns()}.json"
    spec.write_text(json.dumps(saves))
    subprocess.run([PYTHON, "-m", "tests.mindformers_fixtures", str(spec), "--weights",
                    str(faults._weights_cache())], env=base_env(), cwd=str(REPO), check=True, timeout=300)


def _mkdirs(out: Path, sub: str) -> Path:
    path = out.parent
    for part in [out.name, *sub.split("/")]:
        path = path / part
        if not path.is_dir():
            path.mkdir()
            os.chmod(path, DIR_MODE)  # mkdir's mode is filtered by the umask
    return path


def _save(save_spec: dict[str, Any], base: dict[str, np.ndarray]) -> None:
    import mindspore as ms

    out, fmt = Path(save_spec["out"]), save_spec["fmt"]
    epoch, step, global_step = save_spec["epoch"], save_spec["step"], save_spec["global"]
    weights = faults.weights_for_step(global_step, base)
    if save_spec["full"]:
        directory = _mkdirs(out, "checkpoint/rank_0")
        rng = np.random.default_rng(global_step)
        params = [{"name": n, "data": ms.Tensor(a)} for n, a in weights.items()]
        for state in ("adam_m.", "adam_v."):
            params += [{"name": state + n, "data": ms.Tensor((1e-3 * rng.standard_normal(a.shape)).astype(a.dtype))}
                       for n, a in weights.items()]
        params += [{"name": "global_step", "data": ms.Tensor(np.array([global_step], np.int32))},
                   {"name": "scale_sense", "data": ms.Tensor(np.array(1024.0, np.float32))},
                   {"name": "current_iterator_step", "data": ms.Tensor(np.array(global_step, np.int32))},
                   {"name": "last_overflow_iterator_step", "data": ms.Tensor(np.array(0, np.int32))}]
        append = {"epoch_num": epoch, "global_step": global_step, "loss_scale": 1024.0}
        if save_spec["step_num"]:
            append["step_num"] = global_step
        name = Path(full_name(epoch, step, fmt)).name
        ms.save_checkpoint(params, str(directory / name), append_dict=append, format=fmt)
        meta = directory / "meta.json"
        tmp = directory / f"tmp{time.time_ns()}"  # MindFormers: NamedTemporaryFile in the directory, replace
        tmp.write_text(json.dumps({"last_epoch": epoch, "last_step": step, "last_ckpt_file": name}))
        os.replace(tmp, meta)
        os.chmod(meta, META_MODE)
    if save_spec["network"]:
        directory = _mkdirs(out, "checkpoint_network/rank_0")
        params = [{"name": n, "data": ms.Tensor(a)} for n, a in weights.items()]
        ms.save_checkpoint(params, str(directory / Path(network_name(epoch, step, fmt)).name), format=fmt)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mindformers_fixtures")
    parser.add_argument("spec")
    parser.add_argument("--weights", required=True)
    args = parser.parse_args(argv)
    with np.load(args.weights) as data:
        base = {name: data[name] for name in data.files}
    for save_spec in json.loads(Path(args.spec).read_text()):
        _save(save_spec, base)
        print(f"saved epoch {save_spec['epoch']} step {save_spec['step']} ({save_spec['global']})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
