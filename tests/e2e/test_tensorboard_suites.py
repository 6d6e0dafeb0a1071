"""Benchmark suites as a TensorBoard user meets them (issue 37, item 6): at TensorBoard's defaults every
value of every task can be read, and each is labelled with its task. Checked through a real ``tensorboard``
process (default flags) and its HTTP API, on what evald's own suite turn commits and its sink writes.

What the API cannot show is how the page draws a chart; TensorBoard 2.21's Custom Scalars page
(tf-custom-scalar-*-chart-card, vz-line-chart2) does this, at its defaults:

* a multi-line chart is smoothed (0.6) and colours its lines by run, so the tasks of one run are lines
  of one colour, told apart only in its folded "Matches" list; a margin chart is drawn unsmoothed, a
  marker at each point;
* "Ignore outliers in chart scaling" (on) fits the y-axis to the 5th-95th percentile (d3.quantile) of
  the values a chart draws: each point's value and, on a margin chart, its lower and upper bound.

So each task's headline metric must be a chart of that task alone, titled with its name, that is a
margin chart whose y-range at those defaults holds every one of its values; and each suite's values
are on the Text page as a table, a row per task, at each step.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

from evald.daemon import suite_turn
from evald.ledger.ledger import EVALUATED, Ledger, Record
from evald.pipeline.pipeline import SuiteEvaluated
from evald.sinks.tensorboard import TensorBoardSink
from evald.ledger.samples import identity_digest
from tests.tensorboard_http import TensorBoard, on_the_page

STEPS = [50, 100, 150, 200, 250, 300, 350, 400]
# the demo's suites (examples/tiny_lm/benchmarks.py): bits per byte on 13 held-out packages, a task each
# (lm-eval gives no stderr for it), and a multiple choice with lm-eval's stderr; acc_norm as the demo saw it
PACKAGES = ("email", "http", "xml", "unittest", "asyncio", "concurrent", "importlib", "urllib", "ctypes", "html",
            "multiprocessing", "xmlrpc", "wsgiref")
ACC_NORM = dict(zip(STEPS, (0.28, 0.285, 0.295, 0.27, 0.295, 0.285, 0.275, 0.265)))


def _bpb(index: int, step: int) -> float:
    return 4.4 + 0.1 * index - step / 500 + 0.03 * ((step // 50 + index) % 3)


def _tasks(suite: str, step: int) -> dict[str, dict[str, float]]:
    if suite == "bpb":
        return {f"bpb_{p}": {"word_perplexity": 2.0 ** (8 * _bpb(i, step)), "byte_perplexity": 2.0 ** _bpb(i, step),
                             "bits_per_byte": _bpb(i, step)} for i, p in enumerate(PACKAGES)}
    return {"stdlib_next_line": {"acc": ACC_NORM[step] - 0.01, "acc_stderr": 0.031, "acc_norm": ACC_NORM[step],
                                 "acc_norm_stderr": 0.0315}}


class StandInPipeline:
    """The suites' part of evald.pipeline.pipeline.EvaluationPipeline: lm-eval's aggregates as given."""

    def __init__(self) -> None:
        self.suites = {name: SimpleNamespace(cell_identity=f"{name}-cell".ljust(64, "0")) for name in ("bpb", "next_line")}

    def evaluate_suite(self, name, ckpt_dir, row):
        identity = {"suite": name, "lm_eval": "0.4.13"}
        tasks = {task: SimpleNamespace(metrics=metrics, documents=1, samples=[
                     {"doc_id": 0, "target": "x", "resps": [[-1.0]], "metrics": {}}])
                 for task, metrics in _tasks(name, row.step).items()}
        scalars = {f"{name}/{task}/{m}": v for task, t in tasks.items() for m, v in t.metrics.items()}
        return SuiteEvaluated(SimpleNamespace(tasks=tasks, identity=identity, identity_sha256=identity_digest(identity),
                                              evaluate_s=1.0, compiled_graphs=1, tokens=100,
                                              scalars=lambda: scalars), 0.0, {})


def _run(tmp_path) -> None:
    """Eight validations, and both suites at each step, committed by evald's suite turn and written by its sink."""
    run = tmp_path / "logs" / "run"
    run.mkdir(parents=True)
    ledger = Ledger(run / "ledger.sqlite")
    pipeline = StandInPipeline()
    for step in STEPS:
        ledger.admit(name=f"step_{step:09d}", step=step, kind="evald", found_via="rescan", run_id="r",
                     commit_time=float(step))
        ledger.start(step)
        ledger.finish(step, EVALUATED, metrics={"eval/loss": 3.0 - step / 1000}, identity="v" * 64,
                      record=Record("eval", step, float(step), {"eval/loss": 3.0 - step / 1000,
                                                                "evald/evaluate_s": 0.1}, {}))
        for name, suite in pipeline.suites.items():
            ledger.queue_cells(name, suite.cell_identity, [step])
        assert suite_turn.evaluate_cells(ledger, pipeline, tmp_path / "ckpt", run, max_attempts=1, step=step)
    sink = TensorBoardSink(run, ledger)
    sink.drain()
    sink.close()
    ledger.close()


def _quantile(values: list[float], p: float) -> float:
    """d3.quantile of sorted ``values``: what TensorBoard's chart uses to ignore outliers."""
    at = (len(values) - 1) * p
    low = math.floor(at)
    return values[low] if low + 1 >= len(values) else values[low] + (values[low + 1] - values[low]) * (at - low)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))  # TensorBoard keeps scalars as float32


def test_each_task_of_each_suite_is_a_labelled_chart_whose_every_point_shows(tmp_path, procs):
    _run(tmp_path)
    tensorboard = TensorBoard(tmp_path / "logs", tmp_path / "tensorboard.log")
    procs.append(tensorboard.proc)
    tags = tensorboard.until(lambda: tensorboard.tags("run/eval"), lambda got: "bpb/bpb_email/bits_per_byte" in got)
    assert {"next_line/stdlib_next_line/acc_norm_stderr", "bpb/bpb_xml/word_perplexity"} <= set(tags)  # kept
    layout = tensorboard.until(lambda: tensorboard.get("/data/plugin/custom_scalars/layout"),
                               lambda got: bool(got.get("category")))

    def series(chart: dict) -> list[tuple[str, list[tuple[int, float]], list[float]]]:
        """What a chart draws: (what, its points, every value its y-range is fitted to), a series each."""
        if "margin" in chart:
            out = []
            for s in chart["margin"]["series"]:
                value, lower, upper = (tensorboard.custom_scalars("run/eval", s[k]) for k in ("value", "lower", "upper"))
                out.append((s["value"], value, [v for points in (value, lower, upper) for _, v in points]))
            return out
        drawn = [t for t in tags if any(re.search(regex, t) for regex in chart["multiline"]["tag"])]
        return [(t, points, [v for _, v in points]) for t in drawn for points in [tensorboard.custom_scalars("run/eval", t)]]

    for category in layout["category"]:  # a suite's tasks in order, as the page shows them
        if category["title"].startswith("benchmark suite "):
            titles = on_the_page([(chart["title"], "margin" in chart) for chart in category["chart"]])
            assert titles == sorted(titles), titles
    charts = [(chart, series(chart)) for category in layout["category"] if not category.get("closed")
              for chart in category["chart"]]
    wrong = []
    for suite, headline in (("bpb", "bits_per_byte"), ("next_line", "acc_norm")):
        for task in _tasks(suite, STEPS[0]):
            want = [(step, _tasks(suite, step)[task][headline]) for step in STEPS]
            drawing = [(chart, drawn) for chart, drawn in charts
                       if any(len(points) == len(want) and all(s == w and _close(v, x)
                                                               for (s, v), (w, x) in zip(points, want))
                              for _, points, _ in drawn)]
            if len(drawing) != 1:
                wrong.append(f"{task}: {len(drawing)} open charts draw its {headline}")
                continue
            [(chart, drawn)] = drawing
            if len(drawn) != 1:
                wrong.append(f"{task}: its chart {chart['title']!r} draws {len(drawn)} series, told apart by no label")
            if task not in chart["title"]:
                wrong.append(f"{task}: its chart is titled {chart['title']!r}")
            if "margin" not in chart:
                wrong.append(f"{task}: its chart {chart['title']!r} is a multi-line chart, smoothed at TensorBoard's "
                             f"defaults")
            fitted = sorted(v for _, _, values in drawn for v in values)
            low, high = _quantile(fitted, 0.05), _quantile(fitted, 0.95)
            hidden = [(s, v) for s, v in want if not low - 1e-6 <= v <= high + 1e-6]
            if hidden:
                wrong.append(f"{task}: {chart['title']!r} fits its y-axis to [{low:.4g}, {high:.4g}] ignoring "
                             f"outliers: {len(hidden)} of {len(want)} points off the chart {hidden}")
            if "margin" in chart and suite == "next_line":  # ± lm-eval's stderr
                [s] = chart["margin"]["series"]
                lower = tensorboard.custom_scalars("run/eval", s["lower"])
                assert [(st, round(v, 5)) for st, v in lower] == [(st, round(v - 0.0315, 5)) for st, v in want]
    assert not wrong, "\n".join(wrong)

    for suite, headline in (("bpb", "bits_per_byte"), ("next_line", "acc_norm")):  # the values, a row per task
        tag = f"{suite}/results/text_summary"  # tensorboardX's text summary: the Text page's tag
        shown = tensorboard.until(lambda: tensorboard.get("/data/plugin/text/text", run="run/eval", tag=tag),
                                  lambda got: len(got) == len(STEPS), timeout=30)
        assert [entry["step"] for entry in shown] == STEPS, f"{tag}: {shown}"
        for entry in shown:
            for task, metrics in _tasks(suite, entry["step"]).items():
                row = re.search(rf"<tr>\s*<td><code>{task}</code></td>(.*?)</tr>", entry["text"], re.S)
                assert row, (task, entry["text"])
                assert f"{metrics[headline]:.4g}" in row.group(1), (task, row.group(1))
    tensorboard.close()
