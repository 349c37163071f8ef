"""Data-parallel training algorithms: a registry of :class:`~speechperf.algorithms.base.Algorithm`
classes keyed by ``algo.name``, each with its own frozen config.

The ``[algo]`` section of a preset or config.json is read as ``[model]`` is: its ``name``
(default ``sync``) picks the algorithm, whose config dataclass holds the other keys. A new
algorithm is one file that defines its config (a subclass of ``AlgoConfig``, field ``name``
defaulting to the registry key) and its hooks, registered with
``@register_algorithm(name, ConfigClass)``, plus its module name in ``_BUILTIN``.

The loop calls the hooks (base.py describes them); which algorithm synchronizes every
``sync_every`` steps is :func:`periodic`. Layering: a stage, beside the models: torch, the
registry, the errors and the process's RNG state (speechperf/rng.py) only, so that the
presets (speechperf/config) can read an ``[algo]`` section.
"""
from __future__ import annotations

import dataclasses

from speechperf.errors import ConfigError
from speechperf.registry import Registry
from speechperf.section import build_section

# the order names are listed in messages
_BUILTIN = ("single", "sync", "bsp", "bmuf", "diloco", "asgd", "easgd", "fsdp")

ALGORITHMS = Registry("algorithm", [f"speechperf.algorithms.{m}" for m in _BUILTIN])
DEFAULT = "sync"  # algo.name of a run that names none: DDP under torchrun, the model itself alone


def register_algorithm(name: str, config: type):
    """Decorator: register an ``Algorithm`` subclass under ``name``, configured by ``config``."""
    if config().name != name:
        raise ValueError(f"algorithm {name!r}: its config's default name is {config().name!r}")

    def named(cls):
        cls.name, cls.config = name, config
        return cls

    return ALGORITHMS.register(name, named)


def names() -> list[str]:
    """Every ``algo.name``: the built-in ones in ``_BUILTIN``'s order, then any other."""
    loaded = list(ALGORITHMS.load())
    return [n for n in _BUILTIN if n in loaded] + [n for n in loaded if n not in _BUILTIN]


def algorithm_class(name: str) -> type:
    """The algorithm ``name`` (ConfigError listing the known names: bad input, exit 2)."""
    if name not in ALGORITHMS.load():
        raise ConfigError(f"algo.name={name!r} is unknown; known: {', '.join(names())}")
    return ALGORITHMS[name]


def config_class(name: str) -> type:
    """The config dataclass of algorithm ``name``."""
    return algorithm_class(name).config


def algo_config(values: dict | None = None):
    """The config of the algorithm ``values["name"]`` names (default ``sync``) with ``values``'
    other fields. A key of another algorithm at that algorithm's default is dropped: it says
    nothing, and a section that holds every algorithm's fields reads the same; any other key
    the algorithm does not have is a ConfigError naming it."""
    values = dict(values or {})
    kind = config_class(values.get("name", DEFAULT))
    own = {f.name for f in dataclasses.fields(kind)}
    for key in [k for k in values if k not in own]:
        if any(values[key] == _default(other.config, key) for other in ALGORITHMS.values()):
            del values[key]
    return build_section(kind, values, "algo")


def _default(kind: type, key: str):
    """The default of ``kind``'s field ``key``; a value nothing equals when it has none."""
    return getattr(kind(), key, _Absent)


class _Absent:
    """No field of that name."""


def periodic(name: str) -> bool:
    """Whether algorithm ``name`` synchronizes every ``algo.sync_every`` steps (the local-SGD
    family); a name no algorithm is registered under: no."""
    return name in ALGORITHMS.load() and ALGORITHMS[name].periodic


def make_algorithm(cfg, world: int, rank: int = 0, device=None, train=None):
    """The configured algorithm for this process (``world`` processes in the run; ``train``: the
    run's [train] section, which fsdp's mixed precision reads)."""
    return algorithm_class(cfg.name)(cfg, world, rank, device, train)


def check_launch(cfg, world: int, train=None) -> None:
    """Refuse a launch the configured algorithm cannot train (``Algorithm.check_launch``; ``train``:
    the run's [train] section, for what the algorithm cannot combine with)."""
    algorithm_class(cfg.name).check_launch(cfg, world, train)
