"""``diloco``: DiLoCo (Douillard et al. 2023). The run's optimizer is the inner one for
``sync_every`` steps; the pseudo-gradient global - mean(local) goes through an outer SGD with
Nesterov momentum, the result is the new global model and every worker restarts from it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from speechperf.algorithms import register_algorithm
from speechperf.algorithms.local_sgd import LocalSGD, LocalSGDConfig


@dataclass(frozen=True)
class DiLoCoConfig(LocalSGDConfig):
    """The outer optimizer of DiLoCo."""

    name: str = "diloco"  # the registry key
    outer_lr: float = 0.7  # learning rate of the outer SGD on the pseudo-gradient (Douillard et al. 2023)
    outer_momentum: float = 0.9  # Nesterov momentum of the outer SGD, in [0, 1)

    def problems(self) -> list[str]:
        checks = [(self.outer_lr > 0, f"algo.outer_lr={self.outer_lr} must be > 0"),
                  (0 <= self.outer_momentum < 1, f"algo.outer_momentum={self.outer_momentum} must be in [0, 1)")]
        return super().problems() + [msg for ok, msg in checks if not ok]


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


@register_algorithm("diloco", DiLoCoConfig)
class DiLoCo(LocalSGD):
    """Inner optimizer: the run's, for ``sync_every`` steps; outer: :class:`DiLoCoOuter`."""

    def start(self):
        params, _ = self.params_and_buffers()
        self.outer = DiLoCoOuter(params, self.cfg.outer_lr, self.cfg.outer_momentum)

    def synchronize(self):
        mean, nbytes = self.mean()
        params, buffers = self.params_and_buffers()
        self.assign(params, self.outer.step(mean[:len(params)]))
        self.assign(buffers, mean[len(params):])
        return nbytes

    def own_state(self):
        return {"outer": self.outer.state_dict()}

    def load_own_state(self, saved):
        self.outer.load_state_dict(saved["outer"])
