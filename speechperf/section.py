"""One section of a preset (a TOML table) read into its stage's frozen config dataclass, and
each field's documentation kept as data.

Below every stage: the presets (``speechperf.config``) read each section through it, and the
model registry reads a recorded model section the same way (``models.model_config``). A field
declared with :func:`setting` (or, for a nested section, :func:`part`) carries its
documentation, which ``--help``, docs/presets.md's key table and ``problems()`` messages read
(:func:`keys`, :func:`doc_of`).
"""
from __future__ import annotations

import dataclasses

from speechperf.errors import ConfigError


def setting(default, doc: str):
    """A config field of ``default`` whose documentation is ``doc`` (read by :func:`keys`)."""
    return dataclasses.field(default=default, metadata={"doc": doc})


def part(kind, doc: str):
    """A nested section: a field holding ``kind()`` (a frozen dataclass), documented by ``doc``."""
    return dataclasses.field(default_factory=kind, metadata={"doc": doc})


def is_section(value) -> bool:
    """Whether a field's value is a nested section (a dataclass instance) rather than a value."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def doc_of(kind, name: str) -> str:
    """The documentation of field ``name`` of ``kind`` ("" where it has none)."""
    return next((f.metadata.get("doc", "") for f in dataclasses.fields(kind) if f.name == name), "")


def keys(kind, prefix: str) -> list[tuple[str, object, str]]:
    """(dotted key, default, documentation) of every value field of ``kind``, nested sections
    walked in declaration order: ``keys(TrainConfig, "train")`` -> ``("train.optim.lr", 1.0, ...)``."""
    out = []
    defaults = kind()
    for f in dataclasses.fields(kind):
        value = getattr(defaults, f.name)
        if is_section(value):
            out += keys(type(value), f"{prefix}.{f.name}")
        else:
            out.append((f"{prefix}.{f.name}", value, f.metadata.get("doc", "")))
    return out


def values(obj, prefix: str) -> list[tuple[str, object]]:
    """(dotted key, value) of every value field of the config ``obj``, nested sections walked."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out += values(value, f"{prefix}.{f.name}") if is_section(value) else [(f"{prefix}.{f.name}", value)]
    return out


def build_section(kind, values: dict, section: str):
    """``kind(**values)``, refusing a key ``kind`` has no field for and a value of another
    type than the field's default (an int is taken for a float field); a nested section's
    values (a TOML table ``[train.optim]``) are read the same way into its own dataclass."""
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = set(values) - names
    if unknown:
        raise ConfigError(f"[{section}] unknown keys {sorted(unknown)}")
    defaults = kind()
    built = {}
    for key, value in values.items():
        default = getattr(defaults, key)
        if is_section(default):
            if not isinstance(value, dict):
                raise ConfigError(f"[{section}] {key} = {value!r}: expected a table [{section}.{key}]")
            built[key] = build_section(type(default), value, f"{section}.{key}")
            continue
        expected = type(default)
        ok = isinstance(value, expected) or (expected is float and isinstance(value, int)
                                             and not isinstance(value, bool))
        if not ok:
            raise ConfigError(f"[{section}] {key} = {value!r}: expected {expected.__name__}")
        built[key] = float(value) if isinstance(default, float) else value
    return kind(**built)
