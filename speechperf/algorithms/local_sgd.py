"""Local SGD, the common part of bsp, bmuf, diloco, asgd and easgd: every rank trains its
own model; every ``sync_every`` batches of an epoch, and at its end, the subclass's
``synchronize`` combines them.

Floating-point buffers (batch-norm statistics) are averaged at every synchronization. A
checkpoint holds every rank's own model, optimizer and RNG, gathered to rank 0.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.distributed as dist

from speechperf.algorithms.base import AlgoConfig, Algorithm, unwrapped
from speechperf.errors import ConfigError
from speechperf.rng import rng_state, set_rng_state


@dataclass(frozen=True)
class LocalSGDConfig(AlgoConfig):
    """The local-SGD family's common field."""

    sync_every: int = 1  # local optimizer steps between synchronizations (tau, H); bsp, bmuf and diloco also at every
    # epoch's end

    def problems(self) -> list[str]:
        return [f"algo.sync_every={self.sync_every} must be >= 1"] if self.sync_every < 1 else []


def sync_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """What local SGD synchronizes: the parameters, then the floating-point buffers."""
    return [p.detach() for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


class LocalSGD(Algorithm, ABC):
    """Every rank trains its own model; every ``sync_every`` batches of an epoch, and at its
    end, :meth:`synchronize` combines them (subclasses: the rule)."""

    periodic = True

    def wrap(self, local):
        self.core = unwrapped(local)
        if self.world > 1:  # a common start (the seeds agree already; a user's init may not)
            for t in sync_tensors(local):
                dist.broadcast(t, 0)
        self.start()
        return local

    def start(self) -> None:
        """The algorithm's own state, from the common starting model."""

    def after_step(self, batches_done):
        if batches_done % self.cfg.sync_every == 0:
            self._timed_sync()

    def before_eval(self, batches_done):
        if batches_done % self.cfg.sync_every:  # the epoch's last block, shorter than sync_every
            self._timed_sync()
        return self.core

    def _timed_sync(self) -> None:
        t = time.perf_counter()
        nbytes = self.synchronize()
        self.comm.add(time.perf_counter() - t, nbytes)

    def mean(self) -> tuple[list[torch.Tensor], int]:
        """The mean over ranks of :func:`sync_tensors` (new tensors) and the bytes sent.

        torch's ``average_parameters`` (one flat all-reduce, divided by the world first) on
        copies: it rebinds each tensor's ``.data`` to a view of its flat buffer, which the
        model's own parameters should not be (the optimizer and a compiled model hold them)."""
        # heavy: torch.distributed's parts load only when a run uses them
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        copies = [t.detach().clone() for t in sync_tensors(self.core)]
        if self.world > 1:
            average_parameters(iter(copies), None)
        return copies, sum(t.numel() * t.element_size() for t in copies)

    @abstractmethod
    def synchronize(self) -> int:
        """Combine the ranks' models (the algorithm's rule); returns the bytes this rank sent."""

    def params_and_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        params = [p.detach() for p in self.core.parameters()]
        return params, sync_tensors(self.core)[len(params):]

    @torch.no_grad()
    def assign(self, tensors: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        for t, v in zip(tensors, values):
            t.copy_(v)

    # ---- checkpoint: every rank's own model, optimizer and RNG, gathered to rank 0 ----------
    def state_dict(self, state) -> dict:
        mine = _to_cpu({"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
                        "rng": rng_state(), **self.rank_state()})
        own = self.own_state() if self.rank == 0 else {}
        ranks = [None] * self.world if self.rank == 0 else None
        if self.world > 1:
            dist.gather_object(mine, ranks, dst=0)
        else:
            ranks = [mine]
        return {"algo": {"name": self.name, "ranks": ranks, **own}} if self.rank == 0 else {}

    def load_state_dict(self, ckpt, state):
        saved = ckpt.get("algo")
        if saved is None or saved.get("name") != self.name:
            raise ConfigError(f"the checkpoint holds no state of algo.name={self.name}")
        if len(saved["ranks"]) != self.world:
            raise ConfigError(f"the checkpoint is of {len(saved['ranks'])} workers, this launch has {self.world}: "
                              f"algo.name={self.name} continues with as many workers as it trained with")
        mine = saved["ranks"][self.rank]
        state.model.load_state_dict(mine["model"])
        state.optimizer.load_state_dict(mine["optimizer"])
        set_rng_state(mine["rng"])
        self.load_rank_state(mine)
        self.load_own_state(saved)

    def own_state(self) -> dict:
        """The algorithm's state common to every rank, from rank 0 (tensors and plain values)."""
        return {}

    def load_own_state(self, saved: dict) -> None:
        pass

    def rank_state(self) -> dict:
        """The algorithm's state of this rank alone (gathered with its model)."""
        return {}

    def load_rank_state(self, mine: dict) -> None:
        pass


def _to_cpu(value):
    """``value`` with every tensor copied to the CPU (gathered by pickling, stored in the checkpoint)."""
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value.detach().cpu() if torch.is_tensor(value) else value
