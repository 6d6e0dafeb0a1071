"""The one rule for opening a file someone else may control (evald.contracts.safe_open): regular files
only, no link anywhere below the root, never blocking, bounded."""

from __future__ import annotations

import os

import pytest

from evald.contracts.safe_open import UnsafeFile, list_beneath, open_beneath, read_beneath, walk_files
from tests.bounded import within


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.json").write_bytes(b"{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s" * 651)
    return root, outside


def test_a_regular_file_below_the_root_is_read(tree):
    root, _ = tree
    data, info = read_beneath(root, "a/b/f.json", 10)
    assert data == b"{}" and info.st_size == 2


def test_a_fifo_is_refused_at_once_not_waited_on(tree):
    root, _ = tree
    os.mkfifo(root / "a" / "fifo")
    with pytest.raises(UnsafeFile, match="FIFO"):
        within(10, lambda: read_beneath(root, "a/fifo", 10), release=[root / "a" / "fifo"], what="the open blocked")


def test_a_link_as_the_last_component_is_refused(tree):
    root, outside = tree
    (root / "a" / "link").symlink_to(outside / "secret")
    with pytest.raises(UnsafeFile, match="symbolic link"):
        read_beneath(root, "a/link", 1 << 20)


def test_a_link_on_the_way_is_refused(tree):
    root, outside = tree
    (root / "out").symlink_to(outside)
    with pytest.raises(UnsafeFile, match="symbolic link.*not a directory"):
        read_beneath(root, "out/secret", 1 << 20)


def test_a_hard_link_is_refused_unless_the_caller_allows_it(tree):
    root, outside = tree
    os.link(outside / "secret", root / "hard")
    with pytest.raises(UnsafeFile, match="hard link"):
        read_beneath(root, "hard", 1 << 20)
    assert read_beneath(root, "hard", 1 << 20, single_link=False)[0] == b"s" * 651


def test_a_file_over_its_limit_is_refused_before_a_byte_is_read(tree):
    root, _ = tree
    with open(root / "sparse", "wb") as f:
        f.truncate(1 << 40)
    with pytest.raises(UnsafeFile, match="more than the 1024"):
        read_beneath(root, "sparse", 1024)


@pytest.mark.parametrize("relative", ["../outside/secret", "a/../../outside/secret", "/etc/passwd", "", ".", "a//b"])
def test_names_that_climb_out_or_are_not_plain_are_refused(tree, relative):
    root, _ = tree
    with pytest.raises(UnsafeFile, match="not a plain relative path"):
        read_beneath(root, relative, 1 << 20)


def test_a_directory_is_not_a_file(tree):
    root, _ = tree
    with pytest.raises(UnsafeFile, match="a directory, not a regular file"):
        read_beneath(root, "a", 1 << 20)


def test_absent_is_file_not_found(tree):
    root, _ = tree
    with pytest.raises(FileNotFoundError):
        read_beneath(root, "a/none", 10)
    with pytest.raises(FileNotFoundError):
        read_beneath(root, "none/f", 10)


def test_pread_reads_a_range_of_the_opened_file(tree):
    root, _ = tree
    (root / "r").write_bytes(bytes(range(100)))
    with open_beneath(root, "r", 100) as opened:
        assert opened.pread(5, 10) == bytes(range(10, 15))
        assert opened.pread(50, 90) == bytes(range(90, 100))
    assert opened.fd == -1


def test_listing_shows_what_each_entry_is_and_never_follows_a_link(tree):
    root, outside = tree
    (root / "a" / "link").symlink_to(outside)
    os.mkfifo(root / "a" / "fifo")
    listed = {e.name: e for e in list_beneath(root, "a")}
    assert listed["b"].is_dir and not listed["link"].is_dir and not listed["fifo"].is_file
    assert list(walk_files(root, "a", depth=1)) == ["a/b/f.json"]
    with pytest.raises(UnsafeFile):
        list_beneath(root, "a/link")
