"""Acoustic models: a registry of builders keyed by the config's ``name``.

Every model maps features ``(B, T, F)`` with lengths ``(B,)`` to CTC log-probabilities
``(T', B, C)`` and output lengths ``(B,)``.
"""
from __future__ import annotations

from typing import Callable

import torch.nn as nn

MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str):
    """Decorator: register a builder ``f(cfg) -> nn.Module`` under ``name``."""

    def deco(fn):
        if name in MODELS:
            raise ValueError(f"model {name!r} registered twice")
        MODELS[name] = fn
        return fn

    return deco


def build_model(cfg) -> nn.Module:
    """Build the model that ``cfg.name`` names (ModelConfig or another model's config)."""
    from speechperf.errors import SpeechperfError

    _load_builtin()
    if cfg.name not in MODELS:
        raise SpeechperfError(f"unknown model {cfg.name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[cfg.name](cfg)


def _load_builtin() -> None:
    # Imported lazily so that importing the registry does not import every model.
    import importlib

    for mod in ("ds2", "dnn", "cldnn"):
        try:
            importlib.import_module(f"speechperf.models.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"speechperf.models.{mod}":
                raise
