"""The CLDNN of the parallel-training paper (003): one convolutional layer of 128 maps over
(time, frequency) of the filterbank with deltas, two LSTM layers of 1024 cells with 512
projections, two DNN layers of 1024, then the output layer (CTC over characters here; the
paper used tied HMM states)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from speechperf.models.fbank import with_deltas
from speechperf.models import register_model
from speechperf.models.contract import AcousticModel


@dataclass(frozen=True)
class CLDNNConfig:
    name: str = "cldnn"  # registry key
    input_dim: int = 40  # filterbank bands
    conv_maps: int = 128  # feature maps of the convolution
    conv_time: int = 3  # kernel extent in frames ('same' padding in time)
    conv_freq: int = 9  # kernel extent in bands (valid in frequency)
    pool_freq: int = 3  # max-pooling over frequency
    lstm_layers: int = 2  # stacked LSTMP layers
    lstm_cells: int = 1024  # cells per LSTM layer
    lstm_proj: int = 512  # projection of each LSTM's output (LSTMP)
    dnn_layers: int = 2  # fully connected ReLU layers after the LSTMs
    dnn_hidden: int = 1024  # units per DNN layer
    num_classes: int = 30  # CTC outputs incl. blank

    @property
    def conv_out(self) -> int:
        return self.conv_maps * ((self.input_dim - self.conv_freq + 1) // self.pool_freq)

    def problems(self) -> list[str]:
        sizes = ("input_dim", "conv_maps", "conv_time", "conv_freq", "pool_freq", "lstm_layers", "lstm_cells",
                 "lstm_proj", "dnn_hidden", "num_classes")
        out = [f"model.{k}={getattr(self, k)} must be >= 1" for k in sizes if getattr(self, k) < 1]
        if self.conv_time % 2 == 0:
            out.append(f"model.conv_time={self.conv_time} must be odd ('same' padding in time)")
        if not out and self.conv_out < 1:
            out.append(f"model.conv_freq={self.conv_freq} and pool_freq={self.pool_freq} leave no bands of "
                       f"input_dim={self.input_dim}")
        if not 0 < self.lstm_proj < self.lstm_cells:
            out.append(f"model.lstm_proj={self.lstm_proj} must be in [1, lstm_cells={self.lstm_cells})")
        return out


class CLDNN(AcousticModel):
    def __init__(self, cfg: CLDNNConfig):
        super().__init__()
        self.cfg = cfg
        self.conv = nn.Conv2d(3, cfg.conv_maps, (cfg.conv_time, cfg.conv_freq), padding=(cfg.conv_time // 2, 0))
        self.pool = nn.MaxPool2d((1, cfg.pool_freq))
        self.lstm = nn.LSTM(cfg.conv_out, cfg.lstm_cells, cfg.lstm_layers, proj_size=cfg.lstm_proj)
        dims = [cfg.lstm_proj] + [cfg.dnn_hidden] * cfg.dnn_layers
        self.dnn = nn.Sequential(*[m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        self.out = nn.Linear(dims[-1], cfg.num_classes)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return lengths  # one output per 10 ms frame

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        """x: (B, T, F >= input_dim) -> log-probs (T, B, C), lengths (B,)."""
        B, T = x.shape[:2]
        h = with_deltas(x[:, :, : self.cfg.input_dim])  # (B, T, 3 * 40)
        h = h.reshape(B, T, 3, self.cfg.input_dim).permute(0, 2, 1, 3)  # (B, 3, T, 40): deltas as channels
        h = self.pool(torch.relu(self.conv(h)))  # (B, maps, T, bands')
        h = h.permute(2, 0, 1, 3).reshape(T, B, -1)  # (T, B, maps * bands')
        h, _ = self.lstm(h)  # (T, B, proj)
        return self.out(self.dnn(h)).log_softmax(-1), lengths


def cldnn_parameter_count(cfg: CLDNNConfig) -> int:
    conv = 3 * cfg.conv_maps * cfg.conv_time * cfg.conv_freq + cfg.conv_maps
    lstm, inp = 0, cfg.conv_out
    for _ in range(cfg.lstm_layers):
        lstm += 4 * cfg.lstm_cells * (inp + cfg.lstm_proj) + 8 * cfg.lstm_cells + cfg.lstm_cells * cfg.lstm_proj
        inp = cfg.lstm_proj
    dims = [cfg.lstm_proj] + [cfg.dnn_hidden] * cfg.dnn_layers + [cfg.num_classes]
    return conv + lstm + sum(a * b + b for a, b in zip(dims, dims[1:]))


@register_model("cldnn", CLDNNConfig)
def build_cldnn(cfg: CLDNNConfig) -> nn.Module:
    return CLDNN(cfg)
