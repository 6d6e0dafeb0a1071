"""Retention leases in-process: the plan (pure), evald's leases from its ledger, and the trainer hook's
pruning against a real control channel (evald's ControlPublisher over ipc, real snapshot files).
The same with a real trainer and a real evald slower than the snapshots: tests/e2e/test_retention_e2e.py."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from evald.contracts import layout
from evald.contracts.wire import ControlState, decode
from evald.sinks.leases import Leases
from evald.ledger.ledger import EVALUATED, FAILED, Ledger
from evald.ledger.requeue import RETRY
from tests.harness import wait_for
from trainer_hooks.retention import Retention, Snapshot, plan

WEIGHTS = {"w": np.zeros(256, np.float32)}


def snapshots(*steps, nbytes=100):
    return [Snapshot(s, Path(f"/x/step_{s:09d}"), nbytes) for s in steps]


def test_the_oldest_released_snapshots_make_room_and_nothing_else():
    on_disk = snapshots(10, 20, 30)
    chosen = plan(on_disk, keep_last=2, max_bytes=None, new_bytes=100, deletable=lambda s: s != 20, best=None)
    assert [s.step for s in chosen.delete] == [10, 30] and chosen.write and chosen.held == [20]
    chosen = plan(on_disk, keep_last=3, max_bytes=None, new_bytes=100, deletable=lambda s: True, best=None)
    assert [s.step for s in chosen.delete] == [10] and chosen.write       # only as much as needed


def test_a_full_budget_of_snapshots_evald_needs_skips_the_new_one_and_deletes_none():
    chosen = plan(snapshots(10, 20), keep_last=2, max_bytes=None, new_bytes=100, deletable=lambda s: False,
                  best=None)
    assert chosen.delete == [] and not chosen.write and chosen.held == [10, 20]
    final = plan(snapshots(10, 20), keep_last=2, max_bytes=None, new_bytes=100, deletable=lambda s: False,
                 best=None, final=True)
    assert final.write and final.over_budget and final.delete == []      # the run's last one is always written


def test_the_best_is_kept_beside_the_budget_and_bytes_count_too():
    chosen = plan(snapshots(10, 20, 30), keep_last=2, max_bytes=None, new_bytes=100, deletable=lambda s: True,
                  best=10)
    assert [s.step for s in chosen.delete] == [20] and chosen.write
    chosen = plan(snapshots(10, 20, 30, nbytes=400), keep_last=None, max_bytes=1000, new_bytes=300,
                  deletable=lambda s: s != 30, best=None)
    assert [s.step for s in chosen.delete] == [10, 20] and chosen.write   # 400 + 300 <= 1000
    chosen = plan(snapshots(10, nbytes=400), keep_last=None, max_bytes=1000, new_bytes=700, deletable=lambda s: False,
                  best=None)
    assert not chosen.write


# ---------------------------------------------------------------- evald's side: leases from the ledger


def admit(ledger, step, **kwargs):
    ledger.admit(name=layout.step_dir_name(step), step=step, kind="evald", found_via=kwargs.get("via", "rescan"),
                 run_id="r", commit_time=1.0)


def test_evald_leases_what_it_needs_and_releases_what_it_is_done_with(tmp_path):
    ckpt = tmp_path / "ckpt"
    for step in (10, 20, 30, 40, 50, 60, 70):
        layout.write_checkpoint(ckpt, step, WEIGHTS, run_id="r")
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for step in (10, 20, 30, 40, 50, 60, 70, 80):   # 80: a foreign file's step, no step_N directory
        admit(ledger, step, via=RETRY if step == 50 else "rescan")
    ledger.finish(10, EVALUATED)
    ledger.finish(20, EVALUATED)
    ledger.skip([(30, "superseded by step 40 (lag policy latest)")])
    ledger.start(40)
    ledger.finish(80, FAILED, reason="bad")
    leases = Leases(ckpt, ledger, lease_s=60.0)
    every = leases.fields(lag_policy="all", final_step=None, best_step=20)
    assert every["leases"] == (40, 50, 60, 70) and every["released"] == (10, 30) and every["best_step"] == 20
    # under latest, queued steps older than the newest are skipped at the next pick whatever happens:
    # released now, except the run's final step and a step `evald retry` asked for
    latest = leases.fields(lag_policy="latest", final_step=60, best_step=20)
    assert latest["leases"] == (40, 50, 60, 70) and latest["released"] == (10, 30)
    latest = leases.fields(lag_policy="latest", final_step=None, best_step=20)
    assert latest["leases"] == (40, 50, 70) and latest["released"] == (10, 30, 60)
    layout.write_checkpoint(ckpt, 90, WEIGHTS, run_id="r")   # committed, evald has not heard of it
    import shutil

    shutil.rmtree(ckpt / layout.step_dir_name(10))           # the trainer deleted it
    again = leases.fields(lag_policy="all", final_step=None, best_step=20)
    assert again["released"] == (30,) and 90 not in again["released"] + again["leases"]
    leases.longest_load_s = 50.0
    assert leases.fields(lag_policy="all", final_step=None, best_step=None)["lease_s"] == 150.0
    state = leases.control_state(None, run_id="r", seq=0, lag_policy="all", final_step=None, best_step=20)
    assert decode(state.encode()) == state and state.stop_at_step is None
    ledger.close()


# ---------------------------------------------------------------- the hook's side, on a real channel


class Publisher:
    """evald's real ControlPublisher, re-publishing ``state`` every 50 ms from one thread until stopped."""

    def __init__(self, endpoint: str):
        from evald.sinks.control import ControlPublisher

        self.state: ControlState | None = None
        self._stop = threading.Event()
        self._publisher = ControlPublisher(endpoint, republish_s=0.05)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            if self.state is not None:
                self._publisher.update(self.state)
        self._publisher.close()

    def stop(self):
        self._stop.set()
        self._thread.join()


@pytest.fixture
def channel(tmp_path):
    endpoint = f"ipc://{tmp_path}/c.sock"
    publisher = Publisher(endpoint)
    yield endpoint, publisher
    publisher.stop()


def committed(ckpt):
    return [step for step, _ in layout.list_committed(ckpt)]


def until_heard(retention, timeout=10.0):
    deadline = time.monotonic() + timeout
    while retention.current() is None:
        assert time.monotonic() < deadline, "the control state never arrived"
        time.sleep(0.05)


def test_the_hook_deletes_only_what_evald_released_and_skips_when_the_rest_fill_the_budget(tmp_path, channel):
    endpoint, publisher = channel
    ckpt = tmp_path / "ckpt"
    for step in (10, 20, 30):
        layout.write_checkpoint(ckpt, step, WEIGHTS, run_id="r")
    publisher.state = ControlState(run_id="r", seq=3, leases=(20, 30), released=(10,), best_step=None, lease_s=60.0)
    retention = Retention(ckpt, keep_last=2, control_endpoint=endpoint, run_id="r")
    until_heard(retention)
    assert not retention.make_room(40, 1024)       # 10 goes; 20 and 30 are evald's: 40 is skipped
    assert committed(ckpt) == [20, 30] and retention.skipped == 1 and retention.deleted == 1
    assert "steps 20, 30" in retention.last_skip_reason
    publisher.state = ControlState(run_id="r", seq=3, leases=(30,), released=(20,), best_step=None, lease_s=60.0)
    wait_for(lambda: retention.current().leases == (30,), 10, "the new leases to arrive")
    assert retention.make_room(50, 1024) and committed(ckpt) == [30]
    ignored = retention._listener.ignored
    publisher.state = ControlState(run_id="other-run", seq=9, released=(30,), lease_s=60.0)  # not ours: ignored
    wait_for(lambda: retention.current() is not None and retention._listener.ignored > ignored, 10,
             "the other run's state to arrive (and be ignored)")
    layout.write_checkpoint(ckpt, 50, WEIGHTS, run_id="r")
    assert not retention.make_room(60, 1024) and committed(ckpt) == [30, 50]
    retention.close()


def test_without_evald_the_budget_alone_decides_and_says_so(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    for step in (10, 20, 30):
        layout.write_checkpoint(ckpt, step, WEIGHTS, run_id="r")
    retention = Retention(ckpt, keep_last=2, control_endpoint=f"ipc://{tmp_path}/nobody.sock", run_id="r")
    with caplog.at_level(logging.INFO, logger="trainer_hooks.retention"):
        assert retention.make_room(40, 1024)
        assert retention.make_room(50, 1024)
    assert committed(ckpt) == [30]
    said = [r.getMessage() for r in caplog.records if "on its control channel" in r.getMessage()]
    assert len(said) == 1 and "keep_last 2" in said[0]                  # said once, not per snapshot
    retention.close()


def test_a_silent_evald_keeps_its_leases_for_lease_s_then_the_budget_decides(tmp_path, channel):
    endpoint, publisher = channel
    ckpt = tmp_path / "ckpt"
    for step in (10, 20, 30):
        layout.write_checkpoint(ckpt, step, WEIGHTS, run_id="r")
    publisher.state = ControlState(run_id="r", seq=1, leases=(10, 20, 30), best_step=20, lease_s=1.0)
    retention = Retention(ckpt, keep_last=2, control_endpoint=endpoint, run_id="r")
    until_heard(retention)
    publisher.stop()                                   # evald dies, or hangs
    assert not retention.make_room(40, 1024) and committed(ckpt) == [10, 20, 30]  # the lease still holds
    # once lease_s has passed since evald was last heard, the budget decides
    wait_for(lambda: retention.make_room(40, 1024), 10, "the leases to lapse")
    assert committed(ckpt) == [20, 30]                 # oldest first; the best (20) kept beside the budget
    retention.close()


def test_each_writer_rank_of_a_partitioned_run_deletes_only_its_own_released_parts(tmp_path, channel):
    from evald.contracts.partition import PART_DIR_PATTERN, part_dir_name
    from trainer_hooks.partition_plan import plan_partition
    from trainer_hooks.snapshot_writer import SnapshotWriter

    endpoint, publisher = channel
    ckpt = tmp_path / "ckpt"
    weights = {"a": np.zeros(256, np.float32), "b": np.ones(256, np.float32)}
    plans = [plan_partition([(n, a.shape, a.nbytes) for n, a in weights.items()], rank=r, writers=(0, 1))
             for r in (0, 1)]
    for step in (10, 20, 30):
        for rank_plan in plans:
            part = {n: weights[n] if rows is None else weights[n][rows[0]:rows[1]]
                    for n, rows in rank_plan.rows.items()}
            layout.write_checkpoint(ckpt, step, part, run_id="r", part=rank_plan.part, slices=rank_plan.slices)
    publisher.state = ControlState(run_id="r", seq=3, leases=(20, 30), released=(10,), best_step=None, lease_s=60.0)
    writers = []
    for rank_plan in plans:  # what the hook builds on every writer rank
        retention = Retention(ckpt, keep_last=2, control_endpoint=endpoint, run_id="r")
        writers.append(SnapshotWriter(ckpt, "r", on_committed=lambda *a: None, partition=rank_plan,
                                      retention=retention))
        until_heard(retention)
    assert [[s for s, _ in w.own_snapshots()] for w in writers] == [[10, 20, 30], [10, 20, 30]]
    assert not writers[0].retention.make_room(40, 1024)  # rank 0 deletes its part of 10; 20, 30 are leased
    parts = sorted(e.name for e in ckpt.iterdir() if PART_DIR_PATTERN.match(e.name))
    assert [p for p in parts if p.startswith("step_000000010")] == [part_dir_name(10, 1, 2)], parts
    assert not writers[1].retention.make_room(40, 1024)
    assert not any("000000010" in e.name for e in ckpt.iterdir())
    assert len([e for e in ckpt.iterdir() if PART_DIR_PATTERN.match(e.name)]) == 4  # 20 and 30, both parts
    for w in writers:
        w.close(timeout_s=5)
        w.retention.close()


def test_the_hooks_retention_hears_an_evald_that_only_talks_curve(tmp_path):
    """The leases come over the same authenticated control channel as the stop: with the hook's keys."""
    import socket as sockets

    from evald.contracts.auth import SecurityConfig, generate_keypair
    from evald.sinks.control import ControlPublisher

    server_public, server_secret = generate_keypair(tmp_path / "evald-keys", "evald")
    client_public, client_secret = generate_keypair(tmp_path / "trainer-keys", "trainer")
    with sockets.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    publisher = ControlPublisher(endpoint, republish_s=0.05,
                                 security=SecurityConfig(server_key=str(server_secret),
                                                         allowed_keys=(str(client_public),)))
    ckpt = tmp_path / "ckpt"
    for step in (10, 20):
        layout.write_checkpoint(ckpt, step, WEIGHTS, run_id="r")
    state = ControlState(run_id="r", seq=1, leases=(20,), released=(10,), best_step=None, lease_s=60.0)
    keys = SecurityConfig(client_key=str(client_secret), server_public_key=str(server_public))
    retention = Retention(ckpt, keep_last=1, control_endpoint=endpoint, run_id="r", security=keys)
    try:
        deadline = time.monotonic() + 10
        while retention.current() is None:
            assert time.monotonic() < deadline, "the CURVE control state never arrived"
            publisher.update(state)
            publisher.tick()
            time.sleep(0.05)
        assert not retention.make_room(30, 1024) and committed(ckpt) == [20]  # 10 released, 20 leased
    finally:
        retention.close()
        publisher.close()


def test_a_partitioned_step_evald_is_done_with_is_released_while_all_its_parts_are_there(tmp_path):
    """Its ledger source is a glob of its parts' names that no entry has: it used to look gone, so it was never
    released and the writer ranks kept its parts whatever their budget. Released while any part is left (each
    rank deletes its own); servable and backfilled only while all are."""
    import shutil

    from evald.contracts.partition import PartInfo, group_name, part_dir_name, source_exists

    ckpt = tmp_path / "ckpt"
    for step in (10, 20):
        for rank in (0, 1):
            layout.write_checkpoint(ckpt, step, {f"w{rank}": np.zeros(4, np.float32)}, run_id="r",
                                    part=PartInfo(rank, 2, (0, 1)))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for step in (10, 20):
        ledger.admit(name=group_name(step, 2), step=step, kind="parts", found_via="rescan", run_id="r",
                     commit_time=1.0)
        ledger.finish(step, EVALUATED)
    assert source_exists(ckpt, group_name(10, 2)) and source_exists(ckpt, layout.step_dir_name(10)) is False
    leases = Leases(ckpt, ledger, lease_s=60.0)
    assert leases.fields(lag_policy="all", final_step=None, best_step=None)["released"] == (10, 20)
    shutil.rmtree(ckpt / part_dir_name(20, 1, 2))      # one rank pruned its part: not servable, still released
    assert not source_exists(ckpt, group_name(20, 2))  # for the other rank, which prunes its own part
    assert leases.fields(lag_policy="all", final_step=None, best_step=None)["released"] == (10, 20)
    shutil.rmtree(ckpt / part_dir_name(20, 0, 2))
    assert leases.fields(lag_policy="all", final_step=None, best_step=None)["released"] == (10,)
    ledger.close()
