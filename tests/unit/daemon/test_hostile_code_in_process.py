"""A RUN.json that others control names no code evald runs: group- or world-writable, or a link (issue 12).

evald's own Server and its real Pipeline in this process: were the trust rule to let a factory through, the
bait's code would run right here and leave its marker (tests/hostile.py ``Bait``). The same rule for a RUN.json
of another owner, and the other channels, run as real processes in tests/e2e/test_hostile_code.py.
"""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest

from evald.contracts import layout, wire
from evald.daemon.server import Server
from tests import faults, hostile
from tests.unit.daemon.rig import config

pytestmark = pytest.mark.usefixtures("private_umask")


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "link"])
def test_a_run_json_others_control_names_no_code_and_no_search_path(tmp_path, how, caplog, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    bait = hostile.Bait.make(tmp_path)
    text = wire.RunAnnounced(run_id="faults", ckpt_dir=str(ckpt), model_factory=bait.evil_factory(),
                             data_factory=bait.system_factory()).encode().decode()
    run_file = ckpt / layout.RUN_FILE
    if how == "link":  # to a RUN.json evald's user owns: the link itself is refused
        trusted = tmp_path / "elsewhere"
        trusted.mkdir()
        layout.write_run_file(trusted, text)
        os.symlink(trusted / layout.RUN_FILE, run_file)
    else:
        layout.write_run_file(ckpt, text)
        os.chmod(run_file, {"group-writable": 0o664, "world-writable": 0o646}[how])
    layout.write_checkpoint(ckpt, 10, {"w": np.ones(4, np.float32)}, run_id="faults")
    server = Server(config(tmp_path, None, ckpt_dir=str(ckpt), logdir=None, idle_exit_s=0.0))  # the real Pipeline
    monkeypatch.setattr(server, "install_signal_handlers", lambda: None)
    with caplog.at_level(logging.INFO):
        assert server.serve() == 3  # checkpoints wait that cannot be evaluated
    log = caplog.text
    if how == "link":
        assert f"{run_file} is a symbolic link; links are not followed here" in log
    else:
        assert ("refused the model factory 'evil:build' (kwargs {}, search path " + repr(str(bait.root))) in log
        assert "refused the data factory 'os:system'" in log and "group or others can write" in log
        assert f"(mode {oct(run_file.stat().st_mode & 0o777)})" in log
    assert "importing the" not in log  # nothing was imported, and the bait never reached sys.path
    assert str(bait.root) not in sys.path
    assert bait.untouched()
    assert [r["state"] for r in faults.ledger_rows(ckpt)] == ["queued"]
