"""Early stopping on a suite metric (``--monitor fast/mc/acc``): the decisions see each cell of that suite,
with the paired SE of the difference from the best step (its per-sample file; the step just evaluated from memory),
and their state is committed with the cell in one ledger transaction.

The real Decisions, ledger, per-sample writer and reader; the suite's results stand in for lm-eval's.
"""

from __future__ import annotations

import dataclasses

from evald.config import EvaldConfig
from evald.config.values import MinDelta
from evald.daemon.suite_turn import SuiteMonitor
from evald.decisions.decisions import Decisions
from evald.ledger.ledger import EVALUATED, Ledger
from evald.ledger.samples import write_samples

DOCS = 200


def _cell(run_dir, step: int, right: int) -> dict[str, float]:
    """Step ``step`` answers the first ``right`` of 200 documents right; its per-sample file on disk."""
    samples = [{"doc_id": i, "target": "a", "resps": [["a"]], "metrics": {"acc": float(i < right)}}
               for i in range(DOCS)]
    acc = right / DOCS
    stderr = (acc * (1 - acc) / (DOCS - 1)) ** 0.5
    write_samples(run_dir, suite="fast", task="mc", step=step, identity={"suite": "fast"}, identity_sha256="ab" * 32,
                  cell_identity="cd" * 32, metrics={"acc": acc, "acc_stderr": stderr}, samples=samples)
    return {"fast/mc/acc": acc, "fast/mc/acc_stderr": stderr}


def _monitor(**options) -> SuiteMonitor:
    config = dataclasses.replace(EvaldConfig(), monitor="fast/mc/acc", mode="max", patience=1, **options)
    decisions = Decisions(config)
    decisions.run_id = "r"
    return SuiteMonitor(decisions, newest_step=lambda: 0, every_n_steps=lambda: 10)


def test_a_suite_monitor_decides_on_its_cells_and_the_state_goes_with_the_cell(tmp_path):
    monitor = _monitor()
    assert monitor.wants("fast") and not monitor.wants("bpb")
    ledger = Ledger(tmp_path / "ledger.sqlite")
    try:
        for step, right in ((10, 150), (20, 100)):
            scalars = _cell(tmp_path, step, right)
            texts, kv = monitor.observe(tmp_path, step, scalars)
            ledger.finish_cell(step, "fast", "cd" * 32, EVALUATED, metrics=scalars, kv=kv)  # cell absent: kv alone
        assert monitor.decisions.best_step == 10
        assert monitor.decisions.stop_at_step is not None and "STOP" in texts["evald/decision"]
        assert ledger.get_state("decisions")["early_stop"]["best_step"] == 10
    finally:
        ledger.close()


def test_min_delta_in_standard_errors_uses_the_paired_one(tmp_path):
    """The same documents answered by both steps: the paired SE of the difference, not the unpaired one."""
    monitor = _monitor(min_delta=MinDelta(2.0, "se"))
    monitor.observe(tmp_path, 10, _cell(tmp_path, 10, 100))
    monitor.observe(tmp_path, 20, _cell(tmp_path, 20, 110))   # +0.05: 10 more right, none fewer
    reason = monitor.outcome.reason
    assert "paired" in reason, reason


def test_the_step_just_evaluated_is_paired_from_memory_and_gives_what_its_file_gives(tmp_path):
    """Issue 25: the monitor no longer reads back the file its own cell wrote in the same turn. From memory
    the paired SE equals the one read from disk; with that file broken after the write, memory still pairs."""
    from types import SimpleNamespace

    from evald.ledger.samples import list_samples

    def result_of(right: int):
        samples = [{"doc_id": i, "target": "a", "resps": [["a"]], "metrics": {"acc": float(i < right)}}
                   for i in range(DOCS)]
        return SimpleNamespace(identity_sha256="ab" * 32, tasks={"mc": SimpleNamespace(samples=samples)})

    by_disk, by_memory = _monitor(min_delta=MinDelta(2.0, "se")), _monitor(min_delta=MinDelta(2.0, "se"))
    for monitor in (by_disk, by_memory):
        monitor.observe(tmp_path, 10, _cell(tmp_path, 10, 100))
    scalars = _cell(tmp_path, 20, 110)
    [written] = [f.samples for f in list_samples(tmp_path, suite="fast", task="mc") if f.step == 20]
    this_step = by_memory.monitored_samples(result_of(110), {"mc": written})
    assert this_step is not None and this_step.samples.file is None
    by_disk.observe(tmp_path, 20, scalars)
    by_memory.observe(tmp_path, 20, scalars, this_step)
    assert "paired" in by_disk.outcome.reason and by_memory.outcome.reason == by_disk.outcome.reason

    written.write_bytes(b"not gzip")   # the file is not read for the step just evaluated
    again = _monitor(min_delta=MinDelta(2.0, "se"))
    again.observe(tmp_path, 10, _cell(tmp_path, 10, 100))
    again.observe(tmp_path, 20, scalars, this_step)
    assert again.outcome.reason == by_memory.outcome.reason
    from_disk = _monitor(min_delta=MinDelta(2.0, "se"))
    from_disk.observe(tmp_path, 10, _cell(tmp_path, 10, 100))
    from_disk.observe(tmp_path, 20, scalars)
    assert "paired" not in from_disk.outcome.reason   # read back, the broken file gives the unpaired rule
