"""speechperf: how fast real hardware trains speech recognition models to a target accuracy."""

__version__ = "0.1.0"
