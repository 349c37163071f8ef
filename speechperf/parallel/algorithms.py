"""Data-parallel training algorithms of paper 003 behind one interface, on torch.distributed.

Every algorithm: ``setup(model)`` (broadcast rank 0's model, wrap it), ``after_step(model,
frames)`` after each local optimizer step, ``finish(model)`` (final synchronization; a
rank whose data ran out keeps answering synchronizations with weight 0 until every rank
is done, so uneven data never hangs), and ``stats`` (communication seconds, bytes, syncs).

- ``single``: one worker, the baseline.
- ``sync``: synchronous SGD, gradients all-reduced every step (DDP).
- ``bsp``: local SGD; every tau steps the model is the frame-weighted mean of the local
  models (Eq. 1).
- ``bmuf``: every tau steps G = mean(local) - global, Delta = zeta Delta + eta G, global +=
  Delta (Eqs. 3-5); classical BMUF restarts workers from global, CBM-BMUF with Nesterov
  from global + zeta Delta. Defaults: eta = 1, zeta = 1 - eta / (N C) with C = 1.05 (Eq. 6:
  eta / (N (1 - zeta)) = C, slightly above 1).
BatchNorm running statistics are averaged at every synchronization.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from speechperf.errors import SpeechperfError
from speechperf.registry import Registry

ALGORITHMS = Registry("algorithm", ["speechperf.parallel.server"])  # server.py: the asynchronous ones


def register_algorithm(name: str):
    """Decorator: register an :class:`Algorithm` subclass under ``name`` (its ``name`` too)."""
    def named(cls):
        cls.name = name
        return cls
    return ALGORITHMS.register(name, named)


@dataclass(frozen=True)
class AlgoConfig:
    sync_period: int = 1  # tau: local steps between synchronizations (bsp, bmuf)
    block_lr: float = 1.0  # eta of BMUF
    block_momentum: float | None = None  # zeta of BMUF; None: 1 - eta / (N C)
    bmuf_c: float = 1.05  # C of Eq. 6
    nesterov: bool = True  # CBM-BMUF (Nesterov) or classical BMUF
    easgd_alpha: float = 0.1  # alpha = eta * lambda of EASGD (Eq. 9)


@dataclass
class CommStats:
    seconds: float = 0.0  # time inside collectives
    bytes: int = 0  # payload sent per rank (all-reduce counted once)
    syncs: int = 0


class Algorithm:
    name = "base"

    def __init__(self, cfg: AlgoConfig, world: int, rank: int = 0):
        if cfg.sync_period < 1:
            raise SpeechperfError(f"sync period must be >= 1, got {cfg.sync_period}")
        self.cfg, self.world, self.rank, self.stats, self.steps = cfg, world, rank, CommStats(), 0

    def setup(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.world > 1:
            self._timed(lambda: [dist.broadcast(t, 0) for t in _state_tensors(model)], _bytes(model))
        return model

    def after_step(self, model: torch.nn.Module, frames: int) -> None:
        self.steps += 1

    def finish(self, model: torch.nn.Module) -> None:
        pass

    def end_epoch(self, model: torch.nn.Module) -> None:
        """Bring the workers to a common model before the epoch's evaluation."""
        self.finish(model)

    def eval_vector(self, model: torch.nn.Module) -> torch.Tensor:
        """The parameters to evaluate (flattened): the model itself unless overridden."""
        return parameters_to_vector(model.parameters()).detach().clone()

    def state_dict(self) -> dict:
        """This rank's state beyond the model, taken after ``end_epoch`` for a checkpoint."""
        # steps: the synchronization cadence counts steps across epochs, so a restart that
        # reset it would synchronize at other steps than the uninterrupted run
        return {"steps": self.steps, "stats": asdict(self.stats)}

    def load_state_dict(self, state: dict, model: torch.nn.Module) -> None:
        """Continue from ``state``, after ``setup`` has given every rank the checkpoint's model."""
        self.steps = state["steps"]
        # setup's broadcast on restart is not training communication: the totals continue
        # as if the run had not stopped
        self.stats = CommStats(**state["stats"])

    def _timed(self, fn, nbytes: int):
        t = time.perf_counter()
        out = fn()
        self.stats.seconds += time.perf_counter() - t
        self.stats.bytes += nbytes
        self.stats.syncs += 1
        return out


def _state_tensors(model) -> list[torch.Tensor]:
    return [p.data for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


def _bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in _state_tensors(model))


@register_algorithm("single")
class Single(Algorithm):
    def __init__(self, cfg: AlgoConfig, world: int, rank: int = 0):
        if world != 1:
            raise SpeechperfError(f"'single' runs on one worker, not {world}")
        super().__init__(cfg, world, rank)


@register_algorithm("sync")
class SyncSGD(Algorithm):
    """DDP: gradients averaged every step (its all-reduce is timed by DDP itself, not here)."""

    def setup(self, model):
        model = super().setup(model)
        if self.world == 1:
            return model
        return torch.nn.parallel.DistributedDataParallel(model)


@register_algorithm("bsp")
class BSP(Algorithm):
    """Periodic model averaging weighted by the frames each worker trained on."""

    def __init__(self, cfg: AlgoConfig, world: int, rank: int = 0):
        super().__init__(cfg, world, rank)
        self.frames = 0

    def after_step(self, model, frames):
        super().after_step(model, frames)
        self.frames += frames
        if self.steps % self.cfg.sync_period == 0:
            self.sync(model, active=True)

    def _average(self, model, weight: float) -> bool:
        """Weighted mean of the active ranks' models into this one; False when no rank is active."""
        tensors = _state_tensors(model)
        flat = torch.cat([t.reshape(-1).double() for t in tensors] + [torch.tensor([weight, 1.0 if weight else 0.0],
                                                                                   dtype=torch.float64)])
        flat[:-2] *= weight
        self._timed(lambda: dist.all_reduce(flat), flat.numel() * 8)
        total, active = float(flat[-2]), float(flat[-1])
        if total > 0:
            offset = 0
            for t in tensors:
                n = t.numel()
                t.copy_((flat[offset: offset + n] / total).view_as(t).to(t.dtype))
                offset += n
        return active > 0

    def sync(self, model, active: bool) -> bool:
        more = self._average(model, float(self.frames) if active else 0.0)
        self.frames = 0
        return more

    def finish(self, model):
        if self.world == 1:
            return
        if self.steps % self.cfg.sync_period or self.frames:
            self.sync(model, active=True)
        while self.sync(model, active=False):  # keep answering until every rank is done
            pass


@register_algorithm("bmuf")
class BMUF(BSP):
    """Blockwise model-update filtering (CBM-BMUF with Nesterov momentum by default)."""

    def setup(self, model):
        model = super().setup(model)
        self.global_params = parameters_to_vector(model.parameters()).detach().clone()
        self.delta = torch.zeros_like(self.global_params)
        self.zeta = self.cfg.block_momentum
        if self.zeta is None:
            self.zeta = 1.0 - self.cfg.block_lr / (self.world * self.cfg.bmuf_c)
        return model

    def sync(self, model, active: bool) -> bool:
        # Eq. 3 uses the plain mean of the local models: weight 1 per active worker
        more = self._average(model, 1.0 if active else 0.0)
        self.frames = 0
        if not more:  # nobody trained since the last block: no update, the model stays as it is
            return False
        avg = parameters_to_vector(model.parameters()).detach()
        g = avg - self.global_params  # Eq. 3
        self.delta = self.zeta * self.delta + self.cfg.block_lr * g  # Eq. 4
        self.global_params = self.global_params + self.delta  # Eq. 5
        start = self.global_params + self.zeta * self.delta if self.cfg.nesterov else self.global_params
        vector_to_parameters(start.clone(), model.parameters())
        return more

    def eval_vector(self, model) -> torch.Tensor:
        """Evaluate the global model, not the Nesterov look-ahead the workers continue from."""
        return self.global_params.clone()

    def state_dict(self) -> dict:
        return {**super().state_dict(), "global": self.global_params.clone(), "delta": self.delta.clone()}

    def load_state_dict(self, state, model):
        super().load_state_dict(state, model)
        self.global_params, self.delta = state["global"].clone(), state["delta"].clone()
        # the workers resume where the last block left them: the look-ahead under Nesterov
        # (the same expression as in sync, so the restart is bitwise the uninterrupted run)
        start = self.global_params + self.zeta * self.delta if self.cfg.nesterov else self.global_params
        vector_to_parameters(start.clone(), model.parameters())


def make_algorithm(name: str, cfg: AlgoConfig, world: int, rank: int = 0) -> Algorithm:
    return ALGORITHMS.lookup(name)(cfg, world, rank)
