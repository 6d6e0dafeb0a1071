"""Which run a bare ``evald status`` / ``evald retry`` means (issue 18, item 11): the README shows
them without ``--ckpt-dir``. They find the run as evald itself is configured: ``--ckpt-dir`` or
``EVALD_CKPT_DIR``, else the ``--config`` TOML's ``ckpt_dir``/``logdir``/``run_name``, else the
current directory (a run directory, a checkpoint directory a run serves, or a log directory
holding one run). Real files, a real ledger; the commands run in-process."""

from __future__ import annotations

import json

import pytest

from evald.cli.main import main


@pytest.fixture
def run(tmp_path, monkeypatch, new_run):
    served = new_run(tmp_path / "runs" / "exp1" / "ckpt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return served


def _status(capsys, *args: str) -> tuple[int, dict | str]:
    code = main(["status", "--json", *args])
    out = capsys.readouterr()
    return code, json.loads(out.out) if code == 0 else out.err


def test_bare_status_from_elsewhere_says_what_it_tried(run, capsys):
    code, err = _status(capsys)
    assert code == 2
    assert "--ckpt-dir" in err and "EVALD_CKPT_DIR" in err and "--config" in err and "current directory" in err


def test_the_environment_names_the_run(run, capsys, monkeypatch):
    monkeypatch.setenv("EVALD_CKPT_DIR", str(run.ckpt_dir))
    code, info = _status(capsys)
    assert code == 0 and info["run_dir"] == str(run.path)


def test_the_config_file_names_the_run(run, capsys, tmp_path):
    toml = tmp_path / "evald.toml"
    toml.write_text(f'ckpt_dir = "{run.ckpt_dir}"\npatience = 5\n[tuning]\nwatch = "polling"\n')
    code, info = _status(capsys, "--config", str(toml))
    assert code == 0 and info["run_dir"] == str(run.path)
    toml.write_text(f'logdir = "{run.logdir}"\nrun_name = "{run.name}"\n')
    code, info = _status(capsys, "--config", str(toml))
    assert code == 0 and info["run_dir"] == str(run.path)
    toml.write_text("subset_size = 0\n")
    code, err = _status(capsys, "--config", str(toml))
    assert code == 2 and "ckpt_dir" in err


@pytest.mark.parametrize("where", ["run directory", "checkpoint directory", "log directory"])
def test_the_current_directory_names_the_run(run, capsys, monkeypatch, where):
    monkeypatch.chdir({"run directory": run.path, "checkpoint directory": run.ckpt_dir,
                       "log directory": run.logdir}[where])
    code, info = _status(capsys)
    assert code == 0 and info["run_dir"] == str(run.path)


def test_bare_retry_in_the_checkpoint_directory(run, capsys, monkeypatch):
    monkeypatch.chdir(run.ckpt_dir)
    assert main(["retry"]) == 0
    assert "evald retry:" in capsys.readouterr().out


def test_run_dir_alone_names_the_run_whatever_the_config_file_says(run, capsys, tmp_path):
    """issue 35: `--run-dir` with a --config TOML that sets no ckpt_dir (it is given for its suites, as
    `evald export` needs them) was refused with "sets neither ckpt_dir nor logdir"."""
    toml = tmp_path / "evald.toml"
    toml.write_text("subset_size = 0\n")
    code, info = _status(capsys, "--run-dir", str(run.path), "--config", str(toml))
    assert code == 0, info
    assert info["run_dir"] == str(run.path)
    code, err = _status(capsys, "--config", str(toml))
    assert code == 2 and "give --ckpt-dir or --run-dir" in err
