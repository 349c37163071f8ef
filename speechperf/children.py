"""Child processes that do not outlive the command that started them: the seeds side by side
(drive/seed_slots.py) and the ranks of ``bench scale --world N`` (bench/scale_launch.py); and a
command that ends on SIGTERM as a stop, its temporary files removed (:func:`sigterm_stops`).

A SIGKILL to a parent (the kernel's OOM killer, say) gives it no chance to stop its children;
on Linux each child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), and
a child started after its parent died stops at once.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading

from speechperf.errors import Stopped

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def dies_with(parent: int):
    """A ``preexec_fn`` for a child process: SIGTERM to it when ``parent`` dies, or at once where the
    parent died before it asked. None where the C library has no prctl (not Linux)."""
    prctl = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform.startswith("linux") else None
    if prctl is None:
        return None

    def preexec():  # in the child, between fork and exec: the function was looked up before
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


@contextlib.contextmanager
def sigterm_stops():
    """Inside: SIGTERM raises :class:`~speechperf.errors.Stopped` where the code is (exit 143), so
    that the ``with`` blocks around it clean up (a temporary folder of synthetic shards) instead of
    the process dying as it stands; the handler before is put back after. Outside the main thread
    (where Python cannot set a handler) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
