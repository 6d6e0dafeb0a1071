"""When a rank of the eval group dies, the launcher's log says why: the first lines of its error."""

from __future__ import annotations

from evald.daemon.eval_group import first_errors, msrun_command


def test_a_dead_rank_says_why_in_the_launchers_log(tmp_path):
    (tmp_path / "worker_0.log").write_text("starting\n")
    (tmp_path / "worker_1.log").write_text("noise\nTraceback (most recent call last):\n  File \"x\", line 1\n"
                                           "ImportError: cannot import name '__version__' from 'evald'\n")
    said = dict(first_errors(tmp_path))
    assert list(said) == ["worker_1.log"] and "ImportError: cannot import name" in said["worker_1.log"]


def test_the_ranks_start_with_the_current_directory_off_sys_path():
    """python -P: a folder named evald where the user stands cannot shadow the installed package."""
    from evald.cli.main import parse_config

    resolved = parse_config(["--device", "0,1"], environ={})
    cmd = msrun_command(resolved, ["--device", "0,1"], __import__("pathlib").Path("/tmp/x"), 1234)
    assert cmd[-6:-2] == ["python", "-P", "-m", "evald"] and cmd[1] == "-P"
