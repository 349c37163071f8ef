"""Dropout whose CPU mask costs a sixth of torch's, and is the same on Intel and AMD CPUs.

Why not ``nn.Dropout`` on a CPU: torch draws its mask with ``bernoulli_``, and ATen's CPU
``bernoulli_(p)`` has two codes chosen by the CPU's maker: on an Intel CPU MKL's VSL stream,
elsewhere one draw of torch's generator per element, ~7.5 ns an element on the 2-core AVX2
EPYC of the demo (torch 2.13.0): 10.7 ms for one (24, 90, 576) feed-forward activation,
against 1.6 ms for the same number of 16-bit draws taken from full-range int64 ``random_``
(ledger: bench_dropout). So the same seed dropped other elements on the two makers, and on
an AMD CPU the masks were about a quarter of a ``conformer-cpu`` training step and a tenth of
a ``cpu`` (DS2) one. Both models use this module; on any other device it is plain ``F.dropout``.

The CPU mask: each element gets a uniform 16-bit draw r in [-32768, 32767] and is dropped
when r < round(p * 65536) - 32768, i.e. with probability round(p * 65536) / 65536 (within
8e-6 of p); kept elements are scaled by 1 / (1 - that probability), so the expectation is
the input's, as torch's dropout. The draws come from torch's default CPU generator (the
run's RNG), so a resumed run repeats them exactly.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

LEVELS = 1 << 16  # resolution of the drop probability on a CPU


def cpu_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """A (shape) tensor of 0 and 1 / (1 - p') in ``dtype``, p' = round(p * 65536) / 65536 dropped."""
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)  # 4 draws per word
    draws = words.view(torch.int16)[:n].view(shape)  # uniform over all 16 bits (full-range words)
    drop = min(round(p * LEVELS), LEVELS - 1)
    keep = draws >= drop - LEVELS // 2
    return keep.to(dtype) * (LEVELS / (LEVELS - drop))


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with the cheap mask on a CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * cpu_mask(x.shape, p, x.dtype)


class Dropout(nn.Module):
    """``nn.Dropout`` with the cheap CPU mask (see the module docstring)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability {p} not in [0, 1)")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
