"""How a training run ends when it cannot finish right: named, recorded, never a success.

Two kinds (speechperf.errors): the run diverged (``TrainingDiverged``: weights or too many
steps non-finite; status ``diverged: ...``, final: the same command reports it), or the
machine failed it (``MachineFault``: a full disk, a read-only or vanished folder; status
``failed: ...``; the last checkpoint is intact and the same command continues once the
cause is fixed; a run stopped by SIGINT or SIGTERM is recorded the same way, train/stop.py).
Either way the status goes to the run's database, ``summary.json`` and a ``run_stop`` line
with status ``aborted`` in ``events.log``, as far as the machine still lets them be written
(what could not be is said in the message; train/recorder.py writes them), and the exit
status is 1 (a signal's: 128 + its number).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from speechperf.atomic import DiskFullError, disk_full
from speechperf.errors import MachineFault, RunFailed, SpeechperfError, in_words
from speechperf.train.stop import Interrupted
from speechperf.train.step import TrainingDiverged


def check_trained(model: torch.nn.Module, prog, tc) -> None:
    """At the end of an epoch (one host read): raise ``TrainingDiverged`` when the weights hold
    a non-finite value, or when more than ``train.stop.max_skipped_fraction`` of the steps so far
    were skipped for non-finite losses or gradients (e.g. ``lr=1e30``: every update blows up)."""
    if prog.iteration and prog.skipped_steps > tc.stop.max_skipped_fraction * prog.iteration:
        raise TrainingDiverged(f"{prog.skipped_steps} of {prog.iteration} steps were skipped for non-finite losses or "
                               f"gradients (more than train.stop.max_skipped_fraction={tc.stop.max_skipped_fraction}); "
                               f"lower train.optim.lr={tc.optim.lr}")
    finite = torch.stack([p.detach().isfinite().all() for p in model.parameters()])
    if not bool(finite.all()):
        bad = [name for (name, _), ok in zip(model.named_parameters(), finite.tolist()) if not ok]
        raise TrainingDiverged(f"non-finite weights after epoch {prog.epoch} ({len(bad)} tensors: "
                               f"{', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); "
                               f"lower train.optim.lr={tc.optim.lr}")


def as_fault(e: BaseException, out: Path) -> RunFailed | None:
    """``e`` as a named failure of the run in ``out``: itself when it already is one, a
    DiskFullError or MachineFault for an OS error (or torch's wrapped ENOSPC), else None."""
    if isinstance(e, RunFailed):
        return e
    if isinstance(e, SpeechperfError) or not isinstance(e, (OSError, RuntimeError)):
        return None
    if _peer_lost(e):
        return PeerLost(f"rank {os.environ.get('RANK', '0')} lost its process group ({in_words(e)}): another "
                        f"process of the run in {out} stopped; under torchrun --max-restarts the group restarts and "
                        "continues from the last checkpoint, else run the same command again")
    if disk_full(e, Path(out)):
        return DiskFullError.writing(getattr(e, "filename", None) or out, str(e))
    if isinstance(e, OSError):
        where = e.filename or out
        return MachineFault(f"{where}: {e.strerror or e} (the run in {out} stopped; fix this and run the same command "
                            "again: it continues from the last checkpoint)")
    return None


class PeerLost(RunFailed):
    """A collective failed because another rank of the run died or left (torchrun restarts)."""


def _peer_lost(e: BaseException) -> bool:
    """A collective's failure: torch's DistError (DistBackendError, DistNetworkError), or the
    RuntimeError older gloo transports raise when a peer's connection closes."""
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("Connection closed by peer" in text or "gloo" in text.lower()
                                            or "Connection reset by peer" in text)


def failure_status(e: BaseException) -> str:
    """The status a failed run records: ``diverged: ...``, ``failed: disk full``, ``failed: ...``."""
    if isinstance(e, TrainingDiverged):
        return f"diverged: {e}"
    if isinstance(e, DiskFullError):
        return "failed: disk full"
    if isinstance(e, Interrupted):
        return f"failed: interrupted ({e.signal_name})"
    if isinstance(e, KeyboardInterrupt):
        return "failed: interrupted"
    return f"failed: {type(e).__name__}: {e}"
