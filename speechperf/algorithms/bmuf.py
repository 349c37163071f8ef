"""``bmuf``: blockwise model-update filtering (Chen & Huo 2016).

Per block: G = mean(local) - start, Delta = zeta Delta + eta G, global += Delta; workers
restart from global + zeta Delta (Nesterov, NBM-BMUF) or global (CBM-BMUF). Defaults
eta = 1, zeta = 1 - eta / (N C), C = 1.05 (Eq. 6). Rank 0 evaluates the global model.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from speechperf.algorithms import register_algorithm
from speechperf.algorithms.local_sgd import LocalSGD, LocalSGDConfig


@dataclass(frozen=True)
class BMUFConfig(LocalSGDConfig):
    """Block learning rate and momentum of BMUF."""

    name: str = "bmuf"  # the registry key
    block_lr: float = 1.0  # block learning rate eta
    block_momentum: float = -1.0  # block momentum zeta in [0, 1); -1 = 1 - block_lr / (workers x bmuf_c) (Eq. 6)
    bmuf_c: float = 1.05  # C of Eq. 6 (eta / (workers (1 - zeta)) = C), used when block_momentum = -1
    nesterov: bool = True  # workers restart from the look-ahead global + momentum x Delta and a block's update is
    # measured from it (NBM-BMUF); false: from the global model (CBM-BMUF, the paper's)

    def problems(self) -> list[str]:
        checks = [
            (self.block_lr > 0, f"algo.block_lr={self.block_lr} must be > 0"),
            (self.block_momentum == -1 or 0 <= self.block_momentum < 1,
             f"algo.block_momentum={self.block_momentum} must be in [0, 1), or -1 (from block_lr and bmuf_c)"),
            (self.bmuf_c > 0, f"algo.bmuf_c={self.bmuf_c} must be > 0"),
        ]
        return super().problems() + [msg for ok, msg in checks if not ok]


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


@register_algorithm("bmuf", BMUFConfig)
class BMUF(LocalSGD):
    """Blockwise model-update filtering; evaluates its global model."""

    @property
    def momentum(self) -> float:
        c = self.cfg
        return c.block_momentum if c.block_momentum >= 0 else 1.0 - c.block_lr / (self.world * c.bmuf_c)

    def start(self):
        params, _ = self.params_and_buffers()
        self.global_ = [p.clone() for p in params]
        self.delta = [torch.zeros_like(p) for p in params]

    def synchronize(self):
        mean, nbytes = self.mean()
        params, buffers = self.params_and_buffers()
        c, starts = self.cfg, []
        for i, m in enumerate(mean[:len(params)]):
            self.global_[i], self.delta[i], s = bmuf_update(self.global_[i], self.delta[i], m, c.block_lr,
                                                            self.momentum, c.nesterov)
            starts.append(s)
        self.assign(params, starts)
        self.assign(buffers, mean[len(params):])
        return nbytes

    def before_eval(self, batches_done):
        core = super().before_eval(batches_done)
        if not self.cfg.nesterov:
            return core  # the workers continue from the global model itself
        model = copy.deepcopy(core)  # the global model, not the look-ahead the workers continue from
        self.assign([p.detach() for p in model.parameters()], self.global_)
        return model

    def own_state(self):
        return {"global": [t.clone() for t in self.global_], "delta": [t.clone() for t in self.delta]}

    def load_own_state(self, saved):
        self.global_ = [t.to(self.device) for t in saved["global"]]
        self.delta = [t.to(self.device) for t in saved["delta"]]
