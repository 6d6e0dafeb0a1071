#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs evald with its test extra, once per pyproject.toml version.
# --with-system-tools: also the system packages the second test stage needs, installed with apt-get when this
# runs as root: headless Chromium (Debian's chromium-headless-shell, else chromium) for the TensorBoard view test
# (tests/e2e/test_views.py), and systemd for `systemd-analyze verify` of the unit file (tests/e2e/test_deploy.py).
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
if [[ ${1:-} == --with-system-tools ]] && ! command -v chromium-headless-shell >/dev/null 2>&1 \
        && ! command -v chromium >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "setup_env: installing headless Chromium for tests/e2e/test_views.py (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq chromium-headless-shell >/dev/null || apt-get install -y -qq chromium >/dev/null \
            || echo "setup_env: could not install Chromium; tests/e2e/test_views.py will fail and say so" >&2
    else
        echo "setup_env: no headless Chromium and not root with apt-get: install chromium-headless-shell" \
             "(or chromium) yourself, or tests/e2e/test_views.py fails" >&2
    fi
fi
# tests/e2e/test_deploy.py runs `systemd-analyze verify` on deploy/evald@.service (systemd is in the image;
# install it where it is not and we may).
if [[ ${1:-} == --with-system-tools ]] && ! command -v systemd-analyze >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi
