"""What a TensorBoard reader sees first: the Custom Scalars layout, and how the ledger's tags are shown.

TensorBoard's Time Series and Scalars pages sort tag groups by name, so they open on whatever
metric sorts first (``accuracy``), not on loss. TensorBoard's own ``custom_scalars`` plugin
shows a layout the writer chooses, in the order it chooses; evald writes one per run:

1. "loss and <monitor>": train and eval loss on one chart (``^Loss$`` matches the tag in both
   sub-runs), eval loss ± one standard error, and the monitored metric ± its SE;
2. "eval metrics ± standard error": every other eval metric as a margin chart (value, value - SE,
   value + SE) in place of a chart of its own for the SE;
3. "sample quality" and 4. "evald" (timings, lag, queue, counts: bookkeeping), both closed.

Shown tags (the ledger keeps its own names): a metric's standard error ``eval/<m>_se`` is written
as ``σ/<m>/lower`` and ``σ/<m>/upper`` (the margin's bounds) beside a copy of the value, ``σ/<m>``:
TensorBoard's Time Series and Scalars pages show every scalar tag as a card, grouped by the part
before the first ``/`` and sorted by code point, and only the first two groups open; ``σ`` sorts
after every ASCII name, so the bounds are one closed group at the end, not two cards beside each
metric. The margin chart's value is the ``σ/<m>`` copy because a Custom Scalars margin chart lists,
under "Missing Tags", each run that has its value tag but not both bounds: ``loss`` is also the
train sub-run's tag, ``σ/loss`` is only the eval sub-run's. The sample texts ``sample/<mode>`` are
shown as ``Samples/<mode>``: TensorBoard's Text page sorts groups by code point, so the capital
puts the samples before ``evald/``'s provenance, subset and decision texts; they are written as
preformatted text (``preformatted``), which the Text page's Markdown leaves as it is.

Benchmark suites' metrics (``eval/<suite>/<task>/<metric>``) get one chart per suite in the
"benchmark suites" category: its headline metric (``HEADLINES``, else its first) of every task.

The layout is a record of the ledger's outbox like any other (stream ``layout``, in the ``eval/``
sub-run), so it is written exactly once and survives crashes. It is added only when it changes:
at the first evaluation, and again only when a later evaluation brings a metric the layout did
not have or the monitor changed, at that evaluation's step (one point per step).

Imports tensorboardX (its layout proto and custom_scalars summary) and nothing of evald.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping

LAYOUT_STREAM = "layout"
LAYOUT_TAG = "custom_scalars__config__"  # the custom_scalars plugin's own tag (its metadata.CONFIG_SUMMARY_TAG)
LAYOUT_STATE = "tensorboard_layout"      # ledger kv: the metric names and monitor the written layout covers
SE_SUFFIX = "_se"                        # evald.pipeline.metrics.uncertainty.SE_SUFFIX: eval/loss -> eval/loss_se
SAMPLE_TEXTS = ("sample/", "Samples/")   # ledger prefix -> shown prefix of the sample texts
CLOSED = ("sample quality", "evald")
LOSS = "Loss"    # train/loss and eval/loss as shown: the capital sorts before every lowercase tag group, so
                 # TensorBoard's Time Series page (groups sorted by code point, the first two open) opens on it
SE_GROUP = "σ"  # sorts after every ASCII tag group in TensorBoard (see above)
SUITES = "benchmark suites"
HEADLINES = ("acc_norm", "acc", "exact_match", "f1", "bits_per_byte", "word_perplexity", "perplexity")

# evald's bookkeeping scalars, grouped into charts of one unit each
BOOKKEEPING = {
    "seconds per checkpoint (load, evaluate, verify)": r"^evald/(load|evaluate|verify)_s$",
    "lag behind training (steps)": r"^evald/lag_steps$",
    "lag behind the commit (seconds)": r"^evald/lag_s$",
    "checkpoints waiting": r"^evald/queue_depth$",
    "skipped, failed, bad messages (totals)": r"^evald/(skipped|failed|bad_messages)_total$",
}


def bounds(name: str) -> tuple[str, str]:
    """The shown tags of ``name`` - SE and ``name`` + SE (``name`` as shown: ``loss``)."""
    return f"{SE_GROUP}/{name}/lower", f"{SE_GROUP}/{name}/upper"


def margin_value(name: str) -> str:
    """The copy of ``name``'s value beside its bounds: the margin chart's value tag."""
    return f"{SE_GROUP}/{name}"


def preformatted(text: str) -> str:
    """``text`` as a fenced code block (longer than any run of backticks in it): TensorBoard's Text
    page renders Markdown, where a sample's ``# flake8: noqa`` would be a heading."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def shown_eval_scalars(scalars: Mapping[str, float], shown) -> dict[str, float]:
    """An eval record's scalars as written: ``shown(tag)`` names each; a metric's SE becomes its bounds."""
    out: dict[str, float] = {}
    for tag, value in scalars.items():
        base = tag[: -len(SE_SUFFIX)] if tag.endswith(SE_SUFFIX) else None
        if base is not None and base in scalars:
            lower, upper = bounds(shown(base))
            out[lower], out[upper] = scalars[base] - value, scalars[base] + value
            out[margin_value(shown(base))] = scalars[base]
        else:
            out[shown(tag)] = value
    return out


def shown_text_tag(tag: str) -> str:
    ledger, shown = SAMPLE_TEXTS
    return shown + tag[len(ledger):] if tag.startswith(ledger) else tag


def covered(state: Mapping[str, Any] | None, metrics: Iterable[str], monitor: str) -> dict[str, Any]:
    """What the layout should cover now: every metric seen so far (the state's and ``metrics``) and the monitor."""
    seen = set((state or {}).get("metrics", ())) | {m for m in metrics if m.startswith(("eval/", "sample/"))}
    return {"metrics": sorted(seen), "monitor": monitor}


def layout(cover: Mapping[str, Any]) -> dict[str, dict[str, list]]:
    """tensorboardX's layout dict, ``{category: {chart: ["Multiline"|"Margin", tags]}}``, in display order.

    The same metric names and monitor give the same layout, so runs sharing a log directory merge
    into one (the plugin drops identical charts of same-named categories)."""
    metrics, monitor = set(cover["metrics"]), cover["monitor"]
    values = sorted(m for m in metrics if m.startswith("eval/") and not m.endswith(SE_SUFFIX) and m.count("/") == 1)

    def chart(metric: str) -> list:
        name = shown_name(metric)
        if metric + SE_SUFFIX in metrics:
            return ["Margin", [margin_value(name), *bounds(name)]]
        return ["Multiline", [f"^{re.escape(name)}$"]]

    def title(metric: str) -> str:
        name = metric.removeprefix("eval/")
        return f"eval {name} ± SE" if metric + SE_SUFFIX in metrics else f"eval {name}"

    first: dict[str, list] = {"loss (train and eval)": ["Multiline", [f"^{LOSS}$"]]}
    for metric in dict.fromkeys(["eval/loss", monitor]):
        if metric in values:
            first[title(metric)] = chart(metric)
    heading = "loss" if monitor == "eval/loss" else f"loss and {monitor.removeprefix('eval/')}"
    out = {heading: first}
    suites = suite_charts(metrics)
    if suites:
        out[SUITES] = suites
    rest = {title(m): chart(m) for m in values if m not in ("eval/loss", monitor)}
    if rest:
        out["eval metrics ± standard error"] = rest
    modes = sorted({m.split("/")[1] for m in metrics if m.startswith("sample/") and m.count("/") >= 2})
    if modes:
        out["sample quality"] = {f"{mode} continuations": ["Multiline", [f"^sample/{mode}/"]] for mode in modes}
    out["evald"] = {name: ["Multiline", [regex]] for name, regex in BOOKKEEPING.items()}
    return out


def suite_charts(metrics: Iterable[str]) -> dict[str, list]:
    """One chart per benchmark suite: its headline metric of every task (``eval/<suite>/<task>/<metric>``)."""
    names: dict[str, set[str]] = {}
    for metric in metrics:
        parts = metric.split("/")
        if len(parts) == 4 and parts[0] == "eval" and not parts[3].endswith(("_stderr", SE_SUFFIX)):
            names.setdefault(parts[1], set()).add(parts[3])
    charts = {}
    for suite, found in sorted(names.items()):
        headline = next((h for h in HEADLINES if h in found), min(found))
        charts[f"{suite}: {headline}"] = ["Multiline", [f"^{re.escape(suite)}/[^/]+/{re.escape(headline)}$"]]
    return charts


def shown_name(metric: str) -> str:
    """A validation metric's tag in the eval sub-run (evald.sinks.tensorboard_view.shown_tag)."""
    name = metric.removeprefix("eval/")
    return LOSS if name == "loss" else name


def layout_text(cover: Mapping[str, Any]) -> str:
    return json.dumps(layout(cover))


def layout_summary(text: str):
    """The custom_scalars summary of a layout record (tensorboardX builds it; evald's categories
    after the first two are closed, which tensorboardX's helper cannot say)."""
    from tensorboardX.proto import layout_pb2
    from tensorboardX.summary import custom_scalars

    summary = custom_scalars(json.loads(text))
    value = summary.value[0]
    proto = layout_pb2.Layout.FromString(value.tensor.string_val[0])
    for category in proto.category:
        category.closed = category.title in CLOSED
    value.tensor.string_val[0] = proto.SerializeToString()
    return summary
