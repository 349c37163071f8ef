"""SpecAugment (Park et al. 2019) on training batches: frequency and time masks.

AlgoPerf's Conformer and DeepSpeech workloads are the reference values: 2 frequency masks
of up to 27 bins, 10 time masks of up to 40 frames and at most 5% of the utterance's
length. The defaults mask nothing, so a run without an ``[augment]`` section computes
exactly what it did before (and draws nothing from the RNG).

Each utterance gets its own masks. Widths are uniform integers in [0, max] and starts
uniform over the positions where the whole mask fits: frequency masks inside the first
``dims`` feature columns (the log-mel, not the MFCC after them), time masks inside the
utterance's valid frames (a mask never lands on padding, which would waste it). A masked
value is 0, the train-set mean of the normalized features.

Determinism: every random number is drawn on the CPU from torch's default generator, the
run's RNG whose state the checkpoint saves, so a resumed CPU run draws the same masks.
The masks are built on the CPU from the CPU lengths, sent to the batch's device as one
(B, T) and one (B, F) mask and applied there as one multiply: no device value is read on
the host, and no batch-sized mask crosses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SpecAugmentConfig:
    """How many masks of which widths; 0 masks (the default) leaves every batch untouched."""

    freq_masks: int = 0  # frequency masks per utterance (AlgoPerf: 2)
    freq_width: int = 27  # a frequency mask covers 0..freq_width columns (AlgoPerf: 27)
    time_masks: int = 0  # time masks per utterance (AlgoPerf: 10)
    time_width: int = 40  # a time mask covers 0..time_width frames (AlgoPerf: 40) ...
    time_ratio: float = 0.05  # ... and at most time_ratio x the utterance's frames (AlgoPerf: 0.05)
    dims: int = 80  # frequency masks fall in feature columns 0..dims-1 (the 80 log-mel)

    def problems(self) -> list[str]:
        """One message per invalid value, naming ``augment.FIELD=value``."""
        out = [f"augment.{f}={getattr(self, f)} must be >= 0"
               for f in ("freq_masks", "freq_width", "time_masks", "time_width") if getattr(self, f) < 0]
        if not 0.0 <= self.time_ratio <= 1.0:
            out.append(f"augment.time_ratio={self.time_ratio} must be in [0, 1]")
        if self.dims < 1:
            out.append(f"augment.dims={self.dims} must be >= 1")
        if self.freq_masks and self.freq_width > self.dims:
            out.append(f"augment.freq_width={self.freq_width} must be <= augment.dims={self.dims}")
        return out

    @property
    def active(self) -> bool:
        return self.freq_masks > 0 or self.time_masks > 0


def _spans(count: int, max_width: torch.Tensor, room: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` masks per row: widths uniform in [0, max_width], starts uniform in
    [0, room - width]; (B, count) int64 each. ``max_width``, ``room``: (B,) int64."""
    b = room.shape[0]
    u_width, u_start = torch.rand(b, count, dtype=torch.float64), torch.rand(b, count, dtype=torch.float64)
    width = (u_width * (max_width[:, None] + 1)).long().clamp(max=max_width[:, None])  # (B, n)
    start = (u_start * (room[:, None] - width + 1)).long().clamp(max=room[:, None] - width)  # (B, n)
    return start, width


def _keep(start: torch.Tensor, width: torch.Tensor, size: int) -> torch.Tensor:
    """(B, size) float: 0 where any of the (B, n) spans [start, start + width) covers, else 1."""
    pos = torch.arange(size)[None, None, :]  # (1, 1, size)
    covered = (pos >= start[:, :, None]) & (pos < (start + width)[:, :, None])  # (B, n, size)
    return (~covered.any(dim=1)).float()


def masks(lengths: torch.Tensor, frames: int, columns: int,
          cfg: SpecAugmentConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The keep-masks of one batch, on the CPU: time (B, frames) and frequency (B, columns).

    ``lengths``: (B,) CPU valid frames of a batch padded to ``frames``, with ``columns``
    feature columns. Draws from torch's default CPU generator."""
    lengths = lengths.cpu().long()
    b = lengths.shape[0]
    time_keep, freq_keep = torch.ones(b, frames), torch.ones(b, columns)
    if cfg.freq_masks:
        dims = min(cfg.dims, columns)
        room = torch.full((b,), dims, dtype=torch.int64)
        start, width = _spans(cfg.freq_masks, torch.full((b,), min(cfg.freq_width, dims)), room)
        freq_keep = _keep(start, width, columns)
    if cfg.time_masks:
        # the dynamic width limit: at most time_ratio of this utterance's frames
        max_width = torch.minimum(torch.full((b,), cfg.time_width), (lengths * cfg.time_ratio).long())
        start, width = _spans(cfg.time_masks, max_width, lengths)
        time_keep = _keep(start, width, frames)
    return time_keep, freq_keep


def apply(feats: torch.Tensor, lengths: torch.Tensor, cfg: SpecAugmentConfig) -> torch.Tensor:
    """Training batch ``feats`` (B, T, F) with ``cfg``'s masks applied (a new tensor; the
    input unchanged); ``lengths``: (B,) valid frames on the CPU. Never for evaluation."""
    if not cfg.active:
        return feats
    time_keep, freq_keep = masks(lengths, feats.shape[1], feats.shape[2], cfg)
    valid = torch.arange(feats.shape[1])[None, :] < lengths.cpu()[:, None]  # (B, T)
    # the (B, T) and (B, F) masks cross to the device and are combined there: a (B, T, F) one
    # built on the host would cross whole (~60 MB a step at the conformer preset's 1600 s batch)
    time_keep, freq_keep, valid = (m.to(feats.device, non_blocking=True) for m in (time_keep, freq_keep, valid))
    keep = time_keep[:, :, None] * freq_keep[:, None, :]  # (B, T, 1) x (B, 1, F) -> (B, T, F), 0 or 1
    keep = torch.where(valid[:, :, None], keep, 1.0)  # padding is left as it is
    return feats * keep.to(feats.dtype)
