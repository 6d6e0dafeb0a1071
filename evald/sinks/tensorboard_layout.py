"""What a TensorBoard reader sees first: the Custom Scalars layout, and how the ledger's tags are shown.

TensorBoard's Time Series and Scalars pages sort tag groups by name, so they open on whatever
metric sorts first (``accuracy``), not on loss. TensorBoard's own ``custom_scalars`` plugin
shows a layout the writer chooses, in the order it chooses; evald writes one per run:

1. "loss and <monitor>": train and eval loss on one chart (``^Loss$`` matches the tag in both
   sub-runs), eval loss ± one standard error, and the monitored metric ± its SE (a suite's too);
2. "benchmark suite <suite>", one category per suite (below);
3. "eval metrics ± standard error": every other eval metric as a margin chart (value, value - SE,
   value + SE) in place of a chart of its own for the SE;
4. "sample quality" and 5. "evald" (timings, lag, queue, counts: bookkeeping), both closed.

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

Benchmark suites' metrics (``eval/<suite>/<task>/<metric>``; written as ``<suite>/<task>/<metric>``)
get a category per suite, "benchmark suite <suite>", with one chart per task, titled with the task's
name: its headline metric (``HEADLINES``, else its first) as a margin chart. TensorBoard smooths
multi-line charts (0.6 by default) and draws no legend on them, and with "ignore outliers" (on by
default) it fits the y-axis to the 5th-95th percentile of what a chart draws: with 8 points the
highest and the lowest fall off a one-line chart, and a chart of all tasks is lines of one colour.
A margin chart is drawn unsmoothed, with a marker at each point, and its y-axis counts the bounds
too: lm-eval's ``<metric>_stderr`` becomes the bounds ``σ/<suite>/<task>/<metric>/lower|upper`` beside
the copy ``σ/<suite>/<task>/<metric>`` (the ``_stderr`` tag is kept as it was); a metric without one
(bits per byte, perplexities) is its own value and both bounds, so each point counts three times and
up to 13 points none is cut off. Each suite's evaluation also writes a Markdown table of every
task's metrics (± stderr), ``<suite>/results``, on the Text page: the exact values at each step.

The layout is a record of the ledger's outbox like any other (stream ``layout``, in the ``eval/``
sub-run), so it is written exactly once and survives crashes. It is added only when it changes:
at the first evaluation, and again only when a later evaluation brings a metric the layout did
not have, the monitor changed or evald's layout did (``LAYOUT_VERSION``: a run resumed by a newer
evald gets its layout at the next evaluation), at that evaluation's step (one point per step).

Imports tensorboardX (its layout proto and custom_scalars summary) and nothing of evald.
"""

from __future__ import annotations

import json
import re
from typing import AbstractSet, Any, Iterable, Mapping

LAYOUT_STREAM = "layout"
LAYOUT_TAG = "custom_scalars__config__"  # the custom_scalars plugin's own tag (its metadata.CONFIG_SUMMARY_TAG)
LAYOUT_STATE = "tensorboard_layout"      # ledger kv: the metric names and monitor the written layout covers
SE_SUFFIX = "_se"                        # evald.pipeline.metrics.uncertainty.SE_SUFFIX: eval/loss -> eval/loss_se
STDERR_SUFFIX = "_stderr"                # lm-eval's: acc -> acc_stderr, acc@filter -> acc_stderr@filter
LAYOUT_VERSION = 2                       # raised when layout() changes for the same metrics (2: a chart per suite task)
SUITE_MARK = "evald/suites/{}/identity"  # the text a suite's evaluated cell carries (daemon/suite_turn.py, fleet_merge.py)
SAMPLE_TEXTS = ("sample/", "Samples/")   # ledger prefix -> shown prefix of the sample texts
CLOSED = ("sample quality", "evald")
LOSS = "Loss"    # train/loss and eval/loss as shown: the capital sorts before every lowercase tag group, so
                 # TensorBoard's Time Series page (groups sorted by code point, the first two open) opens on it
SE_GROUP = "σ"  # sorts after every ASCII tag group in TensorBoard (see above)
SUITE_CATEGORY = "benchmark suite {}"  # a category per suite
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


def stderr_of(metric: str) -> str:
    """lm-eval's name of ``metric``'s standard error: ``acc_stderr``, ``acc_stderr@filter``."""
    name, at, filt = metric.partition("@")
    return f"{name}{STDERR_SUFFIX}{at}{filt}"


def is_stderr(metric: str) -> bool:
    return metric.partition("@")[0].endswith(STDERR_SUFFIX)


def shown_eval_scalars(scalars: Mapping[str, float], shown) -> dict[str, float]:
    """An eval record's scalars as written: ``shown(tag)`` names each; a metric's SE becomes its bounds,
    and a suite metric's lm-eval stderr adds its bounds (``SUITE/TASK/METRIC``, the stderr tag kept)."""
    out: dict[str, float] = {}
    for tag, value in scalars.items():
        base = tag[: -len(SE_SUFFIX)] if tag.endswith(SE_SUFFIX) else None
        if base is not None and base in scalars:
            lower, upper = bounds(shown(base))
            out[lower], out[upper] = scalars[base] - value, scalars[base] + value
            out[margin_value(shown(base))] = scalars[base]
            continue
        out[shown(tag)] = value
        if tag.count("/") == 2 and not is_stderr(tag) and stderr_of(tag) in scalars:
            lower, upper = bounds(tag)
            out[lower], out[upper] = value - scalars[stderr_of(tag)], value + scalars[stderr_of(tag)]
            out[margin_value(tag)] = value
    return out


def shown_text_tag(tag: str) -> str:
    ledger, shown = SAMPLE_TEXTS
    return shown + tag[len(ledger):] if tag.startswith(ledger) else tag


def covered(state: Mapping[str, Any] | None, metrics: Iterable[str], monitor: str) -> dict[str, Any]:
    """What the layout should cover now: every metric seen so far (the state's and ``metrics``) and the monitor."""
    seen = set((state or {}).get("metrics", ())) | {m for m in metrics if m.startswith(("eval/", "sample/"))}
    return {"metrics": sorted(seen), "monitor": monitor, "version": LAYOUT_VERSION}


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
    if f"eval/{monitor}" in metrics and monitor.count("/") == 2:  # a suite's SUITE/TASK/METRIC
        first[suite_title(monitor, metrics)] = suite_chart(monitor, metrics)
    heading = "loss" if monitor == "eval/loss" else f"loss and {monitor.removeprefix('eval/')}"
    out = {heading: first}
    out.update(suite_categories(metrics))
    rest = {title(m): chart(m) for m in values if m not in ("eval/loss", monitor)}
    if rest:
        out["eval metrics ± standard error"] = rest
    modes = sorted({m.split("/")[1] for m in metrics if m.startswith("sample/") and m.count("/") >= 2})
    if modes:
        out["sample quality"] = {f"{mode} continuations": ["Multiline", [f"^sample/{mode}/"]] for mode in modes}
    out["evald"] = {name: ["Multiline", [regex]] for name, regex in BOOKKEEPING.items()}
    return out


def suite_categories(metrics: Iterable[str]) -> dict[str, dict[str, list]]:
    """A category per benchmark suite (``eval/<suite>/<task>/<metric>``), a chart per task: its headline metric."""
    metrics = set(metrics)
    found: dict[str, dict[str, set[str]]] = {}
    for metric in metrics:
        parts = metric.split("/")
        if len(parts) == 4 and parts[0] == "eval" and not is_stderr(parts[3]) and not parts[3].endswith(SE_SUFFIX):
            found.setdefault(parts[1], {}).setdefault(parts[2], set()).add(parts[3])
    out: dict[str, dict[str, list]] = {}
    for suite, tasks in sorted(found.items()):
        charts = {}
        for task, names in sorted(tasks.items()):
            tag = f"{suite}/{task}/{next((h for h in HEADLINES if h in names), min(names))}"
            charts[suite_title(tag, metrics, task_only=True)] = suite_chart(tag, metrics)
        out[SUITE_CATEGORY.format(suite)] = charts
    return out


def suite_chart(tag: str, metrics: AbstractSet[str]) -> list:
    """A margin chart of a suite's ``SUITE/TASK/METRIC``: ± lm-eval's stderr, else the value as its own bounds
    (drawn unsmoothed, each point kept in the y-axis's range: the module's docstring)."""
    if f"eval/{stderr_of(tag)}" in metrics:
        return ["Margin", [margin_value(tag), *bounds(tag)]]
    return ["Margin", [tag, tag, tag]]


def suite_title(tag: str, metrics: AbstractSet[str], task_only: bool = False) -> str:
    suite, task, metric = tag.split("/")
    name = f"{task}: {metric}" if task_only else f"{suite}/{task}: {metric}"
    return f"{name} ± stderr" if f"eval/{stderr_of(tag)}" in metrics else name


def suite_results(scalars: Mapping[str, float], texts: Mapping[str, str]) -> dict[str, str]:
    """``{"<suite>/results": table}`` for each suite evaluated in an eval record (it carries ``SUITE_MARK``):
    a Markdown table, a row per task and a column per metric (headlines first), each value ± its stderr."""
    tasks: dict[str, dict[str, dict[str, float]]] = {}
    for tag, value in scalars.items():
        parts = tag.split("/")
        if len(parts) == 3 and SUITE_MARK.format(parts[0]) in texts and not is_stderr(parts[2]):
            tasks.setdefault(parts[0], {}).setdefault(parts[1], {})[parts[2]] = value
    out = {}
    for suite, found in tasks.items():
        names = {m for metrics in found.values() for m in metrics}
        columns = [h for h in HEADLINES if h in names] + sorted(names - set(HEADLINES))
        rows = [f"| task | {' | '.join(_cell(c) for c in columns)} |", "|---" * (len(columns) + 1) + "|"]
        for task, metrics in sorted(found.items()):
            cells = []
            for column in columns:
                value, stderr = metrics.get(column), scalars.get(f"{suite}/{task}/{stderr_of(column)}")
                cells.append("" if value is None else f"{value:.4g}" + ("" if stderr is None else f" ± {stderr:.2g}"))
            rows.append(f"| {_cell(task)} | {' | '.join(cells)} |")
        caption = f"**{_cell(suite)}**: {len(found)} task{'s' if len(found) != 1 else ''}"
        if any(" ± " in row for row in rows[2:]):
            caption += " (value ± lm-eval's standard error)"
        out[f"{suite}/results"] = caption + "\n\n" + "\n".join(rows)
    return out


def _cell(name: str) -> str:
    """A name as Markdown code in a table cell (a ``|`` would end the cell, a backtick the code)."""
    return "`" + name.replace("`", "'").replace("|", "\\|") + "`"


def shown_name(metric: str) -> str:
    """A validation metric's tag in the eval sub-run (evald.sinks.tensorboard_view.shown_tag)."""
    name = metric.removeprefix("eval/")
    return LOSS if name == "loss" else name


def layout_text(cover: Mapping[str, Any]) -> str:
    return json.dumps(layout(cover))


def layout_summary(text: str):
    """The custom_scalars summary of a layout record (tensorboardX builds it; evald's categories
    after the first two are closed, and each lists its charts so that TensorBoard shows them in the
    layout's order: ``shown_in_order``; neither can tensorboardX's helper say)."""
    from tensorboardX.proto import layout_pb2
    from tensorboardX.summary import custom_scalars

    summary = custom_scalars(json.loads(text))
    value = summary.value[0]
    proto = layout_pb2.Layout.FromString(value.tensor.string_val[0])
    for category in proto.category:
        category.closed = category.title in CLOSED
        charts = [layout_pb2.Chart.FromString(c.SerializeToString()) for c in shown_in_order(list(category.chart))]
        del category.chart[:]
        category.chart.extend(charts)
    value.tensor.string_val[0] = proto.SerializeToString()
    return summary


def shown_in_order(charts: list) -> list:
    """A category's charts (layout protos, multi-line charts before margin charts) listed so that
    TensorBoard's Custom Scalars page shows them in this order: it shows a category's multi-line charts
    in the order listed, then its margin charts in reverse (TensorBoard 2.21's tf-category-paginated-view
    inserts each chart's two templates, one per kind, at the chart's index among the templates already
    inserted). So the margin charts are listed reversed: a suite's tasks, and "eval loss ± SE" before
    the monitor's chart, read in the layout's order."""
    return ([c for c in charts if not c.HasField("margin")]
            + [c for c in reversed(charts) if c.HasField("margin")])
