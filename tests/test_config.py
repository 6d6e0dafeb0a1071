"""Configuration precedence and the CLI: every option shown with its default."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evald.cli import parse_config
from evald.config import option_fields
from tests.harness import REPO


def test_help_lists_every_option_with_its_default():
    text = subprocess.run([sys.executable, "-m", "evald", "--help"], capture_output=True, text=True,
                          cwd=REPO, check=True, env={"COLUMNS": "200", "PATH": "/usr/bin"}).stdout
    flat = " ".join(text.split())
    for f in option_fields():
        flag = "--metric-plugin" if f.name == "metric_plugins" else "--" + f.name.replace("_", "-")
        assert flag in flat, flag
    assert flat.count("(default:") >= len(option_fields())


def test_precedence_cli_over_env_over_toml(tmp_path, monkeypatch):
    toml = tmp_path / "evald.toml"
    toml.write_text('device = 3\nlag_policy = "all"\nckpt_dir = "/from/toml"\n'
                    '[model]\nfactory = "pkg.m:build"\nkwargs = {seq_len = 64}\n'
                    '[early_stop]\npatience = 4\n[generation]\nprompts = 0\n'
                    '[metrics]\nplugins = [{target = "a.b:C"}]\n')
    monkeypatch.setenv("EVALD_CKPT_DIR", "/from/env")
    config = parse_config(["--config", str(toml), "--device", "5"])
    assert config.device == 5 and config.lag_policy == "all" and config.ckpt_dir == "/from/env"
    assert config.patience == 4 and config.generation_prompts == 0
    assert config.factory("model").kwargs == {"seq_len": 64}
    assert config.metric_plugins == ({"target": "a.b:C"},)


def test_unknown_toml_key_is_an_error(tmp_path, capsys):
    toml = tmp_path / "evald.toml"
    toml.write_text("patiense = 3\n")
    with pytest.raises(SystemExit):
        parse_config(["--config", str(toml)])
    assert "unknown option 'patiense'" in capsys.readouterr().err


def test_docs_list_every_option():
    text = (REPO / "docs" / "configuration.md").read_text()
    for f in option_fields():
        flag = "--metric-plugin" if f.name == "metric_plugins" else "--" + f.name.replace("_", "-")
        assert f"`{flag}`" in text, f"{flag} is not documented in docs/configuration.md"
