"""Issue 19, kind 2: a path from outside (wire, RUN.json, config, environment) is resolved by one
function that raises only a bounded OutsidePathError: for a symbolic-link loop (``Path.resolve()``
raised RuntimeError), an overlong path, a NUL byte, a file where a directory should be, an unpaired
surrogate. Property test over generated path strings and filesystem states."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.contracts.outside_paths import OutsidePathError, resolve


def make_tree(root: Path, state: list[tuple[str, str]]) -> None:
    """Build links, loops, files and directories under ``root`` from (kind, name) pairs."""
    (root / "dir").mkdir(exist_ok=True)
    for kind, name in state:
        path = root / name
        if os.path.lexists(path):
            continue
        if kind == "loop":           # name -> name.b -> name
            os.symlink(path.with_name(name + ".b"), path)
            if not os.path.lexists(path.with_name(name + ".b")):
                os.symlink(path, path.with_name(name + ".b"))
        elif kind == "self":
            os.symlink(path, path)
        elif kind == "dangling":
            os.symlink(root / "nowhere" / name, path)
        elif kind == "file":
            path.write_text("x")
        elif kind == "dir":
            path.mkdir()
        elif kind == "up":           # a link out of the tree, to a real place
            os.symlink("/", path)


NAMES = st.sampled_from(["a", "b", "loop", "self", "f", "d", "up", "dir", "..", ".", "", "x" * 300])
STATE = st.lists(st.tuples(st.sampled_from(["loop", "self", "dangling", "file", "dir", "up"]),
                           st.sampled_from(["a", "b", "loop", "self", "f", "d", "up"])), max_size=6)
ODD = st.sampled_from(["\x00", "\ud800", "\udcff", "\n", "/" * 5000, "é", "\u0660"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=STATE, parts=st.lists(st.one_of(NAMES, ODD), min_size=1, max_size=12), absolute=st.booleans())
def test_resolving_any_path_over_any_tree_raises_only_a_bounded_error(tmp_path_factory, state, parts, absolute):
    root = tmp_path_factory.mktemp("tree")
    make_tree(root, state)
    text = "/".join(parts)
    text = str(root / text) if absolute else text
    try:
        found = resolve(text, "the ckpt_dir of a checkpoint_committed message")
    except OutsidePathError as exc:
        assert len(str(exc)) < 600 and "ckpt_dir" in str(exc)
        return
    assert found.is_absolute()


def test_a_loop_an_overlong_path_and_a_file_as_parent_are_errors_that_say_why(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    (tmp_path / "file").write_text("x")
    cases = {str(tmp_path / "a"): "loop", str(tmp_path / "a" / "step_1"): "loop",
             "/x" * 3000: "PATH_MAX", str(tmp_path / "file" / "sub"): "not a directory",
             "a\x00b": "NUL", "\ud800": "can store"}
    for text, why in cases.items():
        with pytest.raises(OutsidePathError, match=why):
            resolve(text, "--ckpt-dir")
    assert resolve(tmp_path / "not-yet" / "there", "--ckpt-dir") == tmp_path / "not-yet" / "there"
