"""Points written out of step order reach the screen (issue 26, item 1). TensorBoard's own server, with
its default flags, drops a tag's points at and after a step written below that tag's latest one; evald
writes backfills newest first, re-evaluates steps (``retry --step``, a changed configuration) and
finishes cells left by a restart. Checked through a real ``tensorboard`` process's HTTP API: every
step of every tag, with its current value."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time

from evald.ledger.ledger import SUPERSEDED_TAG, Ledger, Record
from evald.sinks.tensorboard import TensorBoardSink
from examples.tiny_lm.benchmarks import write_benchmarks
from tests import faults
from tests.harness import PYTHON, REPO, base_env, run_dir, wait_for
from tests.tensorboard_http import TensorBoard

STEPS = [50, 100, 150, 200, 250, 300, 350, 400]


def _eval(ledger: Ledger, step: int, scalars: dict[str, float], texts: dict[str, str] | None = None) -> None:
    ledger.add_records([Record("eval", step, time.time(), scalars, texts or {})])


def test_a_live_tensorboard_shows_backfilled_re_evaluated_and_restarted_points(tmp_path, procs):
    run = tmp_path / "logs" / "run"
    ledger = Ledger(tmp_path / "ledger.sqlite")
    sink = TensorBoardSink(run, ledger)
    for step in STEPS:  # the validation beside training, in order
        _eval(ledger, step, {"eval/loss": 4.0 - step / 1000, "eval/loss_se": 0.01, "evald/evaluate_s": 0.1})
        sink.drain()
    tensorboard = TensorBoard(tmp_path / "logs", tmp_path / "tensorboard.log")  # default flags
    procs.append(tensorboard.proc)
    loss = [(s, 4.0 - s / 1000) for s in STEPS]
    shown = tensorboard.until(lambda: tensorboard.scalars("run/eval", "Loss"), lambda got: _close(got, loss))
    assert _close(shown, loss), shown

    # a backfill: the suite's cells newest first, one record (and one drain) each, TensorBoard reading
    for step in reversed(STEPS):
        _eval(ledger, step, {"eval/bpb/email/bits_per_byte": 2.0 + step / 1000})
        sink.drain()
    # `evald retry --step 200`: the old result superseded, the new one written later
    _eval(ledger, 200, {}, {SUPERSEDED_TAG: "the earlier result at this step is superseded"})
    sink.drain()
    _eval(ledger, 200, {"eval/loss": 1.25, "eval/loss_se": 0.02, "evald/evaluate_s": 0.1})
    sink.drain()
    sink.close()
    # a restart with queued cells: records committed, not yet written, by the process that stopped
    for step in (300, 100, 200):
        _eval(ledger, step, {"eval/mc/next_line/acc": step / 1000})
    sink = TensorBoardSink(run, ledger)
    sink.drain()
    for step in (50, 150):  # and the rest of the cells after the restart
        _eval(ledger, step, {"eval/mc/next_line/acc": step / 1000})
        sink.drain()
    sink.close()
    ledger.close()

    loss = [(s, 1.25 if s == 200 else 4.0 - s / 1000) for s in STEPS]
    want = {"Loss": loss,  # eval/loss as shown (evald.sinks.tensorboard_layout.LOSS)
            "σ/Loss/lower": [(s, v - (0.02 if s == 200 else 0.01)) for s, v in loss],
            "bpb/email/bits_per_byte": [(s, 2.0 + s / 1000) for s in STEPS],
            "mc/next_line/acc": [(s, s / 1000) for s in (50, 100, 150, 200, 300)]}
    fresh = TensorBoard(tmp_path / "logs", tmp_path / "tensorboard-fresh.log")
    procs.append(fresh.proc)
    for name, server in (("the TensorBoard that was open", tensorboard), ("a TensorBoard started now", fresh)):
        for tag, points in want.items():
            shown = server.until(lambda: server.scalars("run/eval", tag),
                                 lambda got: _close(got, points))
            assert _close(shown, points), (name, tag, shown)
            assert _close(server.time_series("run/eval", tag), points), (name, tag)
            assert _close(server.custom_scalars("run/eval", tag), points), (name, tag)
    tensorboard.close()
    fresh.close()


def _close(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """The same steps, and values equal to float32 (TensorBoard keeps scalars as float32)."""
    return [s for s, _ in got] == [s for s, _ in want] and all(abs(a - b) <= 1e-6 * max(1, abs(b))
                                                                for (_, a), (_, b) in zip(got, want))


def test_every_point_of_a_real_evald_reaches_tensorboard(tmp_path, procs):
    """The acceptance of issue 26, item 1, with the real evald and its CLI: validation in order, a suite
    backfilled newest first, ``evald retry --step``, and a restart with a suite's cells still queued;
    then TensorBoard (default flags) shows every step of every tag, with the ledger's current value."""
    include = write_benchmarks(tmp_path / "bench", next_line_count=60, bpb_docs_per_set=2)
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    steps = [10, 20, 30, 40]
    for step in steps:
        faults.commit(ckpt, step)
    env = {"HF_HOME": str(tmp_path / "hf")}
    first = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "2", env=env)
    procs.append(first)
    assert first.wait(300) == 0, first.output()[-3000:]

    bpb = 'tasks = ["bpb_email"]'
    config = _toml(tmp_path / "a.toml", include, {"bpb": bpb})
    out = _evald("backfill", "--suite", "bpb", "--ckpt-dir", str(ckpt), "--", "--config", config, "--endpoint",
                 "none", *faults.FAST, "--idle-exit-s", "2", env=env)  # cells newest first
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    out = _evald("retry", "--ckpt-dir", str(ckpt), "--step", "20", env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    again = faults.start(tmp_path, ckpt, "--config", config, "--lag-policy", "all", "--idle-exit-s", "2", env=env,
                         name="evald-retry")
    procs.append(again)
    assert again.wait(900) == 0, again.output()[-3000:]

    # a suite added and backfilled beside a running evald, which is killed after the first cell: the
    # others stay queued, and a restart finishes them
    mc = 'tasks = ["stdlib_next_line"]\nlimit = 16\nbatch_size = 4'
    config = _toml(tmp_path / "b.toml", include, {"bpb": bpb, "mc": mc})
    killed = faults.start(tmp_path, ckpt, "--config", config, "--lag-policy", "all", env=env, name="evald-killed")
    procs.append(killed)
    wait_for(lambda: "suite mc ready" in killed.output(), 1200, "evald running with the mc suite built")
    out = _evald("backfill", "--suite", "mc", "--ckpt-dir", str(ckpt), env=env)  # recorded for the running evald
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    wait_for(lambda: any(e == "suite:mc" and st == "evaluated" for _, e, st in _cells(ckpt)), 1200,
             "a first mc cell")
    killed.signal(signal.SIGKILL)
    killed.wait(30)
    assert [st for _, e, st in _cells(ckpt) if e == "suite:mc"].count("evaluated") < 4  # some left queued
    restarted = faults.start(tmp_path, ckpt, "--config", config, "--lag-policy", "all", "--idle-exit-s", "2",
                             env=env, name="evald-restarted")
    procs.append(restarted)
    assert restarted.wait(1200) == 0, restarted.output()[-3000:]

    want = _current_points(ckpt)
    assert {tag for tag in want if tag.startswith("mc/")} and {tag for tag in want if tag.startswith("bpb/")}
    assert all([s for s, _ in points] == steps for points in want.values()), want
    tensorboard = TensorBoard(run_dir(ckpt).parent, tmp_path / "tensorboard.log")  # default flags
    procs.append(tensorboard.proc)
    run = f"{run_dir(ckpt).name}/eval"
    for tag, points in want.items():
        shown = tensorboard.until(lambda: tensorboard.scalars(run, tag),
                                  lambda got: _close(got, points))
        assert _close(shown, points), (tag, shown, points)
    texts = tensorboard.get("/data/plugin/text/text", run=run, tag="evald/superseded/text_summary")
    # 20 by `retry --step`; the suites' tokenizer also changed the validation's identity, so every step
    # was evaluated again (its old result superseded), out of order after the backfill
    assert 20 in [t["step"] for t in texts]
    tensorboard.close()


def _evald(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "evald", *args], cwd=REPO, env=base_env(env), capture_output=True,
                          text=True, timeout=900)


def _toml(path, include, suites) -> str:
    text = 'tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"\n'
    for name, body in suites.items():
        text += f"[suites.{name}]\ninclude_path = [{json.dumps(include)}]\n{body}\n"
    path.write_text(text)
    return str(path)


def _cells(ckpt) -> list[tuple[int, str, str]]:
    """``(step, evaluation, state)`` of the current cells."""
    if not faults.ledger_path(ckpt).exists():
        return []
    db = sqlite3.connect(faults.ledger_path(ckpt), timeout=30)
    try:
        return db.execute("SELECT step, evaluation, state FROM cells WHERE superseded_by IS NULL").fetchall()
    except sqlite3.OperationalError:  # no schema yet
        return []
    finally:
        db.close()


def _current_points(ckpt) -> dict[str, list[tuple[int, float]]]:
    """Each metric's current value per step, from the ledger's results (not its TensorBoard outbox):
    the validation's in ``steps``, the suites' in their current cells; as TensorBoard names the tags."""
    db = sqlite3.connect(faults.ledger_path(ckpt), timeout=30)
    try:
        rows = db.execute("SELECT step, metrics FROM steps WHERE state='evaluated'").fetchall()
        rows += db.execute("SELECT step, metrics FROM cells WHERE superseded_by IS NULL AND state='evaluated'"
                           " AND evaluation != 'validation'").fetchall()
    finally:
        db.close()
    out: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in rows:
        for tag, value in json.loads(metrics).items():  # the validation's eval/NAME, a suite's SUITE/TASK/METRIC
            if not tag.endswith("_se"):  # a validation metric's SE is shown as its margin's bounds
                out.setdefault("Loss" if tag == "eval/loss" else tag.removeprefix("eval/"), []).append((step, value))
    return {tag: sorted(points) for tag, points in out.items()}
