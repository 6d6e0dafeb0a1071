"""Issue 35: the one check that stored pieces make up a parameter exactly once (evald.contracts.partition.untiled),
for Checkpoint 2.0 chunks (evald.files.checkpoint2) and evald's own parts (partition.tiling_problem): exact (no
gap, no overlap, every piece inside the shape, a duplicate is an overlap), whatever the layout. Its speed on
12,288 and 100k pieces: test_tiling_speed.py.
"""

from __future__ import annotations

import itertools

import pytest

from evald.contracts.partition import GAP, IRREGULAR, OUTSIDE, OVERLAP, untiled
from evald.files import checkpoint2 as c2
from tests.bounded import cpu_within

BOUND_S = 2.0   # the bound for anything the main loop does with a file of the checkpoint directory (CPU time)


def _grid(shape, cuts):
    """The boxes of ``shape`` cut at ``cuts`` (one sorted list of inner cut points per dimension)."""
    edges = [[0, *c, n] for c, n in zip(cuts, shape)]
    return [tuple(box) for box in itertools.product(*(list(zip(e, e[1:])) for e in edges))]


def test_100k_chunks_of_an_uneven_grid_are_exact():
    shape = (1000, 700)
    cuts = [sorted({3, 17, *range(50, 1000, 4)}), sorted({1, 2, *range(10, 700, 3)})]
    boxes = _grid(shape, cuts)
    assert len(boxes) > 50_000
    assert cpu_within(BOUND_S, lambda: untiled(shape, boxes)) is None


@pytest.mark.parametrize("shape,boxes,kind,which", [
    ((4, 6), [((0, 2), (0, 6))], GAP, ()),                                         # half of it
    ((4, 6), [((0, 2), (0, 6)), ((2, 4), (0, 3))], GAP, ()),                       # a corner missing
    ((4, 6), [((0, 3), (0, 6)), ((2, 4), (0, 6))], OVERLAP, (0, 1)),               # one row twice
    ((4, 6), [((0, 2), (0, 6)), ((0, 2), (0, 6)), ((2, 4), (0, 6))], OVERLAP, (0, 1)),   # a duplicate
    ((4, 6), [((0, 2), (0, 6)), ((2, 5), (0, 6))], OUTSIDE, (1,)),                 # past the end
    ((4, 6), [((-2, 2), (0, 6)), ((2, 4), (0, 6))], OUTSIDE, (0,)),                # before the start
    ((4, 6), [((0, 4), (3, 2))], OUTSIDE, (0,)),                                   # a negative size
    ((4, 6), [((0, 4),)], OUTSIDE, (0,)),                                          # one dimension short
    ((4,), [((0, 4), (0, 1))], OUTSIDE, (0,)),                                     # one too many
    ((), [(), ()], OVERLAP, (0, 1)),                                               # a scalar stored twice
    ((4, 6), [((0, 2), (0, 6)), ((2, 4), (0, 6)), ((1, 1), (0, 6))], None, ()),    # an empty box: nothing
    ((0, 6), [], None, ()),                                                        # nothing to tile
    ((), [()], None, ()),
    ((4, 6), [], GAP, ()),
])
def test_exactly_once_or_what_is_wrong_and_where(shape, boxes, kind, which):
    problem = untiled(shape, boxes)
    assert (problem and problem.kind) == kind and (problem.boxes if problem else ()) == which, problem


def test_a_gap_says_how_much_is_covered():
    problem = untiled((4, 6), [((0, 2), (0, 6)), ((2, 4), (0, 3))])
    assert (problem.covered, problem.total) == (18, 24)


def test_layouts_that_are_not_grids_are_still_judged_exactly():
    # bricks: row 0 cut at column 2, row 1 at column 4: a tiling that is not a grid product
    bricks = [((0, 1), (0, 2)), ((0, 1), (2, 6)), ((1, 2), (0, 4)), ((1, 2), (4, 6))]
    assert untiled((2, 6), bricks) is None
    assert untiled((2, 6), bricks[:-1]).kind == GAP
    overlapping = [*bricks[:3], ((1, 2), (3, 6))]   # the last brick reaches into the one before it
    problem = untiled((2, 6), overlapping)
    assert problem.kind == OVERLAP and set(problem.boxes) == {2, 3}


def test_an_irregular_layout_too_big_to_check_cell_by_cell_is_refused_unless_its_count_decides():
    # each row cut at its own column: rows x columns cells, far more than the boxes
    rows = 2000
    bricks = [box for r in range(rows) for box in (((r, r + 1), (0, r + 1)), ((r, r + 1), (r + 1, rows + 1)))]
    assert untiled((rows, rows + 1), bricks, max_cells=10_000).kind == IRREGULAR
    assert untiled((rows, rows + 1), bricks[:-1], max_cells=10_000).kind == GAP
    assert untiled((rows, rows + 1), [*bricks, bricks[0]], max_cells=10_000).kind == OVERLAP
    assert untiled((rows, rows + 1), bricks, max_cells=rows * (rows + 1)) is None   # exact when it may look


def test_checkpoint2_says_which_chunks_are_wrong():
    shape = (4, 6)
    chunk = lambda offset, local: c2.Chunk(offset, local, "m")  # noqa: E731
    param = lambda *chunks: c2.Param(shape, "float32", chunks)  # noqa: E731
    assert c2._tiling_problem(param(chunk((0, 0), (2, 6)), chunk((2, 0), (2, 6)))) is None
    assert "overlap" in c2._tiling_problem(param(chunk((0, 0), (2, 6)), chunk((0, 0), (2, 6)), chunk((2, 0), (2, 6))))
    assert "cover 12 of its 24" in c2._tiling_problem(param(chunk((0, 0), (2, 6))))
    assert "outside" in c2._tiling_problem(param(chunk((0, 0), (2, 6)), chunk((2, 0), (3, 6))))
    assert "outside" in c2._tiling_problem(param(chunk((0, 0), (4, 6, 1))))
