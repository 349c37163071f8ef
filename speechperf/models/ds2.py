"""The Deep Speech 2-style acoustic model of docs/spec.md B.

conv1d (valid, stride 2) -> BN -> clipped ReLU -> dropout -> [LSTM -> BN -> dropout] x L
-> linear -> log-softmax. Batch normalization statistics are taken over valid frames only
(padding would otherwise bias them: in the paper's pad mode most frames are padding).
The LSTMs are unidirectional, so the outputs at valid frames do not depend on the padding
after them and no packing is needed. The dropout is models/dropout.py's: on a CPU torch's own
draws its mask with MKL on an Intel CPU and element by element elsewhere, so the same seed
trained otherwise on the two makers and an AMD step spent about a tenth of its time on masks.

Host synchronization: the valid frames are gathered by an index of known length (never a
boolean mask, whose result size needs the device's answer), so with the index planned on
the CPU (:meth:`DeepSpeech2.plan`, from the loader's CPU lengths) a forward pass on a GPU
never waits for it. :meth:`DeepSpeech2.masked` takes the valid frames as a ``(T', B)`` mask
instead: every shape in it is the input's, as a CUDA graph needs (train/graphs.py); its
batch norms reduce over the mask, the same statistics summed in another order.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from dataclasses import dataclass

from speechperf.models import register_model
from speechperf.models.contract import AcousticModel, TooShortError
from speechperf.models.dropout import Dropout

__all__ = ["DS2Config", "DeepSpeech2", "TooShortError", "parameter_count", "flops_per_frame"]


@dataclass(frozen=True)
class DS2Config:
    """A Deep Speech 2-style model: one strided conv over time, stacked LSTMs, one FC."""

    name: str = "ds2"  # registry key in speechperf.models.MODELS
    input_dim: int = 93  # features per frame it reads (80 log-mel + 13 MFCC)
    conv_channels: int = 600  # conv output channels (DS2 itself: 1280)
    conv_kernel: int = 11  # conv width in frames
    conv_stride: int = 2  # conv stride in frames; valid padding: T' = (T - k) // s + 1
    lstm_layers: int = 5  # unidirectional LSTM layers
    lstm_hidden: int = 800  # units per LSTM layer (DS2 itself: 1510)
    num_classes: int = 30  # output symbols incl. CTC blank
    dropout: float = 0.05  # dropout between every pair of layers
    batch_norm: bool = True  # batch normalization between every pair of layers

    def problems(self) -> list[str]:
        """One message per value that cannot build a model."""
        out = [f"model.{k}={getattr(self, k)} must be >= 1" for k in
               ("input_dim", "conv_channels", "conv_kernel", "conv_stride", "lstm_layers", "lstm_hidden", "num_classes")
               if getattr(self, k) < 1]
        if not 0.0 <= self.dropout < 1.0:
            out.append(f"model.dropout={self.dropout} not in [0, 1)")
        return out


class MaskedBatchNorm(nn.Module):
    """BatchNorm1d over the valid frames of a padded ``(T, B, C)`` tensor."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm1d(channels)

    def forward(self, x: torch.Tensor, index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalized valid frames, padding zero: over ``index`` (flat valid positions) or,
        without it, over ``mask`` ((T, B) bool: valid frames)."""
        if index is None:
            return self.masked(x, mask)
        # x: (T, B, C); index: flat (T*B) positions of the valid frames in row-major order,
        # the order of x[mask]: (N, C) -> BN -> back in place, padding zero.
        t, b, c = x.shape
        y = self.bn(x.reshape(t * b, c).index_select(0, index))
        return y.new_zeros(t * b, c).index_copy(0, index, y).reshape(t, b, c)  # BN's dtype under autocast

    def masked(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """BatchNorm1d's training-mode function over the frames of ``mask``, with every shape
        static: statistics in fp32 (as BN computes them under autocast), the biased variance
        normalizes, the unbiased one enters the running estimate (torch's rule); eval mode
        uses the running estimates. Padding comes out zero (``where``, so that whatever the
        padded frames hold, even inf, never reaches the sums)."""
        bn, m = self.bn, mask.unsqueeze(-1)  # (T, B, 1)
        wide = torch.promote_types(x.dtype, torch.float32)
        xf = torch.where(m, x.to(wide), 0.0)  # (T, B, C) fp32 (fp64 stays), padding zero
        if bn.training:
            n = m.sum(dtype=wide)  # valid frames, a 0-dim device tensor: no host read
            mean = xf.sum((0, 1)) / n  # (C,)
            var = torch.where(m, xf - mean, 0.0).square().sum((0, 1)) / n  # biased
            with torch.no_grad():
                bn.num_batches_tracked.add_(1)
                bn.running_mean.lerp_(mean.detach().to(bn.running_mean.dtype), bn.momentum)
                bn.running_var.lerp_((var.detach() * n / (n - 1).clamp_min(1)).to(bn.running_var.dtype), bn.momentum)
        else:
            mean, var = bn.running_mean, bn.running_var
        y = (xf - mean) * torch.rsqrt(var + bn.eps) * bn.weight + bn.bias
        return torch.where(m, y, 0.0).to(x.dtype)


def output_lengths(lengths: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """Frames after the valid strided conv: (T - k) // s + 1."""
    return torch.div(lengths - kernel, stride, rounding_mode="floor") + 1


def valid_index(out_lens: torch.Tensor, frames: int) -> torch.Tensor:
    """Flat positions (row-major over ``(frames, B)``) of the valid output frames."""
    mask = torch.arange(frames, device=out_lens.device)[:, None] < out_lens[None, :]
    return mask.reshape(-1).nonzero().squeeze(1)


class DeepSpeech2(AcousticModel):
    """Conv + stacked unidirectional LSTMs + FC with CTC outputs."""

    def __init__(self, cfg: DS2Config):
        super().__init__()
        self.cfg, self.min_frames = cfg, cfg.conv_kernel
        self.conv = nn.Conv1d(cfg.input_dim, cfg.conv_channels, cfg.conv_kernel, stride=cfg.conv_stride)
        self.conv_bn = MaskedBatchNorm(cfg.conv_channels) if cfg.batch_norm else None
        sizes = [cfg.conv_channels] + [cfg.lstm_hidden] * cfg.lstm_layers
        self.lstms = nn.ModuleList(nn.LSTM(i, cfg.lstm_hidden) for i in sizes[:-1])
        self.bns = nn.ModuleList(MaskedBatchNorm(cfg.lstm_hidden) for _ in self.lstms) if cfg.batch_norm else None
        self.dropout = Dropout(cfg.dropout)
        self.fc = nn.Linear(cfg.lstm_hidden, cfg.num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier (Glorot) uniform weights, zero biases (docs/spec.md B)."""
        for name, p in self.named_parameters():
            if "bn" in name:
                continue
            if p.dim() >= 2:
                nn.init.xavier_uniform_(p)
            else:
                nn.init.zeros_(p)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return output_lengths(lengths, self.cfg.conv_kernel, self.cfg.conv_stride)

    def plan(self, lengths: torch.Tensor, frames: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """On the CPU, from CPU ``lengths`` of inputs padded to ``frames``: the output lengths
        and the valid-frame ``index`` that :meth:`forward` takes (no host sync)."""
        self.check_lengths(lengths)
        out_lens = self.output_lengths(lengths)
        k, s = self.cfg.conv_kernel, self.cfg.conv_stride
        return out_lens, {"index": valid_index(out_lens, (frames - k) // s + 1)}

    def forward(self, x: torch.Tensor, lengths: torch.Tensor,
                index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, F) features, lengths: (B,) -> log-probs (T', B, C), out lengths (B,).

        ``index``: the valid-frame index from :meth:`plan`, on x's device; without it the
        index is computed here (a host sync when ``lengths`` live on a GPU)."""
        k = self.cfg.conv_kernel
        if lengths.device.type == "cpu":
            self.check_lengths(lengths)
        else:  # checked on the device: a failed check stops the run without a host sync here
            torch._assert_async(lengths.min() >= k, f"an input has fewer frames than the conv's {k}")
        out_lens = self.output_lengths(lengths)
        h = self._conv(x)
        if index is None and (self.conv_bn is not None or self.bns is not None):
            index = valid_index(out_lens, h.shape[0]).to(h.device, non_blocking=True)
        return self._layers(h, index=index), out_lens

    def masked(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: (B, T, F) features, mask: (T', B) bool, the valid output frames -> log-probs
        (T', B, C). :meth:`forward`'s function with every shape fixed by the input's and no
        host read: what a CUDA graph captures. A row of the batch with no valid frame (a
        graph's padding row) adds nothing to the batch norms' statistics."""
        return self._layers(self._conv(x), mask=mask)

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x[:, :, : self.cfg.input_dim].transpose(1, 2))  # (B, F, T) -> (B, C, T')
        return h.permute(2, 0, 1)  # (T', B, C)

    def _layers(self, h: torch.Tensor, index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """(T', B, C) conv output -> log-probs (T', B, classes); batch norms over ``index`` or ``mask``."""
        if self.conv_bn is not None:
            h = self.conv_bn(h, index, mask)
        h = self.dropout(torch.clamp(h, 0.0, 20.0))  # clipped ReLU as in DS2
        for i, lstm in enumerate(self.lstms):
            h, _ = lstm(h)  # (T', B, H)
            if self.bns is not None:
                h = self.bns[i](h, index, mask)
            h = self.dropout(h)
        return self.fc(h).log_softmax(-1)  # (T', B, C)


def parameter_count(cfg: DS2Config) -> int:
    """Trainable parameters by formula (torch's LSTM has two bias vectors per gate set)."""
    conv = cfg.input_dim * cfg.conv_channels * cfg.conv_kernel + cfg.conv_channels
    lstm, prev = 0, cfg.conv_channels
    for _ in range(cfg.lstm_layers):
        lstm += 4 * cfg.lstm_hidden * (prev + cfg.lstm_hidden) + 8 * cfg.lstm_hidden
        prev = cfg.lstm_hidden
    bn = 2 * (cfg.conv_channels + cfg.lstm_layers * cfg.lstm_hidden) if cfg.batch_norm else 0
    fc = cfg.lstm_hidden * cfg.num_classes + cfg.num_classes
    return conv + lstm + bn + fc


def flops_per_frame(cfg: DS2Config) -> float:
    """Forward multiply-add FLOPs (2 per MAC) per input frame, conv + LSTM + FC."""
    conv = 2 * cfg.input_dim * cfg.conv_channels * cfg.conv_kernel / cfg.conv_stride
    lstm, prev = 0.0, cfg.conv_channels
    for _ in range(cfg.lstm_layers):
        lstm += 2 * 4 * cfg.lstm_hidden * (prev + cfg.lstm_hidden)
        prev = cfg.lstm_hidden
    fc = 2 * cfg.lstm_hidden * cfg.num_classes
    return conv + (lstm + fc) / cfg.conv_stride


@register_model("ds2", DS2Config)
def build_ds2(cfg: DS2Config) -> DeepSpeech2:
    return DeepSpeech2(cfg)
