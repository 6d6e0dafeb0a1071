"""MindFormers' output directory, as evald judges it: which entries, which steps, which file per step.

Fixtures are written by MindSpore's own save_checkpoint in MindFormers 2.0's exact layout,
names and permissions (tests/mindformers_fixtures.py). These tests judge them in-process
(evald.files.recognise, evald.intake.intake with a real ledger, evald.intake.discovery with a real
observer); test_mindformers_e2e.py runs a real evald on them.
"""

from __future__ import annotations

import os
import queue
import stat
import time

import numpy as np
import pytest

from evald.files import mindformers as mf
from evald.files.recognise import FOREIGN, FOREIGN_WEIGHTS, Found, Rejected, recognise
from tests import faults
from tests.mindformers_fixtures import full_name, network_name, save, write

# epoch 1 has 25 steps; CheckpointMonitor saves every 10 global steps
SAVES = [(1, 10, 10), (1, 20, 20), (2, 5, 30), (2, 15, 40)]


@pytest.fixture(scope="module")
def out_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("mf") / "output"
    write([save(out, e, s, g) for e, s, g in SAVES], out.parent)
    return out


def test_the_fixtures_are_mindformers_layout(out_ckpt):
    assert sorted(os.listdir(out_ckpt / "checkpoint" / "rank_0")) == sorted(
        ["meta.json"] + [full_name(e, s).split("/")[-1] for e, s, _ in SAVES])
    for sub in ("checkpoint", "checkpoint_network", "checkpoint/rank_0", "checkpoint_network/rank_0"):
        assert stat.S_IMODE((out_ckpt / sub).stat().st_mode) == 0o750
    for e, s, _ in SAVES:
        for name in (full_name(e, s), network_name(e, s)):
            assert stat.S_IMODE((out_ckpt / name).stat().st_mode) == 0o400  # save_checkpoint's own chmod


@pytest.mark.parametrize("served", ["output", "network_dir"])
def test_every_file_gets_its_global_step_and_weights_only_files_their_own_kind(out_ckpt, served):
    """Epoch 2's weights-only files have no step in their name or contents: the full checkpoint
    of the same epoch and step has it. Also when evald serves checkpoint_network/rank_0 itself."""
    for epoch, step, global_step in SAVES:
        if served == "output":
            verdicts = {name: recognise(out_ckpt, name) for name in (network_name(epoch, step), full_name(epoch, step))}
            kinds = dict(zip(verdicts, (FOREIGN_WEIGHTS, FOREIGN)))
        else:
            name = network_name(epoch, step).split("/")[-1]
            verdicts = {name: recognise(out_ckpt / "checkpoint_network" / "rank_0", name)}
            kinds = {name: FOREIGN_WEIGHTS}
        for name, verdict in verdicts.items():
            assert verdict == Found(name, global_step, kinds[name], None, verdict.commit_time), verdict
    assert recognise(out_ckpt, "checkpoint/rank_0/meta.json") is None


def test_global_step_is_enough_when_the_full_checkpoint_has_no_step_num(tmp_path):
    out = tmp_path / "output"
    write([save(out, 3, 7, 57, step_num=False)], tmp_path)  # only the optimizer's global_step
    assert recognise(out, network_name(3, 7)).step == 57
    assert recognise(out, full_name(3, 7)).step == 57


def test_a_weights_file_waits_for_its_full_checkpoint_then_says_what_to_set(tmp_path):
    out = tmp_path / "output"
    write([save(out, 2, 5, 30, full=False)], tmp_path)  # async saving: the full file comes later, or never
    name = network_name(2, 5)
    assert recognise(out, name) is None  # young: looked at again later
    old = time.time() - mf.SIBLING_WAIT_S - 5
    os.utime(out / name, (old, old))
    verdict = recognise(out, name)
    assert isinstance(verdict, Rejected) and verdict.step is None
    assert "--foreign-steps-per-epoch" in verdict.reason and full_name(2, 5) in verdict.reason
    assert recognise(out, name, steps_per_epoch=25).step == 30


def test_safetensors_layout_and_the_weights_read_from_each_file(tmp_path):
    from evald.pipeline.swap.weights import load_foreign, match_names

    out = tmp_path / "output"
    write([save(out, 2, 5, 30, fmt="safetensors")], tmp_path)
    assert recognise(out, network_name(2, 5, "safetensors")).step == 30
    assert recognise(out, full_name(2, 5, "safetensors")).kind == FOREIGN
    expected_weights = faults.weights_for_step(30)
    specs = {n: (a.shape, a.dtype) for n, a in expected_weights.items()}
    for name in (network_name(2, 5, "safetensors"), full_name(2, 5, "safetensors")):
        picked = match_names(load_foreign(out / name), specs, strict=False)  # adam moments, scale_sense: dropped
        assert set(picked) == set(expected_weights)
        assert all(np.array_equal(picked[n], expected_weights[n]) for n in picked), name


def test_entry_names_cover_the_served_directories_and_nothing_else(tmp_path):
    out = tmp_path / "output"
    assert mf.entry_name(out, out / "step_000000010") == "step_000000010"
    assert mf.entry_name(out, out / "checkpoint_network/rank_0/a.ckpt") == "checkpoint_network/rank_0/a.ckpt"
    assert mf.entry_name(out, out / "checkpoint/rank_1/a.ckpt") is None  # rank 0 holds every weight
    assert mf.entry_name(out, out / "log/rank_0/a.ckpt") is None
    for name in ("../x.ckpt", "checkpoint/rank_0/../../x.ckpt", "checkpoint/rank_0/..", "a/b.ckpt", "/etc/x"):
        assert not mf.is_entry_name(name), name


def test_intake_one_step_one_row_read_from_the_weights_file(out_ckpt, tmp_path):
    """Whichever file is found first, each step is read from the weights-only file; meta.json and
    the full checkpoints leave no other trace than a duplicate row in the files table."""
    from evald.config import EvaldConfig
    from evald.config.options import TuningOptions
    from evald.intake.intake import Intake
    from evald.ledger.ledger import Ledger

    ledger = Ledger(tmp_path / "ledger.sqlite")
    intake = Intake(out_ckpt, ledger, EvaldConfig(lag_policy="all", tuning=TuningOptions(foreign_settle_s=0)))
    names = ["checkpoint/rank_0/meta.json"] + [n for e, s, _ in SAVES for n in (full_name(e, s), network_name(e, s))]
    for name in names:  # full file first: the step switches to the weights file while queued
        intake.found(name, "rescan")
    rows = {row.step: row for row in ledger.steps("queued")}
    assert {s: (r.source, r.kind) for s, r in rows.items()} == {
        g: (network_name(e, s), FOREIGN_WEIGHTS) for e, s, g in SAVES}
    files = {name: ledger.file_status(name) for name in names}
    assert files["checkpoint/rank_0/meta.json"] is None
    assert all(files[full_name(e, s)] == "duplicate" for e, s, _ in SAVES), files
    ledger.close()


def test_an_evald_snapshot_of_the_same_step_wins_over_both_mindformers_files(tmp_path):
    """EvaldCallback(ckpt_dir=<MindFormers' output_dir>): one directory, three files for step 10."""
    from evald.config import EvaldConfig
    from evald.config.options import TuningOptions
    from evald.contracts import layout
    from evald.intake.intake import Intake
    from evald.ledger.ledger import Ledger

    out = tmp_path / "output"
    write([save(out, 1, 10, 10)], tmp_path)
    faults.commit(out, 10)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    intake = Intake(out, ledger, EvaldConfig(lag_policy="all", tuning=TuningOptions(foreign_settle_s=0)))
    for name in (full_name(1, 10), network_name(1, 10), layout.step_dir_name(10)):  # worst first
        intake.found(name, "rescan")
    [row] = ledger.steps("queued")
    assert (row.step, row.source, row.kind) == (10, layout.step_dir_name(10), "evald")
    assert ledger.file_status(full_name(1, 10)) == ledger.file_status(network_name(1, 10)) == "duplicate"
    ledger.close()


def test_discovery_watches_mindformers_directories_that_appear_after_it_started(tmp_path):
    """evald creates nothing: it watches output/ and, once they exist, MindFormers' directories
    (here created after the watch began, as MindFormers does at its first save)."""
    from evald.intake.discovery import Discovery

    out = tmp_path / "output"
    out.mkdir()
    events: queue.Queue = queue.Queue()
    discovery = Discovery(out, events, watch="inotify")
    discovery.start()
    try:
        assert sorted(os.listdir(out)) == []
        write([save(out, 1, 10, 10)], tmp_path)
        seen, deadline = set(), time.time() + 30
        while time.time() < deadline and network_name(1, 10) not in seen:
            try:
                _, path = events.get(timeout=0.5)
            except queue.Empty:
                continue
            if discovery.reach(path):  # what evald.daemon.run does with a directory that appeared
                seen.update(mf.entry_name(out, p) for p in discovery.rescan())
            seen.add(mf.entry_name(out, path))
        assert network_name(1, 10) in seen and full_name(1, 10) in seen
    finally:
        discovery.stop()
    assert sorted(os.listdir(out)) == ["checkpoint", "checkpoint_network"]


def test_a_directory_removed_and_created_again_is_watched_again(tmp_path):
    """MindFormers' CheckpointMonitor removes the checkpoint directory it created too early (empty)
    and creates it again at its first save: the new directory is watched, not the dead one."""
    from evald.intake.discovery import Discovery

    out = tmp_path / "output"
    (out / "checkpoint_network" / "rank_0").mkdir(parents=True)
    events: queue.Queue = queue.Queue()
    discovery = Discovery(out, events, watch="inotify")
    discovery.start()
    try:
        (out / "checkpoint_network" / "rank_0").rmdir()
        (out / "checkpoint_network" / "rank_0").mkdir()
        name = "checkpoint_network/rank_0/llama_rank_0-network-1_10.ckpt"
        deadline, seen = time.time() + 30, set()
        while time.time() < deadline and name not in seen:
            try:
                _, path = events.get(timeout=0.2)
            except queue.Empty:
                (out / name).write_bytes(b"x")  # written once the new directory may be watched
                continue
            discovery.reach(path)  # rescans are not needed: the event path alone re-watches it
            seen.add(mf.entry_name(out, path))
        assert name in seen
    finally:
        discovery.stop()


def test_evald_state_goes_beside_the_output_directory_not_into_it(tmp_path):
    from evald.daemon.run_dir import default_logdir, default_run_name

    exp = tmp_path / "llama-exp1"
    for served in (exp / "output", exp / "output" / "checkpoint_network" / "rank_0"):
        assert default_logdir(served) == exp / "tensorboard"
        assert default_run_name(served) == "llama-exp1"
