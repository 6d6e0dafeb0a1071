"""Configuration: one definition, one validator for every source, the source named in every error."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from evald.cli.main import help_text, parse_config
from evald.config import ConfigError, default_of, flag_of, option_fields, with_announcement
from tests.harness import REPO


def test_help_lists_every_option_with_its_default_and_every_table_key():
    text = subprocess.run([sys.executable, "-m", "evald", "--help"], capture_output=True, text=True,
                          cwd=REPO, check=True, env={"COLUMNS": "200", "PATH": "/usr/bin"}).stdout
    flat = " ".join(text.split())
    for f in option_fields():
        flag = "--metric-plugin" if f.name == "metric_plugins" else flag_of(f)
        assert flag in flat, flag
        if f.metadata["kind"] == "table":
            for key in f.metadata["table"].__dataclass_fields__:
                assert f"{key}=" in flat, f"{flag} does not show its key {key}"
    # each option says what its default is, once (tests/unit/cli/test_help.py checks the once)
    assert all(re.search(r"\bdefault\b", help_text(f), re.IGNORECASE) for f in option_fields())


def test_version():
    out = subprocess.run([sys.executable, "-m", "evald", "--version"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and re.fullmatch(r"evald \d+\.\d+\.\d+\n", out.stdout)


def test_precedence_cli_over_env_over_toml_over_default(tmp_path):
    toml = tmp_path / "evald.toml"
    from_toml, from_env = tmp_path / "from-toml", tmp_path / "from-env"  # not there yet: the trainer makes them
    toml.write_text(f'device = "3"\nlag_policy = "all"\nckpt_dir = "{from_toml}"\nsubset_size = 7\n'
                    'model_factory = "pkg.m:build"\n[model_kwargs]\nseq_len = 64\n'
                    '[generation]\nprompts = 0\n[[metric_plugins]]\ntarget = "a.b:C"\n')
    resolved = parse_config(["--config", str(toml), "--device", "GPU:5", "--subset-size", "9"],
                            environ={"EVALD_CKPT_DIR": str(from_env)})
    config = resolved.config
    assert str(config.device) == "GPU:5" and config.lag_policy == "all" and config.ckpt_dir == str(from_env)
    assert config.subset_size == 9 and config.generation.prompts == 0 and config.generation.new_tokens == 32
    assert config.model_kwargs == {"seq_len": 64} and config.metric_plugins == ({"target": "a.b:C"},)
    assert resolved.sources["subset_size"] == "command line --subset-size"
    assert resolved.sources["ckpt_dir"] == "environment EVALD_CKPT_DIR"
    assert resolved.sources["lag_policy"] == f"TOML file {toml} lag_policy"
    assert "default" in resolved.sources.get("patience", "default")
    assert any(line.startswith("subset_size = 9  (command line --subset-size)") for line in resolved.describe())


def test_a_table_given_twice_merges_key_by_key(tmp_path):
    toml = tmp_path / "evald.toml"
    toml.write_text('[tuning]\nwatch = "polling"\nmax_attempts = 5\n')
    config = parse_config(["--config", str(toml), "--tuning", '{"max_attempts": 7}',
                           "--tuning", '{"rescan_interval_s": 2}'], environ={}).config
    assert (config.tuning.watch, config.tuning.max_attempts, config.tuning.rescan_interval_s) == ("polling", 7, 2.0)


def test_an_empty_environment_variable_is_unset_not_an_error():
    assert parse_config([], environ={"EVALD_CKPT_DIR": "", "EVALD_ENDPOINT": ""}).config.ckpt_dir is None


BAD = [  # (option, bad value, environment variable or None, what the error must say)
    ("subset_size", "0", None, "must be >= 1, got 0"),
    ("every_k", "0", None, "must be >= 1, got 0"),
    ("lag_policy", "fastest", None, "'fastest' is not one of: latest, all, every-k"),
    ("batch_size", "2.5", None, "expected an integer"),
    ("idle_exit_s", "-1", None, "must be > 0"),
    ("endpoint", "http://x", "EVALD_ENDPOINT", "expected ipc://PATH, tcp://HOST:PORT or none"),
    ("device", "TPU:1", None, "backend 'TPU' is not one of"),
    ("generation", '{"top_p": 0}', None, "must be > 0"),
    ("tuning", '{"watch": "sometimes"}', None, "'sometimes' is not one of: auto, inotify, polling"),
    ("model_kwargs", "[1, 2]", None, "expected a JSON object"),
]


@pytest.mark.parametrize("source,name,value,env,expected", [
    (source, *case) for case in BAD for source in ("command line", "environment", "TOML")
    if source != "environment" or case[2] is not None])  # only options with a variable come from the environment
def test_bad_values_are_rejected_alike_from_every_source_with_the_source_named(tmp_path, source, name, value,
                                                                               env, expected):
    extra = {"every_k": ["--lag-policy", "every-k"], "model_kwargs": ["--model-factory", "a:b"]}.get(name, [])
    environ, argv = {}, list(extra)
    if source == "command line":
        argv += [flag_of(_field(name)), value]
    elif source == "environment":
        environ[env] = value
    else:
        toml = tmp_path / "e.toml"
        kind = _field(name).metadata["kind"]
        literal = value if kind in ("int", "float", "table", "object") else json.dumps(value)
        if kind in ("table", "object"):
            literal = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in json.loads(value).items()) + " }" \
                if value.startswith("{") else value
        toml.write_text(f"{name} = {literal}\n")
        argv += ["--config", str(toml)]
    with pytest.raises(ConfigError) as error:
        parse_config(argv, environ=environ)
    message = str(error.value)
    assert expected in message
    named = {"command line": flag_of(_field(name)), "environment": env, "TOML": f"{tmp_path / 'e.toml'}"}[source]
    assert message.startswith({"command line": "command line", "environment": "environment",
                               "TOML": "TOML file"}[source]) and named in message


def test_unknown_toml_key_names_the_file_and_the_key(tmp_path):
    toml = tmp_path / "evald.toml"
    toml.write_text("patiense = 3\n")
    with pytest.raises(ConfigError, match=r"TOML file .*evald.toml patiense: unknown option"):
        parse_config(["--config", str(toml)], environ={})


@pytest.mark.parametrize("argv,expected", [
    (["--model-kwargs", '{"a": 1}'], "given without model_factory"),
    (["--data-kwargs", '{"a": 1}'], "given without data_factory"),
    (["--every-k", "3"], "only applies with lag_policy every-k"),
    (["--serve-forever", "--idle-exit-s", "5"], "contradicts serve_forever"),
    (["--endpoint", "none"], "set --ckpt-dir"),
    (["--endpoint", "none", "--control-endpoint", "none"], "set --ckpt-dir"),
    (["--stopping-threshold", "5", "--divergence-threshold", "1"], "must be below divergence_threshold"),
    (["--device", "0,1", "--metric-plugin", "a.b:C"], "cannot combine them exactly"),
    (["--group", '{"nodes": 2, "node_rank": 1}'], "needs group.master_port"),
    (["--group", '{"nodes": 2, "node_rank": 1, "master_port": 8119}'], "needs group.key_file"),
    (["--group", '{"nodes": 2, "node_rank": 2}'], "must be below nodes"),
])
def test_options_that_only_make_sense_together_are_checked(argv, expected):
    with pytest.raises(ConfigError, match=expected):
        parse_config(argv, environ={})


def test_the_announcement_fills_only_what_the_operator_left_unset():
    resolved = parse_config(["--model-factory", "mine.m:build", "--model-kwargs", '{"size": 1}'], environ={})
    merged = with_announcement(resolved, {"task": "classification", "model_factory": "theirs.m:build",
                                          "model_kwargs": {"size": 7}, "data_factory": "theirs.d:val",
                                          "data_kwargs": {"n": 3}, "app_dir": None}, "run announcement RUN.json")
    config = merged.config
    assert (config.model_factory, config.model_kwargs) == ("mine.m:build", {"size": 1})
    assert (config.data_factory, config.data_kwargs, config.task) == ("theirs.d:val", {"n": 3}, "classification")
    assert merged.sources["data_factory"] == "run announcement RUN.json data_factory"
    with pytest.raises(ConfigError, match=r"run announcement RUN.json task: 'speech' is not one of"):
        with_announcement(resolved, {"task": "speech"}, "run announcement RUN.json")


def test_a_bad_value_exits_2_before_touching_anything(tmp_path):
    ckpt, sockets = tmp_path / "ckpt", tmp_path / "sockets"
    out = subprocess.run([sys.executable, "-m", "evald", "--ckpt-dir", str(ckpt), "--lag-policy", "every-k",
                          "--every-k", "0"], capture_output=True, text=True, cwd=REPO, timeout=60,
                         env={"PATH": "/usr/bin", "EVALD_SOCKET_DIR": str(sockets), "PYTHONPATH": str(REPO)})
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == "evald: error: command line --every-k: must be >= 1, got 0"
    assert not ckpt.exists() and not sockets.exists()


def test_docs_table_lists_every_option_once_with_its_default():
    text = (REPO / "docs" / "configuration.md").read_text()
    table = text[text.index("## Options"):]
    rows = table.split("\n\n")[1].splitlines()  # the first table: from its header to a blank line
    header, rule, *body = rows
    assert header == "| option | environment | default | meaning |" and set(rule) <= set("|-")
    cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in body]
    assert all(len(c) == 4 for c in cells), [row for row, c in zip(body, cells) if len(c) != 4]
    flags = [c[0].strip("`") for c in cells]
    expected = ["--metric-plugin" if f.name == "metric_plugins" else flag_of(f) for f in option_fields()]
    assert flags == expected
    for f, c in zip(option_fields(), cells):
        if f.metadata["kind"] not in ("table", "suites", "endpoint", "device"):
            assert c[2] == f"`{json.dumps(default_of(f)) if f.metadata['kind'] in ('plugins',) else default_of(f)}`"
        assert c[3] == f.metadata["help"].replace("|", "\\|")
    for f in option_fields():
        if f.metadata["kind"] == "table":
            section = table[table.index(f"### `[{f.name}]`"):].split("\n\n")[1].splitlines()[2:]
            keys = [row.split(" | ")[0].strip("| `") for row in section]
            assert keys == list(f.metadata["table"].__dataclass_fields__), f.name
    assert all(help_text(f) for f in option_fields())


def _field(name: str):
    return next(f for f in option_fields() if f.name == name)
