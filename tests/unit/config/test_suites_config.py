"""``[suites.NAME]`` and the tokenizer factory: validated once, errors naming the key."""

from __future__ import annotations

import pytest

from evald.config import ConfigError, resolve, toml_layer


def _resolve(tmp_path, text):
    path = tmp_path / "evald.toml"
    path.write_text(text)
    return resolve([toml_layer(path)]).config


def test_a_suite_table_becomes_suite_options(tmp_path):
    (tmp_path / "tasks").mkdir()
    config = _resolve(tmp_path, f"""
tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"
[suites.fast]
tasks = ["stdlib_next_line"]
include_path = ["{tmp_path / 'tasks'}"]
limit = 200
every_k = 2
[suites.bpb]
tasks = ["stdlib_bpb"]
""")
    fast = config.suites["fast"]
    assert fast.tasks == ("stdlib_next_line",) and fast.limit == 200 and fast.every_k == 2 and fast.seed == 1234
    assert config.suites["bpb"].batch_size == 8 and config.tokenizer_factory.endswith(":build_tokenizer")


@pytest.mark.parametrize("text, key, says", [
    ("[suites.fast]\nlimit = 3\n", "suites.fast", "at least one lm-eval task"),
    ("[suites.fast]\ntasks = ['a']\nlimit = 0\n", "suites.fast.limit", ">= 1"),
    ("[suites.fast]\ntasks = ['a']\nbogus = 1\n", "suites.fast.bogus", "unknown key"),
    ("[suites.fast]\ntasks = ['a']\ninclude_path = ['/no/such/dir']\n", "suites.fast.include_path",
     "not a directory"),
    ("[suites.'a b']\ntasks = ['a']\n", "suites.a b", "letters, digits"),
    # the whole name: a trailing newline once passed ("$" matches before it) and reached the per-sample path builder
    ('[suites."mc\\n"]\ntasks = [\'a\']\n', "suites.mc\n", "letters, digits"),
    ("[suites.'mc\u0661']\ntasks = ['a']\n", "suites.mc\u0661", "letters, digits"),   # an Arabic-Indic digit
    ("[suites.fast]\ntasks = ['a']\ndevice = '3'\n", "suites", "not in --device"),
    ("tokenizer_kwargs = {a = 1}\n", "tokenizer_kwargs", "without tokenizer_factory"),
])
def test_bad_suites_are_refused_naming_the_key(tmp_path, text, key, says):
    with pytest.raises(ConfigError) as caught:
        _resolve(tmp_path, text)
    assert caught.value.key == key and says in caught.value.problem
