"""The one writer of ``evald export`` (evald.sinks.export_target): files staged whole in a private
directory inside ``--out`` and renamed into place, never through a link, even one swapped in between
the check and the rename; what killed exports left removed, and only theirs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from evald.sinks import export_target
from evald.sinks.export_target import STAGING_PREFIX, ExportTarget, ExportTargetError, check_out, open_target
from tests.export_runs import tree


def _outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    return outside


def test_files_are_staged_privately_and_appear_only_at_the_commit(tmp_path):
    out = tmp_path / "out"
    with open_target(check_out(out)) as target:
        path = target.write_text(("a", "b", "file.json"), "{}")
        staging = out / target.staging
        assert stat.S_IMODE(staging.stat().st_mode) == 0o700 and (staging / "a" / "b" / "file.json").read_text() == "{}"
        assert not path.exists() and sorted(os.listdir(out)) == [target.staging]
        with pytest.raises(ExportTargetError, match="would be written twice"):
            target.write_text(("a", "b", "file.json"), "again")
        assert target.commit() == [path]
    assert path.read_text() == "{}" and sorted(os.listdir(out)) == ["a"]      # the staging directory is gone


@pytest.mark.parametrize("parts", [("..", "x"), ("a/b",), ("a", ".", "x"), ("nul\x00",), ("x" * 256,), ("",),
                                   ("lone\ud800",)])
def test_a_name_that_is_no_plain_file_name_is_refused(tmp_path, parts):
    out = tmp_path / "out"
    with open_target(out) as target, pytest.raises(ExportTargetError, match="not a|bytes long|cannot store|UTF-8"):
        target.write_text(parts, "x")
    assert tree(tmp_path) == {}         # the fresh --out is gone with its staging directory


def test_text_that_is_no_unicode_is_refused_naming_the_file(tmp_path):
    (tmp_path / "out").mkdir()
    with open_target(tmp_path / "out") as target:
        with pytest.raises(ExportTargetError, match=r"out/x\.jsonl cannot be written as UTF-8 .*'\\ud800'"):
            target.write_text(("x.jsonl",), '{"a": "\ud800"}')
    assert tree(tmp_path) == {"out": "<dir>"}


def test_a_link_swapped_in_after_the_check_is_replaced_itself_never_written_through(tmp_path, monkeypatch):
    """rename(2) over a symbolic link replaces the link: the file it points to keeps its bytes."""
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    checked = ExportTarget._check_place

    def check_then_swap(self, parts):
        checked(self, parts)
        (out.joinpath(*parts)).symlink_to(outside / "precious")     # the race: after the check, before the rename

    monkeypatch.setattr(ExportTarget, "_check_place", check_then_swap)
    with open_target(out) as target:
        path = target.write_text(("x.json",), "new")
        target.commit()
    assert not path.is_symlink() and path.read_text() == "new"
    assert tree(outside) == {"precious": b"keep me"}


def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(tmp_path, monkeypatch):
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    (out / "hf").mkdir(parents=True)
    checked = ExportTarget._check_place

    def check_then_swap(self, parts):
        checked(self, parts)
        (out / "hf").rmdir()
        (out / "hf").symlink_to(outside)

    monkeypatch.setattr(ExportTarget, "_check_place", check_then_swap)
    with open_target(out) as target:
        target.write_text(("hf", "precious"), "overwritten")
        with pytest.raises(ExportTargetError, match=r"out/hf is no longer a directory .* 0 of 1 files were"):
            target.commit()
    assert tree(outside) == {"precious": b"keep me"}
    assert sorted(os.listdir(out)) == ["hf"]                        # the staging directory removed


def _staging_name(host: str, pid: int) -> str:
    return f"{STAGING_PREFIX}{host}-{pid}-0123abcd"


def test_only_staging_directories_of_dead_exports_on_this_host_are_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = export_target._host()
    for name in (_staging_name(host, int(dead.stdout)), _staging_name(host, os.getpid()),
                 _staging_name("elsewhere", int(dead.stdout))):
        (out / name / "lm-eval").mkdir(parents=True)
        (out / name / "lm-eval" / "half.json").write_text("{")
    outside = _outside(tmp_path)
    linked = _staging_name(host, int(dead.stdout)).replace("0123abcd", "4567abcd")
    (out / linked).symlink_to(outside)                                # named like one, but a link: left alone
    with open_target(out) as target:
        assert target.removed_leftovers == [_staging_name(host, int(dead.stdout))]
    assert sorted(os.listdir(out)) == sorted([_staging_name(host, os.getpid()), _staging_name("elsewhere",
                                                                                             int(dead.stdout)), linked])
    assert tree(outside) == {"precious": b"keep me"}
