"""A fleet worker validates nothing, so it builds its suites at once: a pipeline builds them lazily (after the
first validation, issue 26 item 5), which left every worker refusing "suite mc is not configured" when the two
changes met. The real Pipeline, the demo model and its benchmark tasks, in this process."""

from __future__ import annotations

from evald.daemon.fleet import _built
from evald.daemon.fleet_cells import Plan
from evald.pipeline.pipeline import Pipeline
from tests import faults


def test_a_worker_has_its_suites_built_before_its_first_cell(tmp_path, graph_mode):
    resolved = faults.demo_suite_config(tmp_path)
    # this process runs MindSpore already: the device is not chosen again (the worker process chooses its own)
    pipeline = _built(resolved.config, Plan(("mc",), ()), Pipeline(should_abort=lambda: False, device_selected=True))
    assert "mc" in pipeline.suites and pipeline.suites_pending == ()
