"""``single``: one process, the hooks identities; refuses a launch of several."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.algorithms import register_algorithm
from speechperf.algorithms.base import AlgoConfig, Algorithm
from speechperf.errors import ConfigError


@dataclass(frozen=True)
class SingleConfig(AlgoConfig):
    """One process; nothing to configure."""

    name: str = "single"  # the registry key


@register_algorithm("single", SingleConfig)
class Single(Algorithm):
    def __init__(self, cfg, world, rank=0, device=None, train=None):
        self.check_launch(cfg, world)
        super().__init__(cfg, world, rank, device, train)

    @classmethod
    def check_launch(cls, cfg, world, train=None):
        if world != 1:
            raise ConfigError(f"algo.name=single trains in one process, not {world}: use algo.name=sync "
                              "(or bsp, bmuf, diloco) under torchrun")
