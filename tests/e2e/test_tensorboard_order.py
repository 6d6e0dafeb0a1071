"""Points written out of step order reach the screen (issue 26, item 1). TensorBoard's own server, with
its default flags, drops a tag's points at and after a step written below that tag's latest one; evald
writes backfills newest first, re-evaluates steps (``retry --step``, a changed configuration) and
finishes cells left by a restart. Checked through a real ``tensorboard`` process's HTTP API: every
step of every tag, with its current value."""

from __future__ import annotations

import time

from evald.ledger.ledger import SUPERSEDED_TAG, Ledger, Record
from evald.sinks.tensorboard import TensorBoardSink
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
    shown = tensorboard.until(lambda: tensorboard.scalars("run/eval", "loss"), lambda got: _close(got, loss))
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
    want = {"loss": loss,
            "loss/se_lower": [(s, v - (0.02 if s == 200 else 0.01)) for s, v in loss],
            "bpb/email/bits_per_byte": [(s, 2.0 + s / 1000) for s in STEPS],
            "mc/next_line/acc": [(s, s / 1000) for s in (50, 100, 150, 200, 300)]}
    fresh = TensorBoard(tmp_path / "logs", tmp_path / "tensorboard-fresh.log")
    procs.append(fresh.proc)
    for name, server in (("the TensorBoard that was open", tensorboard), ("a TensorBoard started now", fresh)):
        for tag, points in want.items():
            shown = server.until(lambda: server.scalars("run/eval", tag),  # noqa: B023 - called right here
                                 lambda got: _close(got, points))  # noqa: B023
            assert _close(shown, points), (name, tag, shown)
            assert _close(server.time_series("run/eval", tag), points), (name, tag)
    tensorboard.close()
    fresh.close()


def _close(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """The same steps, and values equal to float32 (TensorBoard keeps scalars as float32)."""
    return [s for s, _ in got] == [s for s, _ in want] and all(abs(a - b) <= 1e-6 * max(1, abs(b))
                                                                for (_, a), (_, b) in zip(got, want))
