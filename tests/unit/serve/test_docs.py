"""docs/serving.md is executable: its Python examples are the files the e2e tests run, its TOML and its
--serve commands are accepted by evald's own configuration parser."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from evald.cli.main import parse_config

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "serving.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, re.S)


def test_the_python_examples_are_the_files_the_tests_run():
    shown = {block.splitlines()[0][2:]: block.split("\n", 1)[1] for block in _blocks("python")}
    assert set(shown) == {"examples/serving/lm_eval_local_completions.py", "examples/serving/openai_client.py"}
    for path, text in shown.items():
        assert text == (REPO / path).read_text(), f"docs/serving.md shows an outdated {path}"


def test_the_toml_and_the_evald_commands_are_accepted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the page's relative paths (runs/exp1/ckpt), as in a training folder
    (tmp_path / "runs" / "exp1" / "ckpt").mkdir(parents=True)
    (tmp_path / "runs" / "demo" / "ckpt").mkdir(parents=True)    # the demo's run, served
    [toml] = _blocks("toml")
    path = tmp_path / "evald.toml"
    path.write_text(toml)
    tomllib.loads(toml)
    assert parse_config(["--config", str(path)], {}).config.serve.listen == "127.0.0.1:8000"
    commands = [line for block in _blocks("bash") for line in block.splitlines() if line.startswith("evald ")]
    assert len(commands) == 3
    token = tmp_path / "serve.token"
    for command in commands:
        argv = [a.replace("serve.token", str(token)) for a in shlex.split(command)[1:]]
        assert parse_config(argv, {}).config.serve.enabled
