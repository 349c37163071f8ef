"""Child processes that do not outlive the command that started them: the seeds side by side
(drive/seed_slots.py) and the ranks of ``bench scale --world N`` (bench/scale_launch.py).

A SIGKILL to a parent (the kernel's OOM killer, say) gives it no chance to stop its children;
on Linux each child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), and
a child started after its parent died stops at once.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

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
