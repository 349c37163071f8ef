"""``easgd``: elastic averaging SGD (paper 003, Eq. 9) through the parameter server of asgd.py:
every ``sync_every`` steps a worker makes an elastic exchange with the centre."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.algorithms import param_server as ps
from speechperf.algorithms import register_algorithm
from speechperf.algorithms.asgd import ASGDConfig, AsyncSGD


@dataclass(frozen=True)
class EASGDConfig(ASGDConfig):
    """The elastic exchange's moving rate, and the server's order of service."""

    name: str = "easgd"  # the registry key
    easgd_alpha: float = 0.1  # moving rate alpha = eta x lambda of the elastic exchange (Eq. 9), in (0, 1)

    def problems(self) -> list[str]:
        bad = not 0 < self.easgd_alpha < 1
        return super().problems() + ([f"algo.easgd_alpha={self.easgd_alpha} must be in (0, 1)"] if bad else [])


@register_algorithm("easgd", EASGDConfig)
class EASGD(AsyncSGD):
    def server_alpha(self):
        return self.cfg.easgd_alpha

    def synchronize(self):
        local = self._flat()
        self._unflat(local - ps.call("elastic", self.rank, local))
        return 2 * local.numel() * local.element_size()  # the model sent, the elastic difference received
