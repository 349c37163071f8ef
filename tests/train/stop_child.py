"""``python -m tests.train.stop_child PHASE[:SIGINT] MARKER LEFT ARGS...`` (tests/forked_cli.py forks it
from the suite's server): ``speechperf ARGS`` that
sends SIGTERM (or SIGINT) to its own process group (as Slurm's scancel and Kubernetes do: the readers get it too) at
one precise phase of the run, writing the signal's wall-clock time into MARKER and, as the
interpreter begins to exit, the pids of its child processes still alive into LEFT (JSON):

- ``step``: during training step 6 (epoch 1 holds more than 6 batches);
- ``eval``: inside epoch 1's evaluation, the next epoch's readers started ahead;
- ``checkpoint``: while epoch 1's end-of-epoch checkpoint is written on the writer thread;
- ``ahead-readers``, ``eval-readers``, ``final-readers``: from inside the first reader process started
  ahead for epoch 2, by epoch 1's evaluation (none on the tiny preset: its batches are kept), by the
  final evaluation, the moment torch's worker has
  set its own signal handlers and before the loader's ``worker_init_fn`` runs (issue 61: a reader
  signalled there died of it and the run failed).
"""
import atexit
import json
import os
import signal
import sys
import time

import speechperf.atomic as atomic
import speechperf.train.loop as loop
import speechperf.train.trainer as trainer
from torch.utils.data._utils import signal_handling

import psutil

phase, marker, left = sys.argv[1], sys.argv[2], sys.argv[3]
phase, _, signame = phase.partition(":")  # PHASE:SIGINT sends SIGINT instead
SIGNAL = getattr(signal, signame or "SIGTERM")


@atexit.register  # registered after torch's and multiprocessing's: runs before theirs
def children_left() -> None:
    with open(left, "w") as f:
        json.dump([c.pid for c in psutil.Process().children(recursive=True) if c.is_running()], f)


def stop() -> None:
    with open(marker, "w") as f:
        f.write(repr(time.time()))
    os.killpg(os.getpgid(0), SIGNAL)


def on_call(real, n: int, pause: float = 0.0):
    """``real``, stopping the run at its ``n``-th call and, after ``pause`` s, going on into it."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            stop()
            time.sleep(pause)
        return real(*args, **kwargs)
    return wrapped


def on_epoch_checkpoint(real):
    def save(obj, path):
        p = obj["progress"]
        if p["epoch"] == 2 and p["start_batch"] == 0 and not os.path.exists(marker):
            stop()
            time.sleep(0.5)  # the signal is handled while this write is still going
        return real(obj, path)
    return save


def kept(real):
    """The trainer kept referenced to the end (as a reference cycle would keep it until the
    collector runs at exit, where torch no longer stops readers): its loaders must have been
    closed by the loop itself."""
    def begin(*args, **kwargs):
        t = real(*args, **kwargs)
        KEPT.append(t)
        return t
    return begin


def staged(real, stage: str):
    """``real``, noting that ``stage`` runs while it does: a reader forked meanwhile reads its copy."""
    def wrapped(*args, **kwargs):
        STAGE[0] = stage
        try:
            return real(*args, **kwargs)
        finally:
            STAGE[0] = None
    return wrapped


def in_reader_start(stage: str):
    """torch's worker's own signal handlers set, in a reader forked during ``stage``: the first such
    reader signals the group there, before the loader's worker_init_fn runs."""
    real = signal_handling._set_worker_signal_handlers

    def wrapped():
        real()
        if STAGE[0] == stage and not os.path.exists(marker):
            stop()
    return wrapped


STAGE = [None]
KEPT = []
loop.begin = kept(loop.begin)
if phase == "step":
    loop.train_step = on_call(loop.train_step, 6)
elif phase == "eval":
    loop._epoch_eval = on_call(loop._epoch_eval, 1, pause=0.5)  # the signal taken inside the evaluation
elif phase == "checkpoint":
    atomic.atomic_torch_save = on_epoch_checkpoint(atomic.atomic_torch_save)
elif phase.endswith("-readers"):
    stage = phase.removesuffix("-readers")
    trainer.Trainer.start_ahead = staged(trainer.Trainer.start_ahead, "ahead")
    loop._epoch_eval = staged(loop._epoch_eval, "eval")
    loop._final_eval = staged(loop._final_eval, "final")
    signal_handling._set_worker_signal_handlers = in_reader_start(stage)
else:
    raise SystemExit(f"unknown phase {phase}")

from speechperf.cli import main  # noqa: E402

sys.exit(main(sys.argv[4:]))
