"""Atomic training checkpoints: everything needed to continue a run bit for bit.

A checkpoint holds the model, optimizer and scheduler state, the position in the data
(epoch and next batch), the TTA clock, RNG states, the evaluation history and the
RunConfig, so that ``train --resume RUN`` needs nothing else.

It also holds the number of intra-op threads the run computed with. On CPU the result of
a step depends on it: ATen's parallel reductions (the sums of the masked batch norm, of
the loss, of weight gradients) give each thread a slice and add the partial sums, so 1
and 2 threads round differently in the last bits (measured: ``x.sum()`` of a conv output
differs, the elementwise conv, batch norm and LSTM outputs do not). With
``train.threads=0`` the count is whatever the process was given (the CPUs in its affinity
mask, ``OMP_NUM_THREADS``), so a run resumed with another count drifted apart: the
scalar loss of the first resumed steps still rounded equal and the difference showed from
the second or third on. ``set_rng_state`` therefore restores
the count with the RNG states.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from speechperf.atomic import atomic_torch_save
from speechperf.errors import SpeechperfError

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT = 1


class CheckpointError(SpeechperfError):
    """A checkpoint is missing, truncated or of another format."""


def rng_state() -> dict:
    """What makes the next steps' numbers: every RNG state and the intra-op thread count."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads()}


def set_rng_state(state: dict) -> None:
    """Restore ``rng_state()``; a checkpoint of format 1 written before the thread count was
    kept leaves the process's count as it is."""
    if state.get("threads") and state["threads"] != torch.get_num_threads():
        torch.set_num_threads(state["threads"])  # even above the cores now available: exact, only slower
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def contents(run_id: str, config: dict, progress: dict, state: dict) -> dict:
    """Everything a checkpoint holds, the one place its keys are named: format, the run's id and
    configuration, ``progress`` (train/progress.py, as a dict), the ``state`` dicts of the
    trainer (:meth:`TrainState.state_dict`; the parallel worker's own) and the RNG states."""
    return {"format": FORMAT, "run_id": run_id, "config": config, "progress": progress, **state, "rng": rng_state()}


@dataclass
class TrainState:
    """What the training loop trains and a checkpoint restores: model, optimizer, learning-rate
    scheduler and fp16 gradient scaler (``model`` without DDP or compile wrappers)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict()}

    def load(self, ckpt: dict) -> None:
        """Restore the state and the RNG streams of ``ckpt`` (its progress is the caller's)."""
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        set_rng_state(ckpt["rng"])


def save_checkpoint(run: Path, state: dict) -> Path:
    """Write ``RUN/checkpoint.pt`` (``state``: :func:`contents`) atomically; the previous one
    survives a crash mid-write."""
    path = Path(run) / CHECKPOINT_NAME
    atomic_torch_save(state, path)
    return path


def load_checkpoint(run: Path) -> dict:
    path = Path(run) / CHECKPOINT_NAME
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the run stopped before its first checkpoint")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"{path} cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a speechperf checkpoint of format {FORMAT}")
    return state
