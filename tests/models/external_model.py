"""A model written outside the package, as a buyer writes their own encoder: a frozen config
dataclass and a builder registered with ``@register_model``. Tests name it
``model.name=external_model:ext_conv`` with this folder on the Python path (PYTHONPATH); the
module also holds objects that fall short of the contract, each registered under its own name."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from speechperf.models import register_model
from speechperf.models.contract import AcousticModel


@dataclass(frozen=True)
class ExtConvConfig:
    name: str = "ext_conv"  # registry key
    input_dim: int = 93  # feature columns read (80 log-mel + 13 MFCC)
    channels: int = 48  # channels of the strided convolution
    kernel: int = 9  # its width in frames (valid padding, stride 2)
    hidden: int = 48  # units of the one LSTM
    num_classes: int = 30  # CTC outputs incl. blank

    def problems(self) -> list[str]:
        return [f"model.{k}={getattr(self, k)} must be >= 1" for k in
                ("input_dim", "channels", "kernel", "hidden", "num_classes") if getattr(self, k) < 1]


class ExtConv(AcousticModel):
    """conv1d (stride 2) -> batch norm -> ReLU -> LSTM -> batch norm -> linear -> log-softmax (its
    batch norms count padded frames too: the loader's length buckets keep them few)."""

    def __init__(self, cfg: ExtConvConfig):
        super().__init__()
        self.cfg, self.min_frames = cfg, cfg.kernel
        self.conv = nn.Conv1d(cfg.input_dim, cfg.channels, cfg.kernel, stride=2)
        self.lstm = nn.LSTM(cfg.channels, cfg.hidden)
        self.norms = nn.ModuleList([nn.BatchNorm1d(cfg.channels), nn.BatchNorm1d(cfg.hidden)])
        self.out = nn.Linear(cfg.hidden, cfg.num_classes)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return (lengths - self.cfg.kernel) // 2 + 1

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        h = torch.relu(self.norms[0](self.conv(x[:, :, : self.cfg.input_dim].transpose(1, 2))))  # (B, C, T')
        h, _ = self.lstm(h.permute(2, 0, 1))  # (T', B, H): unidirectional, padding after valid frames is harmless
        h = self.norms[1](h.permute(1, 2, 0)).permute(2, 0, 1)  # batch norm over (B, H, T')
        return self.out(h).log_softmax(-1), self.output_lengths(lengths)


@register_model("ext_conv", ExtConvConfig)
def build_ext_conv(cfg: ExtConvConfig) -> nn.Module:
    return ExtConv(cfg)


# --- objects that do not meet the contract (tests/models/test_external.py) ---

@dataclass(frozen=True)
class NoProblemsConfig:  # lacks problems() and num_classes
    name: str = "ext_no_problems"
    input_dim: int = 93


@register_model("ext_no_problems", NoProblemsConfig)
def build_no_problems(cfg):
    return nn.Linear(cfg.input_dim, 30)


@dataclass(frozen=True)
class PlainConfig:
    name: str = "ext_plain"
    input_dim: int = 93
    num_classes: int = 30

    def problems(self) -> list[str]:
        return []


@register_model("ext_plain", PlainConfig)
def build_plain(cfg):  # an nn.Module without min_frames, output_lengths or plan
    return nn.Linear(cfg.input_dim, cfg.num_classes)


@dataclass(frozen=True)
class WrongClassesConfig(PlainConfig):
    name: str = "ext_wrong_classes"


class WrongClasses(AcousticModel):
    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.out = cfg, nn.Linear(cfg.input_dim, cfg.num_classes - 1)

    def output_lengths(self, lengths):
        return lengths

    def forward(self, x, lengths):  # one class short of its config's num_classes
        return self.out(x).transpose(0, 1).log_softmax(-1), lengths


@register_model("ext_wrong_classes", WrongClassesConfig)
def build_wrong_classes(cfg):
    return WrongClasses(cfg)


@dataclass(frozen=True)
class RaisingProblemsConfig(ExtConvConfig):
    name: str = "ext_raising_problems"

    def problems(self) -> list[str]:  # a bug in the user's check: named, not a traceback
        raise AttributeError("'RaisingProblemsConfig' object has no attribute 'widht'")


@register_model("ext_raising_problems", RaisingProblemsConfig)
def build_raising_problems(cfg):
    return ExtConv(cfg)
