#!/usr/bin/env bash
# The tests: sets everything up on first use, then runs pytest.
#
#   ./scripts/test.sh            the default stage: every in-process test (tests/unit) and the smoke set of
#                                real-process tests (tests/e2e, @pytest.mark.smoke): one for each contract only
#                                a process can prove. The README's command.
#   ./scripts/test.sh --rest     the second stage: every other real-process test and the MindFormers recipe.
#   ./scripts/test.sh --long     the third stage: the slow fault/load runs (-m slow) and the heavy tests (several
#                                processes for minutes each: msrun tensor-parallel groups, Checkpoint 2.0 under
#                                msrun, a backfill fleet). .ci/run runs the three stages; together they run every test.
#   ./scripts/test.sh --heavy    the heavy tests alone.
#   ./scripts/test.sh ARGS...    pytest with ARGS as given (a file, a folder, -k, -m ...), nothing selected for you.
#
# Each stage installs only what it needs: .venv always; headless Chromium, systemd and .venv-mindformers only for
# --rest, --long and --heavy.
set -euo pipefail
cd "$(dirname "$0")/.."
export GLOG_v=3

# The sets are disjoint and cover every test: heavy tests, slow tests, and of the others the default stage
# (in-process or in the smoke set) and the rest (tests/conftest.py marks tests/e2e as `e2e`).
DEFAULT_STAGE="not heavy and not slow and (not e2e or smoke)"
REST_STAGE="not heavy and not slow and e2e and not smoke"
HEAVY_STAGE="heavy"
LONG_STAGE="slow or heavy"

stage=default
if [[ ${1:-} == --rest || ${1:-} == --heavy || ${1:-} == --long ]]; then
    stage=${1#--}
    shift
fi

selects=false   # did the caller choose tests (a path, a node id, -m or -k)? then run exactly those
for arg in "$@"; do
    case $arg in
        -m|-k|-m*|-k*|tests|tests/*|*::*) selects=true ;;
    esac
done

if [[ $stage == rest || $stage == heavy || $stage == long ]]; then
    bash scripts/setup_env.sh --with-system-tools   # Chromium (test_views.py), systemd (test_deploy.py)
    bash scripts/setup_mindformers.sh          # .venv-mindformers, for the MindFormers recipe and Checkpoint 2.0
    case $stage in
        rest) $selects || set -- -m "$REST_STAGE" "$@" ;;
        heavy) set -- -m "$HEAVY_STAGE" "$@" ;;
        long) set -- -m "$LONG_STAGE" "$@" ;;
    esac
else
    bash scripts/setup_env.sh
    if [[ $# -eq 0 ]] || ! $selects; then
        set -- -m "$DEFAULT_STAGE" "$@"
    fi
fi
# Two workers (pytest-xdist), a test file each at a time (--dist loadfile: a module's compiled network and a
# session's shared training run stay in one process). On 2 cores much of a test's time is one thread compiling
# or waiting on a process or a socket, so two run well side by side. `-n 0` after the script's arguments runs
# everything in one process (the last -n counts).
exec .venv/bin/python -m pytest -n 2 --dist loadfile --durations=30 "$@"
