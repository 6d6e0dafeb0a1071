#!/usr/bin/env bash
# The demo: a small training run with evald beside it. Sets everything up on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m examples.demo "$@"
