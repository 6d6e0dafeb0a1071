"""--monitor is checked at start-up against what the configured evaluation reports (Lightning's rule)."""

from __future__ import annotations

import pytest

from evald.cli.main import main, parse_config
from evald.config import ConfigError


@pytest.mark.parametrize("argv", [["--monitor", "eval/los"], ["--task", "lm", "--monitor", "eval/macro_f1"],
                                  ["--monitor", "loss"]])
def test_a_metric_nothing_reports_is_refused_naming_it(argv):
    with pytest.raises(ConfigError, match="no evaluation configured here reports it"):
        parse_config(argv, environ={})


@pytest.mark.parametrize("argv", [[], ["--monitor", "eval/accuracy", "--mode", "max"],
                                  ["--task", "classification", "--monitor", "eval/auc", "--mode", "max"],
                                  ["--monitor", "eval/loss_se"], ["--monitor", "sample/greedy/distinct_2"]])
def test_what_the_task_reports_is_accepted(argv):
    assert parse_config(argv, environ={}).config.monitor


def test_the_command_exits_2_with_the_reason(capsys):
    assert main(["--monitor", "eval/los"]) == 2
    assert "--monitor 'eval/los'" in capsys.readouterr().err
