"""A real ``tensorboard`` process with its default flags (its Rust data server, as a user runs it), and
its HTTP data API: what TensorBoard's pages show, which reading the event files cannot tell
(docs/benchmarks.md, "What TensorBoard shows")."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

from tests.harness import PYTHON, Proc, base_env, wait_for

T = TypeVar("T")


class TensorBoard:
    def __init__(self, logdir: Path, log_path: Path, *flags: str) -> None:
        self.proc = Proc([PYTHON, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                          "--port", "0", *flags], base_env(), log_path)
        found = wait_for(lambda: re.search(r"at (http://127\.0\.0\.1:\d+)/", self.proc.output()), 120,
                         "TensorBoard's address")
        self.base = found.group(1)

    def get(self, path: str, **query: str):
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read())

    def scalars(self, run: str, tag: str) -> list[tuple[int, float]]:
        """``[(step, value)]`` of ``tag`` in ``run`` as the Scalars page draws it."""
        try:
            return [(step, value) for _, step, value in self.get("/data/plugin/scalars/scalars", run=run, tag=tag)]
        except urllib.error.HTTPError:  # not loaded yet
            return []

    def time_series(self, run: str, tag: str) -> list[tuple[int, float]]:
        """The same through the Time Series page's own request (its ``timeSeries`` endpoint)."""
        body = urllib.parse.urlencode({"requests": json.dumps([{"plugin": "scalars", "tag": tag, "run": run}])})
        request = urllib.request.Request(f"{self.base}/data/plugin/timeseries/timeSeries", data=body.encode(),
                                         method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            [answer] = json.loads(response.read())
        return [(p["step"], p["value"]) for p in answer.get("runToSeries", {}).get(run, [])]

    def custom_scalars(self, run: str, tag: str) -> list[tuple[int, float]]:
        """The same through the Custom Scalars page's request (a chart's tag regex, here the tag alone)."""
        answer = self.get("/data/plugin/custom_scalars/scalars", run=run, tag=f"^{re.escape(tag)}$")
        return [(step, value) for _, step, value in answer.get("tag_to_events", {}).get(tag, [])]

    def tags(self, run: str) -> list[str]:
        return sorted(self.get("/data/plugin/scalars/tags").get(run, {}))

    def until(self, read: Callable[[], T], done: Callable[[T], bool], timeout: float = 90) -> T:
        """``read()`` once ``done`` with it (TensorBoard reloads every 5 s), else its last answer."""
        deadline, got = time.monotonic() + timeout, read()
        while not done(got) and time.monotonic() < deadline:
            time.sleep(1)
            got = read()
        return got

    def close(self) -> None:
        self.proc.kill()


def on_the_page(charts: list[tuple[str, bool]]) -> list[str]:
    """The order TensorBoard 2.21's Custom Scalars page shows a category's charts ``(title, is a margin
    chart)`` in, as its screenshots show: the multi-line charts as listed, then the margin charts in
    reverse (evald.sinks.tensorboard_layout.shown_in_order says why)."""
    return [t for t, margin in charts if not margin] + [t for t, margin in reversed(charts) if margin]
