"""Reshard on read: bytes each tensor-parallel eval rank reads, against its share of the model bytes.

    .venv/bin/python -m bench.reshard_read [--hidden 512] [--layers 4] [--vocab 8192] [--dir DIR] [--json OUT]

A LLaMA-shaped set of fp32 weights (column-parallel q/k/v and gate/up cut along their output rows,
row-parallel o and down along their input columns, vocabulary-parallel embedding and head, replicated
norms) is written as evald's partitioned snapshot (layout version 3, ``layout.write_checkpoint`` with
each part's tensor-parallel slices and layouts) at a training TP degree, then read by every rank of
an eval TP degree with evald.files.parts.pieces_of_parts + evald.files.slices (each rank: its 1/N of
every cut weight, the whole replicated ones). Per rank: bytes read (os.pread, counted, plus every
part's MANIFEST.json, which each rank reads whole) over its share
(the bytes of what it holds), and whether what it read equals numpy's slice of the full weights.
Goal (issue 29): bytes read <= 1.05 x share; 0 optimizer bytes (a snapshot holds none).

Then the cost of verification (issue 35): each rank of a group also streams its share of the snapshot's
weights files through the whole-file check (evald.pipeline.swap.tp_load.read_rank with share=(rank, N)).
Side by side, alternating, page cache warm, median of ``--reps``: the slices alone (this bench's read, what
a rank did before) and ``read_rank`` with its share verified; per rank the bytes hashed and the time ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evald.contracts import layout
from evald.contracts.partition import PartInfo, SliceSpec, TensorLayout
from evald.files.parts import pieces_of_parts
from evald.files.slices import plan_reads, read_region, tp_region

CASES = [(4, 2), (4, 1), (2, 4), (4, 4), (1, 4)]   # (written at TP, read at TP)


def llama_shapes(hidden: int, layers: int, vocab: int, *, ffn: int | None = None, seq_len: int | None = None,
                 example_names: bool = False) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Each weight's whole shape and the dimension it is cut along in Megatron tensor parallelism (None:
    replicated). ``example_names``: the parameter names of examples/llama_tp's network (``embed``,
    ``layers.0.q``, ...), with its learned positions ``pos`` (``seq_len`` rows, replicated); otherwise
    ``*.weight`` names and no positions. ``ffn`` defaults to LLaMA's 11/4 of ``hidden`` (a multiple of 8)."""
    ffn = ffn or hidden * 11 // 4 // 8 * 8
    w = "" if example_names else ".weight"
    shapes: dict[str, tuple[tuple[int, ...], int | None]] = {"embed" + w: ((vocab, hidden), 0)}
    if example_names:
        shapes["pos"] = ((seq_len or 64, hidden), None)
    for i in range(layers):
        p = f"layers.{i}."
        shapes.update({p + "attn_norm.weight": ((hidden,), None), p + "q" + w: ((hidden, hidden), 0),
                       p + "k" + w: ((hidden, hidden), 0), p + "v" + w: ((hidden, hidden), 0),
                       p + "o" + w: ((hidden, hidden), 1), p + "ffn_norm.weight": ((hidden,), None),
                       p + "gate" + w: ((ffn, hidden), 0), p + "up" + w: ((ffn, hidden), 0),
                       p + "down" + w: ((hidden, ffn), 1)})
    shapes.update({"norm.weight": ((hidden,), None), "head" + w: ((vocab, hidden), 0)})
    return shapes


def llama_weights(hidden: int, layers: int, vocab: int, seed: int = 0, **shape_options
                  ) -> tuple[dict[str, np.ndarray], dict[str, int | None]]:
    """The weights (standard normal fp32) and the dimension each is cut along (llama_shapes)."""
    rng = np.random.default_rng(seed)
    shapes = llama_shapes(hidden, layers, vocab, **shape_options)
    weights = {n: rng.standard_normal(s).astype(np.float32) for n, (s, _) in shapes.items()}
    return weights, {n: d for n, (_, d) in shapes.items()}


def write_tp(ckpt: Path, step: int, weights: dict[str, np.ndarray], cuts: dict[str, int | None], degree: int
             ) -> None:
    """One part per training rank: its slice of each cut weight (with its layout), replicated ones shared out."""
    replicated = [n for n, d in cuts.items() if d is None]
    for rank in range(degree):
        part, specs = {}, {}
        for name, array in weights.items():
            dim = cuts[name]
            if dim is None:
                if replicated.index(name) % degree == rank:
                    part[name] = array
                continue
            region = tp_region(array.shape, dim if degree > 1 else None, degree, rank)
            part[name] = np.ascontiguousarray(array[tuple(slice(a, b) for a, b in region)])
            tensor_map = tuple(0 if d == dim else -1 for d in range(array.ndim))
            specs[name] = SliceSpec(region, array.shape, TensorLayout((degree,), tensor_map))
        layout.write_checkpoint(ckpt, step, part, run_id="bench", part=PartInfo(rank, degree, tuple(range(degree))),
                                slices=specs)


def read_rank(ckpt: Path, step: int, written: int, cuts: dict[str, int | None], degree: int, rank: int
              ) -> tuple[dict[str, np.ndarray], int, int]:
    """Rank ``rank`` of ``degree``: its arrays, the bytes it read and its share."""
    from evald.contracts.partition import part_dir_name

    parts = [(ckpt / part_dir_name(step, i, written), layout.read_manifest(ckpt / part_dir_name(step, i, written)))
             for i in range(written)]
    out, share = {}, 0
    read = sum((d / layout.MANIFEST_FILE).stat().st_size for d, _ in parts)  # every rank reads every manifest
    for name, (shape, dtype, pieces) in pieces_of_parts(parts).items():
        want = tp_region(shape, cuts[name], degree, rank)
        dt = np.dtype(dtype)
        out[name], nbytes = read_region(plan_reads(pieces, want, dt.itemsize), want, dt)
        read += nbytes
        share += out[name].nbytes
    return out, read, share


def slices_into(ckpt: Path, step: int, written: int, cuts: dict[str, int | None], degree: int, rank: int,
                live: dict[str, np.ndarray]) -> None:
    """The rank's slices alone, read straight into ``live`` (as a rank reads into its parameters): what a
    rank read before it verified its share of the files."""
    from evald.contracts.partition import part_dir_name

    parts = [(ckpt / part_dir_name(step, i, written), layout.read_manifest(ckpt / part_dir_name(step, i, written)))
             for i in range(written)]
    for name, (shape, dtype, pieces) in pieces_of_parts(parts).items():
        want = tp_region(shape, cuts[name], degree, rank)
        read_region(plan_reads(pieces, want, np.dtype(dtype).itemsize), want, np.dtype(dtype), live[name])


def time_verification(root: Path, weights: dict[str, np.ndarray], cuts: dict[str, int | None], reps: int
                      ) -> list[dict]:
    """Per case and rank, into the same pre-touched arrays (a rank's live parameters), alternating: the slices
    alone, and tp_load.read_rank with the rank's share of the files verified (share=(rank, degree))."""
    from evald.contracts.partition import group_name
    from evald.files.recognise import PARTS
    from evald.pipeline.swap.tp_load import read_rank as verified_read

    print(f"\nverification: slices alone vs slices + the rank's share of the files hashed (into live arrays, "
          f"page cache warm, median of {reps})")
    print(f"{'written':>8} {'read':>5} {'rank':>5} {'share MiB':>10} {'hashed MiB':>11} {'slices s':>9} "
          f"{'+verify s':>10} {'ratio':>6}")
    out = []
    for written, degree in CASES:
        ckpt = root / f"tp{written}"
        for rank in range(degree):
            live = {n: np.ones(tuple(b - a for a, b in tp_region(w.shape, cuts[n], degree, rank)), w.dtype)
                    for n, w in weights.items()}
            specs = {n: (a.shape, a.dtype) for n, a in live.items()}
            alone, checked, hashed = [], [], 0
            for _ in range(reps):
                begun = time.perf_counter()
                slices_into(ckpt, 10, written, cuts, degree, rank, live)
                alone.append(time.perf_counter() - begun)
                begun = time.perf_counter()
                got = verified_read(ckpt / group_name(10, written), PARTS, specs, degree, rank, into=live,
                                    share=(rank, degree))
                checked.append(time.perf_counter() - begun)
                hashed = got.bytes_verified
            share = sum(a.nbytes for a in live.values())
            row = {"written_tp": written, "read_tp": degree, "rank": rank, "share_bytes": share,
                   "hashed_bytes": hashed, "slices_s": statistics.median(alone),
                   "verified_s": statistics.median(checked)}
            row["ratio"] = row["verified_s"] / row["slices_s"]
            out.append(row)
            print(f"{written:>8} {degree:>5} {rank:>5} {share / 2**20:>10.2f} {hashed / 2**20:>11.2f} "
                  f"{row['slices_s']:>9.4f} {row['verified_s']:>10.4f} {row['ratio']:>6.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reshard_read")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--reps", type=int, default=5, help="timed reads per rank for the verification table")
    args = parser.parse_args(argv)
    weights, cuts = llama_weights(args.hidden, args.layers, args.vocab)
    total = sum(a.nbytes for a in weights.values())
    root = Path(tempfile.mkdtemp(prefix="reshard-", dir=args.dir))
    results = []
    try:
        print(f"model: {len(weights)} tensors, {total / 2**20:.1f} MiB fp32 (hidden {args.hidden}, "
              f"{args.layers} layers, vocab {args.vocab})")
        print(f"{'written':>8} {'read':>5} {'rank':>5} {'read MiB':>9} {'share MiB':>10} {'ratio':>6} exact")
        for written, degree in CASES:
            ckpt = root / f"tp{written}"
            if not ckpt.exists():
                ckpt.mkdir()
                write_tp(ckpt, 10, weights, cuts, written)
            for rank in range(degree):
                arrays, read, share = read_rank(ckpt, 10, written, cuts, degree, rank)
                exact = all(np.array_equal(arrays[n], weights[n][tuple(slice(a, b) for a, b in
                                                                       tp_region(weights[n].shape, cuts[n], degree,
                                                                                 rank))]) for n in weights)
                results.append({"written_tp": written, "read_tp": degree, "rank": rank, "bytes_read": read,
                                "share_bytes": share, "ratio": read / share, "exact": exact,
                                "optimizer_bytes": 0})
                print(f"{written:>8} {degree:>5} {rank:>5} {read / 2**20:>9.2f} {share / 2**20:>10.2f} "
                      f"{read / share:>6.3f} {exact}")
        verification = time_verification(root, weights, cuts, args.reps)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"model_bytes": total, "results": results, "verification": verification},
                                        indent=1))
    worst = max(r["ratio"] for r in results)
    print(f"worst ratio bytes read / share: {worst:.4f} (goal <= 1.05); all exact: {all(r['exact'] for r in results)}")
    return 0 if worst <= 1.05 and all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
