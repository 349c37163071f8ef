"""The suite's two tiers. A test is ``slow`` when it, a helper of the tests it calls, or one of
its fixtures starts a process (the CLI, torchrun, any ``subprocess``) or trains a whole run in
this process (``speechperf.train.loop.train``); everything else is the fast tier that
``bash scripts/test.sh --fast`` runs. Nobody marks a test by hand: collection reads each test's
code (its names, those of the functions and fixtures it uses) and marks it. Under ``--fast`` a
test that starts a process anyway fails, naming itself, so the marking cannot rot silently."""
from __future__ import annotations

import platform
import subprocess
import types
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)

# Names that, called or imported by a test's code, start a process or a whole training.
# The library's own starters: seeds side by side, the sweep, the demo, reproduce's child, the
# MLPerf checker (a process of its own), the environment (a child reads the kernels), the training loop.
STARTER_NAMES = frozenset({"subprocess", "Popen", "check_output", "cli", "cli_argv", "cli_start", "run_cli",
                           "forked_cli", "torchrun", "torchrun_start",
                           "train_seeds", "train_seeds_parallel", "run_sweep", "launch", "run_demo",
                           "check_log", "check_run", "capture_env", "run_benchmark", "trace_in_child",
                           "speechperf.train.loop", "speechperf.drive.reproduce",
                           *(f"main:{command}" for command in ("train", "reproduce", "demo", "parallel"))})


def _code_names(code: types.CodeType) -> set[str]:
    """Every global, attribute and imported-module name a code object (and its nested
    functions, lambdas and comprehensions) refers to; ``main:WORD`` for each word beside a call of
    the command line's ``main`` (``main:train``: the CLI's training, in this process)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    if "speechperf.train" in names and "loop" in names:  # from speechperf.train import loop
        names.add("speechperf.train.loop")
    if "main" in names:
        names |= {f"main:{const}" for const in code.co_consts if isinstance(const, str)}
    return names


def starts_processes(func, seen: set | None = None) -> bool:
    """Whether ``func`` (a test, a fixture or a helper in tests/) starts a process or a whole
    training, directly or through another function defined in tests/ that it names."""
    seen = set() if seen is None else seen
    func = getattr(func, "__wrapped__", func)
    code = getattr(func, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    names = _code_names(code)
    if names & STARTER_NAMES:
        return True
    import speechperf.drive.reproduce as reproduce
    import speechperf.train.loop as loop  # a whole training, in this process

    scope = getattr(func, "__globals__", {})
    for name in names:
        obj = scope.get(name)
        if obj is loop or obj is loop.train or obj is reproduce:
            return True
        if _in_tests(obj) and starts_processes(obj, seen):
            return True
    return False


def _in_tests(obj) -> bool:
    """A function (or class) written in tests/: the collection follows it."""
    code = getattr(getattr(obj, "__wrapped__", obj), "__code__", None)
    if code is None or code.co_filename == __file__:  # this module names the starters, starts none
        return False
    return str(Path(code.co_filename).resolve()).startswith(TESTS)


def _fixture_funcs(item) -> list:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [d.func for defs in info.name2fixturedefs.values() for d in defs]


def is_slow(item) -> bool:
    """The tier of one collected test: its own code, then each fixture in its closure."""
    if item.get_closest_marker("slow") is not None:
        return True
    funcs = [getattr(item, "function", None), *_fixture_funcs(item)]
    return any(f is not None and starts_processes(f) for f in funcs)


def mark_tiers(config, items) -> None:
    """Marks the slow tests; under ``--fast`` deselects them (pytest reports the count)."""
    slow = [item for item in items if is_slow(item)]
    for item in slow:
        item.add_marker(pytest.mark.slow)
    chosen = set(slow)
    fast = [item for item in items if item not in chosen]
    if not config.getoption("fast"):
        # the slow tests first: pytest-xdist hands each worker a share in this order, so the long
        # cases start early and the short ones fill the end (in path order, tests/train/'s
        # torchrun and end-to-end cases came last and one worker waited on them alone)
        items[:] = slow + fast
        return
    config.hook.pytest_deselected(items=slow)
    items[:] = fast


def refuse_processes(monkeypatch, nodeid: str) -> None:
    """The fast tier's net: a process started, or a run trained, by a test the collection called
    fast fails it."""
    def refused(what):
        def fail(*args, **kwargs):
            pytest.fail(f"{nodeid} {what} but was not marked slow: name its starter in "
                        "tests/tiers.py STARTER_NAMES or call it through tests/conftest.py's cli()", pytrace=False)
        return fail

    import speechperf.train.loop as loop
    from tests import forked_cli

    # Python's platform module runs `uname -p` once per process, the first time anything asks
    # (capture_env's platform.platform()): asked here, before the net, it is no test's process
    # (otherwise whichever fast test first records an environment failed when run alone)
    platform.processor()
    monkeypatch.setattr(subprocess.Popen, "__init__", refused("starts a process"))
    monkeypatch.setattr(forked_cli.Forked, "__init__", refused("starts a process"))  # a fork, no Popen (cli, cli_start)
    monkeypatch.setattr(loop, "_train", refused("trains a whole run"))
