"""What every data-parallel algorithm is: its config's common field, its communication meter
and the hooks the one training loop (train/loop.py) calls, one line each:

- ``wrap(local)``: the module the step trains (``sync``: DDP; local SGD: the model itself,
  every rank starting from rank 0's weights);
- ``after_step(batches_done)``: after each optimizer step (local SGD synchronizes every
  ``algo.sync_every`` batches of the epoch);
- ``before_eval(batches_done)``: on every rank before an evaluation; returns the model
  rank 0 evaluates (BMUF: its global model); local SGD synchronizes the epoch's last,
  shorter block here, so that every epoch ends on a common model;
- ``after_eval()``: after an epoch's evaluation (fsdp: rank 0's evaluation copy leaves the device);
- ``state_dict(state)`` / ``load_state_dict(ckpt, state)``: what a checkpoint needs beyond
  rank 0's model, optimizer and RNG (local SGD: every rank's own, and the global model);
  tensors and plain values only (results/checkpoint.py);
- ``comm``: communication seconds and bytes, taken per step into the iteration rows;
- ``close()``: at the end (asgd, easgd: rpc ends; at once on a failed rank).

The synchronization points are a pure function of the progress a checkpoint holds
(``prog.start_batch``: batches done in this epoch), so a run resumed inside an epoch
synchronizes where the uninterrupted one did.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AlgoConfig:
    """The ``[algo]`` section: the data-parallel algorithm of a run launched by torchrun.

    Each algorithm's config subclasses it with its own fields, always written ``algo.FIELD``
    on the command line (a bare ``name`` or ``sync_every`` is the model's or the loop's)."""

    name: str = "sync"  # the algorithm (speechperf/algorithms' registry; DEFAULT there); its own config holds the rest

    def problems(self) -> list[str]:
        """One message per invalid value, naming ``algo.FIELD=value``."""
        return []


@dataclass
class CommMeter:
    """Communication of this rank: totals, and what is not yet taken into an iteration row."""

    seconds: float = 0.0  # in collectives (DDP: buckets' all-reduce in flight, overlapping the backward)
    bytes: int = 0  # payload this rank sent (an all-reduce counted once)
    pending_s: float = 0.0  # seconds since the last take (DDP's hook adds them from gloo's thread,
    # before the step ends)
    pending_bytes: int = 0  # bytes since the last take

    def add(self, seconds: float, nbytes: int) -> None:
        self.seconds += seconds
        self.bytes += nbytes
        self.pending_s += seconds
        self.pending_bytes += nbytes

    def take(self) -> tuple[float, int]:
        """(seconds, bytes) since the last take: one step's, where the loop takes it after each step."""
        out = (self.pending_s, self.pending_bytes)
        self.pending_s, self.pending_bytes = 0.0, 0
        return out


class Algorithm:
    """One process, nothing to synchronize: the hooks are identities (``single``)."""

    name = "base"  # the registry key (set by register_algorithm)
    config = AlgoConfig  # its config dataclass (set by register_algorithm)
    periodic = False  # synchronizes every algo.sync_every steps (the local-SGD family); else every step or never
    # wrap re-parameterizes the model (fsdp: DTensor shards): the trainer builds the optimizer after wrap,
    # and saves and restores the model and optimizer through whole_state / load_whole_state (fsdp.py)
    shards = False

    def __init__(self, cfg: AlgoConfig, world: int, rank: int = 0, device: torch.device | None = None, train=None):
        self.cfg, self.world, self.rank = cfg, world, rank
        self.train = train  # the run's [train] section (None: not known)
        self.device = torch.device("cpu") if device is None else device
        self.comm = CommMeter()
        self.core: torch.nn.Module | None = None  # the unwrapped model (set by wrap)

    @classmethod
    def check_launch(cls, cfg: AlgoConfig, world: int, train=None) -> None:
        """Refuse (ConfigError) a launch this algorithm cannot train, before anything exists
        (the loop asks on rank 0, before the run folder; ``train``: the run's [train] section,
        None where unknown); nothing to refuse here."""

    def wrap(self, local: torch.nn.Module) -> torch.nn.Module:
        """The module the step trains, from ``local`` (the model, compiled or not)."""
        self.core = unwrapped(local)
        return local

    def after_step(self, batches_done: int) -> None:
        """After the optimizer step of batch ``batches_done`` (counted from 1 in its epoch)."""

    def before_eval(self, batches_done: int) -> torch.nn.Module:
        """Every rank, before an evaluation: the model rank 0 evaluates."""
        return self.core

    def after_eval(self) -> None:
        """Every rank, after an epoch's evaluation (the model :meth:`before_eval` gave is done with)."""

    def state_dict(self, state) -> dict:
        """Checkpoint keys beyond ``TrainState``'s (a collective: every rank calls it; the
        dict matters on rank 0, which writes the checkpoint)."""
        return {}

    def load_state_dict(self, ckpt: dict, state) -> None:
        """Continue from ``ckpt`` after ``state.load(ckpt)`` and ``wrap``."""

    def close(self, graceful: bool = True) -> None:
        """Every rank, after training and the final evaluation; not ``graceful``: this rank's
        run failed."""


def unwrapped(local: torch.nn.Module) -> torch.nn.Module:
    """The model itself under torch.compile's wrapper (what is evaluated, averaged and saved)."""
    return getattr(local, "_orig_mod", local)
