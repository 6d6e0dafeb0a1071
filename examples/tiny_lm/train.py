"""Train the demo model with evald's trainer hook.

    python -m examples.tiny_lm.train --ckpt-dir runs/demo/ckpt --steps 300 --every 50

``--loop model`` (default) uses ``Model.train`` with ``EvaldCallback``;
``--loop custom`` drives ``EvaldHook`` from a hand-written loop. Both tell
evald how to build the model and the validation data (the run announcement),
so ``evald`` needs no model flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=50, help="snapshot every N steps")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loop", choices=("model", "custom"), default="model")
    p.add_argument("--run-id", default=None)
    p.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU core")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (tests)")
    p.add_argument("--no-evald", action="store_true", help="train without the evald hook (baseline)")
    p.add_argument("--agree-every", type=int, default=1)
    p.add_argument("--keep-last", type=int, default=None)
    p.add_argument("--model-checkpoint", action="store_true",
                   help="also save MindSpore ModelCheckpoint files into --ckpt-dir, every --every steps")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # before mindspore starts its threads
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from examples.tiny_lm import data, model as model_mod
    from trainer_hooks import EvaldCallback, EvaldHook, TrainStepWithGradNorm

    ms.set_context(mode=ms.GRAPH_MODE)
    rank, world = 0, 1
    if os.environ.get("MS_ROLE"):  # started by msrun: join its group (msrun's scheduler ends inside init)
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank, world = get_rank(), get_group_size()
        if world > 1:  # data parallel: the same initial weights (seed), each rank its shard of the data
            ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    net = model_mod.build_model(seq_len=args.seq_len, seed=args.seed)
    loss_net = model_mod.LMLoss(net)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=args.lr, weight_decay=0.01)
    train_step = TrainStepWithGradNorm(loss_net, optimizer, clip_norm=1.0)
    windows = data.training_windows(args.steps * args.batch_size * world, args.seq_len, seed=args.seed)[rank::world]
    hook_kwargs = dict(
        network=net, total_steps=args.steps, run_id=args.run_id, task="lm",
        model_factory={"target": "examples.tiny_lm.model:build_model", "kwargs": {"seq_len": args.seq_len}},
        data_factory={"target": "examples.tiny_lm.data:validation_windows", "kwargs": {"seq_len": args.seq_len}},
        agree_every=args.agree_every, keep_last=args.keep_last,
    )
    started = time.time()
    if args.loop == "model":
        import mindspore.dataset as ds

        dataset = ds.NumpySlicesDataset({"window": windows}, shuffle=False).batch(args.batch_size, drop_remainder=True)
        callbacks = []
        if not args.no_evald:
            callbacks.append(EvaldCallback(args.ckpt_dir, args.every, batch_size=args.batch_size,
                                           tokens_per_sample=args.seq_len, **hook_kwargs))
        if args.model_checkpoint:  # MindSpore's own checkpoints beside evald's, in the same directory
            from mindspore.train import CheckpointConfig, ModelCheckpoint

            callbacks.append(ModelCheckpoint(prefix="tinylm", directory=args.ckpt_dir, config=CheckpointConfig(
                save_checkpoint_steps=args.every, keep_checkpoint_max=1000)))
        if args.step_sleep:
            from mindspore.train import LambdaCallback

            callbacks.append(LambdaCallback(on_train_step_end=lambda rc: time.sleep(args.step_sleep)))
        callbacks.append(_LossPrinter(every=max(1, args.steps // 10)))
        Model(train_step).train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
        if callbacks and isinstance(callbacks[0], EvaldCallback):
            print("evald hook:", json.dumps(callbacks[0].hook.stats()), flush=True)
    else:
        hook = None if args.no_evald else EvaldHook(args.ckpt_dir, args.every, **hook_kwargs)
        step = 0
        for step in range(1, args.steps + 1):
            batch = ms.Tensor(windows[(step - 1) * args.batch_size: step * args.batch_size])
            loss, grad_norm = train_step(batch)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if step % max(1, args.steps // 10) == 0:
                print(f"step {step} loss {float(loss.asnumpy()):.4f}", flush=True)
            if hook is not None and hook.step_end(step, loss=loss, grad_norm=grad_norm, lr=args.lr,
                                                  samples=args.batch_size,
                                                  tokens=args.batch_size * args.seq_len,
                                                  data_offset=step * args.batch_size, seed=args.seed):
                break
        if hook is not None:
            hook.train_end(step)
            print("evald hook:", json.dumps(hook.stats()), flush=True)
    print(f"training finished in {time.time() - started:.1f}s", flush=True)
    return 0


class _LossPrinter:
    """Prints the loss every few steps (a tiny Callback, defined lazily to keep imports light)."""

    def __new__(cls, every: int):
        from mindspore.train import Callback

        class LossPrinter(Callback):
            def on_train_step_end(self, run_context):
                args = run_context.original_args()
                if args.cur_step_num % every == 0:
                    out = args.net_outputs
                    loss = out[0] if isinstance(out, (tuple, list)) else out
                    print(f"step {args.cur_step_num} loss {float(loss.asnumpy()):.4f}", flush=True)

        return LossPrinter()


if __name__ == "__main__":
    sys.exit(main())
