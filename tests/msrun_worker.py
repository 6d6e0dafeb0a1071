"""One worker of a real MindSpore CPU data-parallel job, launched by msrun.

Used by tests/e2e/test_msrun_distributed.py::

    msrun --worker_num=4 --local_worker_num=4 --master_port=PORT --log_dir=DIR --join=True \
        tests/msrun_worker.py --ckpt-dir ... --control-endpoint ... --run-id ... --out-dir ...

Every rank: same seed, a tiny nn.Dense regression, its shard of the data,
``Model.train`` with ``EvaldCallback(agree_every=1)`` (which must pick up the
MindSpore AllReduce-SUM from ``mindspore_reduce_sum()`` by itself) and a small
``ResultCallback`` that writes ``<out-dir>/rank_<r>.json`` at the end of
training: the last step, how the stop agreement was wired, and a checksum of
the weights (data parallel keeps them identical on every rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--endpoint", required=True, help="evald notification endpoint (nobody needs to listen)")
    p.add_argument("--control-endpoint", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--steps", type=int, default=150, help="steps per rank if nobody stops training")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--every-n-steps", type=int, default=20)
    args = p.parse_args()

    import numpy as np
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init
    from mindspore.train import Callback, Model

    from trainer_hooks import EvaldCallback
    from trainer_hooks.stop_agreement import mindspore_reduce_sum

    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(1234)  # same initial weights on every rank

    # Direct check of the collective the agreement relies on: rank r sends [r, 1].
    shipped = mindspore_reduce_sum()
    probe_sum, probe_error = None, None
    try:
        probe_sum = None if shipped is None else [int(v) for v in shipped(np.array([rank, 1]))]
    except Exception as exc:  # e.g. CPU AllReduce refusing int32
        probe_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"

    n = args.steps * args.batch_size * world
    rng = np.random.default_rng(0)  # the same full data set on every rank; each takes its shard
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32) + 0.1).astype(np.float32)
    dataset = ms.dataset.NumpySlicesDataset({"x": x, "y": y}, shuffle=False,
                                            num_shards=world, shard_id=rank)
    dataset = dataset.batch(args.batch_size, drop_remainder=True)

    net = nn.Dense(4, 1)
    loss_fn = nn.MSELoss()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    model = Model(net, loss_fn=loss_fn, optimizer=opt)

    evald_cb = EvaldCallback(ckpt_dir=args.ckpt_dir, every_n_steps=args.every_n_steps,
                             endpoint=args.endpoint, control_endpoint=args.control_endpoint,
                             run_id=args.run_id, agree_every=1, network=net,
                             total_steps=args.steps, final_snapshot_timeout_s=30.0)
    hook = evald_cb.hook

    class ResultCallback(Callback):
        """Writes this rank's outcome; runs after EvaldCallback (listed after it)."""

        def __init__(self):
            super().__init__()
            self.t0 = time.monotonic()
            self.collective_calls = 0
            agreement = hook.control.agreement if hook.control else None
            if agreement is not None and agreement.reduce_sum is not None:
                inner = agreement.reduce_sum

                def counting(vector, inner=inner):
                    self.collective_calls += 1
                    return inner(vector)

                counting.__qualname__ = inner.__qualname__
                agreement.reduce_sum = counting

        def on_train_end(self, run_context):
            cb_args = run_context.original_args()
            agreement = hook.control.agreement if hook.control else None
            weights = sum(float(np.abs(p.asnumpy()).sum()) for p in net.trainable_params())
            result = {
                "rank": rank,
                "world_size": world,
                "final_step": int(cb_args.get("cur_step_num") or 0),
                "agreed_stop_step": None if agreement is None else agreement.agreed_stop_step,
                "stop_reason": hook.stop_reason,
                "agreement_collective": None if agreement is None or agreement.reduce_sum is None
                else agreement.reduce_sum.__qualname__,
                "agreement_collective_calls": self.collective_calls,
                "subscriber": agreement is not None and agreement.subscriber is not None,
                "probe_sum": probe_sum,
                "probe_error": probe_error,
                "hook_rank": hook.rank,
                "hook_world_size": hook.world_size,
                "hook_errors": hook.errors,
                "stats": hook.stats(),
                "weights_abs_sum": weights,
                "train_seconds": time.monotonic() - self.t0,
            }
            out = Path(args.out_dir) / f"rank_{rank}.json"
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result))
            os.replace(tmp, out)

    model.train(1, dataset, callbacks=[evald_cb, ResultCallback()], dataset_sink_mode=False)
    print(f"rank {rank}: training returned", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
