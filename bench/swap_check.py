"""What proving a hot swap costs, next to the swap itself (evald.pipeline.swap.swap_check).

    .venv/bin/python -m bench.swap_check            # --gb 0.25,1 --params 32,2048 --reps 5

For each size and parameter count, one network compiled in Graph mode (like bench/scale.py)
and one committed checkpoint; each repetition swaps the checkpoint in (``NetworkWeights.load``,
page cache hot: reads, verifies the digest of every file on the same pass, xxh3-128 by default) and then runs the
check in both modes on the same live memory, side by side. Prints medians and the check's cost
as a fraction of the swap.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _network(total_bytes: int, params: int):
    import mindspore as ms
    from mindspore import nn

    class Weights(nn.Cell):
        def __init__(self):
            super().__init__()
            n = total_bytes // 4 // params
            self.ws = ms.ParameterTuple([ms.Parameter(ms.Tensor(np.zeros(n, np.float32)), name=f"layers.{i}.weight")
                                         for i in range(params)])

        def construct(self, x):
            out = x
            for w in self.ws:
                out = out + w[0]
            return out
    return Weights()


def measure(gb: float, params: int, reps: int, root: Path) -> dict[str, float]:
    import mindspore as ms

    from evald.contracts import layout
    from evald.pipeline.swap.hot_swap import NetworkWeights
    from evald.pipeline.swap.swap_check import check

    total = int(gb * (1 << 30))
    net = _network(total, params)
    net(ms.Tensor(np.zeros(1, np.float32)))  # compiled once, as evald does
    rng = np.random.default_rng(0)
    weights = {name: rng.random(p.shape, dtype=np.float32) for name, p in net.parameters_and_names()}
    step_dir = layout.write_checkpoint(root, params, weights, run_id="bench")
    del weights
    manifest = layout.read_manifest(step_dir)
    swap = NetworkWeights(net)
    live = dict(net.parameters_and_names())
    swap.load(step_dir, manifest)  # warm the page cache and the parameter memory
    rows = []
    for _ in range(reps):
        row = {}
        start = time.perf_counter()
        swap.load(step_dir, manifest)
        row["swap"] = time.perf_counter() - start
        for mode in ("sampled", "full"):
            start = time.perf_counter()
            check(live, mode=mode, step=params, step_dir=step_dir, manifest=manifest)
            row[mode] = time.perf_counter() - start
        rows.append(row)
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", default="0.25,1")
    p.add_argument("--params", default="32,2048")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    print("| weights | parameters | swap (load + verify files) | sampled check | full check | sampled / swap | "
          "full / swap |\n|---|---|---|---|---|---|---|")
    for gb in (float(x) for x in args.gb.split(",")):
        for params in (int(x) for x in args.params.split(",")):
            with tempfile.TemporaryDirectory(prefix="swapcheck", dir=Path.cwd()) as root:
                m = measure(gb, params, args.reps, Path(root))
            print(f"| {gb:g} GB | {params} | {m['swap'] * 1e3:.0f} ms | {m['sampled'] * 1e3:.1f} ms | "
                  f"{m['full'] * 1e3:.0f} ms | {m['sampled'] / m['swap']:.3f} | {m['full'] / m['swap']:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
