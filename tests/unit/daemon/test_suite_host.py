"""Issue 36 item 2: a suite's life has one owner (evald.pipeline.suite_host.SuiteHost) behind one typed seam
(evald.pipeline.seam), and the daemon never assigns to a pipeline's attribute nor writes into its views:
it reads them and asks (``refuse_suite``, ``build_next_suite``, ``evaluate_suite``). Before, the daemon
popped a suite out of ``pipeline.suites``, wrote ``pipeline.suite_errors[name]`` and set
``pipeline.keep_alive``."""

from __future__ import annotations

import ast
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import pytest

from evald.daemon import suite_turn
from evald.ledger.ledger import Ledger

DAEMON = Path(__file__).resolve().parents[3] / "evald" / "daemon"
VIEWS = {"suites", "suite_errors", "suites_pending"}
MUTATORS = {"pop", "popitem", "clear", "update", "setdefault", "__setitem__", "__delitem__"}


def _names_pipeline(node: ast.AST) -> bool:
    """``pipeline`` or ``x.pipeline``: the daemon's names for its pipeline."""
    return (isinstance(node, ast.Name) and node.id == "pipeline") or (
        isinstance(node, ast.Attribute) and node.attr == "pipeline")


def _writes(tree: ast.AST) -> list[str]:
    """Assignments to a pipeline's attributes or into its views, and mutating calls on its views."""
    found = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [node.targets[0]]
                   if isinstance(node, ast.Delete) else [])
        for target in targets:
            if isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and _names_pipeline(target.value):
                found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr in VIEWS and _names_pipeline(owner.value):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_daemon_never_assigns_to_a_pipeline_attribute_nor_writes_into_its_views():
    writes = {path.name: _writes(ast.parse(path.read_text())) for path in sorted(DAEMON.glob("*.py"))}
    assert {name: found for name, found in writes.items() if found} == {}


def test_the_checker_sees_each_kind_of_write():
    source = ("pipeline.suites.pop('a')\npipeline.suite_errors['a'] = 'why'\nself.pipeline.keep_alive = f\n"
              "x = pipeline.suites['a']\n")
    assert len(_writes(ast.parse(source))) == 3


def test_the_daemon_refuses_a_suite_through_the_seam(tmp_path):
    """A tokenizer that changed within the run: the daemon asks the pipeline to refuse the suite (its views
    are read-only, as the real pipeline's are)."""
    refused = []
    suites = {"fast": SimpleNamespace(options=SimpleNamespace(every_k=1), cell_identity="f" * 64,
                                      identity={"tokenizer": "b" * 64})}
    pipeline = SimpleNamespace(suites=MappingProxyType(suites), suite_errors=MappingProxyType({}), suites_pending=(),
                               validation_identity="v" * 64, refuse_suite=lambda *why: refused.append(why))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    try:
        ledger.put_state(suite_turn.TOKENIZER_KEY, "a" * 64)   # the run's first tokenizer
        suite_turn.on_built(ledger, pipeline)
    finally:
        ledger.close()
    [(name, reason)] = refused
    assert name == "fast" and "tokenizer changed between checkpoints of this run" in reason


def test_the_suite_host_owns_refusal_and_its_views_are_read_only():
    pytest.importorskip("mindspore")
    from evald.config import EvaldConfig
    from evald.config.options import SuiteOptions
    from evald.pipeline.pipeline import Pipeline

    pipeline = Pipeline(should_abort=lambda: False)
    with pytest.raises(TypeError):
        pipeline.suites["x"] = object()      # type: ignore[index]
    with pytest.raises(TypeError):
        pipeline.suite_errors["x"] = "why"   # type: ignore[index]
    host = pipeline._suites
    config = EvaldConfig(suites={"mc": SuiteOptions(tasks=("t",)), "bpb": SuiteOptions(tasks=("u",))})
    host.plan(config, SimpleNamespace())
    assert pipeline.suites_pending == ("bpb", "mc")
    pipeline.refuse_suite("mc", "the tokenizer changed")
    assert pipeline.suites_pending == ("bpb",) and dict(pipeline.suite_errors) == {"mc": "the tokenizer changed"}
