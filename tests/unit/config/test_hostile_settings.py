"""Issue 19, kind 10: every numeric option is bounded to a sane range and the error names the limit
(``patience = 2**63`` was accepted); bad settings end in a clear error and exit 2, not a traceback
(the socket-directory and ipc-path cases are in tests/unit/daemon/test_hostile_state_dirs.py)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from evald.cli.main import parse_config
from evald.config.options import option_fields
from evald.config.schema import ConfigError, coerce

NUMERIC = ("int", "float", "delta")


def _numeric_options():
    for f in option_fields():
        if f.metadata["kind"] in NUMERIC:
            yield f.name, f
        elif f.metadata["kind"] == "table":
            for sub in fields(f.metadata["table"]):
                if sub.metadata.get("kind") in NUMERIC:
                    yield f"{f.name}.{sub.name}", sub


@pytest.mark.parametrize("name, field", list(_numeric_options()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_numeric_option_is_bounded_and_the_error_names_the_limit(name, field):
    for huge in (2**63, 10**30, -(2**63)):
        if field.metadata["kind"] == "delta" and huge < 0:
            continue
        with pytest.raises(ConfigError, match=r"must be (<=|>=|>) -?[0-9]") as raised:
            coerce(field, huge, "--test", name)
        assert name in str(raised.value)


def test_patience_of_2_to_the_63_is_refused_naming_the_limit():
    with pytest.raises(ConfigError, match=r"patience: must be <= 1000000000"):
        parse_config(["--patience", str(2**63)], environ={})


def test_a_bad_setting_exits_2_with_a_clear_error(tmp_path, capsys):
    from evald.cli.main import main

    assert main(["--ckpt-dir", str(tmp_path), "--endpoint", "none", "--idle-exit-s", "0.1",
                 "--patience", str(2**63)]) == 2
    err = capsys.readouterr().err
    assert "patience" in err and "Traceback" not in err
