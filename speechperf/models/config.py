"""Acoustic model configuration (SPEC B)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """A Deep Speech 2-style model: one strided conv over time, stacked LSTMs, one FC."""

    name: str = "ds2"  # registry key in speechperf.models.MODELS
    input_dim: int = 93  # features per frame (80 log-mel + 13 MFCC)
    conv_channels: int = 600  # conv output channels (DS2 itself: 1280)
    conv_kernel: int = 11  # conv width in frames
    conv_stride: int = 2  # conv stride in frames; valid padding: T' = (T - k) // s + 1
    lstm_layers: int = 5  # unidirectional LSTM layers
    lstm_hidden: int = 800  # units per LSTM layer (DS2 itself: 1510)
    num_classes: int = 30  # output symbols incl. CTC blank
    dropout: float = 0.05  # dropout between every pair of layers
    batch_norm: bool = True  # batch normalization between every pair of layers
