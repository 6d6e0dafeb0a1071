"""Bad checkpoints: each one is recorded with a clear reason (ledger, log, TensorBoard text
under ``evald/skipped`` at its step, starting "failed: " or "deleted before evaluation: ") and
evald goes on to the next one.

evald-layout checkpoints are corrupted AFTER their commit (the manifest's sizes and digests
catch it); foreign ``.ckpt`` files are truncated, emptied or replaced by garbage; one
checkpoint is deleted after evald queued it but before it got to it (evald starts with no
factories, so everything waits, and learns them from RUN.json once step 70 is gone). A file
whose step cannot be known at all is rejected in the ledger's files table (no step, no point).
"""

from __future__ import annotations

import shutil

from evald.contracts import layout
from tests import faults
from tests.harness import raw_scalar_steps, run_dir, scalar_points, wait_for

# key -> (expected state, words the reason must contain)
EXPECTED = {
    layout.step_dir_name(10): ("failed", ["bytes on disk but the manifest says", "truncated"]),
    layout.step_dir_name(20): ("failed", ["0 bytes on disk"]),
    layout.step_dir_name(30): ("failed", ["xxh3-128", "does not match"]),
    layout.step_dir_name(40): ("failed", ["xxh3-128", "bit flip"]),
    layout.step_dir_name(50): ("failed", ["shape mismatch", "head.weight"]),
    layout.step_dir_name(60): ("failed", ["missing parameters", "ln_f.gamma"]),
    layout.step_dir_name(65): ("failed", ["unexpected parameters", "extra.weight"]),
    layout.step_dir_name(70): ("deleted", ["deleted before it could be evaluated"]),
    layout.step_dir_name(75): ("failed", ["not a valid manifest"]),
    "truncated-1_81.ckpt": ("failed", ["MindSpore cannot read it", "corrupt"]),
    "empty-1_82.ckpt": ("failed", ["MindSpore cannot read it"]),
    "garbage-1_83.ckpt": ("failed", ["MindSpore cannot read it"]),
    layout.step_dir_name(90): ("evaluated", []),
    "good-1_95.ckpt": ("evaluated", []),
}


def test_bad_checkpoints_are_recorded_and_evald_goes_on(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for step in (10, 20, 30, 40, 70, 75, 90):
        faults.commit(ckpt, step)
    faults.truncate(faults.weights_path(ckpt, 10), 0.5)
    faults.truncate(faults.weights_path(ckpt, 20), 0.0)
    faults.overwrite_garbage(faults.weights_path(ckpt, 30))         # same size, other bytes
    faults.flip_bit(faults.weights_path(ckpt, 40))
    manifest = ckpt / layout.step_dir_name(75) / layout.MANIFEST_FILE
    manifest.write_text(manifest.read_text()[:40])                   # torn manifest
    weights = faults.weights_for_step(50)
    weights["head.weight"] = weights["head.weight"][:, :-1].copy()   # a consistent manifest, wrong shape
    faults.commit(ckpt, 50, weights)
    weights = faults.weights_for_step(60)
    del weights["ln_f.gamma"]
    faults.commit(ckpt, 60, weights)
    weights = faults.weights_for_step(65)
    weights["extra.weight"] = weights["ln_f.gamma"].copy()
    faults.commit(ckpt, 65, weights)
    faults.save_ckpts([{"path": str(ckpt / name), "seed": seed, "step_num": step} for name, seed, step in (
        ("truncated-1_81.ckpt", 81, None), ("empty-1_82.ckpt", 82, None), ("good-1_95.ckpt", 95, 95))], tmp_path)
    faults.truncate(ckpt / "truncated-1_81.ckpt", 0.5)
    faults.truncate(ckpt / "empty-1_82.ckpt", 0.0)
    faults.overwrite_garbage(ckpt / "garbage-1_83.ckpt", 4096)
    faults.overwrite_garbage(ckpt / "garbage-2_1.ckpt", 4096, seed=1)

    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--tuning", '{"foreign_settle_s": 0}',
                         "--idle-exit-s", "10")
    procs.append(evald)
    # Delete step 70 once evald has queued it: with no factories known yet, nothing is read.
    wait_for(lambda: faults.ledger_by_key(ckpt).get(layout.step_dir_name(70), {}).get("state") == "queued",
             120, "step 70 queued", interval=0.02)
    shutil.rmtree(ckpt / layout.step_dir_name(70))
    faults.announce(ckpt)
    assert evald.wait(180) == 0, evald.output()[-3000:]
    log = evald.output()
    # the file whose step cannot be known: rejected once, with the reason, and no step invented for it
    rejected = faults.ledger_files(ckpt)["garbage-2_1.ckpt"]
    assert rejected["status"] == "rejected" and rejected["step"] is None
    assert "MindSpore cannot read it" in rejected["reason"] and "rejected garbage-2_1.ckpt" in log

    rows = faults.ledger_by_key(ckpt)
    assert sorted(rows) == sorted(EXPECTED)
    texts = faults.tb_texts(run_dir(ckpt), "evald/")
    for key, (state, words) in EXPECTED.items():
        row = rows[key]
        assert row["state"] == state, (key, row)
        assert row["finished_at"] is not None
        if state == "evaluated":
            continue
        assert all(w in row["reason"] for w in words), (key, row["reason"])
        assert f"({key}) not evaluated ({state})" in log or f"rejected {key}: " in log, key
        category = {"failed": "failed", "deleted": "deleted before evaluation"}[state]
        [text] = [t for _, tag, t in texts if tag == "evald/skipped" and t.startswith(f"{category}: {key}: ")]
        assert row["reason"] in text
    # the good ones after all of that were evaluated, once
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == [90, 95]
    assert [s for s, _, _ in scalar_points(run_dir(ckpt), "eval/loss")] == [90, 95]
    failed_total = [v for _, _, v in scalar_points(run_dir(ckpt), "evald/failed_total")]
    assert failed_total[-1] == sum(state != "evaluated" for state, _ in EXPECTED.values())
    assert "Traceback" not in log
