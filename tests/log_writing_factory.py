"""A model factory that, like MindFormers (mindformers.tools.utils.get_log_path), creates its log directory
on import: ``$LOG_MF_PATH``, else ``./output/log`` in the current directory. It stands in for MindFormers,
which the project's .venv does not carry (the real one runs in .venv-mindformers, in
tests/e2e/test_mindformers_recipe.py), in tests/e2e/test_framework_logs.py."""

from __future__ import annotations

import os

os.makedirs(os.path.expanduser(os.getenv("LOG_MF_PATH", "./output/log")), exist_ok=True)

from examples.tiny_lm.model import build_model  # noqa: E402,F401  (the factory itself)
