"""One registry helper for models, decoders, algorithms and report sections.

A :class:`Registry` is a plain dict (name -> entry) filled by a decorator. It refuses a
name registered twice (two modules claiming one name is a bug that would otherwise
silently keep the later one), names the known entries when asked for an unknown one, and
imports its built-in modules on first lookup, so that importing the registry does not
import every model (torch, numba) and ``--help`` still lists every name.
"""
from __future__ import annotations

import importlib
from typing import Callable, Iterable

from speechperf.errors import SpeechperfError


class UnknownName(SpeechperfError, ValueError):
    """A name that no module registered; the message lists the known ones."""


class Registry(dict):
    """``name -> entry`` for one kind of thing (``kind`` names it in messages).

    ``builtin``: module names imported (once, on first lookup) so that their decorators
    run; a listed module that does not exist is skipped, any other import error (a
    dependency it imports is missing) propagates."""

    def __init__(self, kind: str, builtin: Iterable[str] = ()):
        super().__init__()
        self.kind, self.builtin, self._loaded = kind, tuple(builtin), False

    def register(self, name: str, transform: Callable | None = None):
        """Decorator registering its argument under ``name`` (``transform(obj)`` if given)."""

        def deco(obj):
            if dict.__contains__(self, name):
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self[name] = transform(obj) if transform else obj
            return obj

        return deco

    def load(self) -> "Registry":
        """Import the built-in modules (once); returns self."""
        if not self._loaded:
            self._loaded = True
            for mod in self.builtin:
                try:
                    importlib.import_module(mod)
                except ModuleNotFoundError as e:
                    if e.name != mod:  # the module exists; something it imports does not
                        raise
        return self

    def names(self) -> list[str]:
        return sorted(self.load())

    def lookup(self, name: str):
        """The entry ``name``; :class:`UnknownName` listing the known names otherwise."""
        self.load()
        if not dict.__contains__(self, name):
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self[name]
