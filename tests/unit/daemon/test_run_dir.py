"""Where a run lives (issue 11): one run directory per training run in a shared TensorBoard log
directory, train/ and eval/ sub-runs sharing tag names, a run name chosen once and found again,
nothing written in the checkpoint directory, and a ledger of another schema refused.
In-process with the real ledger, sink and TensorBoard reader; evald as a process in test_views.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evald.ledger.ledger import Ledger, Record
from evald.daemon.run_dir import RunDirError, default_logdir, open_run, runs_in
from evald.sinks.summary_table import summary_markdown
from evald.sinks.tensorboard import TensorBoardSink
from tests.harness import scalar_points


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
    assert "Loss" in tags["train"]["scalars"] and "Loss" in tags["eval"]["scalars"]  # one chart, two runs
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


def test_a_ledger_of_another_schema_is_refused_and_left_as_it_was(tmp_path):
    """No migration layers: nothing was released before this schema, so any other is an error."""
    import sqlite3
    from evald.ledger.ledger import LedgerVersionError

    path = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE checkpoints (step INTEGER)")  # an unknown, older state file
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(LedgerVersionError, match="schema 0.*new --logdir"):
        Ledger(path)
    assert path.read_bytes() == before
