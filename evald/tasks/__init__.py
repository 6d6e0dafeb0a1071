"""Evaluation tasks: each builds a Graph-mode eval cell around the network and turns its
outputs on the fixed subset into metrics. ``lm`` and ``classification`` ship with evald."""

from __future__ import annotations

from typing import Any


def make_task(name: str, **options: Any):
    if name == "lm":
        from evald.tasks.lm import LanguageModelTask

        return LanguageModelTask(**options)
    if name == "classification":
        from evald.tasks.classification import ClassificationTask

        return ClassificationTask(**options)
    raise ValueError(f"unknown task {name!r}; evald knows 'lm' and 'classification'")
