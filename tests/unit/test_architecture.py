"""The architecture stays visible: no import cycle, and each package imports only what its docstring allows.

Reads the sources (every import, including those inside functions, which would otherwise hide a
cycle) rather than importing them, so it runs in well under a second.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAGES = ("cli", "config", "contracts", "daemon", "decisions", "files", "intake", "ledger", "pipeline", "serve", "sinks")


def _modules() -> dict[str, Path]:
    found = {}
    for top in ("evald", "trainer_hooks"):
        for path in (REPO / top).rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute module a ``from`` import names: ``from ..ledger import x`` in evald.daemon.run is
    evald.ledger (a relative import counts from the importer's package; a package's __init__ is its own)."""
    if level == 0:
        return module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[:len(package) - (level - 1)] if level > 1 else package
    return ".".join(base + ([module] if module else []))


def _imports(path: Path, importer: str = "") -> set[str]:
    is_package = path.name == "__init__.py"
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, importer, is_package)
            names = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        targets |= {_resolve(n) for n in names if n.split(".")[0] in ("evald", "trainer_hooks")}
    return targets - {""}


GRAPH = {name: _imports(path, name) - {name} for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "evald" and len(parts) > 1 and parts[1] in STAGES else None


def test_no_module_imports_itself_back_even_through_an_import_inside_a_function():
    assert _cycles(GRAPH) == []


def test_the_stage_packages_form_layers_without_a_cycle():
    packages: dict[str, set[str]] = {}
    for module, deps in GRAPH.items():
        here = _stage(module)
        if here:
            packages.setdefault(here, set()).update(d for d in map(_stage, deps) if d and d != here)
    assert _cycles(packages) == []


@pytest.mark.parametrize("stage", STAGES)
def test_each_package_says_its_job_and_imports_only_what_it_says_it_may(stage):
    doc = ast.get_docstring(ast.parse((REPO / "evald" / stage / "__init__.py").read_text())) or ""
    assert len(doc.splitlines()[0]) > 20, f"evald/{stage}/__init__.py: the first line names the job"
    line = re.search(r"May import: (.*?)(?:\n\n|$)", doc, re.S)
    assert line, f"evald/{stage}/__init__.py: its docstring says what it may import ('May import: ...')"
    allowed = set(re.findall(r"\b(" + "|".join(STAGES) + r")\b", line.group(1)))
    if "every other package" in line.group(1):
        allowed = set(STAGES)
    used = {d for m, deps in GRAPH.items() if _stage(m) == stage for d in map(_stage, deps) if d and d != stage}
    assert used <= allowed, f"evald.{stage} imports {sorted(used - allowed)}, which its docstring does not allow"


def test_evald_has_no_flat_modules_beside_its_packages():
    flat = sorted(p.name for p in (REPO / "evald").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert flat == [], "every module belongs to a stage package"


def test_the_trainer_side_imports_only_the_contracts():
    for module, deps in GRAPH.items():
        if module.startswith("trainer_hooks"):
            foreign = {d for d in deps if d.startswith("evald") and not d.startswith("evald.contracts")}
            assert not foreign, f"{module} imports {sorted(foreign)}; the trainer shares only evald.contracts"


def test_the_checker_sees_a_cycle_and_an_import_inside_a_function():
    """The guard itself can fail: a two-module loop, one side hidden in a function, is found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(graph) == [["a", "b"]]
    source = "def f():\n    from evald.daemon import server\n"
    tree_imports = {_resolve(f"{n.module}.{a.name}") for n in ast.walk(ast.parse(source))
                    if isinstance(n, ast.ImportFrom) for a in n.names}
    assert tree_imports == {"evald.daemon.server"}


def test_the_checker_sees_relative_imports(tmp_path):
    """A relative import is an import: ``from ..ledger import ledger`` in a daemon module is seen as
    evald.ledger.ledger, and a planted relative cycle is found."""
    planted = tmp_path / "run.py"
    planted.write_text("from ..ledger import ledger\nfrom . import server\nfrom .. import pipeline\n")
    assert _imports(planted, "evald.daemon.run") == {"evald.ledger.ledger", "evald.daemon.server", "evald.pipeline"}
    package = tmp_path / "__init__.py"
    package.write_text("from .run import Run\n")
    assert _imports(package, "evald.daemon") == {"evald.daemon.run"}
    graph = dict(GRAPH)
    graph["evald.ledger.ledger"] = graph["evald.ledger.ledger"] | _imports(planted, "evald.daemon.run")
    assert _cycles(graph), "a relative import that closes a loop is a cycle"


PIPELINE_SUBPACKAGES = sorted(p.parent.name for p in (REPO / "evald" / "pipeline").glob("*/__init__.py"))


@pytest.mark.parametrize("sub", PIPELINE_SUBPACKAGES)
def test_each_pipeline_sub_package_imports_only_what_it_says_within_the_pipeline(sub):
    """pipeline/'s sub-packages (swap, suites, group, tasks, metrics) say which of the pipeline's own modules
    they may use (``within evald.pipeline: ...``); with no such line, none outside themselves."""
    doc = ast.get_docstring(ast.parse((REPO / "evald" / "pipeline" / sub / "__init__.py").read_text())) or ""
    line = re.search(r"within evald\.pipeline: (.*?)(?:\.\s*$|\n\n|$)", doc, re.S | re.M)
    allowed = {a.strip() for a in line.group(1).replace("\n", " ").split(",")} if line else set()
    here = f"evald.pipeline.{sub}"
    used = set()
    for module, deps in GRAPH.items():
        if module == here or module.startswith(here + "."):
            for dep in deps:
                if dep.startswith("evald.pipeline.") and not (dep == here or dep.startswith(here + ".")):
                    used.add(dep.removeprefix("evald.pipeline."))
    outside = {u for u in used if not any(u == a or u.startswith(a + ".") for a in allowed)}
    assert not outside, f"evald/pipeline/{sub} uses {sorted(outside)} of the pipeline; its docstring allows {sorted(allowed)}"


def test_the_scoring_engine_is_below_its_clients():
    """evald.pipeline.engine (the TokenScorer) is imported by its clients (the suites, the eval group, the HTTP
    endpoint) and imports none of them: within evald only itself and the pipeline's tasks (the cached-decoding
    interface). Its clients import it by its own name, not by the old path kept one release (suites.scoring)."""
    engine = {m: deps for m, deps in GRAPH.items() if m == "evald.pipeline.engine" or m.startswith("evald.pipeline.engine.")}
    assert engine, "evald/pipeline/engine/ exists"
    for module, deps in engine.items():
        foreign = {d for d in deps if not (d.startswith("evald.pipeline.engine") or d.startswith("evald.pipeline.tasks"))}
        assert not foreign, f"{module} imports {sorted(foreign)}: the engine imports none of its clients"
    old = "evald.pipeline.suites.scoring"
    users = sorted(m for m, deps in GRAPH.items() if old in deps and m.startswith("evald"))
    assert users == [], f"{users} import the engine's old path {old}; import evald.pipeline.engine"
