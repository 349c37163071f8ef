"""Filterbank front end of the parallel-training models (paper 003): static log-mel bands
with first and second derivatives and an 11-frame context window.

Deltas use the standard regression over +-2 frames, d_t = sum_n n (c_{t+n} - c_{t-n}) /
(2 sum_n n^2), edges replicated; the context stacks frames t-5..t+5 (edges replicated).
Applied inside the models as a fixed layer, so any prepared features folder serves:
a 40-band front end reads the first 40 columns of a folder prepared with n_mels=40.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def deltas(x: torch.Tensor, window: int = 2) -> torch.Tensor:
    """x: (B, T, F) -> regression deltas (B, T, F)."""
    padded = F.pad(x.transpose(1, 2), (window, window), mode="replicate")  # (B, F, T + 2w)
    T = x.shape[1]
    num = sum(n * (padded[:, :, window + n: window + n + T] - padded[:, :, window - n: window - n + T])
              for n in range(1, window + 1))
    return (num / (2 * sum(n * n for n in range(1, window + 1)))).transpose(1, 2)


def with_deltas(x: torch.Tensor) -> torch.Tensor:
    """(B, T, F) -> (B, T, 3F): static, delta, delta-delta."""
    d1 = deltas(x)
    return torch.cat([x, d1, deltas(d1)], dim=2)


def stack_context(x: torch.Tensor, left: int = 5, right: int = 5) -> torch.Tensor:
    """(B, T, F) -> (B, T, F * (left + 1 + right)), frame t holding frames t-left..t+right."""
    padded = F.pad(x.transpose(1, 2), (left, right), mode="replicate")  # (B, F, T + l + r)
    windows = padded.unfold(2, left + 1 + right, 1)  # (B, F, T, L)
    return windows.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[1], -1)  # (B, T, L * F)
