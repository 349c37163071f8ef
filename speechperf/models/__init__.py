"""Acoustic models: a registry of (config class, builder) keyed by the config's ``name``.

Every model meets the contract of :mod:`speechperf.models.contract`: features ``(B, T, F)``
with lengths ``(B,)`` to CTC log-probabilities ``(T', B, C)`` and output lengths ``(B,)``,
its output-length rule planned on the CPU. A new model is one file that defines its
config dataclass and registers a builder with ``@register_model(name, ConfigClass)``,
plus its module name in ``_BUILTIN``. The same file outside the package is named
``MODULE:NAME`` (imported from the Python path), or listed by an installed package under the
entry-point group ``speechperf.models`` (then ``NAME`` alone): :mod:`speechperf.models.external`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from speechperf.models import external
from speechperf.registry import Registry
from speechperf.section import build_section

_BUILTIN = ("ds2", "dnn", "cldnn", "conformer", "fastconformer", "rnnt", "encdec")


@dataclass(frozen=True)
class ModelSpec:
    """What the registry holds for a model."""

    config: type  # its frozen config dataclass (field ``name`` = the registry key)
    build: Callable[..., nn.Module]  # builder f(cfg) -> AcousticModel


MODELS = Registry("model", [f"speechperf.models.{m}" for m in _BUILTIN], entry_points=external.ENTRY_POINTS,
                  hint="; a model outside the package is model.name=MODULE:NAME (MODULE on the Python path)")


def register_model(name: str, config: type):
    """Decorator: register a builder ``f(cfg) -> AcousticModel`` for configs of class ``config``."""
    if config().name != name:
        raise ValueError(f"model {name!r}: its config's default name is {config().name!r}")
    return MODELS.register(name, lambda build: ModelSpec(config, build))


def _spec(name: str) -> ModelSpec:
    """Model ``name``'s entry (``MODULE:NAME``: imported first); one from outside the package
    with its config class checked against the contract."""
    spec = external.import_model(MODELS, name) if ":" in name else MODELS.lookup(name)
    if not _builtin(spec):
        external.refuse(name, external.config_problems(name, spec.config))
    return spec


def _builtin(spec: ModelSpec) -> bool:
    return getattr(spec.build, "__module__", None) in MODELS.builtin


def config_class(name: str) -> type:
    """The config dataclass of model ``name`` (an unknown name lists the known ones)."""
    return _spec(name).config


def value_problems(cfg) -> list[str]:
    """One message per invalid value of a model config (its ``problems()``); a model from outside
    the package whose ``problems()`` raises is named with the exception (models/external.py)."""
    return cfg.problems() if _builtin(_spec(cfg.name)) else external.value_problems(cfg)


def check_contract(cfg) -> None:
    """Refuse (exit 2, naming the model and what it lacks) a model from outside the package that
    does not meet the contract; built-in models are checked by their tests, not here."""
    spec = _spec(cfg.name)
    if _builtin(spec):
        return
    try:
        _checked(cfg, spec)
    except TypeError:  # an unhashable config (a list field): checked, not remembered
        external.refuse(cfg.name, external.model_problems(cfg.name, spec.build, cfg))


@functools.lru_cache(maxsize=16)
def _checked(cfg, spec: ModelSpec) -> None:
    """Once per config (a meta-device build of an LSTM model takes seconds)."""
    external.refuse(cfg.name, external.model_problems(cfg.name, spec.build, cfg))


def model_config(values: dict | None = None):
    """The config of the model that ``values["name"]`` names (default ``ds2``), with ``values``'
    fields; a field the model does not have is a ConfigError naming it."""
    values = dict(values or {})
    return build_section(config_class(values.get("name", "ds2")), values, "model")


def build_model(cfg) -> nn.Module:
    """Build the model that ``cfg.name`` names."""
    return _spec(cfg.name).build(cfg)


def describe_builtin(values: dict) -> dict | None:
    """:func:`describe` of a recorded model section (config.json's ``model``) where it names a
    built-in model; None for any other (``MODULE:NAME``, an entry point's, an unknown one): a
    reader of a run folder from elsewhere imports nothing its files name."""
    if MODELS.builtin_entry(str(values.get("name", "ds2"))) is None:
        return None
    return describe(values)


def describe(cfg) -> dict:
    """``{"model": name, "params": trainable parameters}`` of a config (or its dict): the
    workload a run measures, named by its registered name (``NAME`` of ``MODULE:NAME``). The
    model is built on the meta device (no memory, no time)."""
    if isinstance(cfg, dict):
        cfg = model_config(cfg)
    with torch.device("meta"):
        model = build_model(cfg)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"model": external.registered_name(cfg.name), "params": params}
