"""Issue 29 item 5: an eval layout whose weights cannot fit the device memory MindSpore reports is
refused before compiling, with the arithmetic (evald.pipeline.memory_fit)."""

from __future__ import annotations

import pytest

from evald.pipeline import memory_fit


def test_the_arithmetic_of_a_70b_model_on_64_gb_devices():
    weights = 70_000_000_000 * 2                       # bf16
    problem = memory_fit.fit_problem(weights, 64 * 10**9, device="Ascend:0")
    assert problem.startswith("the evaluation network holds 140.0 GB of weights, more than 90% of Ascend:0's "
                              "64.0 GB (57.6 GB), before activations: it cannot fit.")
    assert "a tensor-parallel degree of at least 3" in problem
    assert memory_fit.fit_problem(weights // 4, 64 * 10**9) is None            # TP 4: 35 GB a rank
    share = memory_fit.fit_problem(weights // 2, 64 * 10**9, degree=2)
    assert "each of the 2 tensor-parallel ranks holds 70.0 GB" in share and "at least 3" in share
    assert memory_fit.fit_problem(weights, 141 * 10**9) is not None              # 140 > 126.9
    assert memory_fit.fit_problem(weights // 2, 141 * 10**9) is None


def test_nothing_is_refused_where_mindspore_reports_no_memory():
    assert memory_fit.fit_problem(10**15, None) is None
    pytest.importorskip("mindspore")
    assert memory_fit.device_memory("CPU", 0) is None   # MindSpore 2.10 on CPU reports nothing


def test_the_evaluator_refuses_before_compiling(monkeypatch):
    pytest.importorskip("mindspore")
    from evald.contracts.wire import FactorySpec
    from evald.pipeline.network import Evaluator

    monkeypatch.setattr(memory_fit, "device_memory", lambda target, device_id: 1_000_000)  # a 1 MB device
    with pytest.raises(ValueError, match=r"holds 0.0 GB of weights, more than 90% of CPU:0's 0.0 GB"):
        Evaluator(task="lm", model=FactorySpec("examples.tiny_lm.model:build_model", {"seq_len": 64}),
                  data=FactorySpec("examples.tiny_lm.data:validation_windows", {"seq_len": 64}),
                  subset_size=8, subset_seed=0, batch_size=4)
