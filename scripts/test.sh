#!/usr/bin/env bash
# The tests: sets everything up on first use, then runs pytest (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --with-browser
export GLOG_v=3
exec .venv/bin/python -m pytest "$@"
