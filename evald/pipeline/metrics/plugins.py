"""User-supplied metrics: load a mindspore.train.Metric subclass by name and run it.

evald evaluates in its own process from a TOML config, so users cannot hand it
Python objects; they name a class instead (``"mypkg.metrics:MyMetric"``) and
evald imports it. Requiring a mindspore.train.Metric subclass means any metric
already written for ``Model.eval`` works here unchanged.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
from mindspore.train import Metric

__all__ = ["Plugin", "load_metric", "load_plugins", "plugin_name", "run_metric"]

PluginSpec = Union[str, Mapping[str, Any]]

_SPEC_KEYS = {"target", "kwargs", "name"}


def _parse_spec(spec: PluginSpec) -> tuple[str, dict[str, Any], str | None]:
    """Split a spec into (target, kwargs, name), rejecting malformed specs with a fixable message."""
    if isinstance(spec, str):
        target, kwargs, name = spec, {}, None
    elif isinstance(spec, Mapping):
        unknown = set(spec) - _SPEC_KEYS
        if unknown:
            raise ValueError(
                f"metric plugin spec {dict(spec)!r} has unknown keys {sorted(unknown)}; "
                f"allowed keys are {sorted(_SPEC_KEYS)}"
            )
        if "target" not in spec:
            raise ValueError(
                f"metric plugin spec {dict(spec)!r} has no 'target'; "
                "add target = \"module.path:ClassName\""
            )
        target = spec["target"]
        kwargs = spec.get("kwargs") or {}
        name = spec.get("name")
        if not isinstance(kwargs, Mapping):
            raise TypeError(
                f"metric plugin spec {target!r}: 'kwargs' must be a table/dict of constructor "
                f"arguments, got {type(kwargs).__name__}"
            )
        if name is not None and not isinstance(name, str):
            raise TypeError(f"metric plugin spec {target!r}: 'name' must be a string, got {type(name).__name__}")
        kwargs = dict(kwargs)
    else:
        raise TypeError(
            f"metric plugin spec must be a 'module:ClassName' string or a dict with 'target', "
            f"got {type(spec).__name__}: {spec!r}"
        )
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise ValueError(
            f"metric plugin target {target!r} is not of the form 'module.path:ClassName' "
            "(exactly one colon, module on the left, class on the right)"
        )
    return target, kwargs, name


def plugin_name(spec: PluginSpec) -> str:
    """The name a plugin's value is reported under: the spec's ``name``, else the class name."""
    target, _, name = _parse_spec(spec)
    return name if name else target.split(":")[1].split(".")[-1]


def _resolve(target: str) -> Any:
    module_name, attr_path = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"metric plugin {target!r}: cannot import module {module_name!r} ({exc}); "
            "check the spelling and that the package is installed in evald's Python environment "
            "(or on PYTHONPATH)"
        ) from exc
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            candidates = sorted(
                n for n, v in vars(module).items()
                if inspect.isclass(v) and issubclass(v, Metric) and v is not Metric
            )
            hint = f"Metric subclasses defined there: {candidates}" if candidates else "it defines no Metric subclass"
            raise AttributeError(
                f"metric plugin {target!r}: module {module_name!r} has no attribute {attr_path!r}; {hint}"
            ) from exc
    return obj


def load_metric(spec: PluginSpec) -> Metric:
    """Import and instantiate the metric named by ``spec``.

    ``spec`` is ``"module:ClassName"`` or ``{"target": "module:ClassName",
    "kwargs": {...}, "name": "my_metric"}`` (``kwargs`` go to the constructor;
    ``name`` is only used for reporting, see :func:`plugin_name`).

    Raises ImportError / AttributeError naming the spec when the module or class
    cannot be found, and TypeError when the target is not a mindspore.train.Metric
    subclass or rejects the kwargs.
    """
    target, kwargs, _ = _parse_spec(spec)
    cls = _resolve(target)
    if not (inspect.isclass(cls) and issubclass(cls, Metric)):
        what = f"class {cls.__module__}.{cls.__qualname__}" if inspect.isclass(cls) else f"{type(cls).__name__} {cls!r}"
        raise TypeError(
            f"metric plugin {target!r} resolved to {what}, but a subclass of mindspore.train.Metric "
            "is expected (define clear(), update(*inputs) and eval() on a Metric subclass)"
        )
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise TypeError(
            f"metric plugin {target!r} could not be constructed with kwargs {kwargs!r}: {exc}; "
            "fix the [metrics.plugins] kwargs to match the class's __init__"
        ) from exc


@dataclass(frozen=True)
class Plugin:
    """A loaded plug-in: its name (``plugin_name``, the last part of its TensorBoard tag) and its metric."""
    name: str
    metric: Metric


def load_plugins(specs: Sequence[PluginSpec]) -> list[Plugin]:
    """Every plug-in of ``specs`` loaded (``load_metric``), in order."""
    return [Plugin(plugin_name(spec), load_metric(spec)) for spec in specs]


def run_metric(metric: Metric, batches: Iterable[tuple[np.ndarray, ...]]) -> float:
    """Evaluate ``metric`` over ``batches`` from a clean state and return its value as a float.

    Calls ``clear()``, then ``update(*batch)`` per batch, then ``eval()``; the
    clear() first means a metric object can be reused across checkpoints.
    """
    metric.clear()
    seen = 0
    for batch in batches:
        if not isinstance(batch, tuple):
            batch = (batch,)
        metric.update(*batch)
        seen += 1
    if seen == 0:
        raise ValueError(
            f"run_metric got no batches for {type(metric).__name__}; the evaluation data set is empty"
        )
    value = metric.eval()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.size != 1:
        shape = "a non-numeric value" if arr is None else f"an array of shape {arr.shape}"
        raise TypeError(
            f"{type(metric).__name__}.eval() returned {shape} ({type(value).__name__}), "
            "but evald logs one scalar per metric; make eval() return a single number (e.g. the mean)"
        )
    return float(arr.reshape(()))
