"""Issue 18 item 10: a mistyped ``--ckpt-dir`` is an error (exit 2), not a silent wait that exits 0.

A checkpoint directory that does not exist yet is normal (the trainer creates it), but one
whose parent does not exist either is a typo unless ``--wait-for-ckpt-dir`` says to wait
for it; and evald creates nothing before then (no log directory under a missing path)."""

from __future__ import annotations

import pytest

from evald.cli.main import main, parse_config
from evald.config import ConfigError


def test_a_ckpt_dir_whose_parent_does_not_exist_exits_2_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "nonexistent" / "dir"
    assert main(["--ckpt-dir", str(missing), "--idle-exit-s", "5", "--endpoint", "none"]) == 2
    error = capsys.readouterr().err
    assert str(missing) in error and "--wait-for-ckpt-dir" in error, error
    assert list(tmp_path.iterdir()) == []  # no tensorboard/, ledger, lock beside the missing path


def test_a_ckpt_dir_the_trainer_has_not_created_yet_is_fine(tmp_path):
    config = parse_config(["--ckpt-dir", str(tmp_path / "ckpt"), "--endpoint", "none"], environ={}).config
    assert config.ckpt_dir == str(tmp_path / "ckpt") and not config.wait_for_ckpt_dir


def test_waiting_for_it_is_asked_for(tmp_path):
    config = parse_config(["--ckpt-dir", str(tmp_path / "a" / "b"), "--wait-for-ckpt-dir"], environ={}).config
    assert config.wait_for_ckpt_dir


def test_the_environment_and_a_file_in_the_way_are_judged_the_same(tmp_path):
    with pytest.raises(ConfigError, match="EVALD_CKPT_DIR.*does not exist"):
        parse_config([], environ={"EVALD_CKPT_DIR": str(tmp_path / "x" / "y")})
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        parse_config(["--ckpt-dir", str(tmp_path / "file")], environ={})


def test_a_logdir_under_a_path_that_does_not_exist_is_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ConfigError, match="--logdir.*does not exist"):
        parse_config(["--ckpt-dir", str(tmp_path / "ckpt"), "--logdir", str(tmp_path / "no" / "tb")], environ={})
    parse_config(["--ckpt-dir", str(tmp_path / "ckpt"), "--logdir", str(tmp_path / "tb")], environ={})
