"""``bsp``: local SGD by model averaging (paper 003's BSP, Eq. 1): every ``sync_every`` steps
the models are averaged (torch's ``model_averaging.utils.average_parameters``)."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.algorithms import register_algorithm
from speechperf.algorithms.local_sgd import LocalSGD, LocalSGDConfig, sync_tensors


@dataclass(frozen=True)
class BSPConfig(LocalSGDConfig):
    """Model averaging every ``sync_every`` steps."""

    name: str = "bsp"  # the registry key


@register_algorithm("bsp", BSPConfig)
class BSP(LocalSGD):
    """Model averaging (Eq. 1, unweighted: every rank trains batches of the same size)."""

    def synchronize(self):
        mean, nbytes = self.mean()
        self.assign(sync_tensors(self.core), mean)
        return nbytes
