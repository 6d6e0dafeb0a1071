"""The paired SE of a suite monitor (``--monitor SUITE/TASK/METRIC``) from two steps' per-sample
outputs: the step just evaluated from memory (its cell's results, in the form its file holds), the best
step from its file, read with evald.ledger.samples (the format's one reader: validated, bounded); the
caller falls back to the unpaired rule when a file is missing or malformed.

May import: ledger (the per-sample files), decisions (the paired statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evald.decisions import paired
from evald.decisions.monitor_targets import parse_suite_monitor
from evald.ledger.samples import SAMPLES_DIR, SampleFileError, TaskSamples, current, list_samples, read_samples


@dataclass(frozen=True)
class StepSamples:
    """The monitored task's per-sample values of the step just evaluated, as its cell produced them."""

    identity12: str          # the suite identity's first 12 hex digits, as in the file names
    samples: TaskSamples


@dataclass(frozen=True)
class PairedSE:
    """The paired SE of the monitored metric's difference, or None and why the unpaired rule applies."""

    value: float | None
    reason: str


def paired_se_of_monitor(run_dir: Path, monitor: str, step: int, best_step: int | None,
                         this_step: StepSamples | None = None) -> PairedSE:
    """The paired SE of ``monitor``'s difference between ``step`` and ``best_step``, from their current
    per-sample outputs (``step``'s from ``this_step`` when given, else from its file). Its value is None,
    with the reason, when it cannot be had: not a suite metric, no best step yet, a file missing or
    malformed, the two steps' current identities differ, or they scored different documents. Never raises
    for a bad file: the caller then uses the unpaired rule."""
    target = parse_suite_monitor(monitor)
    if target is None:
        return PairedSE(None, f"{monitor} is not a suite metric (SUITE/TASK/METRIC)")
    if best_step is None or best_step == step:
        return PairedSE(None, "no earlier best step to pair with")
    try:
        newest = current(list_samples(run_dir, suite=target.suite, task=target.task))
    except (OSError, SampleFileError) as exc:   # SampleFileError: samples/ or a directory in it is a link
        return PairedSE(None, f"the per-sample outputs under {Path(run_dir) / SAMPLES_DIR} cannot be listed: {exc}")
    here = newest.get((target.suite, target.task, step))
    best = newest.get((target.suite, target.task, best_step))
    here_identity = this_step.identity12 if this_step is not None else here.identity12 if here is not None else None
    if here_identity is None or best is None:
        missing = step if here_identity is None else best_step
        return PairedSE(None, f"step {missing} has no per-sample outputs for {target.suite}/{target.task}")
    if here_identity != best.identity12:
        return PairedSE(None, f"steps {best_step} and {step} were scored under different identities "
                              f"({best.identity12}, {here_identity})")
    try:
        a = read_samples(best)
        b = this_step.samples if this_step is not None else read_samples(here) if here is not None else None
    except SampleFileError as exc:
        return PairedSE(None, str(exc))
    if target.metric not in a.metrics or target.metric not in b.metrics:
        return PairedSE(None, f"the per-sample outputs of {target.suite}/{target.task} have no {target.metric!r}")
    assert b is not None   # here_identity came from here when this_step is None
    if not np.array_equal(a.doc_ids, b.doc_ids):
        return PairedSE(None, f"steps {best_step} and {step} scored different documents")
    try:
        se = paired.paired_se(target.metric, a.metrics[target.metric], b.metrics[target.metric])
    except paired.PairedError as exc:
        return PairedSE(None, str(exc))
    return PairedSE(se, f"paired over {a.doc_ids.size} documents")
