"""Issue 18 item 10, the process side: ``--wait-for-ckpt-dir`` waits for a directory whose parent does
not exist yet, writes nothing until it is created (no log directory under a missing path), then serves it."""

from __future__ import annotations

import signal

from tests.harness import PYTHON, Proc, base_env, wait_for


def test_evald_waits_for_the_directory_and_creates_nothing_until_it_exists(tmp_path, procs):
    ckpt = tmp_path / "job" / "out" / "ckpt"
    evald = Proc([PYTHON, "-m", "evald", "--ckpt-dir", str(ckpt), "--wait-for-ckpt-dir", "--endpoint", "none",
                  "--cpu-affinity", "1"], base_env(), tmp_path / "evald.log")
    procs.append(evald)
    wait_for(lambda: "waiting for" in evald.output(), 60, "evald waiting for the directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evald.log"]  # nothing under job/
    ckpt.mkdir(parents=True)
    wait_for(lambda: (tmp_path / "job" / "out" / "tensorboard").is_dir() and "serving " in evald.output(), 60,
             "evald serving the directory once it exists")
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]
