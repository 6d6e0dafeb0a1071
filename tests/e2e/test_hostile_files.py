"""Issue 12, parts 3 and 4: no file in the checkpoint directory can crash evald, hang it, or make it
read outside the directory; evald's own state is private.

One directory holds every hostile entry of the issue (and a few more) beside a good checkpoint.
evald must record each bad entry once with its reason (ledger, log), evaluate the good one, exit
0 on --idle-exit-s, stop on the first SIGTERM, and never show anything of the secret outside
(its size, its hash) in its log, ledger or TensorBoard files. On commit 1337672 evald died within
seconds on the manifests ``[]``, ``"hello"``, step -5 and 10**30 and on the 1-byte
``huge-1_100...0.ckpt`` (every restart too), spun forever on a weights file linked to /dev/zero
and blocked forever on a FIFO (ignoring SIGTERM), and logged ``/etc/shadow: 651 bytes on disk``.
Here RUN.json itself is a FIFO and RUN_END.json a link to /dev/zero, so the operator names the
factories.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat

import pytest
import xxhash

from evald.contracts import layout
from tests import faults
from tests.harness import run_dir, wait_for

SECRET = b"S" * 1_234_567      # a size that appears nowhere else in evald's output
OPERATOR = ("--model-factory", faults.MODEL_FACTORY.target, "--model-kwargs", '{"seq_len": 64}',
            "--data-factory", faults.DATA_FACTORY.target, "--data-kwargs", '{"seq_len": 64}',
            "--app-dir", faults.MODEL_FACTORY.search_path)


def _step(ckpt, step):
    return ckpt / layout.step_dir_name(step)


def _manifest(ckpt, at, **changes):
    """Commit a good checkpoint at step ``at``, then rewrite its manifest with ``changes``."""
    faults.commit(ckpt, at)
    path = _step(ckpt, at) / layout.MANIFEST_FILE
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "file_name":
            data["files"][0]["name"] = value
            for param in data["params"]:
                param["file"] = value
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return data


def _build(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    faults.commit(outside, 1, run_id="outside")
    expected = {}  # entry -> words its recorded reason must contain

    def entry(name, *words):
        expected[name] = words

    for step, text in ((1, "[]"), (2, '"hello"'), (22, "[" * 100_000 + "]" * 100_000)):
        faults.commit(ckpt, step)
        (_step(ckpt, step) / layout.MANIFEST_FILE).write_text(text)
    entry(layout.step_dir_name(1), "a manifest is a JSON object")
    entry(layout.step_dir_name(2), "a manifest is a JSON object")
    entry(layout.step_dir_name(22), "nests JSON more than 16 levels")
    _manifest(ckpt, 3, step=-5)
    entry(layout.step_dir_name(3), "step", "outside 0..2**63-1")
    _manifest(ckpt, 4, step=10**30)
    entry(layout.step_dir_name(4), "step", "outside 0..2**63-1")
    (ckpt / "huge-1_10000000000000000000000000.ckpt").write_bytes(b"x")
    entry("huge-1_10000000000000000000000000.ckpt", "MindSpore cannot read it")
    for step, how in ((7, "zero"), (8, "fifo"), (14, "secret")):
        faults.commit(ckpt, step)
        weights = _step(ckpt, step) / layout.WEIGHTS_FILE
        weights.unlink()
        if how == "fifo":
            os.mkfifo(weights)
        else:
            os.symlink("/dev/zero" if how == "zero" else outside / "secret", weights)
    entry(layout.step_dir_name(7), "is a symbolic link; links are not followed")
    entry(layout.step_dir_name(8), "not a regular file")
    entry(layout.step_dir_name(14), "is a symbolic link; links are not followed")
    faults.commit(ckpt, 9)
    (_step(ckpt, 9) / layout.MANIFEST_FILE).unlink()
    os.mkfifo(_step(ckpt, 9) / layout.MANIFEST_FILE)
    entry(layout.step_dir_name(9), "a FIFO, not a regular file")
    os.symlink(outside / layout.step_dir_name(1), _step(ckpt, 11))
    entry(layout.step_dir_name(11), "outside the checkpoint directory: not read")
    _manifest(ckpt, 12, file_name="../../outside/secret")
    entry(layout.step_dir_name(12), "is not a plain weights file name")
    _manifest(ckpt, 13, file_name=str(outside / "secret"))
    entry(layout.step_dir_name(13), "is not a plain weights file name")
    os.symlink(outside / "secret", ckpt / "link-1_15.ckpt")
    entry("link-1_15.ckpt", "outside the checkpoint directory: not read")
    os.mkfifo(ckpt / "fifo-1_16.ckpt")
    entry("fifo-1_16.ckpt", "a FIFO, not a regular file")
    (ckpt / "dir-1_17.ckpt").mkdir()
    entry("dir-1_17.ckpt", "a directory, not a regular file")
    with open(ckpt / "sparse-1_18.ckpt", "wb") as f:
        f.truncate(1 << 40)  # 1 TB, no blocks
    entry("sparse-1_18.ckpt", "bytes, more than the", "evald reads")
    (ckpt / os.fsdecode(b"\xff-1_19.ckpt")).write_bytes(b"x")
    entry("\\xff-1_19.ckpt", "not valid UTF-8")
    faults.commit(ckpt, 21)
    with open(_step(ckpt, 21) / layout.MANIFEST_FILE, "r+b") as f:
        f.truncate(10 << 30)  # 10 GB of (sparse) manifest
    entry(layout.step_dir_name(21), "more than the", "this file may have")
    faults.commit(ckpt, 23)
    (_step(ckpt, 23) / layout.MANIFEST_FILE).unlink()
    os.symlink(outside / layout.step_dir_name(1) / layout.MANIFEST_FILE, _step(ckpt, 23) / layout.MANIFEST_FILE)
    entry(layout.step_dir_name(23), "is a symbolic link; links are not followed")
    faults.commit(ckpt, 30)
    os.mkfifo(ckpt / layout.RUN_FILE)
    os.symlink("/dev/zero", ckpt / layout.RUN_END_FILE)
    return ckpt, outside, expected


def _recorded(ckpt):
    """entry -> (status or state, reason), from the files table and the steps table."""
    found = {name: (row["status"], row["reason"]) for name, row in faults.ledger_files(ckpt).items()}
    for row in faults.ledger_rows(ckpt):
        if row["state"] != "evaluated" or row["key"] not in found:
            found[row["key"]] = (row["state"], row["reason"])
    return found


def test_every_hostile_entry_is_recorded_once_and_evald_never_hangs_or_leaks(tmp_path, procs):
    ckpt, outside, expected = _build(tmp_path)
    evald = faults.start(tmp_path, ckpt, *OPERATOR, "--lag-policy", "all", "--idle-exit-s", "5",
                         "--tuning", '{"foreign_settle_s": 0}')
    procs.append(evald)
    assert evald.wait(300) == 0, evald.output()[-4000:]
    log = evald.output()
    recorded = _recorded(ckpt)
    for name, words in expected.items():
        assert name in recorded, (name, sorted(recorded))
        state, reason = recorded[name]
        assert state in ("rejected", "failed"), (name, state, reason)
        assert all(w in reason for w in words), (name, reason)
    assert faults.ledger_by_key(ckpt)[layout.step_dir_name(30)]["state"] == "evaluated"
    assert f"{ckpt / layout.RUN_FILE} is a FIFO, not a regular file" in log
    assert f"{ckpt / layout.RUN_END_FILE} is a symbolic link" in log
    assert "Traceback" not in log and "raised unexpectedly" not in log
    # nothing of the secret outside: not its size, not its hash, anywhere evald writes
    digests = [hashlib.sha256(SECRET).hexdigest(), xxhash.xxh3_128(SECRET).hexdigest()]  # either check's
    logdir = run_dir(ckpt)
    texts = [log, json.dumps(faults.ledger_rows(ckpt)), json.dumps(faults.ledger_files(ckpt)),
             json.dumps(faults.tb_texts(logdir))]
    for text in texts:
        assert str(len(SECRET)) not in text and not any(d[:16] in text for d in digests)
    assert sorted(p.name for p in outside.iterdir()) == ["secret", layout.step_dir_name(1)]

    # a restart judges nothing again and still does not hang; the first SIGTERM stops it
    files_before = faults.ledger_files(ckpt)
    again = faults.start(tmp_path, ckpt, *OPERATOR, "--lag-policy", "all", name="evald2")
    procs.append(again)
    wait_for(lambda: "serving" in again.output(), 120, "the restarted evald serving")
    again.signal(signal.SIGTERM)
    assert again.wait(60) == 0, again.output()[-3000:]
    assert faults.ledger_files(ckpt) == files_before
    assert "rejected" not in again.output()


@pytest.mark.parametrize("mode", ["private", "group"])
def test_evalds_state_files_are_private_unless_shared_with_the_group(tmp_path, procs, mode):
    """``private`` (the default) after a run in ``group`` mode also tightens what that run left."""
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)
    for i, state_mode in enumerate(["group"] + (["private"] if mode == "private" else [])):
        if i:
            faults.commit(ckpt, 20)
        evald = faults.start(tmp_path, ckpt, "--state-mode", state_mode, "--idle-exit-s", "3", name=f"evald{i}")
        procs.append(evald)
        assert evald.wait(180) == 0, evald.output()[-3000:]
    dir_mode, file_mode = {"private": (0o700, 0o600), "group": (0o750, 0o640)}[mode]
    run = run_dir(ckpt)
    directories = [run, run / "eval", run / "train"]
    files = [p for d in directories if d.is_dir() for p in d.iterdir() if p.is_file()]
    assert {p.name for p in files} >= {"ledger.sqlite", "best.json", "subset.json", "evald-run.json"} and any(
        p.name.startswith("events.out.tfevents.") for p in files)
    for path in [d for d in directories if d.is_dir()]:
        assert stat.S_IMODE(path.stat().st_mode) == dir_mode, (path, oct(path.stat().st_mode))
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) & ~file_mode == 0, (path.name, oct(path.stat().st_mode))
