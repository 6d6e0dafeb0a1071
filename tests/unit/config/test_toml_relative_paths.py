"""Issue 37, item 4: a relative path in a TOML file is read against that file's directory.

A suite's ``include_path = ["tasks"]`` was read against evald's current directory, so the same TOML
named other task files (or none) depending on where evald was started. One rule for every path a TOML
file names (a suite's include_path, ckpt_dir, logdir, app_dir, the key and token files, the eval
group's log directory, each of allowed_keys' entries): relative to the file's directory. A value from
the command line or the environment stays relative to the current directory, as a shell user expects.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evald.cli.main import parse_config
from evald.config import ConfigError, resolve, toml_layer


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """evald's current directory: not the TOML file's, and holding none of what it names."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for name in ("EVALD_CKPT_DIR", "EVALD_LOGDIR", "EVALD_APP_DIR", "EVALD_SERVER_KEY", "EVALD_ALLOWED_KEYS"):
        monkeypatch.delenv(name, raising=False)
    return cwd


def _toml(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "evald.toml"
    path.write_text(text)
    return path


def test_a_suites_include_path_is_read_against_the_toml_files_directory(tmp_path, elsewhere):
    conf = tmp_path / "conf"
    (conf / "tasks").mkdir(parents=True)
    config = resolve([toml_layer(_toml(conf, '[suites.mine]\ntasks = ["my_mc"]\ninclude_path = ["tasks"]\n'))]).config
    assert config.suites["mine"].include_path == (str(conf / "tasks"),)


def test_include_path_as_a_single_string_and_dot_segments(tmp_path, elsewhere):
    conf = tmp_path / "conf"
    (tmp_path / "shared" / "tasks").mkdir(parents=True)
    path = _toml(conf, '[suites.mine]\ntasks = ["my_mc"]\ninclude_path = "../shared/tasks"\n')
    config = resolve([toml_layer(path)]).config
    assert config.suites["mine"].include_path == (str(conf / ".." / "shared" / "tasks"),)
    assert os.path.samefile(config.suites["mine"].include_path[0], tmp_path / "shared" / "tasks")


def test_every_path_option_of_a_toml_file_follows_the_same_rule(tmp_path, elsewhere):
    conf = tmp_path / "conf"
    for name in ("ckpt", "app", "keys", "msrun"):
        (conf / name).mkdir(parents=True)
    path = _toml(conf, "\n".join([
        'ckpt_dir = "ckpt"', 'logdir = "tb"', 'app_dir = "app"', 'server_key = "keys/evald.key_secret"',
        f'allowed_keys = "keys{os.pathsep}/abs/trainer.key"',
        '[group]', 'log_dir = "msrun"', 'key_file = "keys/group.key"',
        '[serve]', 'token_file = "keys/serve.token"', ""]))
    config = resolve([toml_layer(path)]).config
    assert config.ckpt_dir == str(conf / "ckpt") and config.logdir == str(conf / "tb")
    assert config.app_dir == str(conf / "app") and config.server_key == str(conf / "keys" / "evald.key_secret")
    assert config.allowed_keys == f"{conf / 'keys'}{os.pathsep}/abs/trainer.key"
    assert config.group.log_dir == str(conf / "msrun") and config.group.key_file == str(conf / "keys" / "group.key")
    assert config.serve.token_file == str(conf / "keys" / "serve.token")


def test_absolute_paths_in_a_toml_file_are_kept(tmp_path, elsewhere):
    (tmp_path / "tasks").mkdir()
    path = _toml(tmp_path / "conf", f'ckpt_dir = "{tmp_path}"\n[suites.mine]\ntasks = ["a"]\n'
                                    f'include_path = ["{tmp_path / "tasks"}"]\n')
    config = resolve([toml_layer(path)]).config
    assert config.ckpt_dir == str(tmp_path) and config.suites["mine"].include_path == (str(tmp_path / "tasks"),)


def test_command_line_and_environment_paths_stay_relative_to_the_current_directory(tmp_path, elsewhere):
    (elsewhere / "ckpt").mkdir()
    config = parse_config(["--ckpt-dir", "ckpt", "--logdir", "tb"], environ={}).config
    assert (config.ckpt_dir, config.logdir) == ("ckpt", "tb")
    config = parse_config([], environ={"EVALD_CKPT_DIR": "ckpt"}).config
    assert config.ckpt_dir == "ckpt"
    # and a TOML's relative value beaten by the command line is the command line's, as typed
    path = _toml(tmp_path / "conf", 'ckpt_dir = "not-here"\n')
    config = parse_config(["--config", str(path), "--ckpt-dir", "ckpt"], environ={}).config
    assert config.ckpt_dir == "ckpt"


def test_a_missing_directory_is_named_where_it_was_looked_for(tmp_path, elsewhere):
    (elsewhere / "tasks").mkdir()      # there, beside evald, but not beside the TOML file: not used
    path = _toml(tmp_path / "conf", '[suites.mine]\ntasks = ["my_mc"]\ninclude_path = ["tasks"]\n')
    with pytest.raises(ConfigError) as caught:
        resolve([toml_layer(path)])
    assert caught.value.key == "suites.mine.include_path"
    assert str(tmp_path / "conf" / "tasks") in caught.value.problem and "not a directory" in caught.value.problem


def test_values_of_the_wrong_type_are_left_to_the_validator(tmp_path, elsewhere):
    path = _toml(tmp_path / "conf", '[suites.mine]\ntasks = ["a"]\ninclude_path = [3]\n')
    with pytest.raises(ConfigError) as caught:
        resolve([toml_layer(path)])
    assert caught.value.key == "suites.mine.include_path" and "a list of directories" in caught.value.problem
