"""CTC decoders behind one interface, in a registry filled by a decorator.

A decoder maps log-probabilities ``(T, C)`` to text (``decode``) or a batch ``(T, B, C)``
with lengths to a list of texts (``decode_batch``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from speechperf.errors import SpeechperfError

DECODERS: dict[str, Callable[..., object]] = {}


def register_decoder(name: str):
    """Decorator: register a factory ``f(beam=..., features=..., **kw) -> decoder``."""

    def deco(factory):
        if name in DECODERS:
            raise ValueError(f"decoder {name!r} registered twice")
        DECODERS[name] = factory
        return factory

    return deco


def get_decoder(name: str, beam: int = 1, features: Path | None = None, **kw):
    """The decoder ``name`` with beam width ``beam`` (1 = greedy for beam decoders)."""
    _load_builtin()
    if name not in DECODERS:
        raise SpeechperfError(f"unknown decoder {name!r}; known: {', '.join(sorted(DECODERS))}")
    if beam < 1:
        raise SpeechperfError(f"beam width must be >= 1, got {beam}")
    return DECODERS[name](beam=beam, features=features, **kw)


def _load_builtin() -> None:
    import importlib

    for mod in ("greedy", "beam", "wordbeam", "flashlight"):
        try:
            importlib.import_module(f"speechperf.decode.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"speechperf.decode.{mod}":
                raise
