"""A suite scored on weights that give non-finite log-likelihoods is a failed cell with a reason, never a
plain number (issue 27, item 3): lm-eval's argmax over NaN picks choice 0, so a checkpoint whose
embedding rows hold NaN scored ``acc=0.5`` in the log, the ledger and TensorBoard.

The real demo network in Graph mode, its embedding table written in place (as a hot swap writes it),
lm-eval's real tasks; the ledger and the cell's turn are the daemon's own."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest

ms = pytest.importorskip("mindspore")
pytest.importorskip("lm_eval")

from evald.config.options import SuiteOptions  # noqa: E402
from evald.daemon import suite_turn  # noqa: E402
from evald.ledger.ledger import EVALUATED, FAILED, Ledger, Record  # noqa: E402
from evald.ledger.samples import list_samples  # noqa: E402
from evald.pipeline import pipeline as pipeline_module  # noqa: E402
from evald.pipeline.suites import runner as runner_module  # noqa: E402
from evald.pipeline.suites.runner import SuiteRunner  # noqa: E402
from evald.pipeline.suites.tokenizer import ByteTokenizer  # noqa: E402

# main had no such error: the tests then fail with "DID NOT RAISE" / a finite accuracy, not at import
NonFiniteScores = getattr(runner_module, "NonFiniteScores", type("NonFiniteScores", (Exception,), {}))
DOCS = 16
NETWORK_SEED = 5       # the network fixture's (tests/unit/conftest.py)
BPB_DOCS_PER_SET = 1   # the include fixture's (conftest.py)


@pytest.fixture(scope="module")
def mc(include, network):
    return SuiteRunner("mc", SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=DOCS, seed=3,
                                          batch_size=4), network, ByteTokenizer())


@pytest.fixture
def broken(network):
    """Write ``value`` into the embedding rows of ``tokens`` (all of them by default) in place; restored after."""
    table = network.tok.embedding_table.asnumpy()   # a live view on CPU: what a hot swap writes
    saved = table.copy()

    def corrupt(value: float, tokens=slice(None)) -> None:
        table[tokens] = value

    yield corrupt
    table[...] = saved


def test_finite_weights_score_as_before(mc):
    task = mc.run().tasks["stdlib_next_line"]
    assert 0 <= task.metrics["acc"] <= 1 and task.documents == DOCS


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_weights_fail_the_suite_naming_the_task_and_the_documents(mc, broken, value):
    broken(value)
    with pytest.raises(NonFiniteScores, match=rf"suite mc: log-likelihoods that are not finite \(NaN or Inf\) on "
                                              rf"{DOCS} of {DOCS} documents of task stdlib_next_line") as caught:
        mc.run()
    assert caught.value.documents == {"stdlib_next_line": (DOCS, DOCS)}


def test_one_broken_row_fails_the_suite_on_the_documents_it_reaches(mc, broken):
    broken(float("nan"), tokens=ord("("))      # a byte some documents hold and others do not
    with pytest.raises(NonFiniteScores) as caught:
        mc.run()
    bad, total = caught.value.documents["stdlib_next_line"]
    assert 0 < bad <= total == DOCS and f"{bad} of {DOCS} documents" in str(caught.value)


def test_rolling_log_likelihoods_that_are_not_finite_fail_too(include, mc, broken):
    bpb = SuiteRunner("bpb", SuiteOptions(tasks=("stdlib_bpb",), include_path=(include,), batch_size=4),
                      mc.scorer.network, ByteTokenizer(), scorer=mc.scorer)
    broken(float("nan"))
    with pytest.raises(NonFiniteScores, match=r"suite bpb: log-likelihoods that are not finite"):
        bpb.run()


def test_the_cell_is_failed_with_the_reason_and_no_number_reaches_the_ledger_or_tensorboard(mc, broken, tmp_path,
                                                                                            caplog):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    try:
        ledger.admit(name="step_000000010", step=10, kind="evald", found_via="rescan", run_id="r", commit_time=1.0)
        ledger.start(10)
        ledger.finish(10, EVALUATED, metrics={"eval/loss": float("nan")}, identity="v" * 64,
                      record=Record("eval", 10, 1.0, {"eval/loss": float("nan")}, {}))
        pipeline = pipeline_module.Pipeline(should_abort=lambda: False)
        pipeline.evaluator = SimpleNamespace()     # the network already holds step 10's weights: no load
        # a built suite handed to the pipeline's SuiteHost (its ``suites`` is a read-only view: issue 36 item 2)
        pipeline._suites._suites["mc"], pipeline.loaded_step = mc, 10
        ledger.queue_cells("mc", mc.cell_identity, [10])
        broken(float("nan"))
        with caplog.at_level(logging.INFO, logger="evald"):
            assert suite_turn.evaluate_cells(ledger, pipeline, tmp_path / "ckpt", tmp_path, max_attempts=3, step=10)
        logged = [r.getMessage() for r in caplog.records if r.name == "evald"]
        assert any(m.startswith("step 10 suite mc not evaluated (failed): ") and "not finite" in m for m in logged)
        assert not any("acc=" in m for m in logged)
        cell = ledger.cell(10, "mc")
        assert cell.state == FAILED and not cell.metrics
        assert re.search(rf"not finite .* on {DOCS} of {DOCS} documents of task stdlib_next_line", cell.reason)
        scalars = {k: v for r in ledger.pending_records() for k, v in r.scalars.items() if k.startswith("mc/")}
        assert scalars == {}
        texts = [t for r in ledger.pending_records() for t in r.texts.values()]
        assert any("not finite" in t for t in texts)
        assert list_samples(tmp_path) == []        # no per-sample file of a failed cell
    finally:
        ledger.close()
