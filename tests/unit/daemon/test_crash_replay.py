"""A crash at every state change, in-process: nothing lost, nothing evaluated or written twice.

evald's own loop (``Server.on_tick``, with the real run, ledger, intake, decisions and TensorBoard
sink) is driven in this process. A crash is injected at the N-th durable write (each ledger
transaction and each TensorBoard record), before it or just after it, for every N; then a fresh
Server on the same files finishes the job, as a restarted evald would. The MindSpore evaluator is replaced by a stand-in
that reads and verifies the real checkpoint files and reports the mean weight as the loss: this
layer checks the bookkeeping in milliseconds; the real evaluator is exercised, with real kills,
in tests/e2e/test_reliability.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from types import SimpleNamespace

import numpy as np
import pytest

from evald.config import EvaldConfig, ResolvedConfig
from evald.contracts import layout, wire
from evald.pipeline.network import EvalResult
from evald.ledger.ledger import EVALUATED, Ledger
from evald.daemon.server import Server
from evald.ledger.samples import identity_digest, read_step
from evald.pipeline.pipeline import Evaluated, SuiteEvaluated
from evald.sinks.tensorboard import EventLog
from evald.pipeline.subset import SubsetInfo
from tests.harness import raw_scalar_steps

STEPS = (10, 20, 30, 40, 50)
RUN_NAME = "exp"
LOSS = {step: 5.0 - step / 20 if step != 40 else 4.5 for step in STEPS}  # 40 is worse: patience counts


class Crash(BaseException):
    """Stands for SIGKILL: nothing after it runs (BaseException, so no except-Exception catches it)."""


class StandInPipeline:
    """Stands in for the MindSpore pipeline (evald.pipeline.pipeline.EvaluationPipeline), with one
    benchmark suite, ``fast`` (every checkpoint), whose cells are ledger cells like any."""

    validation_identity = "v" * 64

    def __init__(self):
        self.subset = SubsetInfo.of([0, 1], num_samples=2, requested=2, seed=0)
        self.blocked_reason = None
        self.evaluated: list[int] = []
        self.suite_evaluated: list[int] = []
        self.suites = {"fast": SimpleNamespace(options=SimpleNamespace(every_k=1), cell_identity="c" * 64,
                                               identity={"tokenizer": "t" * 64})}
        self.suite_errors: dict[str, str] = {}
        self.suites_pending: tuple[str, ...] = ()

    def ensure_built(self, config):
        return True

    def build_next_suite(self):
        return False

    def evaluate_suite(self, name, ckpt_dir, row):
        self.suite_evaluated.append(row.step)
        samples = [{"doc_id": 0, "target": "1", "resps": [[-1.0, False]], "metrics": {"acc": 1.0}}]
        task = SimpleNamespace(metrics={"acc": 1.0, "acc_stderr": 0.0}, samples=samples, documents=1)
        identity = {"suite": name, "lm_eval": "0.4.13"}
        result = SimpleNamespace(tasks={"t": task}, identity=identity,
                                 identity_sha256=identity_digest(identity),   # the reader recomputes it
                                 evaluate_s=0.0, compiled_graphs=2, tokens=10,
                                 scalars=lambda: {f"{name}/t/acc": LOSS[row.step], f"{name}/t/acc_stderr": 0.0})
        return SuiteEvaluated(result, 0.0, {})

    def evaluate(self, ckpt_dir, row):
        path = ckpt_dir / row.source
        weights = layout.read_checkpoint(path, layout.read_manifest(path))  # the real read and verification
        self.evaluated.append(row.step)
        return Evaluated(EvalResult({"eval/loss": float(weights["w"].mean())}, {}, 0.0, 0.0))


class Injector:
    """Raises Crash at the ``at``-th durable write: every ledger transaction (just before its
    COMMIT, which then never happens, or just after it) and every TensorBoard record."""

    def __init__(self, monkeypatch, at: int | None, after: bool):
        self.count, self.at, self.after = 0, at, after
        injector = self
        original = Ledger._transaction

        @contextlib.contextmanager
        def transaction(ledger):
            with original(ledger) as db:
                yield db
                injector.point(before_commit=True)
            injector.point(before_commit=False)

        monkeypatch.setattr(Ledger, "_transaction", transaction)
        write = EventLog.write

        def write_record(log, *args, **kwargs):
            self.point(before_commit=True)
            write(log, *args, **kwargs)
            self.point(before_commit=False)

        monkeypatch.setattr(EventLog, "write", write_record)

    def point(self, before_commit: bool) -> None:
        if before_commit:
            self.count += 1
        if self.count == self.at and before_commit != self.after:
            raise Crash()


def stage(tmp_path):
    ckpt = tmp_path / "ckpt"
    for step in STEPS:
        layout.write_checkpoint(ckpt, step, {"w": np.full(8, LOSS[step], np.float32)}, run_id="r")
    announce = wire.RunAnnounced(run_id="r", ckpt_dir=str(ckpt), every_n_steps=10)
    layout.write_run_file(ckpt, announce.encode().decode())
    layout.write_run_end(ckpt, wire.RunFinished(run_id="r", ckpt_dir=str(ckpt), final_step=50).encode().decode())
    return ckpt


def serve(ckpt, logdir, pipeline) -> None:
    """evald's server, startup and then its loop body ``on_tick``, until the run is complete."""
    config = dataclasses.replace(EvaldConfig(), lag_policy="all", patience=2, ckpt_dir=str(ckpt),
                                 logdir=str(logdir), run_name=RUN_NAME, endpoint="none")
    server = Server(ResolvedConfig(config, {}), pipeline=pipeline)
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        server.startup()
        for _ in range(200):
            if not server.on_tick():
                assert server.run is not None and server.run.complete(), "the loop stopped before the run ended"
                server.shutdown()
                return
        raise AssertionError("the run never completed")
    except BaseException:
        die(server)
        raise
    finally:
        os.umask(umask)  # startup makes evald's state private (a umask): not this test process's


def die(server: Server) -> None:
    """What a SIGKILL leaves: no shutdown; the threads, files and locks go with the process."""
    if server.run is not None:
        server.run.close()  # what its start had opened: the watcher's thread, the ledger, the event files
    for lock in server.locks:
        lock.release()


def test_the_crash_free_run_counts_its_writes(tmp_path, monkeypatch):
    ckpt = stage(tmp_path)
    injector = Injector(monkeypatch, at=None, after=False)
    serve(ckpt, tmp_path / "logdir", StandInPipeline())
    assert injector.count > 20
    check(tmp_path / "logdir")


def _writes_in_a_clean_run(tmp_path_factory) -> int:
    tmp = tmp_path_factory.mktemp("count")
    with pytest.MonkeyPatch.context() as mp:
        injector = Injector(mp, at=None, after=False)
        serve(stage(tmp), tmp / "logdir", StandInPipeline())
    return injector.count


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_crash_at_every_durable_write_loses_and_repeats_nothing(tmp_path_factory, after):
    total = _writes_in_a_clean_run(tmp_path_factory)
    for at in range(1, total + 1):
        tmp = tmp_path_factory.mktemp(f"crash{at}")
        ckpt, logdir = stage(tmp), tmp / "logdir"
        first = StandInPipeline()
        with pytest.MonkeyPatch.context() as mp:
            Injector(mp, at=at, after=after)
            with pytest.raises(Crash):
                serve(ckpt, logdir, first)
        second = StandInPipeline()
        serve(ckpt, logdir, second)  # the restart
        check(logdir, crash=f"write #{at} ({'after' if after else 'before'})")
        # only the step in flight at the crash (its result not committed) is evaluated again
        both = first.evaluated + second.evaluated
        assert len(both) - len(set(both)) <= 1 and set(both) == set(STEPS), (at, first.evaluated, second.evaluated)
        cells = first.suite_evaluated + second.suite_evaluated  # ... and of the suite cells, the one in flight
        assert len(cells) - len(set(cells)) <= 1 and set(cells) == set(STEPS), (at, first.suite_evaluated,
                                                                                 second.suite_evaluated)


def check(logdir, crash: str = "no crash") -> None:
    logdir = logdir / RUN_NAME   # the run directory
    ledger = Ledger(logdir / "ledger.sqlite")
    try:
        steps = ledger.steps()
        assert [(s.step, s.state) for s in steps] == [(s, EVALUATED) for s in STEPS], crash
        assert {s.step: s.metrics["eval/loss"] for s in steps} == LOSS, crash
        assert ledger.pending_records() == [], crash
        decisions = ledger.get_state("decisions")
        assert decisions["early_stop"]["best_step"] == 50 and decisions["early_stop"]["wait"] == 0, crash
        assert ledger.get_state("summarised") == ["r", 50], crash
        assert [(c.step, c.state) for c in ledger.cells()] == [(s, EVALUATED) for s in STEPS], crash
        assert all(not ledger.superseded(s) for s in STEPS), crash
    finally:
        ledger.close()
    assert raw_scalar_steps(logdir, "eval/fast/t/acc") == list(STEPS), crash  # one point per cell, ever
    assert raw_scalar_steps(logdir, "eval/fast/t/acc_stderr") == list(STEPS), crash
    for step in STEPS:
        head, samples = read_step(logdir, "fast", "t", step)
        assert samples[0]["metrics"] == {"acc": 1.0} and head.cell_identity == "c" * 64, crash
    assert raw_scalar_steps(logdir, "eval/loss") == list(STEPS), crash  # one point per step, ever
    assert raw_scalar_steps(logdir, "evald/evaluate_s") == list(STEPS), crash
    # TensorBoard's Custom Scalars layout: one, the newest (the validation's, then the suite's metrics
    # added at the step of the cell that brought them: which step depends on where the crash fell)
    assert len(raw_scalar_steps(logdir, "eval/custom_scalars__config__")) == 1, crash
    from tests.faults import tb_texts

    summaries = [step for step, tag, _ in tb_texts(logdir, "evald/summary")]
    assert summaries == [50], crash
    assert (logdir / "summary.json").exists() and (logdir / "best.json").exists(), crash
