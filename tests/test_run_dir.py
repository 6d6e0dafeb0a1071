"""Where a run lives (issue 11): one run directory per training run in a shared TensorBoard log
directory, train/ and eval/ sub-runs sharing tag names, a run name chosen once and found again,
nothing written in the checkpoint directory, and a flat ledger of evald 0.2 carried over.
In-process with the real ledger, sink and TensorBoard reader; evald as a process in test_views.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from evald.contracts import layout
from evald.ledger import EVALUATED, Ledger, Record
from evald.legacy_layout import migrate_flat_ledger
from evald.run_dir import RunDirError, default_logdir, open_run, runs_in
from evald.sinks.summary_text import summary_markdown
from evald.sinks.tensorboard import EventLog, TensorBoardSink
from tests import faults
from tests.harness import raw_scalar_steps, run_dir, scalar_points


def tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``path`` with its size and mtime: what "unchanged" means."""
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def test_the_default_is_beside_the_checkpoint_directory_under_a_name_a_person_knows(tmp_path):
    ckpt = tmp_path / "runs" / "exp1" / "ckpt"
    ckpt.mkdir(parents=True)
    run = open_run(ckpt, None, None)
    assert run.path == tmp_path / "runs" / "exp1" / "tensorboard" / "exp1"
    assert default_logdir(ckpt) == tmp_path / "runs" / "exp1" / "tensorboard"
    assert json.loads((run.path / "evald-run.json").read_text())["ckpt_dir"] == str(ckpt)
    assert list(ckpt.iterdir()) == []  # nothing in the trainer's directory
    named = tmp_path / "store" / "llama-7b-lr3e-4"
    named.mkdir(parents=True)
    assert open_run(named, tmp_path / "tb", None).name == "llama-7b-lr3e-4"  # a telling name is kept


def test_the_name_is_kept_across_restarts_and_two_runs_never_share_one(tmp_path):
    logdir = tmp_path / "tb"
    a, b = tmp_path / "a" / "ckpt", tmp_path / "b" / "exp"
    (tmp_path / "a" / "ckpt").mkdir(parents=True)
    b.mkdir(parents=True)
    first = open_run(a, logdir, "baseline")
    assert open_run(a, logdir, None).path == first.path  # the restart finds "baseline", not "a"
    (tmp_path / "exp" / "ckpt").mkdir(parents=True)
    other = open_run(tmp_path / "exp" / "ckpt", logdir, None)
    assert other.name == "exp"
    assert open_run(b, logdir, None).name == "exp-2"  # the same derived name, another directory
    assert [r.name for r in runs_in(logdir)] == ["baseline", "exp", "exp-2"]
    (tmp_path / "c").mkdir()
    with pytest.raises(RunDirError, match="serves .* give this one another --run-name"):
        open_run(tmp_path / "c", logdir, "baseline")
    with pytest.raises(RunDirError, match="already served as run 'baseline'"):
        open_run(a, logdir, "renamed")


def test_train_and_eval_sub_runs_share_tag_names(tmp_path):
    run = tmp_path / "tb" / "exp1"
    run.mkdir(parents=True)
    ledger = Ledger(run / "ledger.sqlite")
    ledger.add_records([Record("train", 5, 1.0, {"train/loss": 3.0, "train/lr": 0.1}, {"health/spike": "high"}),
                        Record("eval", 10, 2.0, {"eval/loss": 2.5, "evald/load_s": 0.01}, {"evald/decision": "ok"}),
                        Record("summary", 10, 3.0, {}, {"evald/summary": summary_markdown({"best_step": 10})})])
    sink = TensorBoardSink(run, ledger)
    assert sink.drain() == 3
    sink.close()
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["eval", "train"]
    assert not list(run.glob("events.out.tfevents.*"))  # no "." run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = {}
    for sub_run in ("train", "eval"):
        acc = EventAccumulator(str(run / sub_run))
        acc.Reload()
        tags[sub_run] = acc.Tags()
    assert "loss" in tags["train"]["scalars"] and "loss" in tags["eval"]["scalars"]  # one chart, two runs
    assert "lr" in tags["train"]["scalars"] and "evald/load_s" in tags["eval"]["scalars"]
    assert "health/spike/text_summary" in tags["train"]["tensors"]
    assert "evald/summary/text_summary" in tags["eval"]["tensors"]
    assert [v for _, _, v in scalar_points(run, "train/loss")] == [3.0]
    assert [v for _, _, v in scalar_points(run, "eval/loss")] == [2.5]


def test_the_summary_is_a_markdown_table():
    text = summary_markdown({"run_id": "r1", "final_step": 60, "best_step": 40, "best_value": 2.123456789,
                             "stopped_early": False, "checkpoints": {"evaluated": 3, "failed": 1}, "extra": None})
    lines = text.splitlines()
    assert lines[:2] == ["| field | value |", "|---|---|"]
    assert all(line.startswith("| **") and line.endswith(" |") for line in lines[2:])
    assert "| **best value** | 2.12346 |" in lines and "| **stopped early** | no |" in lines
    assert "| **checkpoints** | evaluated 3, failed 1 |" in lines and "| **extra** | – |" in lines
    assert "{" not in text


def _flat_state(flat: Path, ckpt: Path) -> None:
    """What evald 0.2 left: a flat ledger (10 and 20 evaluated, their records written) and events."""
    for step in (10, 20):
        layout.write_checkpoint(ckpt, step, {"w": np.zeros(4, np.float32)}, run_id="r")
    flat.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(flat / "ledger.sqlite")
    events = EventLog(flat)
    for step in (10, 20):
        ledger.admit(name=layout.step_dir_name(step), step=step, kind="evald", found_via="rescan", run_id="r",
                     commit_time=time.time())
        ledger.start(step)
        ledger.finish(step, EVALUATED, metrics={"eval/loss": 3.0 - step / 100},
                      record=Record("eval", step, time.time(), {"eval/loss": 3.0 - step / 100}, {}))
        events.write(step, time.time(), {"eval/loss": 3.0 - step / 100})
    ledger.mark_written([r.id for r in ledger.pending_records()])
    (flat / "summary.json").write_text('{"best_step": 20}')
    events.close()
    ledger.close()


def test_a_flat_ledger_in_the_checkpoint_directory_is_carried_over_and_the_directory_left_alone(tmp_path):
    ckpt = tmp_path / "exp" / "ckpt"
    _flat_state(ckpt / "evald", ckpt)
    before = tree(ckpt)
    run = open_run(ckpt, None, None)
    assert migrate_flat_ledger(run) == ckpt / "evald" / "ledger.sqlite"
    assert tree(ckpt) == before  # not one byte or mtime changed in the checkpoint directory
    ledger = Ledger(run.ledger)
    assert [(s.step, s.state, s.attempts) for s in ledger.steps()] == [(10, EVALUATED, 1), (20, EVALUATED, 1)]
    assert len(ledger.pending_records()) == 2  # the history, written again in the new layout
    TensorBoardSink(run.path, ledger).drain()
    ledger.close()
    assert raw_scalar_steps(run.path, "eval/loss") == [10, 20]
    assert json.loads((run.path / "summary.json").read_text()) == {"best_step": 20}
    assert migrate_flat_ledger(run) is None  # once


def test_a_flat_ledger_at_the_top_of_the_log_directory_goes_to_its_own_run_only(tmp_path):
    logdir, ckpt, stranger = tmp_path / "tb", tmp_path / "a" / "ckpt", tmp_path / "b" / "ckpt"
    _flat_state(logdir, ckpt)
    before = tree(ckpt)
    stranger.mkdir(parents=True)
    layout.write_checkpoint(stranger, 99, {"w": np.zeros(4, np.float32)}, run_id="s")
    other = open_run(stranger, logdir, None)
    assert migrate_flat_ledger(other) is None and not other.ledger.exists()  # not its ledger
    run = open_run(ckpt, logdir, None)
    assert migrate_flat_ledger(run) == logdir / "ledger.sqlite"
    assert (logdir / "ledger.sqlite.migrated").exists() and not (logdir / "ledger.sqlite").exists()
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1  # the old events stay readable
    ledger = Ledger(run.ledger)
    assert [s.step for s in ledger.steps()] == [10, 20]
    ledger.close()
    assert tree(ckpt) == before


def test_an_evald_restarted_after_the_flat_layout_continues_the_same_run(tmp_path, procs):
    ckpt = tmp_path / "exp" / "ckpt"
    faults.announce(ckpt)
    _flat_state(ckpt / "evald", ckpt)      # evald 0.2 evaluated 10 and 20 ...
    flat_before = tree(ckpt / "evald")
    faults.commit(ckpt, 30)                 # ... and 30 arrived while it was down
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "2")
    procs.append(evald)
    assert evald.wait(240) == 0, evald.output()[-3000:]
    assert "continued the run of the flat layout" in evald.output()
    rows = faults.ledger_rows(ckpt)
    assert [(r["step"], r["state"], r["attempts"]) for r in rows] == [(10, "evaluated", 1), (20, "evaluated", 1),
                                                                       (30, "evaluated", 1)]  # none redone
    assert run_dir(ckpt) == tmp_path / "exp" / "tensorboard" / "exp"
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == [10, 20, 30]  # the whole history, once each
    assert tree(ckpt / "evald") == flat_before  # the old directory as it was, still readable
