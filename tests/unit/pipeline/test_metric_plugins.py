"""load_metric / run_metric with a real Metric subclass from tests/plugin_metric_example.py."""

from pathlib import Path

import numpy as np
import pytest
from mindspore.train import Metric

from evald.pipeline.metrics.plugins import load_metric, plugin_name, run_metric

MODULE = "plugin_metric_example"


@pytest.fixture(autouse=True)
def _plugin_module_importable(monkeypatch):
    """Make tests/plugin_metric_example.py importable by name, as a user's package would be."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))


def _batches():
    return [
        (np.array([[1.0, -2.0], [3.0, -4.0]]), np.array([0, 1])),
        (np.array([[-5.0, 6.0]]), np.array([1])),
    ]


def test_string_spec_loads_and_runs():
    metric = load_metric(f"{MODULE}:MeanAbsoluteLogit")
    assert isinstance(metric, Metric)
    assert run_metric(metric, _batches()) == pytest.approx(21 / 6)


def test_dict_spec_passes_kwargs_and_name():
    spec = {"target": f"{MODULE}:MeanAbsoluteLogit", "kwargs": {"scale": 2.0}, "name": "mal"}
    metric = load_metric(spec)
    assert metric.scale == 2.0
    assert run_metric(metric, _batches()) == pytest.approx(2 * 21 / 6)
    assert plugin_name(spec) == "mal"
    assert plugin_name(f"{MODULE}:MeanAbsoluteLogit") == "MeanAbsoluteLogit"


def test_run_metric_clears_between_runs():
    metric = load_metric(f"{MODULE}:MeanAbsoluteLogit")
    run_metric(metric, [(np.full((2, 2), 100.0),)])
    assert run_metric(metric, _batches()) == pytest.approx(21 / 6)


def test_builtin_mindspore_metric_by_spec():
    metric = load_metric("mindspore.train:Accuracy")
    # argmax per row: 0, 0, 1 against labels 0, 1, 1
    assert run_metric(metric, _batches()) == pytest.approx(2 / 3)


@pytest.mark.parametrize("target", [f"{MODULE}:NotAMetric", f"{MODULE}:mean_abs", "numpy:ndarray"])
def test_non_metric_target_raises_type_error(target):
    with pytest.raises(TypeError, match="subclass of mindspore.train.Metric") as info:
        load_metric(target)
    assert target in str(info.value)


def test_missing_module_names_the_spec():
    spec = "no_such_pkg_evald_test.metrics:Thing"
    with pytest.raises(ImportError, match="no_such_pkg_evald_test") as info:
        load_metric({"target": spec})
    assert spec in str(info.value)


def test_missing_class_names_the_spec_and_lists_candidates():
    spec = f"{MODULE}:MeanAbsLogit"
    with pytest.raises(AttributeError) as info:
        load_metric(spec)
    assert spec in str(info.value)
    assert "MeanAbsoluteLogit" in str(info.value)


def test_bad_kwargs_name_the_spec():
    with pytest.raises(TypeError, match="could not be constructed") as info:
        load_metric({"target": f"{MODULE}:MeanAbsoluteLogit", "kwargs": {"sacle": 2.0}})
    assert f"{MODULE}:MeanAbsoluteLogit" in str(info.value)


@pytest.mark.parametrize(
    "spec, exc",
    [
        ("no_colon_here", ValueError),
        ("a:b:c", ValueError),
        (":Cls", ValueError),
        ({"kwargs": {}}, ValueError),
        ({"target": f"{MODULE}:MeanAbsoluteLogit", "kwarg": {}}, ValueError),
        ({"target": f"{MODULE}:MeanAbsoluteLogit", "kwargs": [1]}, TypeError),
        (42, TypeError),
    ],
)
def test_malformed_specs(spec, exc):
    with pytest.raises(exc):
        load_metric(spec)


def test_vector_valued_metric_is_refused():
    metric = load_metric(f"{MODULE}:PerColumnMean")
    with pytest.raises(TypeError, match="one scalar per metric"):
        run_metric(metric, _batches())


def test_no_batches_is_an_error():
    with pytest.raises(ValueError, match="no batches"):
        run_metric(load_metric(f"{MODULE}:MeanAbsoluteLogit"), [])
