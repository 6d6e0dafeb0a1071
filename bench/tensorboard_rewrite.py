"""What a TensorBoard rewrite costs (evald/sinks/tensorboard.py): a sub-run of N eval records, each of a
validation's ~15 scalars, appended in step order versus rewritten once from the ledger (the cost of one
out-of-order record), side by side in one run.

    PYTHONPATH=. .venv/bin/python -m bench.tensorboard_rewrite [N ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from evald.ledger.ledger import Ledger, Record
from evald.sinks.tensorboard import TensorBoardSink

SCALARS = {f"eval/m{i}": 1.0 for i in range(6)} | {f"eval/m{i}_se": 0.1 for i in range(6)} | {
    "evald/load_s": 0.1, "evald/evaluate_s": 1.0, "evald/lag_s": 2.0}


def measure(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "ledger.sqlite")
        sink = TensorBoardSink(Path(tmp) / "run", ledger)
        ledger.add_records([Record("eval", 0, time.time(), SCALARS, {})])
        sink.drain()  # the first drain makes the file
        ledger.add_records([Record("eval", s, time.time(), SCALARS, {"evald/decision": "x" * 80})
                            for s in range(1, n + 1)])
        start = time.perf_counter()
        sink.drain()  # in order: appended
        appended = time.perf_counter() - start
        ledger.add_records([Record("eval", n // 2, time.time(), {"eval/m0": 2.0}, {})])
        start = time.perf_counter()
        sink.drain()  # one record back in time: the whole sub-run rewritten
        rewritten = time.perf_counter() - start
        sink.close()
        ledger.close()
    return appended, rewritten


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [1000, 10000]:
        appended, rewritten = measure(n)
        print(f"{n} records: appended in order {appended:.2f} s ({n / appended:.0f}/s); "
              f"one rewrite {rewritten:.2f} s ({n / rewritten:.0f} records/s); rewrite/append {rewritten / appended:.2f}")
