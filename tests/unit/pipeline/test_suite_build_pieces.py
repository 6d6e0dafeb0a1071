"""A suite is built in pieces (issue 26 item 5): its tasks, then one graph per call of build_next_suite, so a
checkpoint that arrives while a suite builds waits for one piece (a graph: seconds at LLM shapes), not for
the whole build (36 s for the demo's bpb suite on an idle machine, minutes on a loaded one). The real
Pipeline, the demo model and its benchmark tasks, in this process."""

from __future__ import annotations

from evald.pipeline.pipeline import Pipeline
from tests import faults


def test_each_call_compiles_at_most_one_graph_and_the_suite_is_ready_after_its_last(tmp_path, graph_mode):
    resolved = faults.demo_suite_config(tmp_path)
    pipeline = Pipeline(should_abort=lambda: False, device_selected=True)
    assert pipeline.ensure_built(resolved.config) and pipeline.suites_pending == ("mc",)

    assert pipeline.build_next_suite()                       # the tasks (and the vocabulary check's graph)
    runner = pipeline._building
    assert runner is not None and runner.name == "mc" and "mc" not in pipeline.suites
    compiled = [runner.scorer.compiled_graphs]
    while "mc" not in pipeline.suites:
        assert pipeline.build_next_suite() and pipeline.suites_pending in (("mc",), ())
        compiled.append(runner.scorer.compiled_graphs)
    steps = [b - a for a, b in zip(compiled, compiled[1:])]
    assert set(steps) <= {0, 1} and steps.count(1) >= 3, compiled   # one graph a call, several calls
    assert pipeline.suites_pending == () and not pipeline.build_next_suite()
    result = pipeline.suites["mc"].run()
    assert result.compiled_graphs == compiled[-1]              # scoring compiled nothing more
