"""What the evald trainer hook costs a training step, measured side by side in one process.

    .venv/bin/python -m bench.hook_overhead [--blocks 6] [--block-steps 20] [--every 5]

One network, one optimizer, one data stream. Blocks of ``block-steps`` steps
alternate: without the hook, then with ``EvaldHook.step_end`` after every
step (a snapshot every ``every`` steps, telemetry every step, no evald
running, so every notification goes nowhere). Interleaving cancels the drift
of a shared machine. Reported: median step time of each arm and their
ratio, the time ``step_end`` blocks on snapshot steps (the host copy) and on
other steps, and how long the background write of one snapshot takes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--block-steps", type=int, default=20)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--cpu", type=int, default=0)
    args = p.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms
    from mindspore import nn

    from examples.tiny_lm import data, model
    from trainer_hooks import EvaldHook, TrainStepWithGradNorm

    ms.set_context(mode=ms.GRAPH_MODE)
    net = model.TinyGPT(d_model=args.d_model, n_layers=args.layers, n_heads=8, seq_len=64)
    params = sum(int(p.size) for p in net.get_parameters())
    step_cell = TrainStepWithGradNorm(model.LMLoss(net), nn.AdamWeightDecay(net.trainable_params(), 1e-3))
    total = args.blocks * 2 * args.block_steps + 5
    windows = data.training_windows(total * 8, 64, seed=0)
    batch = lambda i: ms.Tensor(windows[i * 8:(i + 1) * 8])  # noqa: E731
    for i in range(5):  # compile and warm up outside the measurement
        step_cell(batch(i))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["EVALD_SOCKET_DIR"] = os.path.join(tmp, "s")
        hook = EvaldHook(os.path.join(tmp, "ckpt"), args.every, network=net, total_steps=total)
        plain, hooked, snap_block, other_block = [], [], [], []
        step = 5
        for block in range(args.blocks * 2):
            with_hook = block % 2 == 1
            for _ in range(args.block_steps):
                step += 1
                started = time.perf_counter()
                loss, gnorm = step_cell(batch(step - 1))
                loss.asnumpy()  # the step is done when its loss is on the host
                if with_hook:
                    before = time.perf_counter()
                    hook.step_end(step, loss=loss, grad_norm=gnorm, lr=1e-3, samples=8, tokens=8 * 64)
                    blocked = time.perf_counter() - before
                    (snap_block if step % args.every == 0 else other_block).append(blocked)
                (hooked if with_hook else plain).append(time.perf_counter() - started)
        hook.writer.close()
        write_times = []
        from evald.contracts import layout

        arrays = {k: v for k, v in __import__("trainer_hooks.host_copy", fromlist=["x"]).host_copy_of_weights(net).items()}
        for i in range(5):
            t = time.perf_counter()
            layout.write_checkpoint(os.path.join(tmp, "w"), i, arrays, run_id="bench")
            write_times.append(time.perf_counter() - t)
        stats = hook.stats()
        hook.train_end(step)
    result = {
        "parameters": params, "weights_mb": round(params * 4 / 2**20, 1), "steps_per_arm": len(plain),
        "median_step_s_without_hook": statistics.median(plain),
        "median_step_s_with_hook": statistics.median(hooked),
        "ratio_with_over_without": statistics.median(hooked) / statistics.median(plain),
        "step_end_blocking_s_snapshot_steps_median": statistics.median(snap_block),
        "step_end_blocking_s_other_steps_median": statistics.median(other_block),
        "background_commit_s_median": statistics.median(write_times),
        "snapshots_written": stats["snapshots_written"], "snapshots_skipped_busy": stats["snapshots_skipped_busy"],
        "hook_errors": stats["hook_errors"],
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
