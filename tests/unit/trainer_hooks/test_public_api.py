"""The trainer-side API reads like a library: each public class says its arguments, what it
returns and how it is used (issue 11, section 5)."""

from __future__ import annotations

import inspect

import pytest

import trainer_hooks


@pytest.mark.parametrize("name", trainer_hooks.__all__)
def test_each_public_class_documents_args_returns_and_an_example(name):
    cls = getattr(trainer_hooks, name)
    doc = inspect.getdoc(cls) or ""
    assert "Args:" in doc and "Returns:" in doc and "Example::" in doc, name
    documented = doc.split("Args:", 1)[1].split("Returns:", 1)[0]
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    missing = [p for p in params if p.lstrip("*") not in documented]
    assert not missing, f"{name} does not document {missing}"
