"""Acoustic models: a registry of (config class, builder) keyed by the config's ``name``.

Every model meets the contract of :mod:`speechperf.models.contract`: features ``(B, T, F)``
with lengths ``(B,)`` to CTC log-probabilities ``(T', B, C)`` and output lengths ``(B,)``,
its output-length rule planned on the CPU. A new model is one file that defines its
config dataclass and registers a builder with ``@register_model(name, ConfigClass)``,
plus its module name in ``_BUILTIN``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from speechperf.registry import Registry
from speechperf.section import build_section

_BUILTIN = ("ds2", "dnn", "cldnn", "conformer")


@dataclass(frozen=True)
class ModelSpec:
    """What the registry holds for a model."""

    config: type  # its frozen config dataclass (field ``name`` = the registry key)
    build: Callable[..., nn.Module]  # builder f(cfg) -> AcousticModel


MODELS = Registry("model", [f"speechperf.models.{m}" for m in _BUILTIN])


def register_model(name: str, config: type):
    """Decorator: register a builder ``f(cfg) -> AcousticModel`` for configs of class ``config``."""
    if config().name != name:
        raise ValueError(f"model {name!r}: its config's default name is {config().name!r}")
    return MODELS.register(name, lambda build: ModelSpec(config, build))


def config_class(name: str) -> type:
    """The config dataclass of model ``name`` (an unknown name lists the known ones)."""
    return MODELS.lookup(name).config


def model_config(values: dict | None = None):
    """The config of the model that ``values["name"]`` names (default ``ds2``), with ``values``'
    fields; a field the model does not have is a ConfigError naming it."""
    values = dict(values or {})
    return build_section(config_class(values.get("name", "ds2")), values, "model")


def build_model(cfg) -> nn.Module:
    """Build the model that ``cfg.name`` names."""
    return MODELS.lookup(cfg.name).build(cfg)


def describe(cfg) -> dict:
    """``{"model": name, "params": trainable parameters}`` of a config (or its dict): the
    workload a run measures. The model is built on the meta device (no memory, no time)."""
    if isinstance(cfg, dict):
        cfg = model_config(cfg)
    with torch.device("meta"):
        model = build_model(cfg)
    return {"model": cfg.name, "params": sum(p.numel() for p in model.parameters() if p.requires_grad)}
