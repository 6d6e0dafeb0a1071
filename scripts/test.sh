#!/usr/bin/env bash
# The tests: sets everything up on first use, then runs pytest (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --with-browser
bash scripts/setup_mindformers.sh   # .venv-mindformers, for tests/e2e/test_mindformers_recipe.py
export GLOG_v=3
exec .venv/bin/python -m pytest "$@"
