"""`--tensor-parallel N` (issue 29): on the command line and in TOML, and refused where it cannot work."""

from __future__ import annotations

import pytest

from evald.cli.main import parse_config
from evald.config import ConfigError


def test_the_degree_from_the_command_line_and_from_toml(tmp_path):
    resolved = parse_config(["--device", "0,1,2,3", "--tensor-parallel", "4", "--ckpt-dir", str(tmp_path)],
                            environ={})
    assert resolved.config.tensor_parallel == 4 and resolved.config.group_size == 4
    toml = tmp_path / "evald.toml"
    toml.write_text('device = "0,1"\ntensor_parallel = 2\n')
    assert parse_config(["--config", str(toml), "--ckpt-dir", str(tmp_path)], environ={}).config.tensor_parallel == 2
    assert parse_config(["--ckpt-dir", str(tmp_path)], environ={}).config.tensor_parallel == 1


@pytest.mark.parametrize("argv,expected", [
    (["--device", "0,1,2,3", "--tensor-parallel", "2"], "must equal the eval group's ranks"),
    (["--device", "0", "--tensor-parallel", "2"], "must equal the eval group's ranks"),
    (["--tensor-parallel", "0"], "must be >= 1"),
])
def test_a_degree_that_cannot_work_is_refused_at_start(tmp_path, argv, expected):
    with pytest.raises(ConfigError, match=expected):
        parse_config([*argv, "--ckpt-dir", str(tmp_path)], environ={})


def test_benchmark_suites_are_accepted_on_a_tensor_parallel_group(tmp_path):
    resolved = parse_config(["--device", "0,1", "--tensor-parallel", "2", "--suites",
                             '{"fast": {"tasks": ["hellaswag"]}}', "--ckpt-dir", str(tmp_path)], environ={})
    assert resolved.config.tensor_parallel == 2 and list(resolved.config.suites) == ["fast"]
