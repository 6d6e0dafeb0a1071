#!/usr/bin/env bash
# Lint, as CI runs it: ruff over every Python file the project owns (its rules: pyproject.toml, [tool.ruff]).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh >/dev/null
exec .venv/bin/ruff check evald trainer_hooks tests examples bench scripts
