"""``evald --help`` and the subcommands' help as a new user reads them (issue 18, item 11):
one default per option, options in argument groups, every option of a subcommand explained."""

from __future__ import annotations

import re

import pytest

from evald.cli.main import build_parser, main
from evald.config import option_fields
from evald.config.options import HELP_GROUPS


def _option_actions(parser):
    return [a for a in parser._actions if a.option_strings and a.dest not in ("help", "version", "config")]


def test_each_option_states_its_default_once():
    twice = {a.option_strings[0]: a.help for a in _option_actions(build_parser())
             if len(re.findall(r"\bdefault\b", a.help, re.IGNORECASE)) != 1}
    assert not twice, f"options whose help gives no default or two: {twice}"
    shown = {a.option_strings[0]: a.help for a in _option_actions(build_parser())}
    assert "(default 2)" in shown["--every-k"] and "None" not in shown["--every-k"]
    assert "(default: never)" in shown["--idle-exit-s"] and "None" not in shown["--idle-exit-s"]
    assert "None" not in " ".join(shown.values())  # a Python spelling; unset options say what happens


def test_options_are_grouped_and_each_option_is_in_one_group(capsys):
    parser = build_parser()
    titles = [g.title for g in parser._action_groups]
    assert [t for t, _, _ in HELP_GROUPS] == titles[2:]  # after argparse's own positionals/options
    assert {"input", "evaluation", "early stopping", "security", "tuning"} <= set(titles)
    placed = [a.dest for g in parser._action_groups[2:] for a in g._group_actions]
    assert sorted(placed) == sorted(f.name for f in option_fields())
    assert len(placed) == len(set(placed))
    general = [a.dest for a in parser._action_groups[1]._group_actions]
    assert general == ["help", "version", "config"]
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.index("input:") < out.index("  --ckpt-dir") < out.index("evaluation:") < out.index("  --subset-size")


def test_an_option_added_anywhere_joins_the_group_before_it():
    from evald.cli.main import grouped_options

    names = [f.name for f in option_fields()]
    groups = grouped_options(names[:5] + ["a_new_option"] + names[5:])
    [group] = [g for g in groups if "a_new_option" in g[2]]
    assert names[4] in group[2]


def test_subset_help_explains_every_option_without_typos(capsys):
    with pytest.raises(SystemExit):
        main(["subset", "--help"])
    out = capsys.readouterr().out
    assert ".." not in out.replace("...", "")
    lines = out[out.index("options:"):].splitlines()[1:]
    unexplained = []
    for i, line in enumerate(lines):
        match = re.match(r"^  (--[\w-]+)( [A-Z_]+)?(.*)$", line)
        if match and match.group(1) != "--help":
            follows = lines[i + 1] if i + 1 < len(lines) else ""
            if not match.group(3).strip() and not re.match(r"^ {8,}[^ -]", follows):
                unexplained.append(match.group(1))
    assert not unexplained, f"options with no help: {unexplained}"
    flat = re.sub(r"\s+", " ", out)
    assert "default: 256" in flat and "default: 1234" in flat


def test_every_subcommand_is_named_in_help_the_module_and_the_architecture(capsys):
    """Issue 26 item 9: `evald --help` and docs/architecture.md left out `backfill` (and the
    architecture `compare`)."""
    from pathlib import Path

    from evald.cli import main as main_module
    from evald.cli.main import SUBCOMMANDS

    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    architecture = (Path(__file__).resolve().parents[3] / "docs" / "architecture.md").read_text()
    for name in SUBCOMMANDS:
        assert f"evald {name}" in " ".join(shown.split()), name
        assert f"evald {name}" in main_module.__doc__, name
        assert f"`{name}`" in architecture, name
