"""Resolve ``module:function`` factory specs (the model and the validation data).

Importing a module runs its code, so who may name a factory is decided before it gets
here (evald.intake.trust), the operator may restrict the modules further (``--factory-allow``,
``check_allowed``), and the log names every factory before it is imported. What a factory's import
loads (MindFormers) is kept from flooding evald's log (``framework_logs``).
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any, Sequence

from evald.contracts.wire import FactorySpec
from evald.pipeline.framework_logs import quiet_framework_stdout

log = logging.getLogger("evald.pipeline.factories")


class FactoryError(RuntimeError):
    pass


def check_allowed(spec: FactorySpec, what: str, allow: Sequence[str]) -> None:
    """FactoryError unless ``allow`` is empty or the factory's module is under one of its prefixes.

    ``mypkg.`` and ``mypkg`` both allow the package ``mypkg`` and every module inside it.
    """
    module = spec.target.partition(":")[0]
    if allow and not any(module == p.rstrip(".") or module.startswith(p.rstrip(".") + ".") for p in allow):
        raise FactoryError(f"{what} factory {spec.target!r}: module {module!r} is not under --factory-allow "
                           f"{','.join(allow)}; not imported")


def call_factory(spec: FactorySpec, what: str) -> Any:
    log.info("importing the %s factory %s (kwargs %s%s)", what, spec.target, dict(spec.kwargs),
             f", search path {spec.search_path}" if spec.search_path else "")
    if spec.search_path and spec.search_path not in sys.path:
        sys.path.insert(0, spec.search_path)
    module_name, _, attr = spec.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FactoryError(
            f"{what} factory {spec.target!r}: cannot import {module_name!r} ({exc}); "
            f"set --app-dir to the directory it lives in (sys.path[0]={sys.path[0]!r})") from exc
    quiet_framework_stdout()  # before the call: building a MindFormers model logs a dozen INFO lines
    try:
        function = getattr(module, attr)
    except AttributeError as exc:
        raise FactoryError(f"{what} factory {spec.target!r}: module {module_name!r} has no {attr!r}") from exc
    try:
        return function(**dict(spec.kwargs))
    except Exception as exc:
        raise FactoryError(f"{what} factory {spec.target!r} failed with kwargs {dict(spec.kwargs)}: {exc!r}") from exc
