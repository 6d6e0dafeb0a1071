"""The Custom Scalars layout and the shown tags (issue 18, item 14), through the real ledger outbox
and TensorBoard sink, read back with TensorBoard's own readers (EventAccumulator, its layout proto,
and the custom_scalars plugin's merge of several runs' layouts)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from evald.daemon.turn import _layout_if_new
from evald.ledger.ledger import Ledger, Record
from evald.pipeline.metrics.uncertainty import SE_SUFFIX
from evald.sinks import tensorboard_layout as L
from evald.sinks.tensorboard import TensorBoardSink
from tests.harness import raw_scalar_steps
from tests.tensorboard_http import on_the_page

LM = {"eval/loss": 2.5, "eval/loss_se": 0.05, "eval/perplexity": 12.2, "eval/perplexity_se": 0.6,
      "eval/accuracy": 0.31, "eval/accuracy_se": 0.01, "sample/greedy/distinct_1": 0.4}


def _evaluate(ledger: Ledger, step: int, metrics: dict, monitor: str = "eval/loss") -> None:
    """What daemon/turn.py commits for one evaluation, as far as TensorBoard is concerned."""
    _layout_if_new(ledger, SimpleNamespace(step=step), metrics, monitor, time.time())
    texts = {"evald/provenance": "hashes", "sample/greedy": "a continuation"}
    ledger.add_records([Record("eval", step, time.time(), {**metrics, "evald/load_s": 0.1}, texts)])


def _layouts(run_dir) -> list[tuple[int, layout_pb2.Layout]]:
    acc = EventAccumulator(str(run_dir / "eval"), size_guidance={"tensors": 0})
    acc.Reload()
    return [(e.step, layout_pb2.Layout.FromString(e.tensor_proto.string_val[0]))
            for e in acc.Tensors(L.LAYOUT_TAG)]


def _charts(layout: layout_pb2.Layout) -> list[tuple[str, list[str]]]:
    """Each category's charts in the order the page shows them."""
    return [(c.title, on_the_page([(ch.title, ch.HasField("margin")) for ch in c.chart])) for c in layout.category]


@pytest.fixture
def run(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    yield tmp_path, ledger
    ledger.close()


def test_the_layout_opens_on_loss_and_the_monitor_with_margins(run):
    run_dir, ledger = run
    _evaluate(ledger, 10, LM, monitor="eval/accuracy")
    _evaluate(ledger, 20, LM, monitor="eval/accuracy")
    sink = TensorBoardSink(run_dir, ledger)
    sink.drain()
    sink.close()
    [(step, layout)] = _layouts(run_dir)
    assert step == 10  # written once, at the first evaluation
    assert _charts(layout) == [
        ("loss and accuracy", ["loss (train and eval)", "eval loss ± SE", "eval accuracy ± SE"]),
        ("eval metrics ± standard error", ["eval perplexity ± SE"]),
        ("sample quality", ["greedy continuations"]),
        ("evald", list(L.BOOKKEEPING))]
    first = layout.category[0]
    assert list(first.chart[0].multiline.tag) == ["^Loss$"]  # train/ and eval/ both have "Loss": one chart
    series = {c.title: c for c in first.chart}["eval loss ± SE"].margin.series[0]
    assert (series.value, series.lower, series.upper) == ("σ/Loss", "σ/Loss/lower", "σ/Loss/upper")
    assert [c.closed for c in layout.category] == [False, False, True, True]

    acc = EventAccumulator(str(run_dir / "eval"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert not {t for t in scalars if t.endswith(SE_SUFFIX)}  # no chart of its own for an SE
    assert {"Loss", "σ/Loss", "σ/Loss/lower", "σ/Loss/upper", "σ/accuracy/lower"} <= scalars
    assert [e.value for e in acc.Scalars("σ/Loss/lower")] == pytest.approx([2.45, 2.45])
    assert [e.value for e in acc.Scalars("σ/Loss/upper")] == pytest.approx([2.55, 2.55])
    assert [e.value for e in acc.Scalars("σ/Loss")] == pytest.approx([2.5, 2.5])
    texts = set(acc.Tags()["tensors"])
    assert {"Samples/greedy/text_summary", "evald/provenance/text_summary"} <= texts
    assert sorted(t for t in texts if t.endswith("text_summary"))[0].startswith("Samples/")  # first on the page
    # the ledger keeps its own names
    payloads = [p for (p,) in ledger._db.execute("SELECT payload FROM records WHERE stream='eval'")]
    assert all('"eval/loss_se"' in p and '"sample/greedy"' in p for p in payloads) and len(payloads) == 2


def test_a_new_metric_or_monitor_rewrites_the_layout_at_its_step_and_a_restart_does_not(run):
    """Issue 26: the file shows one layout, the newest, at the step that changed it."""
    run_dir, ledger = run
    _evaluate(ledger, 10, {"eval/loss": 2.0, "eval/loss_se": 0.1})
    _evaluate(ledger, 20, {"eval/loss": 1.9, "eval/loss_se": 0.1})           # same: nothing
    _evaluate(ledger, 30, {"eval/loss": 1.8, "eval/loss_se": 0.1, "eval/mine": 3.0})  # a plug-in's metric
    _evaluate(ledger, 40, {"eval/loss": 1.7, "eval/loss_se": 0.1})           # covered already: nothing
    TensorBoardSink(run_dir, ledger).drain()
    ledger.close()
    restarted = Ledger(run_dir / "ledger.sqlite")  # a restart: the state says what is covered
    _evaluate(restarted, 50, {"eval/loss": 1.6, "eval/loss_se": 0.1})
    TensorBoardSink(run_dir, restarted).drain()
    restarted.close()
    layouts = _layouts(run_dir)
    # the newest layout only: the one of step 10 is replaced by the file's rewrite at the restart
    assert [step for step, _ in layouts] == [30]
    assert raw_scalar_steps(run_dir, f"eval/{L.LAYOUT_TAG}") == [30]
    assert _charts(layouts[-1][1])[1] == ("eval metrics ± standard error", ["eval mine"])


def test_runs_sharing_a_log_directory_merge_into_one_layout(tmp_path):
    """TensorBoard's custom_scalars plugin merges every run's layout, dropping identical charts of
    same-named categories: two runs with the same metrics show each chart once."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin

    for name in ("exp1", "exp2"):
        (tmp_path / name).mkdir()
        ledger = Ledger(tmp_path / name / "ledger.sqlite")
        _evaluate(ledger, 10, LM)
        TensorBoardSink(tmp_path / name, ledger).drain()
        ledger.close()
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))
    plugin = CustomScalarsPlugin(base_plugin.TBContext(data_provider=provider, multiplexer=multiplexer,
                                                       logdir=str(tmp_path)))
    merged = json.loads(plugin.layout_impl(context.RequestContext(), ""))
    titles = [(c["title"], on_the_page([(ch["title"], "margin" in ch) for ch in c["chart"]])) for c in merged["category"]]
    assert titles == [("loss", ["loss (train and eval)", "eval loss ± SE"]),
                      ("eval metrics ± standard error", ["eval accuracy ± SE", "eval perplexity ± SE"]),
                      ("sample quality", ["greedy continuations"]), ("evald", list(L.BOOKKEEPING))]


def test_the_se_suffix_is_the_metrics_one():
    assert L.SE_SUFFIX == SE_SUFFIX
