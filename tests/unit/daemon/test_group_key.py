"""The eval group's secret: where the launcher gets it, how a rank takes it, and the key file's rules
(docs/security.md, "The eval group's channel")."""

from __future__ import annotations

import os

import pytest

from evald.cli.keys import create_key_bundles
from evald.contracts.auth import SecurityError, load_group_key, write_group_key
from evald.daemon.eval_group import ENV_GROUP_KEY, group_key, worker_key


def test_one_host_gets_a_fresh_secret_each_start():
    first, second = group_key(None), group_key(None)
    assert len(first) == 32 and first != second


def test_evald_keys_writes_a_private_group_key_that_loads(tmp_path):
    made = create_key_bundles(tmp_path / "keys")
    path = made["group_key"]
    assert path.name == "group.key" and (path.stat().st_mode & 0o777) == 0o600
    assert group_key(str(path)) == load_group_key(path) and len(load_group_key(path)) == 32
    with pytest.raises(FileExistsError):
        create_key_bundles(tmp_path / "keys")


@pytest.mark.parametrize("problem,expected", [
    ("mode", "others may read or write it"),
    ("link to an open file", "others may read or write it"),
    ("short", "does not hold a secret: one line of at least 64"),
    ("spaces", "does not hold a secret"),
    ("not hex", "does not hold hex digits"),
    ("fifo", "is a FIFO, not a regular file"),
    ("absent", "does not exist; make one with `evald keys DIR`"),
])
def test_a_key_file_that_others_may_read_or_that_holds_no_key_is_refused(tmp_path, problem, expected):
    path = tmp_path / "group.key"
    if problem == "link to an open file":
        real = write_group_key(tmp_path / "real.key")
        real.chmod(0o644)
        path.symlink_to(real)
    elif problem == "fifo":
        os.mkfifo(path, 0o600)
    elif problem != "absent":
        write_group_key(path)
        if problem == "mode":
            path.chmod(0o640)
        elif problem == "short":
            path.write_text("ab" * 16)
        elif problem == "spaces":
            path.write_text("not hex at all, not even close to a key of 32 bytes............")
        elif problem == "not hex":
            path.write_text("zz" * 32)
    with pytest.raises(SecurityError, match=expected):
        load_group_key(path)


def test_a_key_file_named_through_a_link_is_read_like_a_mounted_secret(tmp_path):
    """The operator's file may be a link (a Kubernetes Secret's volume shows its files through links)."""
    real = write_group_key(tmp_path / "real.key")
    (tmp_path / "group.key").symlink_to(real)
    assert load_group_key(tmp_path / "group.key") == load_group_key(real)


@pytest.mark.skipif(os.getuid() != 0, reason="another owner is made with chown (root only)")
def test_a_key_file_of_another_user_is_refused(tmp_path):
    path = write_group_key(tmp_path / "group.key")
    os.chown(path, 12345, 12345)
    with pytest.raises(SecurityError, match="belongs to uid 12345"):
        load_group_key(path)


def test_a_rank_takes_the_key_out_of_its_environment_and_refuses_to_run_without_one():
    environ = {ENV_GROUP_KEY: "ab" * 32, "OTHER": "x"}
    assert worker_key(environ) == bytes.fromhex("ab" * 32) and ENV_GROUP_KEY not in environ
    for bad in ({}, {ENV_GROUP_KEY: "zz"}, {ENV_GROUP_KEY: "ab" * 8}):
        with pytest.raises(SecurityError, match="start eval groups with `evald --device"):
            worker_key(bad)
