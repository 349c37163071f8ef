"""Asynchronous algorithms through a parameter server on torch.distributed.rpc (paper 003).

Rank 0 hosts the server (and trains like every other rank); workers reach it with rpc.
- ``asgd``: every tau local steps a worker pushes its accumulated update (its parameters
  minus those it last pulled, i.e. -lr x the summed gradients) and pulls the server's
  model; the server applies each push as it arrives (Eq. 2), so updates may be stale: the
  server records by how many other pushes each one was overtaken.
- ``easgd``: every tau local steps an elastic exchange, w_i <- w_i - alpha (w_i - w~),
  w~ <- w~ + alpha (w_i - w~) (Eq. 9): the sum of the two is conserved.
``round_robin`` makes the server serve workers in turn (for exact tests against a serial
simulation); in real runs pushes are served first come, first served.
"""
from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed.rpc as rpc
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from speechperf.parallel.algorithms import AlgoConfig, Algorithm, register_algorithm

SERVER = "ps"
_server: "ParameterServer | None" = None


class ParameterServer:
    """The global model and the rules to update it; methods are called through rpc."""

    def __init__(self, params: torch.Tensor, workers: int, alpha: float, round_robin: bool = False):
        self.w = params.clone()
        self.workers, self.alpha, self.round_robin = workers, alpha, round_robin
        self.cond = threading.Condition()
        self.turn, self.version = 0, 0
        self.staleness: list[int] = []

    def _wait_turn(self, rank: int) -> None:
        if self.round_robin:
            self.cond.wait_for(lambda: self.turn == rank)

    def _next(self) -> None:
        self.turn = (self.turn + 1) % self.workers
        self.cond.notify_all()

    def push_pull(self, rank: int, delta: torch.Tensor, seen: int) -> tuple[torch.Tensor, int]:
        """ASGD: apply a worker's update, return the current model and its version."""
        with self.cond:
            self._wait_turn(rank)
            self.w += delta
            self.staleness.append(self.version - seen)
            self.version += 1
            self._next()
            return self.w.clone(), self.version

    def elastic(self, rank: int, local: torch.Tensor) -> torch.Tensor:
        """EASGD exchange: move the centre toward the worker; return alpha (w_i - w~)."""
        with self.cond:
            self._wait_turn(rank)
            diff = self.alpha * (local - self.w)
            self.w += diff
            self.version += 1
            self._next()
            return diff

    def pull(self) -> tuple[torch.Tensor, int]:
        with self.cond:
            return self.w.clone(), self.version


def _call(method: str, *args):
    return getattr(_server, method)(*args)


def start_rpc(rank: int, world: int) -> None:
    """RPC beside the process group, on the next port (torchrun sets MASTER_ADDR/PORT)."""
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500")) + 1
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{addr}:{port}", rpc_timeout=600)
    # Under torchrun every store is a client of the agent's store, and nobody would serve
    # this port: rank 0 must host the rpc rendezvous itself (hangs otherwise: observed).
    agent = os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        rpc.init_rpc(SERVER if rank == 0 else f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    finally:
        if agent is not None:
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent


class _Async(Algorithm):
    """Shared set-up: rank 0 creates the server from its model; every rank pulls it."""

    round_robin = False

    def __init__(self, cfg: AlgoConfig, world: int, rank: int = 0):
        super().__init__(cfg, world, rank)
        self.seen = 0

    def setup(self, model):
        global _server
        import torch.distributed as dist

        if self.rank == 0:
            _server = ParameterServer(parameters_to_vector(model.parameters()).detach(), self.world,
                                      self.cfg.easgd_alpha, self.round_robin)
        if dist.is_initialized():
            dist.barrier()  # the server exists before anyone calls it
        w, self.seen = rpc.rpc_sync(SERVER, _call, args=("pull",))
        vector_to_parameters(w, model.parameters())
        self.anchor = w.clone()
        return model

    def _rpc(self, method: str, *args):
        t = time.perf_counter()
        out = rpc.rpc_sync(SERVER, _call, args=(method, *args))
        self.stats.seconds += time.perf_counter() - t
        self.stats.bytes += 2 * self.anchor.numel() * self.anchor.element_size()
        self.stats.syncs += 1
        return out

    def end_epoch(self, model):
        """Asynchronous: nobody waits for anybody at the end of an epoch."""

    # A checkpoint keeps only the server's model (eval_vector) and the base state: after a
    # restart the server starts from it and every worker pulls it, so the workers' own
    # models (EASGD: away from the centre) and the staleness counts start afresh. That is
    # an approximation of the uninterrupted run, accepted since asynchronous runs are not
    # reproducible step by step anyway.

    def eval_vector(self, model) -> torch.Tensor:
        """The server's model (EASGD: the centre variable)."""
        return rpc.rpc_sync(SERVER, _call, args=("pull",))[0]

    def finish(self, model):
        vector_to_parameters(self.eval_vector(model), model.parameters())


@register_algorithm("asgd")
class ASGD(_Async):
    def after_step(self, model, frames):
        super().after_step(model, frames)
        if self.steps % self.cfg.sync_period == 0:
            local = parameters_to_vector(model.parameters()).detach()
            w, self.seen = self._rpc("push_pull", self.rank, local - self.anchor, self.seen)
            vector_to_parameters(w, model.parameters())
            self.anchor = w.clone()


@register_algorithm("easgd")
class EASGD(_Async):
    def after_step(self, model, frames):
        super().after_step(model, frames)
        if self.steps % self.cfg.sync_period == 0:
            local = parameters_to_vector(model.parameters()).detach()
            diff = self._rpc("elastic", self.rank, local)
            vector_to_parameters(local - diff, model.parameters())


def server_staleness() -> list[int]:
    return list(_server.staleness) if _server is not None else []
