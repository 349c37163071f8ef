"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes"): Adam's moments with a per-tensor trust ratio, the optimizer MLPerf Training's RNN-T
reference trains with (batch 1024-6144; apex's FusedLAMB on GPUs). torch.optim has no LAMB, and
the packages that offer one are CUDA-only (apex) or unmaintained, so it is written here on
torch's foreach-free tensor ops: one loop over the parameters, the same numbers on any device.

Per parameter ``p`` with gradient ``g`` at step ``t``::

    m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
    u = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay p
    p = p - lr * (|p| / |u| if |p| > 0 and |u| > 0 else 1) * u

The step counter is a 0-dim tensor on the parameters' device (``capturable`` as torch's Adam on a
GPU), so a step undone by ``step.masked_step`` needs no host read.
"""
from __future__ import annotations

import torch


class Lamb(torch.optim.Optimizer):
    """LAMB with decoupled weight decay inside the trust ratio (the paper's Algorithm 2)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0):
        if lr <= 0 or eps <= 0 or not all(0.0 <= b < 1.0 for b in betas) or weight_decay < 0:
            raise ValueError(f"Lamb: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay} out of range")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group, b1, b2)
        return loss

    def _update(self, p: torch.Tensor, group: dict, b1: float, b2: float) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        g, m, v = p.grad, state["exp_avg"], state["exp_avg_sq"]
        state["step"] += 1
        t = state["step"].to(p.dtype)  # an exact integer: the bias corrections in the parameter's precision
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        update = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + group["eps"])
        if group["weight_decay"]:
            update = update + group["weight_decay"] * p
        w_norm, u_norm = p.norm(), update.norm()
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))  # no host read
        p.sub_(group["lr"] * trust * update)
