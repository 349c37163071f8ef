"""Data-parallel training algorithms as hooks of the one training loop (train/loop.py).

``algo.name`` (config/train.py's ``AlgoConfig``) picks one; the loop calls it where it
needs to, one line each:

- ``wrap(local)``: the module the step trains (``sync``: DDP; local SGD: the model itself,
  every rank starting from rank 0's weights);
- ``after_step(batches_done)``: after each optimizer step (local SGD synchronizes every
  ``algo.sync_every`` batches of the epoch);
- ``before_eval(batches_done)``: on every rank before an evaluation; returns the model
  rank 0 evaluates (BMUF: its global model); local SGD synchronizes the epoch's last,
  shorter block here, so that every epoch ends on a common model;
- ``state_dict(state)`` / ``load_state_dict(ckpt, state)``: what a checkpoint needs beyond
  rank 0's model, optimizer and RNG (local SGD: every rank's own, and the global model);
  tensors and plain values only (results/checkpoint.py);
- ``comm``: communication seconds and bytes, taken per step into the iteration rows;
- ``close()``: at the end (asgd, easgd: rpc ends; at once on a failed rank).

The synchronization points are a pure function of the progress a checkpoint holds
(``prog.start_batch``: batches done in this epoch), so a run resumed inside an epoch
synchronizes where the uninterrupted one did.

The algorithms:

- ``single``: one process; refuses a launch of several.
- ``sync``: synchronous SGD, DDP as the loop always ran it (one process: the model itself).
  Its gradients go through torch's own ``allreduce_hook`` (DDP's default all-reduce, as a
  comm hook) wrapped to count bytes and seconds.
- ``bsp``: local SGD (paper 003's BSP, Eq. 1): every ``sync_every`` steps the models
  are averaged (torch's ``model_averaging.utils.average_parameters``).
- ``bmuf``: blockwise model-update filtering: G = mean(local) - global, Delta = zeta Delta
  + eta G, global += Delta; workers restart from global + zeta Delta (Nesterov, CBM-BMUF)
  or global. Defaults eta = 1, zeta = 1 - eta / (N C), C = 1.05 (Eq. 6).
- ``diloco``: DiLoCo (Douillard et al. 2023): the run's optimizer is the inner one for
  ``sync_every`` steps; the pseudo-gradient global - mean(local) goes through an outer SGD
  with Nesterov momentum (lr 0.7, momentum 0.9), the result is the new global model and
  every worker restarts from it.
- ``asgd``, ``easgd``: asynchronous, through a parameter server on rank 0
  (train/param_server.py, torch.distributed.rpc): every ``sync_every`` steps a worker
  pushes its update and pulls the server's model (ASGD), or makes an elastic exchange with
  the centre (EASGD, ``easgd_alpha``); nobody waits for anybody, except at evaluations
  (the server's model is evaluated, after every rank's pushes). ``algo.round_robin``
  serves the workers in turn: deterministic (tests, exact resume); without it a resumed
  run continues from the same state but is not the uninterrupted one step for step.

Floating-point buffers (batch-norm statistics) are averaged at every synchronization of
the local-SGD algorithms. Each algorithm's update rule is a function of tensors
(:func:`bmuf_update`, :class:`DiLoCoOuter`), which the tests check against a serial
simulation of the workers.

Layering: this module belongs to ``train`` (below the loop) and imports only torch, the
registry, the config (``AlgoConfig``, ``ConfigError``), the checkpoint's RNG states
(results/checkpoint.py) and train's param_server.
"""
from __future__ import annotations

import copy
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.distributed as dist

from speechperf.config import ConfigError
from speechperf.registry import Registry
from speechperf.results.checkpoint import rng_state, set_rng_state
from speechperf.config.train import AlgoConfig

ALGORITHMS = Registry("algorithm")  # name -> Algorithm subclass: the one list of algo.name values (and .periodic)


def register(name: str):
    """Decorator: register an :class:`Algorithm` subclass under ``name``."""
    def named(cls):
        cls.name = name
        return cls
    return ALGORITHMS.register(name, named)


@dataclass
class CommMeter:
    """Communication of this rank: totals, and what is not yet taken into an iteration row."""

    seconds: float = 0.0  # in collectives (DDP: buckets' all-reduce in flight, overlapping the backward)
    bytes: int = 0  # payload this rank sent (an all-reduce counted once)
    pending_s: float = 0.0  # seconds since the last take (DDP's hook adds them from gloo's thread, before the step ends)
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

    name = "base"
    periodic = False  # synchronizes every algo.sync_every steps (the local-SGD family); else every step or never

    def __init__(self, cfg: AlgoConfig, world: int, rank: int = 0, device: torch.device | None = None):
        self.cfg, self.world, self.rank = cfg, world, rank
        self.device = torch.device("cpu") if device is None else device
        self.comm = CommMeter()
        self.core: torch.nn.Module | None = None  # the unwrapped model (set by wrap)

    @classmethod
    def check_launch(cls, cfg: AlgoConfig, world: int) -> None:
        """Refuse (ConfigError) a launch this algorithm cannot train, before anything exists
        (the loop asks on rank 0, before the run folder); nothing to refuse here."""

    def wrap(self, local: torch.nn.Module) -> torch.nn.Module:
        """The module the step trains, from ``local`` (the model, compiled or not)."""
        self.core = _unwrapped(local)
        return local

    def after_step(self, batches_done: int) -> None:
        """After the optimizer step of batch ``batches_done`` (counted from 1 in its epoch)."""

    def before_eval(self, batches_done: int) -> torch.nn.Module:
        """Every rank, before an evaluation: the model rank 0 evaluates."""
        return self.core

    def state_dict(self, state) -> dict:
        """Checkpoint keys beyond ``TrainState``'s (a collective: every rank calls it; the
        dict matters on rank 0, which writes the checkpoint)."""
        return {}

    def load_state_dict(self, ckpt: dict, state) -> None:
        """Continue from ``ckpt`` after ``state.load(ckpt)`` and ``wrap``."""

    def close(self, graceful: bool = True) -> None:
        """Every rank, after training and the final evaluation; not ``graceful``: this rank's
        run failed."""


@register("single")
class Single(Algorithm):
    def __init__(self, cfg, world, rank=0, device=None):
        self.check_launch(cfg, world)
        super().__init__(cfg, world, rank, device)

    @classmethod
    def check_launch(cls, cfg, world):
        if world != 1:
            raise ConfigError(f"algo.name=single trains in one process, not {world}: use algo.name=sync "
                              "(or bsp, bmuf, diloco) under torchrun")


@register("sync")
class Sync(Algorithm):
    """DDP: gradients averaged every step (the loop's data-parallel path since its start)."""

    def wrap(self, local):
        self.core = _unwrapped(local)
        if self.world == 1:
            return local
        ids = [self.device.index] if self.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(local, device_ids=ids)
        model.register_comm_hook(self.comm, counted_allreduce)
        return model


def _unwrapped(local: torch.nn.Module) -> torch.nn.Module:
    """The model itself under torch.compile's wrapper (what is evaluated, averaged and saved)."""
    return getattr(local, "_orig_mod", local)


def counted_allreduce(meter: CommMeter, bucket):  # DDP checks a return annotation, which this module's are strings
    """torch's ``default_hooks.allreduce_hook`` (DDP's own all-reduce: divide by the world,
    sum), returning its future of the averaged bucket; counts the bucket's bytes and the
    seconds until its all-reduce completes (under NCCL the future completes when the work
    is queued: the seconds there are the host's)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buf, t0 = bucket.buffer(), time.perf_counter()
    nbytes = buf.numel() * buf.element_size()

    def done(fut):
        meter.add(time.perf_counter() - t0, nbytes)
        return fut.value()

    return allreduce_hook(None, bucket).then(done)


def _sync_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """What local SGD synchronizes: the parameters, then the floating-point buffers."""
    return [p.detach() for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


class LocalSGD(Algorithm, ABC):
    """Every rank trains its own model; every ``sync_every`` batches of an epoch, and at its
    end, :meth:`synchronize` combines them (subclasses: the rule)."""

    periodic = True

    def wrap(self, local):
        self.core = _unwrapped(local)
        if self.world > 1:  # a common start (the seeds agree already; a user's init may not)
            for t in _sync_tensors(local):
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
        """The mean over ranks of :func:`_sync_tensors` (new tensors) and the bytes sent.

        torch's ``average_parameters`` (one flat all-reduce, divided by the world first) on
        copies: it rebinds each tensor's ``.data`` to a view of its flat buffer, which the
        model's own parameters should not be (the optimizer and a compiled model hold them)."""
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        copies = [t.detach().clone() for t in _sync_tensors(self.core)]
        if self.world > 1:
            average_parameters(iter(copies), None)
        return copies, sum(t.numel() * t.element_size() for t in copies)

    @abstractmethod
    def synchronize(self) -> int:
        """Combine the ranks' models (the algorithm's rule); returns the bytes this rank sent."""

    def _params_and_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        params = [p.detach() for p in self.core.parameters()]
        return params, _sync_tensors(self.core)[len(params):]

    @torch.no_grad()
    def _set(self, tensors: list[torch.Tensor], values: list[torch.Tensor]) -> None:
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


@register("bsp")
class BSP(LocalSGD):
    """Model averaging (Eq. 1, unweighted: every rank trains batches of the same size)."""

    def synchronize(self):
        mean, nbytes = self.mean()
        self._set(_sync_tensors(self.core), mean)
        return nbytes


def bmuf_update(global_: torch.Tensor, delta: torch.Tensor, mean: torch.Tensor, block_lr: float,
                momentum: float, nesterov: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One BMUF block (Eqs. 3-5): (new global, new Delta, the workers' next start).

    The block's update G is the workers' mean less the model they started the block from:
    the global model under classic block momentum (the paper's CBM, Eq. 3), the look-ahead
    ``global + momentum x Delta`` under Nesterov's (Chen & Huo's NBM). Measured from the
    global model instead, NBM counts the momentum twice (Delta grows as 2 x momentum x Delta):
    a 2-worker tiny run so diverged (dev CER 78-93 over 10 epochs, sync 35.7 after 4)."""
    delta = momentum * delta + block_lr * (mean - _bmuf_start(global_, delta, momentum, nesterov))
    global_ = global_ + delta
    return global_, delta, _bmuf_start(global_, delta, momentum, nesterov)


def _bmuf_start(global_: torch.Tensor, delta: torch.Tensor, momentum: float, nesterov: bool) -> torch.Tensor:
    """Where the workers start a block: the look-ahead (NBM) or the global model itself (CBM)."""
    return global_ + momentum * delta if nesterov else global_


@register("bmuf")
class BMUF(LocalSGD):
    """Blockwise model-update filtering; evaluates its global model."""

    @property
    def momentum(self) -> float:
        c = self.cfg
        return c.block_momentum if c.block_momentum >= 0 else 1.0 - c.block_lr / (self.world * c.bmuf_c)

    def start(self):
        params, _ = self._params_and_buffers()
        self.global_ = [p.clone() for p in params]
        self.delta = [torch.zeros_like(p) for p in params]

    def synchronize(self):
        mean, nbytes = self.mean()
        params, buffers = self._params_and_buffers()
        c, starts = self.cfg, []
        for i, m in enumerate(mean[:len(params)]):
            self.global_[i], self.delta[i], s = bmuf_update(self.global_[i], self.delta[i], m, c.block_lr,
                                                            self.momentum, c.nesterov)
            starts.append(s)
        self._set(params, starts)
        self._set(buffers, mean[len(params):])
        return nbytes

    def before_eval(self, batches_done):
        core = super().before_eval(batches_done)
        if not self.cfg.nesterov:
            return core  # the workers continue from the global model itself
        model = copy.deepcopy(core)  # the global model, not the look-ahead the workers continue from
        self._set([p.detach() for p in model.parameters()], self.global_)
        return model

    def own_state(self):
        return {"global": [t.clone() for t in self.global_], "delta": [t.clone() for t in self.delta]}

    def load_own_state(self, saved):
        self.global_ = [t.to(self.device) for t in saved["global"]]
        self.delta = [t.to(self.device) for t in saved["delta"]]


class DiLoCoOuter:
    """DiLoCo's outer step: torch's SGD with Nesterov momentum on the global parameters,
    whose gradient is the pseudo-gradient global - mean(local)."""

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float):
        self.params = [p.detach().clone().requires_grad_(False) for p in params]
        self.opt = torch.optim.SGD(self.params, lr=lr, momentum=momentum, nesterov=momentum > 0)

    @torch.no_grad()
    def step(self, mean: list[torch.Tensor]) -> list[torch.Tensor]:
        """The new global parameters (the tensors this object keeps) from the workers' mean."""
        for g, m in zip(self.params, mean):
            g.grad = g - m
        self.opt.step()
        for g in self.params:
            g.grad = None
        return self.params

    def state_dict(self) -> dict:
        return {"params": [p.clone() for p in self.params], "opt": self.opt.state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        with torch.no_grad():
            for p, v in zip(self.params, saved["params"]):
                p.copy_(v)
        self.opt.load_state_dict(saved["opt"])


@register("diloco")
class DiLoCo(LocalSGD):
    """Inner optimizer: the run's, for ``sync_every`` steps; outer: :class:`DiLoCoOuter`."""

    def start(self):
        params, _ = self._params_and_buffers()
        self.outer = DiLoCoOuter(params, self.cfg.outer_lr, self.cfg.outer_momentum)

    def synchronize(self):
        mean, nbytes = self.mean()
        params, buffers = self._params_and_buffers()
        self._set(params, self.outer.step(mean[:len(params)]))
        self._set(buffers, mean[len(params):])
        return nbytes

    def own_state(self):
        return {"outer": self.outer.state_dict()}

    def load_own_state(self, saved):
        self.outer.load_state_dict(saved["outer"])


class AsyncSGD(LocalSGD):
    """The asynchronous algorithms' common part: the server on rank 0, from the common start
    that wrap broadcast (every rank holds it: none pulls it). A checkpoint holds the server's
    model and version (rank 0) and every rank's own model, optimizer, RNG and last pull."""

    @classmethod
    def check_launch(cls, cfg, world):
        from speechperf.train import param_server as ps

        ps.check_port(cfg.name)  # rank 0 hosts the server's rendezvous on MASTER_PORT + 1

    def start(self):
        from speechperf.train import param_server as ps

        ps.start_rpc(self.rank, self.world)
        if self.rank == 0:
            ps.host(self._flat(), self.world, self.cfg.easgd_alpha, self.cfg.round_robin)
        if self.world > 1:
            dist.barrier()  # the server exists before anyone calls it
        # Every rank holds the server's model already (wrap broadcast it): no pull here. A
        # pull raced with the first pushes: a slow rank pulled a model others had moved (CI).
        self.anchor, self.seen = self._flat(), 0  # the model this rank last pulled, its version

    def _flat(self) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(self.core.parameters()).detach().cpu()

    @torch.no_grad()
    def _unflat(self, w: torch.Tensor) -> None:
        torch.nn.utils.vector_to_parameters(w.to(self.device), self.core.parameters())

    def before_eval(self, batches_done):
        """Rank 0 evaluates the server's model once every rank's pushes are in."""
        from speechperf.train import param_server as ps

        if self.world > 1:
            dist.barrier()
        model = self.core
        if self.rank == 0:
            model = copy.deepcopy(self.core)
            torch.nn.utils.vector_to_parameters(ps.call("pull")[0].to(self.device), model.parameters())
        if self.world > 1:
            dist.barrier()  # read before any rank pushes again (first come, first served, one could)
        return model

    def state_dict(self, state):
        if self.world > 1:  # every push so far served; none until rank 0 has read the server (own_state)
            dist.barrier()
        return super().state_dict(state)

    def own_state(self):
        from speechperf.train import param_server as ps

        w, version = ps.call("pull")
        return {"server": w, "version": version}

    def load_own_state(self, saved):
        from speechperf.train import param_server as ps

        if self.rank == 0:
            ps.call("restore", saved["server"], saved["version"])
        if self.world > 1:
            dist.barrier()  # restored before any rank pushes

    def rank_state(self):
        return {"anchor": self.anchor.clone(), "seen": self.seen}

    def load_rank_state(self, mine):
        self.anchor, self.seen = mine["anchor"].clone(), mine["seen"]

    def close(self, graceful=True):
        from speechperf.train import param_server as ps

        ps.stop_rpc(graceful)


@register("asgd")
class ASGD(AsyncSGD):
    def synchronize(self):
        from speechperf.train import param_server as ps

        local = self._flat()
        w, self.seen = ps.call("push_pull", self.rank, local - self.anchor, self.seen)
        self._unflat(w)
        self.anchor = w.clone()
        return 2 * local.numel() * local.element_size()  # the update sent, the model received


@register("easgd")
class EASGD(AsyncSGD):
    def synchronize(self):
        from speechperf.train import param_server as ps

        local = self._flat()
        self._unflat(local - ps.call("elastic", self.rank, local))
        return 2 * local.numel() * local.element_size()  # the model sent, the elastic difference received


def check(cfg: AlgoConfig) -> None:
    """Refuse an ``algo.name`` no algorithm is registered under (ConfigError, exit 2), before any
    run folder exists; the other ``algo`` values are checked with the preset (``AlgoConfig.problems``)."""
    if cfg.name not in ALGORITHMS:
        raise ConfigError(f"algo.name={cfg.name!r} is unknown; known: {', '.join(ALGORITHMS)}")


def make_algorithm(cfg: AlgoConfig, world: int, rank: int = 0, device: torch.device | None = None) -> Algorithm:
    """The configured algorithm for this process (``world`` processes in the run)."""
    return ALGORITHMS.lookup(cfg.name)(cfg, world, rank, device)


def check_launch(cfg: AlgoConfig, world: int) -> None:
    """Refuse a launch the configured algorithm cannot train (``Algorithm.check_launch``)."""
    ALGORITHMS.lookup(cfg.name).check_launch(cfg, world)
