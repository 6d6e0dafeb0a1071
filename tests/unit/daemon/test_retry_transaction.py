"""A re-evaluation (`evald retry --step N`) commits its result and the best step derived again from the current
results in ONE transaction: a crash right after it cannot leave the best pointing at a superseded value."""

from __future__ import annotations

import pytest

from evald.daemon.server import Server
from evald.ledger.ledger import EVALUATED, Ledger
from evald.ledger.requeue import retry
from evald.pipeline.network import EvalResult
from evald.pipeline.pipeline import Evaluated
from tests.unit.daemon.rig import MeanWeightPipeline, config, evaluated, stage, tick_until

pytestmark = pytest.mark.usefixtures("private_umask")


class Crash(BaseException):
    """Stands for SIGKILL between two durable writes."""


class ChangedOnRetry(MeanWeightPipeline):
    """Step 10 reports 100 when evaluated again (say, after the model factory was fixed)."""

    def evaluate(self, ckpt_dir, row):
        result = super().evaluate(ckpt_dir, row)
        if self.evaluated.count(row.step) > 1:
            return Evaluated(EvalResult({"eval/loss": 100.0}, {}, 0.0, 0.0))
        return result


def test_the_rebuilt_best_is_committed_with_the_re_evaluation(tmp_path, monkeypatch):
    ckpt = stage(tmp_path / "ckpt", 10, 20)  # losses 10 and 20: the best is step 10
    pipeline = ChangedOnRetry()
    server = Server(config(tmp_path, None, ckpt_dir=str(ckpt), idle_exit_s=None), pipeline=pipeline)
    try:
        server.startup()
        tick_until(server, lambda: evaluated(server) == [10, 20], "both steps evaluated")
        ledger = server.run.ledger
        assert ledger.get_state("decisions")["early_stop"]["best_step"] == 10
        retry(ledger, [10], "in this test", evaluated_too=True)
        put_state = Ledger.put_state

        def crash_on_a_second_transaction(self, key, value):
            if key == "decisions":
                raise Crash()  # a second write of the decisions after the outcome's own transaction
            return put_state(self, key, value)

        monkeypatch.setattr(Ledger, "put_state", crash_on_a_second_transaction)
        tick_until(server, lambda: pipeline.evaluated.count(10) == 2 and 10 in evaluated(server),
                   "step 10 evaluated again")
        path = ledger.path
    finally:
        server.shutdown()
    after = Ledger(path)
    try:
        assert [(s.step, s.metrics["eval/loss"]) for s in after.steps(EVALUATED)] == [(10, 100.0), (20, 20.0)]
        assert after.get_state("decisions")["early_stop"]["best_step"] == 20  # from the current results only
    finally:
        after.close()
