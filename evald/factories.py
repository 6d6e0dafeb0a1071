"""Resolve ``module:function`` factory specs (the model and the validation data)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from evald.contracts.wire import FactorySpec


class FactoryError(RuntimeError):
    pass


def call_factory(spec: FactorySpec, what: str) -> Any:
    if spec.search_path and spec.search_path not in sys.path:
        sys.path.insert(0, spec.search_path)
    module_name, _, attr = spec.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FactoryError(
            f"{what} factory {spec.target!r}: cannot import {module_name!r} ({exc}); "
            f"set --app-dir to the directory it lives in (sys.path[0]={sys.path[0]!r})") from exc
    try:
        function = getattr(module, attr)
    except AttributeError as exc:
        raise FactoryError(f"{what} factory {spec.target!r}: module {module_name!r} has no {attr!r}") from exc
    try:
        return function(**dict(spec.kwargs))
    except Exception as exc:
        raise FactoryError(f"{what} factory {spec.target!r} failed with kwargs {dict(spec.kwargs)}: {exc!r}") from exc
