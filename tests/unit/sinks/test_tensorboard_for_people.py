"""TensorBoard laid out for people (issue 26, item 6), read back with TensorBoard's own code: the
Time Series page's grouping and order (its first two groups open), the Custom Scalars plugin's
"Missing Tags" rule, and the Text plugin's Markdown rendering."""

from __future__ import annotations

import time
from types import SimpleNamespace

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


def test_each_suite_gets_a_chart_of_its_headline_metric(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    scalars = {"eval/bpb/bpb_email/bits_per_byte": 1.2, "eval/bpb/bpb_email/word_perplexity": 30.0,
               "eval/bpb/bpb_http/bits_per_byte": 1.1, "eval/mc/next_line/acc": 0.4,
               "eval/mc/next_line/acc_stderr": 0.1}
    _suite_layout_if_new(ledger, 10, scalars, time.time())
    [record] = ledger.pending_records()
    charts = L.layout(ledger.get_state(L.LAYOUT_STATE))[L.SUITES]
    assert charts == {"bpb: bits_per_byte": ["Multiline", ["^bpb/[^/]+/bits_per_byte$"]],
                      "mc: acc": ["Multiline", ["^mc/[^/]+/acc$"]]}
    _suite_layout_if_new(ledger, 20, scalars, time.time())  # nothing new: no second layout
    assert len(ledger.pending_records()) == 1 and record.step == 10
    ledger.close()


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
