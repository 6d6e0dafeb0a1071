"""A suite's task YAML is code: the trust rule applied to it before lm-eval reads a byte of it.

lm-eval imports and runs Python from a task YAML: ``process_docs: !function helpers.keep`` loads
``helpers.py`` beside the YAML (lm-eval's ``tasks/_yaml_loader.py``), and ``include:`` pulls in other
YAML, which may do the same, from anywhere. So before ``TaskManager(include_path=...)`` is built
(``task_manager``, the one place evald builds one), ``check_task_files`` judges, by the one rule for code
(evald.files.ownership, docs/security.md):

* every ``include_path`` directory and every directory below it (lm-eval reads every ``*.yaml`` there:
  whoever may add a file may add a task), and the directories above it;
* every ``*.yaml``/``*.yml`` there, every file they ``include`` (with its directory), and every module a
  ``!function`` names, where it exists (with its directory).

The YAML is read with a safe loader that only records what ``!function`` names; one that cannot be
read that way is refused too, since what it would import cannot be told. Anything refused raises
``UntrustedTaskCode`` naming the file and what to do; nothing is imported.

May import: files (the trust rule).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import yaml

from evald.files.ownership import why_untrusted_above, why_untrusted_path

YAML_SUFFIXES = (".yaml", ".yml")
MAX_FILES = 100_000    # a tree larger than this is refused rather than walked for minutes


class UntrustedTaskCode(ValueError):
    """A suite's task YAML, a module it names, or a directory holding them, fails the trust rule."""


def _refusal(why: str) -> UntrustedTaskCode:
    return UntrustedTaskCode(
        f"{why}. A suite's task YAML is code: lm-eval runs the modules its `!function` names as evald's user, so "
        f"evald reads task YAML, its includes, those modules and their directories only when evald's uid (or "
        f"root) owns them and nobody else can write them (docs/security.md). chown them to evald's user and "
        f"`chmod -R go-w` them, or copy the tasks into a directory only evald's user can write")


class _Loader(yaml.SafeLoader):
    """A safe loader that records what ``!function`` names instead of importing it."""

    functions: list[str]


def _record_function(loader: _Loader, node: yaml.Node) -> str:
    spec = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    loader.functions.append(spec)
    return spec


_Loader.add_constructor("!function", _record_function)


def _read(path: Path) -> tuple[list[str], list[str]]:
    """``(included files, !function names)`` of one YAML file."""
    with open(path, "rb") as fh:
        loader = _Loader(fh)
        loader.functions = []
        try:
            config = loader.get_single_data()
        finally:
            loader.dispose()
    includes = config.get("include") if isinstance(config, dict) else None
    included = [str(i) for i in (includes if isinstance(includes, list) else [includes] if includes else [])]
    return included, loader.functions


def _module_candidates(base: Path, spec: str) -> set[Path]:
    """The files lm-eval may load for ``!function spec`` in a YAML of directory ``base``."""
    module, _, _function = spec.rpartition(".")
    if not module:
        return set()
    candidates = {base / f"{module.replace('.', '/')}.py"}
    by_path = base / module            # lm-eval's other reading: a path to module.py, absolute or relative
    candidates.add(by_path if by_path.suffix == ".py" else by_path.with_name(by_path.name + ".py"))
    return candidates


def _check(path: Path) -> None:
    """``path`` by the rule, and the directory holding it."""
    real = Path(os.path.realpath(path))
    for why in (why_untrusted_path(real), why_untrusted_path(real.parent)):
        if why is not None:
            raise _refusal(why)


def check_task_files(include_path: Iterable[str]) -> None:
    """Raise UntrustedTaskCode unless every task file, module and directory lm-eval would read is trusted."""
    pending: list[Path] = []
    checked_dirs: set[Path] = set()
    for root in include_path:
        root_real = Path(os.path.realpath(root))
        why = why_untrusted_above(root_real) if root_real.is_dir() else None
        if why is not None:
            raise _refusal(why)
        for directory, subdirs, files in os.walk(root_real, followlinks=True):
            here = Path(os.path.realpath(directory))
            if here in checked_dirs:
                subdirs[:] = []        # a link loop, or a directory reached twice
                continue
            checked_dirs.add(here)
            why = why_untrusted_path(here)
            if why is not None:
                raise _refusal(why)
            pending += [here / f for f in files if f.endswith(YAML_SUFFIXES)]
            if len(pending) > MAX_FILES:
                raise UntrustedTaskCode(f"{root} holds more than {MAX_FILES} task YAML files; give include_path "
                                        f"the directory of the suite's own tasks")
    seen: set[Path] = set()
    while pending:
        path = Path(os.path.realpath(pending.pop()))
        if path in seen or not path.is_file():
            continue   # lm-eval reports a missing include itself
        seen.add(path)
        _check(path)
        why = why_untrusted_above(path.parent)
        if why is not None:
            raise _refusal(why)
        try:
            included, functions = _read(path)
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise UntrustedTaskCode(f"the task YAML {path} cannot be read to tell which code it names ({exc}); "
                                    f"fix it, or take it out of include_path") from None
        pending += [Path(i) if os.path.isabs(i) else path.parent / i for i in included]
        for spec in functions:
            for module in _module_candidates(path.parent, spec):
                if module.is_file():
                    _check(module)
                    why = why_untrusted_above(Path(os.path.realpath(module)).parent)
                    if why is not None:
                        raise _refusal(why)


_TASK_MANAGERS: dict[tuple, Any] = {}


def task_manager(include_path: tuple[str, ...], tasks: tuple[str, ...]) -> Any:
    """lm-eval's TaskManager for these local YAMLs; lm-eval's own ~15,000 tasks are indexed (seconds)
    only when a task is not among the local ones. One per process and include path. The local YAML is
    code: it is judged by the trust rule first, every time (UntrustedTaskCode)."""
    check_task_files(include_path)
    from lm_eval.tasks import TaskManager

    if include_path:
        key = (include_path, False)
        if key not in _TASK_MANAGERS:
            _TASK_MANAGERS[key] = TaskManager(include_path=list(include_path), include_defaults=False)
        local = _TASK_MANAGERS[key]
        if all(t in local.all_tasks for t in tasks):
            return local
    key = (include_path, True)
    if key not in _TASK_MANAGERS:
        _TASK_MANAGERS[key] = TaskManager(include_path=list(include_path) or None)
    return _TASK_MANAGERS[key]
