"""Issue 48: no reader process outlives its loader. ``Loader.close`` stops the readers of a loader
started ahead or read in part at once (they ignore SIGTERM, which torch's own shutdown sends), and
a reader dies with the process that started it, even one SIGKILLed (Linux PR_SET_PDEATHSIG)."""
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import psutil
import pytest

from speechperf.data.loader_config import LoaderConfig
from speechperf.data.loader import make_loader

CFG = LoaderConfig(batch_size=4, readers=2, prefetch_batches=2)


def _readers() -> set[int]:
    return {c.pid for c in psutil.Process().children() if c.is_running() and c.status() != psutil.STATUS_ZOMBIE}


@pytest.mark.parametrize("how", ["started ahead", "read in part"])
def test_close_stops_every_reader_at_once(tiny_features, how):
    before = _readers()
    # a window per shard of the two splits: both readers get one
    loader = make_loader(tiny_features, ["train-clean", "train-other"], replace(CFG, bucket_window=1), epoch=1, seed=0)
    if how == "started ahead":
        loader.start()
    else:
        next(iter(loader))
    started = _readers() - before
    assert len(started) == loader.readers_in_use() == 2
    for pid in started:  # as scancel does: the readers ignore it
        os.kill(pid, signal.SIGTERM)
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 3.0
    assert not started & _readers()
    loader.close()  # closing twice does nothing


def test_a_loader_used_as_a_context_is_closed_by_an_error(tiny_features):
    before = _readers()
    with pytest.raises(KeyError):
        with make_loader(tiny_features, "train-clean", CFG, epoch=1, seed=0) as loader:
            for _ in loader:
                raise KeyError("the step failed")
    assert not _readers() - before


CHILD = r"""
import sys, time
from speechperf.data.loader_config import LoaderConfig
from speechperf.data.loader import make_loader
loader = make_loader(sys.argv[1], "train-clean", LoaderConfig(batch_size=4, readers=1), epoch=1, seed=0).start()
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_readers_die_with_a_sigkilled_parent(tiny_features):
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(tiny_features)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "started"
        (reader,) = psutil.Process(p.pid).children()
    finally:
        p.kill()
        p.wait()
    try:
        reader.wait(timeout=3)  # killed by the kernel with its parent (torch's own watchdog looks every 5 s)
    except psutil.TimeoutExpired:
        reader.kill()
        pytest.fail("a reader outlived its SIGKILLed training process")


def test_an_error_while_readers_start_leaves_none_running(tiny_features, monkeypatch):
    """Issue 61: an error raised as the readers start (a second stop signal's, torch's SIGCHLD handler's)
    stops the readers already started: they ignore the SIGTERM multiprocessing ends them with at exit."""
    from torch.utils.data._utils import signal_handling

    def fail():
        raise RuntimeError("a signal handler raised")

    monkeypatch.setattr(signal_handling, "_set_SIGCHLD_handler", fail)  # called once the readers are forked
    before = _readers()
    loader = make_loader(tiny_features, ["train-clean", "train-other"], replace(CFG, bucket_window=1), epoch=1, seed=0)
    with pytest.raises(RuntimeError, match="a signal handler raised"):
        loader.start()
    assert not _readers() - before
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()  # this thread's signals unblocked again
