#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs evald with its test extra, once per pyproject.toml version.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.evald-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[test]"
    echo "$want" > "$stamp"
fi
