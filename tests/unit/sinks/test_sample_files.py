"""The paired SE a suite monitor uses, from both steps' per-sample outputs (their reader:
tests/unit/ledger/test_samples.py)."""

from __future__ import annotations

import numpy as np
import pytest

from evald.decisions.paired import paired_se
from evald.ledger.samples import list_samples
from evald.sinks.sample_files import paired_se_of_monitor
from tests.sample_outputs import IDENTITY, write_task_samples

NEWER = {**IDENTITY, "tokenizer": "cd" * 16}


def test_the_paired_se_of_a_suite_monitor_comes_from_both_steps_documents(tmp_path):
    rng = np.random.default_rng(0)
    a = (rng.random(80) < 0.5).astype(int)
    b = np.where(rng.random(80) < 0.8, a, 1 - a)
    write_task_samples(tmp_path, "fast", "hellaswag", 10, IDENTITY, {"acc_norm": a.tolist()})
    write_task_samples(tmp_path, "fast", "hellaswag", 20, IDENTITY, {"acc_norm": b.tolist()})
    found = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 20, 10)
    assert found.value == pytest.approx(paired_se("acc_norm", a, b)) and found.value > 0
    assert "paired over 80 documents" in found.reason
    assert paired_se_of_monitor(tmp_path, "eval/loss", 20, 10).value is None
    assert paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 20, None).value is None
    missing = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 30, 10)
    assert missing.value is None and "step 30 has no per-sample outputs" in missing.reason
    write_task_samples(tmp_path, "fast", "hellaswag", 30, NEWER, {"acc_norm": b.tolist()})
    other = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 30, 10)
    assert other.value is None and "different identities" in other.reason
    broken = list_samples(tmp_path, step=20)[0].samples
    broken.write_bytes(b"garbage")
    bad = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 20, 10)
    assert bad.value is None and str(broken) in bad.reason
