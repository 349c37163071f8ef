"""The suite's tiers (tests/tiers.py): which tests the fast tier leaves out, read from their code."""
import subprocess
import sys

import pytest

from tests.tiers import starts_processes


def _pure(x):
    return sorted(x)


def _starts():
    return subprocess.run([sys.executable, "-c", "pass"], check=True)


def _through_a_helper():
    return _starts()


def _imports_the_loop():
    from speechperf.train.loop import train  # a whole training in this process

    return train


def _imports_the_loop_module():
    from speechperf.train import loop

    return loop


def _in_a_lambda():
    return lambda: subprocess.Popen(["true"])


# Named through a table: a test that names a starting function itself would be slow (the
# collection follows every function of tests/ a test names, called or not).
H = {"pure": _pure, "starts": _starts, "helper": _through_a_helper, "loop": _imports_the_loop,
     "loop module": _imports_the_loop_module,
     "lambda": _in_a_lambda}
RUN = subprocess.run  # not a starter name: this module's own tests stay fast


def test_a_pure_function_is_fast():
    assert not starts_processes(H["pure"])


def test_subprocess_directly_through_a_helper_or_a_lambda_is_slow():
    assert starts_processes(H["starts"])
    assert starts_processes(H["helper"])
    assert starts_processes(H["lambda"])


def test_a_whole_training_in_this_process_is_slow():
    assert starts_processes(H["loop"]) and starts_processes(H["loop module"])


def test_a_recursive_helper_ends():
    def again(n):
        return again(n - 1) if n else sorted([n])

    assert not starts_processes(again)


def test_the_session_run_fixture_is_slow():
    from tests.conftest import tiny_corpus, tiny_run

    assert starts_processes(tiny_run)
    assert not starts_processes(tiny_corpus)


def test_these_tests_are_fast(request):
    from tests.tiers import is_slow

    assert not is_slow(request.node)


def test_the_fast_tier_refuses_a_process(monkeypatch):
    from tests.tiers import refuse_processes

    refuse_processes(monkeypatch, "tests/test_tiers.py::example")
    with pytest.raises(pytest.fail.Exception, match="example starts a process but was not marked slow"):
        RUN(["true"])
