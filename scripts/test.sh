#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs it.
# constraints.txt pins every package to the versions the suite was run with (a newer pytest
# once broke a test); its torch==2.13.0 makes pip take the CPU build on this machine's disk
# instead of pulling a multi-GB CUDA build (see docs/gpu.md, "Installing torch").
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -c constraints.txt -e '.[test,zoo]'
# The report test opens the HTML page in a real browser (Debian's chromium).
if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
            || echo "warning: could not install chromium; the browser test will fail" >&2
    fi
fi
# The import layers and the absence of cycles (pyproject.toml [tool.importlinter]); set -e: a
# broken contract fails here, before the tests.
lint-imports
# Two workers (pytest-xdist): most cases wait on subprocesses (torchrun, the CLI) and run one
# thread each, so two share a 2-core machine well; worksteal evens out the long cases. With -n N
# each worker's torch, and the subprocesses it starts, use cores / N threads (tests/conftest.py;
# an OMP_NUM_THREADS set here is kept): on 16 cores, -n 8 gives each worker 2 threads.
# --durations: the 20 slowest cases at the end (the suite aims at 10 minutes on 2 cores).
# Arguments after the script's name go to pytest (-n 0: one process). --fast: the fast tier for
# the edit-test loop, every test but those that start a process or train a whole run
# (tests/tiers.py marks them at collection); CI and the README run everything.
python -m pytest -q -n 2 --dist worksteal --durations=20 "$@"
