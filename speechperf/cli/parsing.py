"""What every command's arguments are declared with: the help formatter, argument types shared
by several commands, registries read lazily as choices, and :class:`Command`, one subcommand as
the command table lists it (each command module declares its own beside its ``cmd_*``)."""
from __future__ import annotations

import argparse
import copy
import textwrap
from dataclasses import dataclass
from typing import Callable

from speechperf.tables import WIDTH


@dataclass(frozen=True)
class Command:
    """One subcommand of ``speechperf``."""

    name: str  # its word on the command line (under ``group``, where it has one)
    help: str  # one line: the parent's list of commands and the command's own --help
    run: Callable  # cmd_*(args) -> exit status: parses nothing, calls one library function
    args: Callable | None  # declares its arguments on its parser (--json is every command's); None: its parents' only
    group: str | None = None  # the parent command (corpus, lm, bench, parallel), None at the top
    parents: Callable | None = None  # () -> parsers whose arguments it takes over (argparse's parents)
    epilog: object = None  # text after the arguments in its --help (a LazyText: made only when shown)


class Registry:
    """The names in a registry, read when argparse first checks or shows them (importing a
    registry can take seconds: torch, numba), so that ``--help`` lists them as choices."""

    def __init__(self, load):
        self.load, self.names = load, None

    def _get(self) -> list[str]:
        if self.names is None:
            self.names = sorted(self.load())
        return self.names

    def __contains__(self, name) -> bool:
        return name in self._get()

    def __iter__(self):
        return iter(self._get())


def named(action: argparse.Action, **registries: Registry) -> argparse.Action:
    """``action`` whose help names each registry's names as ``%(KEY)s``, read only when shown."""
    for key, names in registries.items():
        setattr(action, key, names)
    return action


def _presets():
    from speechperf.config import preset_names  # torch (config resolves models): read when --help shows them

    return preset_names()


PRESETS = Registry(_presets)


def csv_list(kind=str, choices=None):
    """A comma-separated list; with ``choices``, every item must be one of them."""
    def parse(s):
        items = [kind(x) for x in s.split(",") if x.strip()]
        bad = [x for x in items if choices is not None and x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{', '.join(map(str, bad))} not among: {', '.join(map(str, choices))}")
        return items
    return parse


def preset(name: str) -> str:
    """A preset name or a TOML file."""
    if name.endswith(".toml") or name in PRESETS:
        return name
    raise argparse.ArgumentTypeError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)} (or a .toml file)")


class LazyText:
    """A help text (a parser's epilog) made only when shown: ``make()`` may import torch."""

    def __init__(self, make):
        self.make = make


def _train_keys(width: int) -> str:
    from speechperf.config.training import key_table  # torch (config resolves models): read when --help shows it

    lines = ["training settings (key=value overrides, or [train.SECTION] tables of a preset; default, then what "
             "it sets):"]
    for key, default, doc in key_table():
        lines.append(f"  {key} = {default!r}")
        lines += textwrap.wrap(doc, width, initial_indent=" " * 6, subsequent_indent=" " * 6, break_on_hyphens=False)
    return "\n".join(lines)


TRAIN_KEYS = LazyText(_train_keys)  # ``speechperf train --help``'s list of every train.* key


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown for every option, documented or not; a :class:`LazyText` made when shown."""

    def _format_text(self, text):
        if isinstance(text, LazyText):
            return text.make(max(self._width - 6, 40)) + "\n\n"
        return super()._format_text(text)

    def _format_action(self, action):
        if not action.help and action.option_strings and self._shows_default(action):
            action = copy.copy(action)  # argparse prints nothing for an option without help
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _split_lines(self, text, width):
        # names such as conformer-cpu stay whole (argparse's wrap breaks lines at hyphens)
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)

    def _expand_help(self, action):
        # a registry's names read only when a help text shows them (see named): reading them imports
        # torch or numba, which the parser, built whole for every command, must not pay for
        lazy = {k: v for k, v in vars(action).items() if isinstance(v, Registry) and k != "choices"}
        if lazy:
            action = copy.copy(action)
            for key, names in lazy.items():
                setattr(action, key, ", ".join(names))
        return super()._expand_help(action)

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" not in text and action.option_strings and self._shows_default(action):
            text = f"{text.strip()} (default: %(default)s)".strip()
        return text

    @staticmethod
    def _shows_default(action) -> bool:
        return not (action.default is None or action.default is False or action.default is argparse.SUPPRESS)


def add_command(parent, command: Command) -> argparse.ArgumentParser:
    """``command``'s parser under ``parent`` (the top level's or a group's subparsers): its help,
    ``--json``, then the arguments it declares; parsing it sets ``func`` to its ``cmd_*``."""
    sp = parent.add_parser(command.name, help=command.help, description=command.help, formatter_class=HelpFormatter,
                           parents=list(command.parents() if command.parents else ()), epilog=command.epilog)
    sp.add_argument("--json", action="store_true", help="print the rows as JSON")
    sp.add_argument("--wide", action="store_true",
                    help=f"print every column of a text table and every note whole (default: they fit {WIDTH} columns)")
    sp.set_defaults(func=command.run)
    if command.args is not None:
        command.args(sp)
    return sp


def width(a) -> int | None:
    """The columns a command's text output fits: None with ``--wide`` (every column, whole)."""
    return None if getattr(a, "wide", False) else WIDTH


def trust_model_arg(sp) -> None:
    """``--trust-model MODULE``: the opt-in to import a model module that a run folder names."""
    sp.add_argument("--trust-model", action="append", default=[], metavar="MODULE",
                    help="import the model module MODULE (on PYTHONPATH) that the run folder's model.name=MODULE:NAME "
                         "names; a folder from elsewhere is data, and no module it names is imported without this "
                         "(docs/reliability.md)")


def trust_models(a, overrides=()) -> None:
    """Trust the modules this command line names: ``--trust-model``, and a new run's own
    ``model.name=MODULE:NAME`` override (its module is imported as the user asked)."""
    from speechperf.models import external  # torch: only for the commands that build a model

    named = [v for k, _, v in (o.partition("=") for o in overrides) if k in ("model.name", "name")]
    external.trust([*getattr(a, "trust_model", []), *map(external.module_of, named)])
