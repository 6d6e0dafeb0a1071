"""Issue 3, "never miss, never repeat": de-duplication, lag policies, restarts under SIGKILL,
shared filesystems, a trainer killed mid-write, notification floods, an absent evald.

Everything here runs the real thing: ``python -m evald`` processes, real checkpoint
directories, ZeroMQ over ipc, and TensorBoard's own readers for what evald wrote.
Checkpoints are committed without training (tests/faults.py: the demo model's real
weight names and shapes), so evald can evaluate them. Long versions are marked slow.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from evald.intake import mounts
from evald.sinks.counters import MessageCounts, read_counts
from evald.contracts import layout
from tests import faults
from tests.harness import (PYTHON, Proc, base_env, committed_steps, hook_stats, raw_scalar_steps, run_dir,
                           scalar_points, start_trainer, wait_for)

def _report(name: str, **figures) -> None:
    """One line per measured run (``pytest -s`` shows it; docs/reliability.md quotes them)."""
    print(f"\nFAULTS-REPORT {name} {json.dumps(figures, sort_keys=True)}", flush=True)


def _evaluated(ckpt: Path) -> list[int]:
    return sorted(r["step"] for r in faults.ledger_rows(ckpt) if r["state"] == "evaluated")


def _all_final(ckpt: Path, count: int) -> bool:
    rows = faults.ledger_rows(ckpt)
    return len(rows) >= count and all(r["state"] in ("evaluated", "skipped", "failed", "deleted") for r in rows)


def _one_point_per_step(logdir: Path, expected: list[int]) -> None:
    """Exactly one eval/loss point per expected step, by both of TensorBoard's readers."""
    raw = raw_scalar_steps(logdir, "eval/loss")
    accumulated = [step for step, _, _ in scalar_points(logdir, "eval/loss")]
    assert raw == expected, f"raw reader: {raw} != {expected}"
    assert sorted(accumulated) == expected, f"EventAccumulator: {accumulated} != {expected}"


# ================================================================ 1. de-duplication


@pytest.mark.smoke
def test_checkpoint_from_zmq_watchdog_rescan_and_restart_is_evaluated_once(tmp_path, endpoints, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)  # before evald starts: the startup rescan finds it
    # The polling observer (every 2 s) and the rescan (every 0.5 s) both keep delivering every
    # checkpoint again; ZeroMQ delivers step 20 six times (whichever of the three comes first).
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--tuning", '{"watch": "polling", "polling_interval_s": 2, "rescan_interval_s": 0.5}',
                         "--log-level", "DEBUG", env=endpoints, zmq=True)   # DEBUG: "also via rescan"
    procs.append(evald)
    wait_for(lambda: _evaluated(ckpt) == [10], 180, "step 10 evaluated")
    with faults.Pusher(endpoints["EVALD_ENDPOINT"]) as pusher:
        faults.commit(ckpt, 20)
        pusher.send([faults.committed_notice(ckpt, 20)] * 6 + [faults.committed_notice(ckpt, 10)] * 3)
    wait_for(lambda: _evaluated(ckpt) == [10, 20], 60, "step 20 evaluated")
    # Events, not a pause: every notice handled (counters.json), and step 20 delivered by all three sources
    wait_for(lambda: (read_counts(run_dir(ckpt)) or MessageCounts()).handled == 9, 120, "the 9 notices handled")
    wait_for(lambda: _sources_of(evald.output(), 20) == {"zmq", "watchdog", "rescan"}, 120,
             "step 20 delivered by ZeroMQ, the polling observer and the rescan")
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]

    # A restart: the ledger and the startup rescan see both again.
    again = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "2", name="evald2")
    procs.append(again)
    assert again.wait(120) == 0, again.output()[-3000:]

    rows = faults.ledger_by_key(ckpt)
    assert sorted(rows) == [layout.step_dir_name(10), layout.step_dir_name(20)]
    assert rows[layout.step_dir_name(10)]["source"] == "rescan"
    assert rows[layout.step_dir_name(20)]["source"] in ("zmq", "watchdog", "rescan")  # whichever came first
    assert all(r["state"] == "evaluated" and r["attempts"] == 1 for r in rows.values()), rows
    _one_point_per_step(run_dir(ckpt), [10, 20])
    first, second = evald.output(), again.output()
    assert first.count("found step 20 in step_000000020") == 1
    assert "found step" not in second and "step 10:" not in second and "step 20:" not in second
    assert "Traceback" not in first + second


def _sources_of(evald_log: str, step: int) -> set[str]:
    """Who delivered ``step``: the source that found it first and each that delivered it again (evald says
    each once; a rescan's only at DEBUG)."""
    name = layout.step_dir_name(step)
    first = re.findall(rf"found step {step} in {name} via (\w+) \(first\)", evald_log)
    return set(first) | set(re.findall(rf"step {step} in {name}: also via (\w+)", evald_log))


# ================================================================ 2. lag policies
# On a burst, in-process through evald's own loop: tests/unit/daemon/test_lag_policy_in_process.py


# ================================================================ 3. SIGKILL at random moments


def _kill_evald_repeatedly(tmp_path: Path, procs: list, *, checkpoints: int, kills: int, seed: int) -> dict:
    """Commit ``checkpoints`` while evald (--lag-policy all) is SIGKILLed ``kills`` times; then one
    clean run. Returns the figures; asserts nothing is lost or duplicated."""
    rng = random.Random(seed)
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    steps = [10 * (i + 1) for i in range(checkpoints)]
    pending = list(steps)
    # A backlog exists from the start and keeps growing while evald restarts, so kills find
    # it at every phase: importing, compiling, loading, evaluating, writing, updating the ledger.
    for _ in range(max(2, checkpoints // (kills + 1))):
        faults.commit(ckpt, pending.pop(0))
    # an external SIGKILL mid-evaluation is not the checkpoint's fault: never give up on it
    args = ("--lag-policy", "all", "--tuning", '{"rescan_interval_s": 1, "max_attempts": 1000}')
    phases = {"starting": 0, "evaluating": 0, "between": 0}
    ready_after: list[float] = []
    started = time.time()
    for i in range(kills):
        for _ in range(max(1, len(pending) // (kills - i))):  # every life has work: it compiles, evaluates
            if pending:
                faults.commit(ckpt, pending.pop(0))
        proc = faults.start(tmp_path, ckpt, *args, "--idle-exit-s", "60", name=f"evald-kill{i:02d}")
        procs.append(proc)
        t0 = time.time()
        mode = rng.random()
        if mode < 0.25:  # during import/compile ...
            deadline = t0 + rng.uniform(0, ready_after[-1] if ready_after else 4.0)
        else:
            wait_for(lambda: "evaluation network ready" in proc.output() or proc.popen.poll() is not None,
                     180, "evald ready")
            ready_after.append(time.time() - t0)
            if mode < 0.6:  # ... at a random moment while it works through the backlog ...
                deadline = time.time() + rng.uniform(0, 1.5)
            else:  # ... or aimed at an evaluation in progress (load, forward, event write, ledger)
                def in_progress_or_none_left():
                    states = faults.ledger_states(ckpt)
                    return states.get("evaluating") or not states.get("queued") or proc.popen.poll() is not None

                wait_for(in_progress_or_none_left, 60, "an evaluation in progress", interval=0.005)
                deadline = time.time() + rng.uniform(0, 0.1)
        while time.time() < deadline:
            if len(pending) > kills - i - 1 and rng.random() < 0.3:
                faults.commit(ckpt, pending.pop(0))
            time.sleep(0.05)
        assert proc.popen.poll() is None, f"evald exited before the kill:\n{proc.output()[-3000:]}"
        proc.signal(signal.SIGKILL)
        proc.popen.wait(10)
        states = faults.ledger_states(ckpt)
        if "evaluation network ready" not in proc.output():
            phases["starting"] += 1
        elif states.get("evaluating"):
            phases["evaluating"] += 1
        else:
            phases["between"] += 1
    while pending:
        faults.commit(ckpt, pending.pop(0))
    final = faults.start(tmp_path, ckpt, *args, "--idle-exit-s", "2", name="evald-final")
    procs.append(final)
    assert final.wait(300) == 0, final.output()[-3000:]
    wall = time.time() - started

    committed = committed_steps(ckpt)
    assert committed == steps
    rows = faults.ledger_rows(ckpt)
    lost = sorted(set(committed) - set(_evaluated(ckpt)))
    raw = raw_scalar_steps(run_dir(ckpt), "eval/loss")
    duplicated = sorted({s for s in raw if raw.count(s) > 1})
    figures = dict(checkpoints=len(committed), kills=kills, kill_phases=phases, lost=len(lost),
                   duplicated=len(duplicated), ledger_rows=len(rows), event_files=len(list(
                       (run_dir(ckpt) / "eval").glob("events.out.tfevents.*"))),
                   recovered_from_events=sum("recovered from TensorBoard" in (r["reason"] or "") for r in rows),
                   max_attempts=max(r["attempts"] for r in rows), wall_s=round(wall, 1), seed=seed)
    _report("sigkill", **figures)
    assert not lost, f"lost {lost}"
    assert not duplicated, f"duplicated {duplicated}"
    assert [r["state"] for r in rows] == ["evaluated"] * len(steps)
    _one_point_per_step(run_dir(ckpt), steps)
    assert all(math.isfinite(v) for _, _, v in scalar_points(run_dir(ckpt), "eval/loss"))
    return figures


@pytest.mark.slow  # a long fault/load run: ./scripts/test.sh -m slow
def test_sigkill_at_random_moments_loses_and_repeats_nothing(tmp_path, procs):
    figures = _kill_evald_repeatedly(tmp_path, procs, checkpoints=12, kills=5, seed=3)
    assert figures["kills"] == 5


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_repeats_nothing_long(tmp_path, procs):
    figures = _kill_evald_repeatedly(tmp_path, procs, checkpoints=32, kills=22, seed=11)
    assert figures["kills"] >= 20 and figures["checkpoints"] >= 30


# ================================================================ 4. shared filesystems


def test_filesystem_type_and_polling_from_a_mounts_file(tmp_path):
    mounts_file = tmp_path / "mounts"
    mounts_file.write_text(
        "sysfs /sys sysfs rw 0 0\n"
        "/dev/sda1 / ext4 rw,relatime 0 0\n"
        "server:/export /mnt/nfs nfs4 rw,vers=4.2 0 0\n"
        "//host/share /mnt/smb cifs rw 0 0\n"
        "10.0.0.1@tcp:/lfs /lustre lustre rw 0 0\n"
        "gpfs0 /gpfs gpfs rw 0 0\n"
        "s3fs /mnt/bucket fuse.s3fs rw 0 0\n"
        "/dev/sdb1 /mnt/nfs/local ext4 rw 0 0\n"
        "/dev/sdc1 /mnt/with\\040space xfs rw 0 0\n"
        "short line\n")
    expected = {"/": "ext4", "/home/user/run": "ext4", "/mnt/nfs/ckpt": "nfs4", "/mnt/nfsx": "ext4",
                "/mnt/smb/a": "cifs", "/lustre/proj/run1": "lustre", "/gpfs/x": "gpfs",
                "/mnt/bucket/ckpt": "fuse.s3fs", "/mnt/nfs/local/ckpt": "ext4", "/mnt/with space/c": "xfs"}
    for path, fs_type in expected.items():
        assert mounts.filesystem_type(Path(path), str(mounts_file)) == fs_type, path
    assert mounts.filesystem_type(Path("/x"), str(tmp_path / "missing")) is None
    for fs_type in ("nfs", "nfs4", "cifs", "lustre", "gpfs", "fuse", "fuse.s3fs", "fuse.sshfs"):
        assert mounts.needs_polling(fs_type), fs_type
    for fs_type in ("ext4", "xfs", "btrfs", "tmpfs", "overlay", None):
        assert not mounts.needs_polling(fs_type), fs_type


def test_watch_auto_polls_on_a_shared_filesystem(tmp_path, monkeypatch):
    import queue

    from watchdog.observers.polling import PollingObserver

    from evald.intake import discovery

    monkeypatch.setattr(discovery, "filesystem_type", lambda path: "nfs4")
    assert isinstance(discovery.Discovery(tmp_path, queue.Queue(), watch="auto")._observer, PollingObserver)
    monkeypatch.setattr(discovery, "filesystem_type", lambda path: "ext4")
    auto = discovery.Discovery(tmp_path, queue.Queue(), watch="auto")
    assert auto.mode == "inotify" and not isinstance(auto._observer, PollingObserver)
    forced = discovery.Discovery(tmp_path, queue.Queue(), watch="polling")
    assert forced.mode == "polling" and isinstance(forced._observer, PollingObserver)


def test_polling_observer_alone_finds_a_new_checkpoint(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    # No ZeroMQ, and a rescan interval far beyond the test: only the polling observer can find it.
    evald = faults.start(tmp_path, ckpt, "--tuning", '{"watch": "polling", "polling_interval_s": 0.5, "rescan_interval_s": 1000}')
    procs.append(evald)
    # "serving" comes after evald's first rescan and after the observer's first snapshot (watchdog takes it inside
    # schedule(), in its emitter's start()): a checkpoint committed now is a change only the observer reports
    wait_for(lambda: "serving " in evald.output(), 120, "evald attached")
    faults.commit(ckpt, 10)
    wait_for(lambda: _evaluated(ckpt) == [10], 180, "step 10 evaluated")
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]
    assert "(polling, filesystem" in evald.output()
    [row] = faults.ledger_rows(ckpt)
    assert row["source"] == "watchdog" and row["state"] == "evaluated"
    _one_point_per_step(run_dir(ckpt), [10])


# ================================================================ 8. trainer killed mid-write


def _kill_writer_mid_write(tmp_path: Path, procs: list, *, kills: int, seed: int) -> dict:
    rng = random.Random(seed)
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.demo_weights()
    weights = faults._weights_cache()
    # evald watches throughout; it never deletes anything in the trainer's directory.
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--tuning", '{"rescan_interval_s": 0.5}')
    procs.append(evald)
    orphans = attempts = 0
    started = time.time()
    while orphans < kills:
        attempts += 1
        assert attempts <= 3 * kills, f"only {orphans} of {attempts} kills landed mid-write"
        next_step = max(committed_steps(ckpt), default=0) + 1
        before = set(faults.temp_dirs(ckpt))
        # Let it commit a few, then kill it while a temp dir exists: mid-write by construction (--hold-at: that
        # write waits before its rename until killed, so a kill that comes late still lands mid-write)
        target = rng.randint(0, 3)
        writer = Proc([PYTHON, "-m", "tests.faults", "writer", "--ckpt-dir", str(ckpt), "--weights",
                       str(weights), "--first-step", str(next_step), "--pause-before-commit", "0.4",
                       "--hold-at", str(target), "--seed", str(rng.randrange(1 << 30))], base_env(),
                      tmp_path / f"writer{attempts:02d}.log")
        procs.append(writer)
        wait_for(lambda: writer.output().count("committed") >= target or writer.popen.poll() is not None,
                 60, "writer commits")
        wait_for(lambda: set(faults.temp_dirs(ckpt)) - before, 60, "a checkpoint being written", interval=0.01)
        time.sleep(rng.uniform(0, 0.1))
        writer.kill()
        orphans += len(set(faults.temp_dirs(ckpt)) - before)
    committed = committed_steps(ckpt)
    wait_for(lambda: _evaluated(ckpt) == committed, 180, "every committed checkpoint evaluated")
    temps_while_running = faults.temp_dirs(ckpt)
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]

    # A new evald evaluates nothing new and leaves the orphans alone ...
    clean = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "2", name="evald-clean")
    procs.append(clean)
    assert clean.wait(120) == 0, clean.output()[-3000:]
    temps_after_evald = len(faults.temp_dirs(ckpt))
    # ... and the trainer's own writer removes them when the trainer starts again.
    from trainer_hooks.snapshot_writer import SnapshotWriter

    writer = SnapshotWriter(ckpt, "faults", on_committed=lambda *_: None, orphan_temp_age_s=0)
    wait_for(lambda: writer.orphans_removed >= orphans, 30, "the writer's clean-up")
    writer.close()
    rows = faults.ledger_rows(ckpt)
    partial = [r["key"] for r in rows if layout.parse_step_dir_name(r["key"]) is None]
    figures = dict(writer_kills=attempts, killed_mid_write=orphans, committed=len(committed),
                   evaluated=len(_evaluated(ckpt)), partial_evaluated=len(partial),
                   temps_left_by_evald=temps_after_evald, orphans_removed_by_writer=writer.orphans_removed,
                   temps_left=len(faults.temp_dirs(ckpt)), wall_s=round(time.time() - started, 1), seed=seed)
    _report("trainer-kill", **figures)
    assert len(temps_while_running) == orphans  # evald left a (possibly live) writer's temps alone
    assert committed == list(range(1, len(committed) + 1))
    assert not partial and [r["key"] for r in rows] == [layout.step_dir_name(s) for s in committed]
    assert _evaluated(ckpt) == committed
    for step in committed:  # everything evaluated is complete and verifies
        directory = ckpt / layout.step_dir_name(step)
        layout.read_checkpoint(directory, layout.read_manifest(directory))
    assert temps_after_evald == orphans  # evald deleted nothing
    assert figures["orphans_removed_by_writer"] == orphans and figures["temps_left"] == 0
    _one_point_per_step(run_dir(ckpt), committed)
    return figures


def test_trainer_killed_mid_write_leaves_nothing_partial(tmp_path, procs):
    figures = _kill_writer_mid_write(tmp_path, procs, kills=10, seed=5)
    assert figures["killed_mid_write"] >= 10


@pytest.mark.slow
def test_trainer_killed_mid_write_leaves_nothing_partial_long(tmp_path, procs):
    figures = _kill_writer_mid_write(tmp_path, procs, kills=30, seed=17)
    assert figures["killed_mid_write"] >= 30


# ================================================================ 9. a flood of notifications


def _flood(tmp_path: Path, endpoints: dict, procs: list, *, burst: int, notifications: int) -> dict:
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 1)
    # The whole validation set in small batches: each evaluation takes seconds.
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "latest", "--subset-size", "100000",
                         "--batch-size", "4", env=endpoints, zmq=True)
    procs.append(evald)
    wait_for(lambda: _evaluated(ckpt) == [1], 240, "step 1 evaluated")
    time.sleep(1.0)
    rss_before = faults.rss_kb(evald.popen.pid)
    faults.commit(ckpt, 2)
    wait_for(lambda: faults.ledger_by_key(ckpt).get(layout.step_dir_name(2), {}).get("state") == "evaluating",
             60, "step 2 being evaluated", interval=0.02)
    burst_started = time.time()
    burst_steps = list(range(3, 3 + burst))
    for step in burst_steps:
        faults.commit(ckpt, step)
    known = [1, 2, *burst_steps]
    rng = random.Random(0)
    messages = []
    for i in range(notifications):  # duplicates of every checkpoint, and notices of ones that never exist
        step = known[i % len(known)] if i % 10 else 100000 + i
        messages.append(faults.committed_notice(ckpt, step))
    rng.shuffle(messages)
    faults.push(endpoints["EVALD_ENDPOINT"], messages)
    burst_done = time.time()
    burst_s = burst_done - burst_started
    rss_peak = rss_before
    deadline = time.time() + 240
    while not (_all_final(ckpt, len(known)) and burst_steps[-1] in _evaluated(ckpt)):
        rss_peak = max(rss_peak, faults.rss_kb(evald.popen.pid))
        assert time.time() < deadline, "the flood was not worked off in time"
        time.sleep(0.2)
    time.sleep(1.0)
    rss_after = faults.rss_kb(evald.popen.pid)
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]

    rows = faults.ledger_by_key(ckpt)
    step2_done = rows[layout.step_dir_name(2)]["finished_at"]
    expected_skipped = burst - 1  # all but the newest of the burst: it arrived during step 2's evaluation
    skipped = sum(r["state"] == "skipped" for r in rows.values())
    figures = dict(burst_checkpoints=burst, notifications=notifications, burst_s=round(burst_s, 2),
                   rss_before_mb=round(rss_before / 1024, 1), rss_peak_mb=round(rss_peak / 1024, 1),
                   rss_after_mb=round(rss_after / 1024, 1), skipped_expected=expected_skipped,
                   skipped_actual=skipped, evaluated=_evaluated(ckpt), ledger_rows=len(rows),
                   step2_evaluate_s=round(step2_done - rows[layout.step_dir_name(2)]["started_at"], 2))
    _report("flood", **figures)
    # The burst really happened while step 2 was being evaluated (the main loop reads the
    # queued notifications and events only after that evaluation, hence one decision for all).
    assert burst_done < step2_done, figures
    assert len(rows) == len(known)  # notices of absent checkpoints left no rows
    assert skipped == expected_skipped, figures
    assert _evaluated(ckpt) == [1, 2, burst_steps[-1]]
    _one_point_per_step(run_dir(ckpt), [1, 2, burst_steps[-1]])
    assert [v for _, _, v in scalar_points(run_dir(ckpt), "evald/skipped_total")][-1] == expected_skipped
    assert rss_after - rss_before < 32 * 1024 and rss_peak - rss_before < 48 * 1024, figures
    return figures


@pytest.mark.slow  # a long fault/load run: ./scripts/test.sh -m slow
def test_thousand_notifications_while_evaluation_is_slow(tmp_path, endpoints, procs):
    _flood(tmp_path, endpoints, procs, burst=20, notifications=1000)


@pytest.mark.slow
def test_many_thousand_notifications_while_evaluation_is_slow(tmp_path, endpoints, procs):
    _flood(tmp_path, endpoints, procs, burst=60, notifications=20000)


# ================================================================ 10. evald absent for a whole run


def test_model_train_without_evald_then_evald_catches_up(tmp_path, endpoints, procs):
    """Extends test_end_to_end (custom loop): Model.train with EvaldCallback, nobody listening."""
    ckpt = tmp_path / "ckpt"
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=40, every=10, loop="model", cpu=None)
    procs.append(trainer)
    assert trainer.wait(300) == 0, trainer.output()[-3000:]
    output = trainer.output()
    assert "Traceback" not in output and " ERROR " not in output
    stats = hook_stats(output)
    assert stats["hook_errors"] == 0 and stats["snapshots_failed"] == 0
    assert stats["snapshots_written"] == 4 and stats["snapshots_skipped_busy"] == 0
    # it did try to talk to evald (announcement, 4 commits, telemetry, run finished): none of it blocked
    assert stats["notifications_sent"] + stats["notifications_dropped"] >= 6
    assert committed_steps(ckpt) == [10, 20, 30, 40]
    assert not os.path.exists(endpoints["EVALD_ENDPOINT"][len("ipc://"):])  # really nobody was there

    # evald starts afterwards (binding the endpoint the trainer used) and evaluates everything once.
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "2", env=endpoints, zmq=True)
    procs.append(evald)
    assert evald.wait(180) == 0, evald.output()[-3000:]
    assert _evaluated(ckpt) == [10, 20, 30, 40]
    _one_point_per_step(run_dir(ckpt), [10, 20, 30, 40])


# ================================================================ 3b. the restart protocol, crash by crash
# Random SIGKILLs rarely land in the few milliseconds between two durable writes. This test
# leaves the files exactly as such a kill would (using evald's own Ledger and EventLog), then
# starts a real evald on them. tests/unit/daemon/test_crash_replay.py injects a crash at every state
# change in-process; this is the same protocol with the real process, files and readers.


def test_restart_after_crashes_between_durable_writes(tmp_path, procs):
    from evald.ledger.ledger import EVALUATED, Ledger, Record
    from evald.sinks.tensorboard import EventLog

    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20, 30, 40, 50):
        faults.commit(ckpt, step)
    logdir = run_dir(ckpt)  # the run directory evald will claim (nothing claims it before)
    logdir.mkdir(parents=True)
    ledger = Ledger(logdir / "ledger.sqlite")
    for step in (10, 20, 30, 40, 50):
        ledger.admit(name=layout.step_dir_name(step), step=step, kind="evald", found_via="rescan", run_id="faults",
                     commit_time=time.time())

    def evaluated(step):  # the one transaction that ends an evaluation, as evald commits it
        ledger.start(step)
        ledger.finish(step, EVALUATED, metrics={"eval/loss": 5.0},
                      record=Record("eval", step, time.time(), {"eval/loss": 5.0, "evald/evaluate_s": 0.1}, {}))

    ledger.start(20)  # 20: killed while evaluating
    evaluated(30)     # 30: killed after the commit, before the TensorBoard write
    evaluated(40)     # 40: killed after the TensorBoard write, before it was marked written
    evaluated(50)     # 50: killed while writing the record: a torn tail
    events = EventLog(logdir / "eval")  # as the sink writes them: the eval sub-run, eval/loss as "loss"
    events.write(40, time.time(), {"loss": 5.0, "evald/evaluate_s": 0.1})
    events.write(50, time.time(), {"loss": 5.0, "evald/evaluate_s": 0.1})
    events.close()
    ledger.close()
    with open(events.path, "r+b") as f:
        f.truncate(events.path.stat().st_size - 7)
    assert faults.event_file_records(events.path)[1] > 0  # torn

    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "2")
    procs.append(evald)
    assert evald.wait(180) == 0, evald.output()[-3000:]
    rows = {r["step"]: r for r in faults.ledger_rows(ckpt)}
    assert {s: r["state"] for s, r in rows.items()} == {s: "evaluated" for s in (10, 20, 30, 40, 50)}, rows
    assert [rows[s]["attempts"] for s in (10, 20, 30, 40, 50)] == [1, 2, 1, 1, 1]  # only 20 was redone
    # 30, 40 (already on disk) and 50 (torn): the eval sub-run rewritten from the ledger, nothing doubled
    assert "3 TensorBoard record(s) were waiting at start-up; eval rewritten from the ledger" in evald.output()
    _one_point_per_step(logdir, [10, 20, 30, 40, 50])
