"""``asgd``: asynchronous SGD through a parameter server on rank 0 (param_server.py,
torch.distributed.rpc), and the asynchronous algorithms' common part (easgd.py builds on it).

Every ``sync_every`` steps a worker pushes its update and pulls the server's model; nobody
waits for anybody, except at evaluations (the server's model is evaluated, after every
rank's pushes). ``round_robin`` serves the workers in turn: deterministic (tests, exact
resume); without it a resumed run continues from the same state but is not the
uninterrupted one step for step.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from speechperf.algorithms import param_server as ps
from speechperf.algorithms import register_algorithm
from speechperf.algorithms.local_sgd import LocalSGD, LocalSGDConfig


@dataclass(frozen=True)
class ASGDConfig(LocalSGDConfig):
    """The parameter server's order of service."""

    name: str = "asgd"  # the registry key
    round_robin: bool = False  # the server serves the workers in turn (deterministic: tests, exact resume)


class AsyncSGD(LocalSGD):
    """The asynchronous algorithms' common part: the server on rank 0, from the common start
    that wrap broadcast (every rank holds it: none pulls it). A checkpoint holds the server's
    model and version (rank 0) and every rank's own model, optimizer, RNG and last pull."""

    @classmethod
    def check_launch(cls, cfg, world, train=None):
        ps.check_port(cfg.name)  # rank 0 hosts the server's rendezvous on MASTER_PORT + 1

    def server_alpha(self) -> float:
        """The server's elastic moving rate (EASGD's); ASGD's server applies pushes as they come."""
        return 0.0

    def start(self):
        ps.start_rpc(self.rank, self.world)
        if self.rank == 0:
            ps.host(self._flat(), self.world, self.server_alpha(), self.cfg.round_robin)
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
        w, version = ps.call("pull")
        return {"server": w, "version": version}

    def load_own_state(self, saved):
        if self.rank == 0:
            ps.call("restore", saved["server"], saved["version"])
        if self.world > 1:
            dist.barrier()  # restored before any rank pushes

    def rank_state(self):
        return {"anchor": self.anchor.clone(), "seen": self.seen}

    def load_rank_state(self, mine):
        self.anchor, self.seen = mine["anchor"].clone(), mine["seen"]

    def close(self, graceful=True):
        ps.stop_rpc(graceful)


@register_algorithm("asgd", ASGDConfig)
class ASGD(AsyncSGD):
    """A worker pushes its accumulated update (paper 003, Eq. 2) and pulls the server's model."""

    def synchronize(self):
        local = self._flat()
        w, self.seen = ps.call("push_pull", self.rank, local - self.anchor, self.seen)
        self._unflat(w)
        self.anchor = w.clone()
        return 2 * local.numel() * local.element_size()  # the update sent, the model received
