"""Checkpoint 2.0 directories written by MindFormers' own writer, ``mindformers.checkpoint.save_checkpoint``.

Run with the MindFormers venv's python (mindformers 2.0.0, .venv-mindformers), alone for a
single-card save or under ``msrun --worker_num=W`` for a W-rank save:

    python tests/mindformers_ckpt2_writer.py OUT_CHECKPOINT_DIR WEIGHTS.npz STEP [STEP ...]

For each STEP it calls ``save_checkpoint(iteration=STEP, network, optimizer, common_info,
user_prefix="llama", save_checkpoint_path=OUT_CHECKPOINT_DIR, sharded_tensor_metas=...)`` exactly as
MindFormers' ``CheckpointMonitor._save_megatron_ckpt_file_format`` does (mindformers 2.0.0,
core/callback/callback.py): ``iteration_XXXXXXXX/`` with ``llama-model-<rank>-<W>.safetensors``,
``llama-opt-<rank>-<W>.safetensors``, ``common.json``, (W > 1) ``metadata.json``, and at the end
``latest_checkpointed_iteration.txt``. The weights are ``tests.faults.weights_for_step(STEP)`` of the
tiny_lm demo model (WEIGHTS.npz is its initial weights).

What is not MindFormers' own here, because it cannot run on CPU: in a W-rank job the callback gets
``sharded_tensor_metas`` from ``get_all_sharded_tensor(network)``, which reads the layouts of a
semi-auto-parallel compile (``LayoutAdapter._get_layout_from_graph``); MindSpore's CPU backend refuses
semi-auto parallel. So each rank holds a Megatron-style tensor-parallel slice of every 2-D weight
(``TP_DIM``) and the metas are built with MindFormers' own ``build_sharded_tensor`` with those slices'
offsets, local and global shapes, ``axis_fragmentations`` and ``replica_id`` (the replicated ones:
replica ``rank``). Everything after that (file names, contents, metadata.json, common.json, the
tracker file, barriers, permissions) is MindFormers' code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

PREFIX = "llama"
# Which dimension a weight is cut along across ranks (Megatron): output rows of column-parallel
# layers and the vocabulary of the embedding and head; input columns of row-parallel layers.
TP_DIM = {"tok.embedding_table": 0, "qkv.weight": 0, "qkv.bias": 0, "proj.weight": 1, "mlp.0.weight": 0,
          "mlp.0.bias": 0, "mlp.2.weight": 1, "head.weight": 0, "head.bias": 0}


def cut_dim(name: str) -> int | None:
    for suffix, dim in TP_DIM.items():
        if name == suffix or name.endswith("." + suffix):
            return dim
    return None


def shard(name: str, array: np.ndarray, rank: int, world: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """Rank ``rank``'s slice of ``array`` and its global offset."""
    dim = cut_dim(name) if world > 1 else None
    offset = [0] * array.ndim
    if dim is None:
        return array, tuple(offset)
    size = array.shape[dim] // world
    offset[dim] = rank * size
    index = [slice(None)] * array.ndim
    index[dim] = slice(rank * size, (rank + 1) * size)
    return np.ascontiguousarray(array[tuple(index)]), tuple(offset)


def _barrier_by_all_reduce() -> None:
    """MindFormers' ``barrier_world`` calls ``mindspore.communication.comm_func.barrier()``, which fails on
    CPU: ``Unsupported op [Barrier] on CPU``. An AllReduce SUM (which CPU has) blocks every rank until all
    have reached it, which is all a barrier does; it replaces that one function where save_checkpoint looks it up."""
    import mindspore as ms
    from mindspore import nn, ops

    import mindformers.checkpoint.checkpoint as mf_checkpoint
    import mindformers.checkpoint.metadata as mf_metadata

    class _Sum(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.all_reduce = ops.AllReduce()

        def construct(self, x):
            return self.all_reduce(x)

    summed = _Sum()

    def barrier_world(action: str | None = None) -> None:
        summed(ms.Tensor(np.ones(1, np.float32))).asnumpy()

    mf_checkpoint.barrier_world = barrier_world
    if hasattr(mf_metadata, "barrier_world"):
        mf_metadata.barrier_world = barrier_world


def main(argv: list[str]) -> int:
    out, weights_file, steps = Path(argv[0]), argv[1], [int(s) for s in argv[2:]]
    import mindspore as ms
    from mindspore import nn

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    world = int(os.environ.get("MS_WORKER_NUM", "1"))
    if world > 1:
        from mindspore.communication import init
        init()
    from mindformers.checkpoint import save_checkpoint
    from mindformers.checkpoint.checkpoint import CommonInfo
    from mindformers.checkpoint.sharded_tensor import build_sharded_tensor
    from mindformers.tools.utils import get_real_rank
    from mindformers.core.context.build_context import build_context

    # MindFormers' own context (not MindSpore's) decides Graph or PyNative saving; unset, it says PyNative.
    build_context({"context": {"mode": "GRAPH_MODE", "device_target": "CPU"}, "parallel": {}})

    if world > 1:
        _barrier_by_all_reduce()
    rank = get_real_rank()
    with np.load(weights_file) as data:
        base = {name: data[name] for name in data.files}

    class Weights(nn.Cell):  # the network's parameters under their own names, as a model's are saved
        def __init__(self, arrays: dict[str, np.ndarray]) -> None:
            super().__init__()
            self.params = ms.ParameterTuple([ms.Parameter(ms.Tensor(a), name=n) for n, a in arrays.items()])

    for step in steps:
        rng = np.random.default_rng(step)  # tests.faults.weights_for_step, without importing the tests' harness
        full = {n: (a + 0.02 * rng.standard_normal(a.shape)).astype(a.dtype) for n, a in base.items()}
        local = {n: shard(n, a, rank, world)[0] for n, a in full.items()}
        net = Weights(local)
        optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-3)
        metas = None
        if world > 1:
            metas = {}
            for r in range(world):
                metas[r] = {}
                for name, array in full.items():
                    piece, offset = shard(name, array, r, world)
                    dim = cut_dim(name)
                    frag = tuple(world if d == dim else 1 for d in range(array.ndim))
                    metas[r][name] = build_sharded_tensor(
                        name, ms.float32, piece.shape, array.shape, frag, offset, replica_id=0 if dim is not None else r)
                for p in optimizer.parameters:  # the moments: cut as their weights; step counters replicated
                    if p.name in metas[r]:
                        continue
                    weight = p.name.split(".", 1)[1] if "." in p.name else None
                    if weight in full:
                        piece, offset = shard(weight, full[weight], r, world)
                        dim = cut_dim(weight)
                        frag = tuple(world if d == dim else 1 for d in range(piece.ndim))
                        metas[r][p.name] = build_sharded_tensor(p.name, p.dtype, piece.shape, full[weight].shape,
                                                                frag, offset, replica_id=0 if dim is not None else r)
                    else:
                        shape = tuple(p.shape)
                        metas[r][p.name] = build_sharded_tensor(p.name, p.dtype, shape, shape, (1,) * len(shape),
                                                                (0,) * len(shape), replica_id=r)
        info = CommonInfo(epoch_num=1, step_num=step, global_step=step, loss_scale=1.0, global_batch_size=8)
        save_checkpoint(iteration=step, network=net, optimizer=optimizer, common_info=info, keep_max_num=100,
                        user_prefix=PREFIX, save_checkpoint_path=str(out), sharded_tensor_metas=metas)
        print(f"rank {rank}: saved iteration {step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


# ---------------------------------------------------------------- for the tests (the project's .venv)

def write(out_checkpoint_dir: Path, steps: list[int], *, world: int, work: Path) -> None:
    """Run this writer with the MindFormers venv's python, under msrun for ``world`` > 1 (tests skip when
    .venv-mindformers is missing). ``work`` receives MindFormers' ``output/log`` and msrun's logs."""
    import socket
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    mf_bin = repo / ".venv-mindformers" / "bin"
    sys.path.insert(0, str(repo))
    from tests import faults
    from tests.harness import base_env

    faults.demo_weights()
    env = base_env({"PYTHONPATH": str(repo / "tests" / "mindformers_stand_in"),
                    "PATH": f"{mf_bin}{os.pathsep}{os.environ.get('PATH', '')}"})  # msrun starts `python`
    args = [str(Path(__file__).resolve()), str(out_checkpoint_dir), str(faults._weights_cache()),
            *map(str, steps)]
    if world == 1:
        cmd = [str(mf_bin / "python"), *args]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        msrun = Path(sys.executable).parent / "msrun"
        cmd = [str(msrun), f"--worker_num={world}", f"--local_worker_num={world}", f"--master_port={port}",
               f"--log_dir={work / 'msrun'}", "--join=True", "--cluster_time_out=300", *args]
    done = subprocess.run(cmd, cwd=str(work), env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted((work / "msrun").glob("*.log")))
        raise RuntimeError(f"MindFormers' writer failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-3000:]}\n{logs}")
