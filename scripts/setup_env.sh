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
# tests/test_deploy.py runs `systemd-analyze verify` on deploy/evald@.service (systemd is in the image;
# install it where it is not and we may).
if ! command -v systemd-analyze >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi
