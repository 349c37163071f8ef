"""One section of a preset (a TOML table) read into its stage's frozen config dataclass.

Below every stage: the presets (``speechperf.config``) read each section through it, and the
model registry reads a recorded model section the same way (``models.model_config``).
"""
from __future__ import annotations

import dataclasses

from speechperf.errors import ConfigError


def build_section(kind, values: dict, section: str):
    """``kind(**values)``, refusing a key ``kind`` has no field for and a value of another
    type than the field's default (an int is taken for a float field)."""
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = set(values) - names
    if unknown:
        raise ConfigError(f"[{section}] unknown keys {sorted(unknown)}")
    defaults = kind()
    for key, value in values.items():
        expected = type(getattr(defaults, key))
        ok = isinstance(value, expected) or (expected is float and isinstance(value, int)
                                             and not isinstance(value, bool))
        if not ok:
            raise ConfigError(f"[{section}] {key} = {value!r}: expected {expected.__name__}")
    return kind(**{k: (float(v) if isinstance(getattr(defaults, k), float) else v) for k, v in values.items()})
