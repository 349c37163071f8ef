"""Atomic training checkpoints: everything needed to continue a run bit for bit.

A checkpoint holds the model, optimizer and scheduler state, the position in the data
(epoch and next batch), the TTA clock, RNG states, the evaluation history and the
RunConfig, so that ``train --resume RUN`` needs nothing else.

It also holds the number of intra-op threads the run computed with. On CPU the result of
a step depends on it: ATen's parallel reductions (the sums of the masked batch norm, of
the loss, of weight gradients) give each thread a slice and add the partial sums, so 1
and 2 threads round differently in the last bits (measured: ``x.sum()`` of a conv output
differs, the elementwise conv, batch norm and LSTM outputs do not). With
``train.system.threads=0`` the count is whatever the process was given (the CPUs in its affinity
mask, ``OMP_NUM_THREADS``), so a run resumed with another count drifted apart: the
scalar loss of the first resumed steps still rounded equal and the difference showed from
the second or third on. ``set_rng_state`` therefore restores
the count with the RNG states.

A checkpoint is data, never code: run folders are copied between machines, and unpickling a
file runs whatever its pickle names. It is therefore read with ``torch.load(weights_only=True)``
(tensors and plain values only) and holds nothing else: the numpy and python RNG states are
stored as their parts (a tensor of the 32-bit words and ints), the configuration and progress as plain
dicts and lists. A file holding anything else, or of another format, is refused by name before
any of it is interpreted.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from speechperf.errors import SpeechperfError
from speechperf.results.checkpoint_writer import CheckpointWriter
from speechperf.results.layout import CHECKPOINT_FILE
from speechperf.results.progress import Progress
from speechperf.rng import rng_state, set_rng_state

FORMAT = 2  # the "format" key of every checkpoint; the only one this release reads
# the checkpoint's keys (:func:`contents`); readers index a loaded checkpoint with these
FORMAT_KEY, RUN_ID, CONFIG, PROGRESS, RNG = "format", "run_id", "config", "progress", "rng"
MODEL, OPTIMIZER, SCHEDULER, SCALER = "model", "optimizer", "scheduler", "scaler"  # TrainState's


class CheckpointError(SpeechperfError):
    """A checkpoint is missing, truncated or of another format."""


def contents(run_id: str, config: dict, progress: dict, state: dict) -> dict:
    """Everything a checkpoint holds, the one place its keys are named: format, the run's id and
    configuration, ``progress`` (results/progress.py, as a dict), the ``state`` dicts of the
    trainer (:meth:`TrainState.state_dict`, and the data-parallel algorithm's: speechperf/algorithms)
    and the RNG states."""
    return {FORMAT_KEY: FORMAT, RUN_ID: run_id, CONFIG: _plain(config, CONFIG),
            PROGRESS: _plain(progress, PROGRESS), **state, RNG: rng_state()}


def _plain(value, where: str):
    """``value`` as plain values that ``weights_only`` reads back: a numpy scalar (a measured
    rate, say) becomes its python number, anything else that is not plain is refused here,
    when the checkpoint is written, not when a resume cannot read it."""
    if isinstance(value, dict):
        return {k: _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool, torch.Tensor)):
        return value
    raise TypeError(f"checkpoint {where} is a {type(value).__name__}, not a plain value or tensor")


@dataclass
class TrainState:
    """What the training loop trains and a checkpoint restores: model, optimizer, learning-rate
    scheduler and fp16 gradient scaler (``model`` without DDP or compile wrappers)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler

    def state_dict(self, model: dict | None = None, optimizer: dict | None = None) -> dict:
        """The state dicts; ``model``, ``optimizer``: theirs as the caller gathered them (a sharded
        model's, whole: train/trainer.py), in place of the modules' own."""
        return {MODEL: self.model.state_dict() if model is None else model,
                OPTIMIZER: self.optimizer.state_dict() if optimizer is None else optimizer,
                SCHEDULER: self.scheduler.state_dict(), SCALER: self.scaler.state_dict()}

    def load(self, ckpt: dict, model_and_optimizer: bool = True) -> None:
        """Restore the state and the RNG streams of ``ckpt`` (its progress is the caller's); without
        ``model_and_optimizer`` those two are the caller's (a sharded model's: train/trainer.py)."""
        if model_and_optimizer:
            self.model.load_state_dict(ckpt[MODEL])
            self.optimizer.load_state_dict(ckpt[OPTIMIZER])
        self.scheduler.load_state_dict(ckpt[SCHEDULER])
        self.scaler.load_state_dict(ckpt[SCALER])
        set_rng_state(ckpt[RNG])


def save(run, progress: Progress, state: dict, writer: CheckpointWriter | None = None) -> None:
    """Write the checkpoint of ``run`` (results/run.py's Run) atomically, the previous one
    surviving a crash mid-write: the run's pending rows first, then :func:`contents` with
    ``progress`` holding the logs' sizes now (a resume cuts them back to these) and ``state``
    (:meth:`TrainState.state_dict`, the algorithm's keys). The file is the one the run's writer
    (``run.checkpoint_writer()``) is bound to: this function never names a path.

    With ``writer`` (results/checkpoint_writer.py, the run's) the file is written on its background
    thread: this waits for the writer's previous write (raising its error, naming the file), copies
    the state to host memory and returns; the caller waits for the last write before the run ends
    (``writer.wait()``). Until the write completes, the previous checkpoint is the one on disk,
    and a resume from it cuts the rows and log lines recorded since (train/admission.py). Without
    one the run's own writer writes it and is waited for: written (or its error raised) on return."""
    waited = writer is None
    writer = writer or run.checkpoint_writer()
    writer.wait()  # at most one write in flight; a failed one stops the run here
    run.rows.flush()
    progress.log_sizes = run.log.log_sizes()
    writer.write(contents(run.run_id, run.config, asdict(progress), state), progress.iteration)
    if waited:
        writer.wait()


def load(run: Path) -> dict:
    """``RUN/checkpoint.pt`` of this format, read as data only (any rank may read it; only rank 0
    writes): a file that would need code to load (a crafted pickle) or that is not a speechperf
    checkpoint is refused by name."""
    path = Path(run) / CHECKPOINT_FILE
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the run stopped before its first checkpoint")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for truncated, foreign or code-carrying files
        raise CheckpointError(f"{path} cannot be read: {_why_unreadable(e)}") from e
    found = state.get(FORMAT_KEY) if isinstance(state, dict) else None
    if found != FORMAT:
        raise CheckpointError(f"{path} cannot be read: {_why_format(found)}")
    return state


def _why_unreadable(error: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file: not a speechperf checkpoint."""
    lines = str(error).strip().splitlines()
    refused = next((line.strip() for line in lines if "Unsupported global" in line), None)
    if refused:  # weights_only's unpickler stopped at a name it would have had to call
        return f"not a speechperf checkpoint: it holds objects other than tensors and plain values ({refused})"
    return f"not a speechperf checkpoint ({type(error).__name__}: {lines[0] if lines else ''})"


def _why_format(found) -> str:
    if found is None:
        return f"not a speechperf checkpoint (no format {FORMAT} dictionary inside)"
    return f"format {found!r}, not {FORMAT}: written by a newer release of speechperf, or not a speechperf checkpoint"
