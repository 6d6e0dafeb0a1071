"""A configuration value with 100,000 items (a suite's task names) put a 1.1 MB line in evald's start-up log
(issue 27, Low 19). Long values are shortened there, saying how many items were left out; the configuration
itself is untouched."""

from __future__ import annotations

import json

from evald.cli.main import parse_config


def test_a_suite_of_100000_tasks_is_shortened_in_the_start_up_echo():
    names = [f"task_{i:06d}" for i in range(100_000)]
    resolved = parse_config(["--suites", json.dumps({"big": {"tasks": names}})], environ={})
    assert len(resolved.config.suites["big"].tasks) == 100_000          # the configuration keeps every name
    lines = resolved.describe()
    [line] = [line for line in lines if line.startswith("suites = ")]
    assert len(line) < 4000, len(line)
    assert "'task_000000'" in line and "99,980 more" in line
    assert max(map(len, lines)) < 4000


def test_long_strings_and_long_lists_are_shortened_saying_how_much_was_left_out():
    resolved = parse_config(["--model-factory", "m:f", "--model-kwargs", json.dumps({"blob": "x" * 10_000}),
                             "--factory-allow", ",".join(f"pkg{i}." for i in range(5000))], environ={})
    lines = {line.split(" = ")[0]: line for line in resolved.describe()}
    assert len(lines["model_kwargs"]) < 4000 and "9,500 more characters" in lines["model_kwargs"]
    assert len(lines["factory_allow"]) < 4000 and "4,980 more" in lines["factory_allow"]
