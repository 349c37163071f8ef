"""A model module outside the package that prints while it imports (a banner, a debug line):
what it prints goes to stderr, so that ``train --json`` and ``tta --json`` stay JSON
(tests/models/test_external.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from speechperf.models import register_model
from external_model import ExtConv, ExtConvConfig  # this folder on the Python path, as the tests put it

print("printing_model: loaded, version 0.0 (a banner on stdout)")


@dataclass(frozen=True)
class PrintingConfig(ExtConvConfig):
    name: str = "ext_printing"


@register_model("ext_printing", PrintingConfig)
def build_printing(cfg) -> nn.Module:
    return ExtConv(cfg)
