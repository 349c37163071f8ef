"""The DNN of the parallel-training paper (003): 6 hidden layers of 1024 ReLU units over a
40-band filterbank with deltas and an 11-frame context. The paper trained it on 5,723 tied
HMM states with cross entropy; without alignments speechperf trains the same body with a
CTC head over the 30 characters, one output per 10 ms frame."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from speechperf.models.fbank import stack_context, with_deltas
from speechperf.models import register_model
from speechperf.models.contract import AcousticModel


@dataclass(frozen=True)
class DNNConfig:
    name: str = "dnn"  # registry key
    input_dim: int = 40  # filterbank bands read from the features (the first log-mel columns)
    context: int = 5  # frames of context on each side (11 in all)
    hidden: int = 1024  # units per hidden layer
    layers: int = 6  # hidden layers
    num_classes: int = 30  # CTC outputs incl. blank

    @property
    def frame_dim(self) -> int:
        return 3 * self.input_dim * (2 * self.context + 1)

    def problems(self) -> list[str]:
        out = [f"model.{k}={getattr(self, k)} must be >= 1" for k in ("input_dim", "hidden", "layers", "num_classes")
               if getattr(self, k) < 1]
        return out + ([f"model.context={self.context} must be >= 0"] if self.context < 0 else [])


class DNN(AcousticModel):
    def __init__(self, cfg: DNNConfig):
        super().__init__()
        self.cfg = cfg
        dims = [cfg.frame_dim] + [cfg.hidden] * cfg.layers
        self.body = nn.Sequential(*[m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        self.out = nn.Linear(cfg.hidden, cfg.num_classes)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return lengths  # one output per 10 ms frame

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        """x: (B, T, F >= input_dim) -> log-probs (T, B, C), lengths (B,)."""
        feats = with_deltas(x[:, :, : self.cfg.input_dim])  # (B, T, 3 F)
        h = stack_context(feats, self.cfg.context, self.cfg.context)  # (B, T, 1320)
        logits = self.out(self.body(h))  # (B, T, C)
        return logits.transpose(0, 1).log_softmax(-1), lengths


def dnn_parameter_count(cfg: DNNConfig) -> int:
    dims = [cfg.frame_dim] + [cfg.hidden] * cfg.layers + [cfg.num_classes]
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


@register_model("dnn", DNNConfig)
def build_dnn(cfg: DNNConfig) -> nn.Module:
    return DNN(cfg)
