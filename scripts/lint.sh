#!/usr/bin/env bash
# Lint, as CI runs it: ruff over every Python file the project owns (its rules: pyproject.toml, [tool.ruff]),
# then mypy over the modules typed so far (pyproject.toml, [tool.mypy]).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh >/dev/null
.venv/bin/ruff check evald trainer_hooks tests examples bench scripts
exec .venv/bin/mypy
