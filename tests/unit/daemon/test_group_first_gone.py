"""Issue 29 item 4: when an eval group fails, the launcher names the rank that ended first."""

from __future__ import annotations

from evald.daemon.eval_group import first_gone


def test_the_first_rank_seen_gone_is_named_and_kept():
    seen = {101: (0, 101), 102: (1, 102), 103: (2, 103)}
    assert first_gone(seen, {101: (0, 101), 102: (1, 102), 103: (2, 103)}, None) is None
    first = first_gone(seen, {101: (0, 101), 103: (2, 103)}, None)
    assert first == (1, 102)
    assert first_gone(seen, {}, first) == (1, 102)          # msrun then ends the others: still rank 1
    assert first_gone({}, {}, None) is None
