"""How long evald's directory watch takes to see a committed checkpoint: inotify vs polling.

    .venv/bin/python -m bench.polling_latency [--commits 20] [--intervals 0.25,1,2]

On a shared file system (NFS, CIFS, Lustre, GPFS, FUSE) inotify never hears other hosts'
writes, so evald uses watchdog's PollingObserver (``--watch auto``). This forces the polling
observer on a local directory and measures, for each polling interval, the time from a
commit (a directory renamed into place, as the trainer commits ``step_N``) to the event
reaching evald's queue, beside the inotify observer on the same machine. Commits are spaced
by a random fraction of the interval, so they land at every phase of the polling cycle.
The directory holds ``--entries`` other entries (each poll lists and stats them all).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evald.intake.discovery import Discovery  # noqa: E402


def measure(watch: str, interval: float, commits: int, entries: int, rng: random.Random) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="evald-bench-poll-") as tmp:
        ckpt = Path(tmp) / "ckpt"
        ckpt.mkdir()
        for i in range(entries):
            (ckpt / f"old_{i:05d}").mkdir()
        events: queue.Queue = queue.Queue()
        discovery = Discovery(ckpt, events, watch=watch, polling_interval_s=interval)
        discovery.start()
        time.sleep(max(0.5, 2 * interval))  # the polling observer's first snapshot
        latencies = []
        try:
            for n in range(commits):
                time.sleep(rng.uniform(0, interval))
                temp, final = ckpt / f".step_{n:09d}.tmp", ckpt / f"step_{n:09d}"
                temp.mkdir()
                (temp / "MANIFEST.json").write_text("{}")
                committed = time.monotonic()
                os.rename(temp, final)
                while True:
                    _, path = events.get(timeout=10 * interval + 10)
                    if Path(path) == final:
                        latencies.append(time.monotonic() - committed)
                        break
        finally:
            discovery.stop()
        return latencies


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commits", type=int, default=20)
    p.add_argument("--intervals", default="0.25,1,2")
    p.add_argument("--entries", type=int, default=200)
    args = p.parse_args()
    rng = random.Random(0)
    rows = [("inotify", 0.0, measure("inotify", 1.0, args.commits, args.entries, rng))]
    for interval in (float(x) for x in args.intervals.split(",")):
        rows.append(("polling", interval, measure("polling", interval, args.commits, args.entries, rng)))
    print(json.dumps([{"watch": w, "interval_s": i, "latencies_s": lat} for w, i, lat in rows]))
    print(f"\n{args.commits} commits each, {args.entries} other entries in the directory\n")
    print("| observer | interval | median latency | max | median / interval |\n|---|---|---|---|---|")
    for watch, interval, lat in rows:
        ratio = f"{statistics.median(lat) / interval:.2f}" if interval else "-"
        shown = f"{interval:g} s" if interval else "-"
        print(f"| {watch} | {shown} | {statistics.median(lat) * 1000:.1f} ms | {max(lat) * 1000:.1f} ms | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
