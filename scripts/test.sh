#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs it.
# torch==2.13.0 is named so that pip takes the CPU build on this machine's disk instead of
# pulling a multi-GB CUDA build (see README, "Installing torch").
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0 -e '.[test,zoo]'
# The report test opens the HTML page in a real browser (Debian's chromium).
if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
            || echo "warning: could not install chromium; the browser test will fail" >&2
    fi
fi
python -m pytest -q "$@"
