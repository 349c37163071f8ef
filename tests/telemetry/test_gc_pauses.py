"""The garbage collector's pauses, counted by generation while started, nothing after stopped."""
import gc

import pytest

from speechperf.telemetry.gc_pauses import GcPauses


@pytest.fixture(autouse=True)
def no_automatic_collections():
    """Only the tests' own gc.collect calls run: the counts are exact."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def _cycles(n: int) -> None:
    for _ in range(n):  # reference cycles: only the collector frees them
        a = []
        a.append(a)


def test_collections_are_counted_by_generation_while_started_only():
    pauses = GcPauses().start()
    _cycles(1000)
    gc.collect(2)
    gc.collect(0)
    pauses.stop()
    got = pauses.figures()
    assert (got["full collections"], got["collections"]) == (1, 2)
    assert 0 < got["longest full s"] <= got["full seconds"] <= got["seconds"]
    assert pauses._callback not in gc.callbacks
    gc.collect(2)  # stopped: not counted
    assert pauses.figures() == got


def test_starting_twice_counts_each_collection_once():
    pauses = GcPauses().start().start()
    gc.collect(2)
    pauses.stop()
    assert pauses.figures()["full collections"] == 1
