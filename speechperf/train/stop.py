"""A training run asked to stop (SIGINT from the terminal; SIGTERM from Slurm, Kubernetes,
``docker stop`` or torchrun) stops at the next safe point, saved and recorded.

While the loop runs, both signals only raise a flag (:class:`StopSignals`). The loop reads
it after each step's bookkeeping (every ``train.system.sync_every`` steps, where it reads the
device anyway, and at an epoch's end), all ranks together, saves a checkpoint and raises
:class:`Interrupted`, which the run records like any failure that the same command
continues (status ``failed: interrupted (SIGTERM)``, a ``run_stop`` line, a summary that
does not mark the run finished). The exit status is 128 + the signal's number, the shell's
convention: 130 for SIGINT, 143 for SIGTERM. A second signal of either kind stops at once,
without the checkpoint (as SIGINT did before).
"""
from __future__ import annotations

import signal
import threading

from speechperf.errors import RunFailed

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(RunFailed):
    """The run was stopped by a signal; the message says whether a checkpoint was saved."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum  # 130 SIGINT, 143 SIGTERM

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


class StopSignals:
    """A context in which SIGINT and SIGTERM set ``requested`` (the signal's number) instead
    of ending the process; outside the main thread (no handler can be set) it does nothing."""

    def __init__(self):
        self.requested: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:  # asked twice: stop now
            raise Interrupted(signum, f"interrupted ({signal.Signals(signum).name} twice): stopped at once, "
                                      "without a checkpoint")
        self.requested = signum


def interrupted(signum: int, where: str) -> Interrupted:
    """The error that ends a run stopped by signal ``signum`` at a safe point, a checkpoint
    saved ``where``."""
    return Interrupted(signum, f"interrupted ({signal.Signals(signum).name}) {where}; a checkpoint is saved there: "
                               "run the same command again to continue the run")
