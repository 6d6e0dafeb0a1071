"""A fleet worker validates nothing, so it builds its suites at once: a pipeline builds them lazily (after the
first validation, issue 26 item 5), which left every worker refusing "suite mc is not configured" when the two
changes met. The real Pipeline, the demo model and its benchmark tasks, in this process."""

from __future__ import annotations

import json

from evald.cli.main import parse_config
from evald.daemon.fleet import _built
from evald.daemon.fleet_cells import Plan
from evald.pipeline.pipeline import Pipeline
from examples.tiny_lm.benchmarks import write_benchmarks
from tests import faults


def test_a_worker_has_its_suites_built_before_its_first_cell(tmp_path, graph_mode):
    include = write_benchmarks(tmp_path / "bench", next_line_count=24, bpb_docs_per_set=1)
    config = tmp_path / "evald.toml"
    config.write_text('tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"\nsubset_size = 16\n'
                      'batch_size = 16\n[generation]\nprompts = 0\n'
                      f'[suites.mc]\ninclude_path = [{json.dumps(include)}]\ntasks = ["stdlib_next_line"]\n'
                      'limit = 8\nbatch_size = 4\n')
    resolved = parse_config(["--config", str(config), "--model-factory", faults.MODEL_FACTORY.target,
                             "--model-kwargs", json.dumps(dict(faults.MODEL_FACTORY.kwargs)),
                             "--data-factory", faults.DATA_FACTORY.target,
                             "--data-kwargs", json.dumps(dict(faults.DATA_FACTORY.kwargs))], environ={})
    # this process runs MindSpore already: the device is not chosen again (the worker process chooses its own)
    pipeline = _built(resolved.config, Plan(("mc",), ()), Pipeline(should_abort=lambda: False, device_selected=True))
    assert "mc" in pipeline.suites and pipeline.suites_pending == ()
