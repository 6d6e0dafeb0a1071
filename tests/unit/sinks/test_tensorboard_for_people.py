"""TensorBoard laid out for people (issue 26, item 6), read back with TensorBoard's own code: the
Time Series page's grouping and order (its first two groups open), the Custom Scalars plugin's
"Missing Tags" rule, and the Text plugin's Markdown rendering."""

from __future__ import annotations

import json
import re
import time
from types import SimpleNamespace

import pytest

from tensorboard.plugins.text.text_plugin import text_array_to_html
from tensorboard.util import tensor_util

from evald.daemon.suite_turn import _samples_text, _suite_layout_if_new
from evald.ledger.ledger import Ledger, Record
from evald.sinks import tensorboard_layout as L
from evald.sinks.tensorboard_view import shown

LM = {"eval/loss": 2.5, "eval/loss_se": 0.05, "eval/accuracy": 0.31, "eval/accuracy_se": 0.01}


def _group(tag: str) -> str:
    return tag.split("/", 1)[0]  # TensorBoard's Time Series groups cards by this


def test_standard_error_bounds_are_not_cards_beside_their_metric():
    scalars, _ = shown(Record("eval", 10, 0.0, LM, {}))
    groups = {_group(t) for t in scalars}
    assert groups == {"Loss", "accuracy", L.SE_GROUP}
    assert [t for t in scalars if _group(t) == "accuracy"] == ["accuracy"]  # one card in its group
    # the SE group sorts after every ASCII group name (TensorBoard sorts by code point: only the
    # first two groups are open on the first screen)
    assert all(L.SE_GROUP > name for name in ("zz", "Loss", "evald", "Samples", "train"))


def test_the_first_group_of_the_time_series_page_is_train_and_eval_loss():
    """TensorBoard sorts the groups by code point (numbers by value) and opens the first two: train
    and eval loss share the tag ``Loss``, before every metric's and suite's lowercase group."""
    eval_tags, _ = shown(Record("eval", 10, 0.0, {**LM, "eval/perplexity": 12.0, "evald/load_s": 0.1,
                                                  "bpb/bpb_email/bits_per_byte": 1.2}, {}))
    train_tags, _ = shown(Record("train", 10, 0.0, {"train/loss": 2.6, "train/lr": 1e-3, "health/nan": 0.0}, {}))
    assert "Loss" in eval_tags and "Loss" in train_tags
    assert sorted({_group(t) for t in {*eval_tags, *train_tags}})[0] == "Loss"


def test_no_margin_chart_has_a_value_tag_that_the_train_run_has_too():
    """The Custom Scalars page lists under "Missing Tags" every run with a margin chart's value tag
    but not both bounds: the train sub-run has ``loss``."""
    layout = L.layout(L.covered(None, LM, "eval/accuracy"))
    train_tags = {"Loss", "lr", "grad_norm"}
    margins = [chart[1] for charts in layout.values() for chart in charts.values() if chart[0] == "Margin"]
    assert margins and all(value not in train_tags for value, _, _ in margins)


def test_each_task_of_each_suite_gets_a_chart_of_its_headline_metric(tmp_path):
    """Issue 37, item 6: one multi-line chart per suite drew its 13 tasks as lines of one colour, smoothed,
    with the highest and lowest points off the chart; now a margin chart per task, titled with its name."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    scalars = {"eval/bpb/bpb_email/bits_per_byte": 1.2, "eval/bpb/bpb_email/word_perplexity": 30.0,
               "eval/bpb/bpb_http/bits_per_byte": 1.1, "eval/mc/next_line/acc": 0.4,
               "eval/mc/next_line/acc_stderr": 0.1, "eval/mc/lambada/perplexity": 9.0}
    _suite_layout_if_new(ledger, 10, scalars, time.time())
    [record] = ledger.pending_records()
    layout = L.layout(ledger.get_state(L.LAYOUT_STATE))
    suites = {title: charts for title, charts in layout.items() if title.startswith("benchmark suite ")}
    assert suites == {
        "benchmark suite bpb": {  # no stderr (lm-eval gives none for bits per byte): the value is its own bounds
            "bpb_email: bits_per_byte": ["Margin", ["bpb/bpb_email/bits_per_byte"] * 3],
            "bpb_http: bits_per_byte": ["Margin", ["bpb/bpb_http/bits_per_byte"] * 3]},
        "benchmark suite mc": {   # each task its own headline
            "lambada: perplexity": ["Margin", ["mc/lambada/perplexity"] * 3],
            "next_line: acc ± stderr": ["Margin", ["σ/mc/next_line/acc", "σ/mc/next_line/acc/lower",
                                                   "σ/mc/next_line/acc/upper"]]}}
    assert list(layout)[:2] == ["loss", "benchmark suite bpb"]  # right after loss, as before
    _suite_layout_if_new(ledger, 20, scalars, time.time())  # nothing new: no second layout
    assert len(ledger.pending_records()) == 1 and record.step == 10
    ledger.close()


def test_a_suite_metric_s_stderr_adds_its_bounds_and_keeps_its_tag():
    scalars = {"mc/next_line/acc": 0.4, "mc/next_line/acc_stderr": 0.1, "mc/next_line/acc@strict": 0.3,
               "mc/next_line/acc_stderr@strict": 0.05, "bpb/bpb_email/bits_per_byte": 1.2}
    shown_scalars, _ = shown(Record("eval", 10, 0.0, scalars, {}))
    assert shown_scalars == pytest.approx({
        **scalars, "σ/mc/next_line/acc": 0.4, "σ/mc/next_line/acc/lower": 0.3, "σ/mc/next_line/acc/upper": 0.5,
        "σ/mc/next_line/acc@strict": 0.3, "σ/mc/next_line/acc@strict/lower": 0.25,
        "σ/mc/next_line/acc@strict/upper": 0.35})
    cover = L.covered(None, {f"eval/{k}": v for k, v in scalars.items()}, "eval/loss")
    assert "acc_stderr@strict: acc_stderr@strict" not in str(L.layout(cover))  # an stderr is no task metric


def test_a_suite_monitor_is_charted_beside_the_loss():
    metrics = {"eval/loss": 2.0, "eval/mc/next_line/acc_norm": 0.3, "eval/mc/next_line/acc_norm_stderr": 0.03}
    layout = L.layout(L.covered(None, metrics, "mc/next_line/acc_norm"))
    first = layout["loss and mc/next_line/acc_norm"]
    assert first["mc/next_line: acc_norm ± stderr"] == ["Margin", ["σ/mc/next_line/acc_norm",
                                                                   "σ/mc/next_line/acc_norm/lower",
                                                                   "σ/mc/next_line/acc_norm/upper"]]


def test_a_run_laid_out_by_an_older_evald_gets_the_new_layout_at_its_next_evaluation(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    scalars = {"eval/bpb/bpb_email/bits_per_byte": 1.2}
    older = {"metrics": sorted(scalars), "monitor": "eval/loss"}  # what evald wrote before LAYOUT_VERSION
    ledger.add_records([], kv={L.LAYOUT_STATE: older})
    _suite_layout_if_new(ledger, 30, scalars, time.time())
    [record] = ledger.pending_records()
    assert record.step == 30 and "benchmark suite bpb" in json.loads(record.texts[L.LAYOUT_TAG])
    ledger.close()


def test_each_suite_evaluation_shows_its_results_as_a_table_on_the_text_page():
    scalars = {"mc/next_line/acc": 0.26, "mc/next_line/acc_stderr": 0.031, "mc/next_line/acc_norm": 0.27,
               "mc/next_line/acc_norm_stderr": 0.0315, "mc/lambada/perplexity": 9.123456,
               "evald/suites/mc/evaluate_s": 1.0}
    texts = {"mc/samples": "...", "evald/suites/mc/identity": "suite identity `abc`"}
    _, shown_texts = shown(Record("eval", 10, 0.0, scalars, texts))
    html = _html(shown_texts["mc/results"])
    header = re.search(r"<thead>(.*?)</thead>", html, re.S).group(1)
    assert re.findall(r"<code>(.*?)</code>", header) == ["acc_norm", "acc", "perplexity"]  # headline first
    rows = {re.search(r"<code>(.*?)</code>", row).group(1): re.findall(r"<td>([^<]*)</td>", row)
            for row in re.findall(r"<tr>(.*?)</tr>", html.split("</thead>")[1], re.S)}
    assert rows == {"lambada": ["", "", "9.123"], "next_line": ["0.27 ± 0.032", "0.26 ± 0.031", ""]}
    _, no_suite = shown(Record("eval", 10, 0.0, {"mc/next_line/acc": 0.26}, {}))  # not a suite's evaluation
    assert not [t for t in no_suite if t.endswith("/results")]


def _html(text: str) -> str:
    """What TensorBoard's Text page shows for ``text`` (its own Markdown rendering)."""
    return text_array_to_html(tensor_util.make_ndarray(tensor_util.make_tensor_proto(text)), enable_markdown=True)


def test_sample_texts_are_preformatted_not_markdown():
    target = "# flake8: noqa\nimport os\n**not bold**"
    _, texts = shown(Record("eval", 10, 0.0, {}, {"sample/greedy": target}))
    html = _html(texts["Samples/greedy"])
    assert "<h1>" not in html and "<strong>" not in html and "# flake8: noqa" in html and "<code" in html
    task = SimpleNamespace(metrics={"acc": 1.0, "acc_stderr": 0.0}, documents=1,
                           samples=[{"doc_id": 0, "target": target, "resps": [["x"]], "metrics": {"acc": 1.0}}])
    html = _html(_samples_text(SimpleNamespace(tasks={"next_line": task})))
    assert "<h1>" not in html and "# flake8: noqa" in html and "<strong>next_line</strong>" in html


def test_a_fence_is_longer_than_any_run_of_backticks_in_the_text():
    text = "a ```b``` c ````d"
    fenced = L.preformatted(text)
    assert fenced.startswith("`````text\n") and fenced.endswith("\n`````")
    assert "a ```b``` c ````d" in _html(fenced)
