"""`evald export` killed with SIGKILL midway (issue 35): a real process, killed by itself at a chosen
point (after two formats were written and before the third; in the middle of a file's bytes). ``--out``
must hold exactly what the earlier export left, whole: the killed export's files, complete or partial,
are only in its clearly named staging directory, which the next export removes."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.export_runs import build_run, include_dir, suite_identity, tree
from tests.harness import PYTHON, REPO, base_env

pytest.importorskip("lm_eval")

STAGING_PREFIX = ".evald-export-partial-"   # evald.sinks.export_target's, as docs/benchmarks.md names it

# the export, run as `evald export` runs it, with a hook that SIGKILLs the process at one point
KILLED = """
import os, signal, sys
from evald.cli.main import main

def die():
    os.kill(os.getpid(), signal.SIGKILL)

point, run_dir, config, out = sys.argv[1:5]
if point == "between-formats":          # lm-eval's and Every Eval Ever's files are written by then
    from evald.sinks import hf_eval_results
    hf_eval_results.write = lambda *args, **kwargs: die()
else:                                   # half of the third file's bytes written, then killed
    from evald.sinks import export_target
    written, real = [], export_target._write_all
    def half_then_die(fd, data):
        written.append(fd)
        if len(written) == 3:
            real(fd, data[:len(data) // 2])
            die()
        real(fd, data)
    export_target._write_all = half_then_die
sys.exit(main(["export", "--run-dir", run_dir, "--config", config, "--out", out, "--model-name", "killed"]))
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    include = include_dir(tmp_path_factory.mktemp("bench"))
    return include, suite_identity(include)


@pytest.mark.parametrize("point", ["between-formats", "mid-file"])
def test_an_export_killed_midway_leaves_out_whole_and_the_next_export_cleans_up(tmp_path, demo, capsys, point):
    from evald.cli.main import main

    run_dir, config = build_run(tmp_path, *demo, steps=(30, 40))
    out = tmp_path / "out"
    assert main(["export", "--run-dir", str(run_dir), "--config", str(config), "--out", str(out)]) == 0
    before = tree(out)
    killed = subprocess.run([PYTHON, "-c", KILLED, point, str(run_dir), str(config), str(out)], cwd=REPO,
                            env=base_env(), capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr[-3000:]

    after = tree(out)
    assert {k: v for k, v in after.items() if not k.startswith(STAGING_PREFIX)} == before   # nothing in place
    (staging,) = {name.split("/")[0] for name in after if name.startswith(STAGING_PREFIX)}
    left = [name for name, body in after.items() if name.startswith(staging + "/") and isinstance(body, bytes)]
    assert left and all("killed@step-" in name for name in left)   # only the killed export's files, staged

    capsys.readouterr()
    assert main(["export", "--run-dir", str(run_dir), "--config", str(config), "--out", str(out), "--model-name",
                 "killed"]) == 0
    said = capsys.readouterr().err
    assert f"removed {out / staging}, left by an export that was killed" in said
    final = tree(out)
    assert not any(name.startswith(STAGING_PREFIX) for name in final)
    assert {k: v for k, v in final.items() if k in before} == before           # the earlier export's files
    assert len([k for k, v in final.items() if "killed@step-" in k and isinstance(v, bytes)]) == 8
