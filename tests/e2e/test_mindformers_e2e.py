"""A real evald on a MindFormers output directory (tests/mindformers_fixtures.py writes it with
MindSpore's own save_checkpoint, in MindFormers 2.0's layout, names and permissions).

* started before training: evald creates nothing in the trainer's tree and waits for it;
  each step is evaluated once, from the weights-only file, with its global step from the
  full checkpoint of the same step (epoch 2), and ``best.json`` names a file that exists;
* run as another user (uid 65534 through ``setpriv``; the tests run as root), 0400 files are a permission problem, kept pending and evaluated once
  they are made readable, never "truncated, empty or corrupt".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

import pytest

from evald.files.recognise import FOREIGN, FOREIGN_WEIGHTS
from tests import faults
from tests.harness import PYTHON, REPO, Proc, base_env, raw_scalar_steps, scalar_points, wait_for
from tests.mindformers_fixtures import full_name, network_name, save, write

FACTORIES = ("--model-factory", "examples.tiny_lm.model:build_model", "--model-kwargs", '{"seq_len": 64}',
             "--data-factory", "examples.tiny_lm.data:validation_windows", "--data-kwargs", '{"seq_len": 64}',
             "--app-dir", str(REPO))
BOTH = [(1, 10, 10), (1, 20, 20), (2, 5, 30), (2, 15, 40)]   # weights-only and full file
FULL_ONLY = [(3, 10, 60)]                                    # a step with the full checkpoint alone
REF = 1000                                                   # evald-layout copies of the same weights


def _tree(root: Path) -> dict[str, int]:
    """Every path under ``root`` with its mode."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def _final(rows) -> bool:
    return bool(rows) and all(r["state"] in ("evaluated", "failed", "skipped", "deleted") for r in rows)


def test_evald_started_before_training_serves_the_output_directory(tmp_path, procs):
    out, logs = tmp_path / "output", None  # the default log directory: beside output/, not in it
    # foreign_settle_s stays at its default (2 s), as in production: MindFormers writes the full checkpoint,
    # then the weights-only file; with 0 s evald could start on the full file of step 10 before the weights
    # file existed (CI, 2026-12-02: step 10 read from checkpoint/, correctly, but not what this test pins)
    evald = faults.start(tmp_path, out, *FACTORIES, "--lag-policy", "all", "--tuning", '{"rescan_interval_s": 1}')
    procs.append(evald)
    wait_for(lambda: "does not exist yet" in evald.output(), 120, "evald waiting for the output directory")
    wait_for(lambda: "evaluation network ready" in evald.output() or "serving" in evald.output(), 180, "evald up")
    assert sorted(os.listdir(tmp_path)) == ["evald.log", "tensorboard"]  # evald created nothing of output/

    write([save(out, e, s, g) for e, s, g in BOTH] + [save(out, e, s, g, network=False) for e, s, g in FULL_ONLY],
          tmp_path)
    written = _tree(out)
    steps = [g for *_, g in BOTH + FULL_ONLY]
    wait_for(lambda: len(faults.ledger_rows(out, logs)) == len(steps) and _final(faults.ledger_rows(out, logs)),
             240, "every MindFormers step evaluated")
    for _, _, g in BOTH + FULL_ONLY:  # reference copies, once the steps above are done (so best is theirs)
        faults.commit(out, REF + g, faults.weights_for_step(g))
    wait_for(lambda: len(faults.ledger_rows(out, logs)) == 2 * len(steps) and _final(faults.ledger_rows(out, logs)),
             240, "reference copies evaluated")
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]

    rows = {r["step"]: r for r in faults.ledger_rows(out, logs)}
    assert {g: (rows[g]["key"], rows[g]["kind"], rows[g]["state"]) for _, _, g in BOTH} == {
        g: (network_name(e, s), FOREIGN_WEIGHTS, "evaluated") for e, s, g in BOTH}  # epoch 2: no option needed
    assert {g: (rows[g]["key"], rows[g]["kind"], rows[g]["state"]) for _, _, g in FULL_ONLY} == {
        g: (full_name(e, s), FOREIGN, "evaluated") for e, s, g in FULL_ONLY}
    files = faults.ledger_files(out, logs)
    assert {n: f["status"] for n, f in files.items() if f["status"] != "used"} == {
        full_name(e, s): "duplicate" for e, s, _ in BOTH}  # meta.json and its temp: not even judged
    # one point per step, and each step's loss is that of its weights (not Adam's moments)
    run = faults.run_dir(out, logs)
    assert raw_scalar_steps(run, "eval/loss") == sorted(steps + [REF + g for g in steps])
    losses = {s: v for s, _, v in scalar_points(run, "eval/loss")}
    for g in steps:
        assert losses[g] == pytest.approx(losses[REF + g], rel=1e-5), (g, losses)
    best = json.loads((run / "best.json").read_text())
    assert best["step"] in steps and best["dir"] == rows[best["step"]]["key"] and (out / best["dir"]).is_file()
    # nothing created, changed or removed in the trainer's tree (but the test's own reference copies)
    after = {p: m for p, m in _tree(out).items() if not p.startswith("step_")}
    assert after == written
    assert "Traceback" not in evald.output()


def _readable_by_others(path: Path) -> None:
    for parent in [path, *path.parents]:
        if parent == Path("/"):
            break
        os.chmod(parent, os.stat(parent).st_mode | 0o005)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_files_another_user_may_not_read_wait_for_their_permission(tmp_path, procs):
    """MindFormers' 0400 files, evald as another user in the files' group (setpriv, uid and gid 65534):
    pending, with a message that says it is a permission problem; evaluated once group-readable."""
    base = Path(tempfile.mkdtemp(prefix="evald-perm-"))  # pytest's tmp_path is private to root
    try:
        _readable_by_others(base)
        out, logs, sockets, home = base / "output", base / "logs", base / "sockets", base / "home"
        write([save(out, e, s, g) for e, s, g in BOTH[:3]], tmp_path)
        for directory in (logs, sockets, home):
            directory.mkdir(mode=0o700)
            os.chown(directory, 65534, 65534)
        for directory, _, files in os.walk(out):  # the trainer's group: evald's user may list, not read
            for path in [directory, *(os.path.join(directory, name) for name in files)]:
                os.chown(path, 0, 65534)
        def start(*extra: str, name: str) -> Proc:
            proc = Proc(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYTHON, "-m", "evald",
                         *faults.FAST, *FACTORIES, "--ckpt-dir", str(out), "--endpoint", "none", "--logdir",
                         str(logs), "--lag-policy", "all", "--tuning",  # no rescan: the pending recheck
                         '{"foreign_settle_s": 0, "rescan_interval_s": 3600}', *extra],
                        base_env({"HOME": str(home), "EVALD_SOCKET_DIR": str(sockets), "TMPDIR": str(home)}),
                        tmp_path / f"{name}.log")
            procs.append(proc)
            return proc

        idle = start("--idle-exit-s", "2", name="evald-idle")  # nothing it may read: waiting is not done
        assert idle.wait(180) == 3, idle.output()[-3000:]
        assert "file(s) evald may not read" in idle.output()
        evald = start(name="evald-other-user")
        wait_for(lambda: evald.output().count("permission denied") >= 6, 180, "every file said to be unreadable")
        wait_for(lambda: "evaluation network ready" in evald.output(), 180, "evald ready to evaluate")
        text = evald.output()
        assert "uid 65534" in text and "mode 0400" in text and "stays pending" in text, text[-3000:]
        assert "truncated, empty or corrupt" not in text and "rejected" not in text, text[-3000:]
        assert faults.ledger_rows(out, logs) == [] and faults.ledger_files(out, logs) == {}  # nothing judged

        for directory, _, files in os.walk(out):  # the fix: group-readable files
            for name in files:
                os.chmod(Path(directory) / name, 0o440)
        wait_for(lambda: len(faults.ledger_rows(out, logs)) == 3 and _final(faults.ledger_rows(out, logs)), 240,
                 "the files read once they could be")
        evald.signal(signal.SIGTERM)
        assert evald.wait(60) == 0, evald.output()[-3000:]
        rows = faults.ledger_rows(out, logs)
        assert [(r["step"], r["key"], r["state"]) for r in rows] == [
            (g, network_name(e, s), "evaluated") for e, s, g in BOTH[:3]]
        assert "can be read now" in evald.output()
    finally:
        shutil.rmtree(base, ignore_errors=True)
