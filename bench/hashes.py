"""Which integrity check: xxHash's xxh3 (the xxhash package) and hashlib's algorithms (zlib.crc32 for scale).

    .venv/bin/python -m bench.hashes [--mib 256]

Hashes the same in-memory bytes in 4 MiB updates, on one thread and on one thread per
core at once (hashlib and xxhash release the GIL), best of 3; prints GB/s next to a memcpy of the
same bytes. The choice and its reasons are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import threading
import time
import zlib

import numpy as np

ALGORITHMS = ("xxh3-128 (xxhash)", "xxh3-64 (xxhash)", "sha256", "sha1", "blake2b", "sha512", "md5", "blake2s", "sha3_256", "crc32 (zlib)")


def _one(name: str, data: memoryview, chunk: int = 4 << 20) -> None:
    if name.startswith("xxh3"):
        import xxhash

        digest = xxhash.xxh3_128() if name == "xxh3-128" else xxhash.xxh3_64()
        for i in range(0, len(data), chunk):
            digest.update(data[i:i + chunk])
        digest.digest()
        return
    if name.startswith("crc32"):
        crc = 0
        for i in range(0, len(data), chunk):
            crc = zlib.crc32(data[i:i + chunk], crc)
        return
    digest = hashlib.new(name)
    for i in range(0, len(data), chunk):
        digest.update(data[i:i + chunk])
    digest.digest()


def rate(name: str, data: memoryview, threads: int) -> float:
    best = float("inf")
    for _ in range(3):
        workers = [threading.Thread(target=_one, args=(name, data)) for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return threads * len(data) / best / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256)
    args = p.parse_args()
    data = np.random.default_rng(0).integers(0, 256, args.mib << 20, dtype=np.uint8)
    copy = np.empty_like(data)
    cores = len(os.sched_getaffinity(0))
    best = min(_timed_copy(copy, data) for _ in range(3))
    print(f"memcpy (np.copyto, warm): {len(data) / best / 1e9:.1f} GB/s\n")
    print(f"| algorithm | 1 thread | {cores} threads |\n|---|---|---|")
    for name in ALGORITHMS:
        key = name.split()[0]
        print(f"| {name} | {rate(key, memoryview(data), 1):.2f} GB/s | {rate(key, memoryview(data), cores):.2f} GB/s |")
    return 0


def _timed_copy(dst, src) -> float:
    start = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - start


if __name__ == "__main__":
    raise SystemExit(main())
