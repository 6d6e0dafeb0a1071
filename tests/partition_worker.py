"""One rank that writes its part of each snapshot, for tests/e2e/test_msrun_partitions.py.

``--mode dp`` (launched by msrun): a real MindSpore CPU data-parallel job.
Every rank trains the same small tiny_lm model on its shard with
``Model.train`` and ``EvaldCallback`` (default writer ranks: every rank; the
run id is agreed through MindSpore's AllReduce). Rank 0 also writes a whole,
single-writer snapshot of the same weights at the same steps into
``--ref-dir``, to compare against.

``--mode split`` (one plain process per rank, ``--rank``/``--world``): the
weights at step ``s`` are a deterministic function of ``s`` (the same bytes in
every process), and the rank writes either the parameters it holds
(``--holds``: rank r holds the r-th of ``world`` consecutive runs of the
parameter list, like pipeline stages) or its share of a replicated model. For
the kill test, ``--pause-at-step`` stretches that step's write (before its
commit) and ``--hold-file`` makes the rank wait after ``--hold-after-step``
until the file exists.

Writes ``<out-dir>/rank_<r>.json`` (hook counters, run id) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 16}
MODEL_FACTORY = {"target": "examples.tiny_lm.model:build_model", "kwargs": MODEL}
DATA_FACTORY = {"target": "examples.tiny_lm.data:validation_windows", "kwargs": {"seq_len": MODEL["seq_len"]}}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("dp", "split"), required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ref-dir", default=None)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--endpoint", required=True)
    p.add_argument("--control-endpoint", required=True)
    p.add_argument("--run-id", default=None)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--holds", action="store_true")
    p.add_argument("--first-step", type=int, default=1)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--pause-at-step", type=int, default=None)
    p.add_argument("--pause-s", type=float, default=0.0)
    p.add_argument("--hold-after-step", type=int, default=None)
    p.add_argument("--hold-file", default=None)
    return p.parse_args(argv)


def main() -> int:
    args = parse()
    rank = int(os.environ.get("RANK_ID", args.rank)) if args.mode == "dp" else args.rank
    os.sched_setaffinity(0, {rank % max(1, len(os.sched_getaffinity(0)))})  # before mindspore starts threads
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s rank" + str(rank) + " %(name)s %(message)s")
    if args.pause_at_step is not None:
        _stretch_write(args.pause_at_step, args.pause_s)
    hook = _dp(args) if args.mode == "dp" else _split(args)
    out = Path(args.out_dir) / f"rank_{hook.rank}.json"
    out.write_text(json.dumps({"rank": hook.rank, "run_id": hook.run_id, "stats": hook.stats(),
                               "errors": hook.errors, "writers": list(hook.writers)}))
    print(f"rank {hook.rank}: done", flush=True)
    return 0


def _stretch_write(step: int, pause_s: float) -> None:
    """Test seam: the write of ``step`` pauses before its commit (the temp directory is complete)."""
    from evald.contracts import layout

    real = layout.write_checkpoint

    def write(ckpt_dir, at, weights, **kwargs):
        if at == step:
            print(f"writing step {at}, pausing {pause_s}s before the commit", flush=True)
            kwargs["before_commit"] = lambda _tmp: time.sleep(pause_s)
        return real(ckpt_dir, at, weights, **kwargs)

    layout.write_checkpoint = write  # the snapshot writer calls layout.write_checkpoint(...)


def _reference(ref_dir: str | None, step: int, net) -> None:
    if ref_dir is None:
        return
    from evald.contracts import layout
    from trainer_hooks.host_copy import host_copy_of_weights

    layout.write_checkpoint(Path(ref_dir), step, host_copy_of_weights(net), run_id="reference")


def _dp(args):
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init
    from mindspore.train import Callback, Model

    from examples.tiny_lm import data, model as tiny
    from trainer_hooks import EvaldCallback

    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    net = tiny.build_model(**MODEL, seed=0)
    windows = data.training_windows(args.steps * 4 * world, MODEL["seq_len"], seed=0)
    dataset = ms.dataset.NumpySlicesDataset({"window": windows}, shuffle=False, num_shards=world, shard_id=rank)
    dataset = dataset.batch(4, drop_remainder=True)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=3e-3)
    callback = EvaldCallback(args.ckpt_dir, args.every, network=net, endpoint=args.endpoint,
                             control_endpoint=args.control_endpoint, total_steps=args.steps, obey_stop=False,
                             model_factory=MODEL_FACTORY, data_factory=DATA_FACTORY, final_snapshot_timeout_s=60)

    class Reference(Callback):
        def on_train_step_end(self, run_context):  # after EvaldCallback copied the same weights
            step = run_context.original_args().cur_step_num
            if rank == 0 and step % args.every == 0:
                _reference(args.ref_dir, step, net)

    Model(tiny.LMLoss(net), optimizer=optimizer).train(1, dataset, callbacks=[callback, Reference()],
                                                        dataset_sink_mode=False)
    return callback.hook


def _split(args):
    import numpy as np
    import mindspore as ms

    from examples.tiny_lm import model as tiny
    from trainer_hooks import EvaldHook

    net = tiny.build_model(**MODEL, seed=0)
    params = list(net.parameters_and_names())
    base = {name: p.asnumpy().copy() for name, p in params}
    held = None
    if args.holds:  # consecutive runs of the parameter list, like pipeline stages
        held = {name for i, (name, _) in enumerate(params) if i * args.world // len(params) == args.rank}
    hook = EvaldHook(args.ckpt_dir, args.every, network=net, run_id=args.run_id, rank=args.rank,
                     world_size=args.world, endpoint=args.endpoint, control_endpoint=args.control_endpoint,
                     total_steps=args.steps, obey_stop=False, holds=held, model_factory=MODEL_FACTORY,
                     data_factory=DATA_FACTORY, final_snapshot_timeout_s=60)
    for step in range(args.first_step, args.steps + 1):
        if step % args.every == 0 or step == args.steps:
            # This loop outruns any disk: wait for the previous write rather than have the hook skip this
            # snapshot as busy on one rank only (that step would then, rightly, be recorded incomplete).
            while hook.writer is not None and hook.writer.busy:
                time.sleep(0.01)
            rng = np.random.default_rng(step)
            for name, p in params:  # the same bytes in every process
                p.set_data(ms.Tensor(base[name] + np.float32(0.01) * rng.standard_normal(base[name].shape,
                                                                                          dtype=np.float32)))
            if args.rank == 0:
                _reference(args.ref_dir, step, net)
        hook.step_end(step, loss=1.0)
        time.sleep(args.step_sleep)
        if args.hold_file and step == args.hold_after_step:
            print(f"holding after step {step} until {args.hold_file} exists", flush=True)
            while not Path(args.hold_file).exists():
                time.sleep(0.05)
    hook.train_end(args.steps)
    return hook


if __name__ == "__main__":
    sys.exit(main())
