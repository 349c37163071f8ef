"""One registry helper for models, decoders, algorithms and report sections.

A :class:`Registry` is a plain dict (name -> entry) filled by a decorator. It refuses a
name registered twice (two modules claiming one name is a bug that would otherwise
silently keep the later one), names the known entries when asked for an unknown one, and
imports its built-in modules only when asked: importing the registry imports no model
(torch, numba), a lookup imports the built-in modules in order up to the one that registers
the name (a run that evaluates with ``greedy`` does not import the beam searches' numba, 0.14 s
of CPU in every training process), and listing the names imports them all, so that ``--help``
lists every name. A registry given an entry-point group also imports, then, the modules
installed packages list under it.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys
from typing import Callable, Iterable

from speechperf.errors import SpeechperfError


class UnknownName(SpeechperfError, ValueError):
    """A name that no module registered; the message lists the known ones."""


class Registry(dict):
    """``name -> entry`` for one kind of thing (``kind`` names it in messages).

    ``builtin``: module names imported (once, on first lookup) so that their decorators
    run; a listed module that does not exist is skipped, any other import error (a
    dependency it imports is missing) propagates. ``entry_points``: a group whose entry points
    (installed packages' modules) are imported after them; one that fails is kept in ``broken``
    and named when a lookup misses, so that a broken plugin does not stop every other name.
    ``hint``: the end of the message for an unknown name."""

    def __init__(self, kind: str, builtin: Iterable[str] = (), entry_points: str | None = None, hint: str = ""):
        super().__init__()
        self.kind, self.builtin, self._loaded = kind, tuple(builtin), False
        self.group, self.broken = entry_points, []
        self.hint = hint  # ends the unknown-name message (another way to name one)

    def register(self, name: str, transform: Callable | None = None):
        """Decorator registering its argument under ``name`` (``transform(obj)`` if given)."""

        def deco(obj):
            if dict.__contains__(self, name):
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self[name] = transform(obj) if transform else obj
            return obj

        return deco

    def load(self) -> "Registry":
        """Import the built-in modules and the entry points (once); returns self."""
        if not self._loaded:
            self._loaded = True
            for mod in self.builtin:
                self._import(mod)
            self._load_entry_points()
        return self

    @staticmethod
    def _import(mod: str) -> None:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # the module exists; something it imports does not
                raise

    def _load_entry_points(self) -> None:
        for ep in importlib.metadata.entry_points(group=self.group) if self.group else ():
            try:
                with contextlib.redirect_stdout(sys.stderr):  # what it prints is no part of a command's --json
                    ep.load()  # a module (or module:attribute) whose decorators register
            except Exception as e:  # whatever a third party's module raises while it runs
                dist = f" (package {ep.dist.name})" if ep.dist else ""
                self.broken.append(f"{ep.name} = {ep.value}{dist}: {type(e).__name__}: {e}")

    def names(self) -> list[str]:
        return sorted(self.load())

    def builtin_entry(self, name: str):
        """The entry ``name`` registered by a built-in module (those imported in order up to it),
        else None: nothing outside the package is imported (neither an entry point nor a module
        named elsewhere), whatever ``name`` says."""
        for mod in self.builtin:
            if dict.__contains__(self, name):
                break
            self._import(mod)
        entry = dict.get(self, name)
        return entry if entry is not None and self._owner(entry) in self.builtin else None

    @staticmethod
    def _owner(entry) -> str | None:
        """The module that registered ``entry`` (a model's ``build``, a decoder's class...)."""
        return getattr(getattr(entry, "build", entry), "__module__", None)

    def lookup(self, name: str):
        """The entry ``name``; :class:`UnknownName` listing the known names otherwise."""
        for mod in () if self._loaded else self.builtin:  # in order, up to the module that registers it
            if dict.__contains__(self, name):
                break
            self._import(mod)
        if not dict.__contains__(self, name):
            self.load()  # the entry points too
        if not dict.__contains__(self, name):
            broken = (f"; entry points of {self.group} that fail to import: {'; '.join(self.broken)}"
                      if self.broken else "")
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}{broken}{self.hint}")
        return self[name]
