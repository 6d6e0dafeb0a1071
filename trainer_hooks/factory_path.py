"""Where evald should import the trainer's factories from: the announced ``search_path``.

evald runs from another directory, often as another process started elsewhere, so
the trainer announces, with each factory, the directory to put first on evald's
``sys.path``. The default is the directory the TRAINER imports the factory's module
from: the ``sys.path`` root above ``mypkg/model.py`` for ``mypkg.model:build``
(found with ``importlib.util.find_spec``, which imports the parent packages, as the
trainer does anyway). Not the trainer's working directory, which is rarely where
the factories live (MindFormers jobs start from a launcher's directory).

* A module installed in site-packages (or the standard library) gets no search path:
  evald imports it from its own environment rather than putting the trainer's
  site-packages first on its ``sys.path``.
* A module the trainer cannot import gets the working directory, as before.
* Give ``{"target": ..., "search_path": ...}`` (or ``--app-dir`` to evald) to choose.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Mapping

from evald.contracts.wire import FactorySpec


def default_search_path(target: str) -> str | None:
    """The ``sys.path`` root the trainer imports ``target``'s module from (see the module doc)."""
    module = target.partition(":")[0]
    try:
        origin = _origin(module)
    except (ImportError, ValueError, AttributeError):  # find_spec imports the parents: anything may fail
        origin = None
    if origin is None:
        return os.getcwd()
    root = origin.parent
    for _ in range(module.count(".") + (origin.name == "__init__.py")):
        root = root.parent
    if _installed(root):
        return None
    return str(root)


def _origin(module: str) -> Path | None:
    loaded = sys.modules.get(module)
    location = getattr(loaded, "__file__", None) if loaded is not None else None
    if location is None:
        spec = importlib.util.find_spec(module)
        location = spec.origin if spec is not None and spec.has_location else None
    return Path(location).resolve() if location else None


def _installed(root: Path) -> bool:
    shared = {Path(p).resolve() for key in ("purelib", "platlib", "stdlib", "platstdlib")
              if (p := sysconfig.get_paths().get(key))}
    return root in shared or root.name in ("site-packages", "dist-packages")


FactoryLike = str | Mapping[str, Any] | FactorySpec | None


def announced_factory(spec: FactoryLike, what: str) -> FactorySpec | None:
    """``spec`` as the run announcement carries it; with no ``search_path``, where the trainer imports it from."""
    if spec is None or isinstance(spec, FactorySpec):
        return spec
    made = FactorySpec.from_obj(spec, what)
    if made is not None and made.search_path is None:
        made = FactorySpec(made.target, made.kwargs, default_search_path(made.target))
    return made
