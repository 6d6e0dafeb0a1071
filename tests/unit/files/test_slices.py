"""An eval rank's slice read from stored pieces of another layout: exactly its elements, and only their
bytes (evald.files.slices). Pieces are raw C-ordered arrays in files, as in any safetensors file."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from evald.files.errors import CheckpointError
from evald.files.slices import Piece, plan_reads, read_region, tp_region


def _store(tmp_path: Path, full: np.ndarray, dim: int | None, degree: int, header: int = 24) -> list[Piece]:
    """``full`` written as ``degree`` pieces cut along ``dim``, each in its own file after a fake header."""
    pieces = []
    for rank in range(degree if dim is not None else 1):
        region = tp_region(full.shape, dim, degree if dim is not None else 1, rank)
        block = np.ascontiguousarray(full[tuple(slice(a, b) for a, b in region)])
        path = tmp_path / f"w-{dim}-{degree}-{rank}.bin"
        path.write_bytes(b"h" * header + block.tobytes() + b"tail")
        pieces.append(Piece(path, header, region))
    return pieces


SHAPES = [(8, 12), (12, 8, 4), (16,)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("written", [(None, 1), (0, 4), (-1, 4), (0, 2), (-1, 2)])
@pytest.mark.parametrize("read", [(None, 1), (0, 2), (-1, 2), (0, 4), (-1, 4), (0, 1)])
def test_any_written_layout_read_at_any_degree_gives_exactly_the_slice_and_only_its_bytes(tmp_path, shape,
                                                                                         written, read):
    full = np.arange(math.prod(shape), dtype=np.float32).reshape(shape) * 0.5
    wdim, wdeg = written
    rdim, rdeg = read
    wdim = None if wdim is None else wdim % len(shape)
    rdim = None if rdim is None else rdim % len(shape)
    pieces = _store(tmp_path, full, wdim, wdeg)
    for rank in range(rdeg):
        want = tp_region(shape, rdim, rdeg, rank)
        got, nbytes = read_region(plan_reads(pieces, want, 4), want, np.dtype(np.float32))
        assert np.array_equal(got, full[tuple(slice(a, b) for a, b in want)])
        assert nbytes == got.nbytes            # its share of the bytes, not one more
        live = np.full(got.shape, np.nan, np.float32)   # a parameter's memory: read straight into it
        into, again = read_region(plan_reads(pieces, want, 4), want, np.dtype(np.float32), live)
        assert into is live and np.array_equal(live, got) and again == nbytes


def test_a_cut_along_the_first_dimension_is_one_run_per_piece_and_along_the_last_one_per_row(tmp_path):
    full = np.zeros((8, 12), np.float32)
    rows = _store(tmp_path, full, 0, 4)
    assert len(plan_reads(rows, tp_region(full.shape, 0, 2, 1), 4)) == 2             # two whole pieces
    assert len(plan_reads(rows, tp_region(full.shape, 1, 2, 1), 4)) == 8             # one run per row


def test_pieces_that_leave_part_of_the_slice_out_are_an_error(tmp_path):
    full = np.zeros((8, 4), np.float32)
    pieces = _store(tmp_path, full, 0, 4)[:3]
    with pytest.raises(CheckpointError, match="cover 8 of the 16"):
        plan_reads(pieces, tp_region(full.shape, 0, 2, 1), 4)


def test_a_scalar_and_a_truncated_file(tmp_path):
    path = tmp_path / "s.bin"
    path.write_bytes(np.float32(3.5).tobytes())
    got, nbytes = read_region(plan_reads([Piece(path, 0, ())], (), 4), (), np.dtype(np.float32))
    assert got.shape == () and got == 3.5 and nbytes == 4
    pieces = _store(tmp_path, np.ones((4, 4), np.float32), 0, 2)
    pieces[1].file.write_bytes(pieces[1].file.read_bytes()[:30])
    with pytest.raises(CheckpointError, match="truncated"):
        read_region(plan_reads(pieces, tp_region((4, 4), None, 1, 0), 4), ((0, 4), (0, 4)), np.dtype(np.float32))


def test_uneven_degree_is_refused():
    with pytest.raises(CheckpointError, match="cannot be cut into 3"):
        tp_region((8, 4), 0, 3, 0)


@pytest.mark.parametrize("written,degree", [(4, 2), (4, 1), (2, 4)])
def test_evald_parts_written_at_one_tp_degree_read_at_another(tmp_path, written, degree):
    """evald's own layout-version-3 parts (layout.write_checkpoint with TP slices), read per eval rank."""
    from bench.reshard_read import llama_weights, read_rank, write_tp

    weights, cuts = llama_weights(hidden=16, layers=1, vocab=32)
    write_tp(tmp_path, 10, weights, cuts, written)
    for rank in range(degree):
        arrays, read, share = read_rank(tmp_path, 10, written, cuts, degree, rank)
        for name, array in weights.items():
            want = tp_region(array.shape, cuts[name], degree, rank)
            assert np.array_equal(arrays[name], array[tuple(slice(a, b) for a, b in want)])
        manifests = sum(p.stat().st_size for p in tmp_path.glob("*/MANIFEST.json"))
        assert read - manifests == share


def test_memory_to_read_into_is_used_only_when_it_fits(tmp_path):
    pieces = _store(tmp_path, np.arange(16, dtype=np.float32).reshape(4, 4), 0, 2)
    want = tp_region((4, 4), 0, 2, 1)
    for other in (np.zeros((4, 4), np.float32), np.zeros((2, 4), np.float64), np.zeros((2, 4), np.float32)[:, ::1]):
        if other.shape == (2, 4) and other.dtype == np.float32:
            other.flags.writeable = False
        got, _ = read_region(plan_reads(pieces, want, 4), want, np.dtype(np.float32), other)
        assert got is not other and np.array_equal(got, np.arange(8, 16, dtype=np.float32).reshape(2, 4))
