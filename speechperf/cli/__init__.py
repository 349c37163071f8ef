"""Command line: parses arguments and calls one library function per command.

``speechperf --help`` speaks to a user (:data:`ABOUT`, the commands in :data:`SECTIONS`);
``speechperf --version`` prints the installed package's version.
Every command that prints a table takes ``--json`` and then prints the same rows as JSON.
Errors that the user can fix (bad input, bad config) print one line naming the file or
value and exit with status 2; anything else is a bug and keeps its traceback.

Each command's arguments are declared beside its ``cmd_*`` function, in the module of its
kind (data_commands, train_commands, result_commands, bench_commands), which lists it in its
``COMMANDS`` table; ``build_parser`` assembles the tables.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version as installed

from speechperf import __version__
from speechperf.cli import bench_commands, data_commands, result_commands, train_commands
from speechperf.cli.parsing import add_command
from speechperf.errors import SpeechperfError

_MODULES = (data_commands, train_commands, result_commands, bench_commands)
COMMANDS = [c for m in _MODULES for c in m.COMMANDS]
GROUPS = {name: text for m in _MODULES for name, text in getattr(m, "GROUPS", {}).items()}
# the order --help lists the top level's commands (and groups) in
ORDER = ("corpus", "prepare", "train", "tta", "eval", "beam-sweep", "lm", "check-log", "report", "export", "platforms",
         "cost", "bench",
         "parallel", "reproduce", "demo")


# what --help says first, to someone who has not used speechperf
ABOUT = ("speechperf measures how fast a machine trains a speech recognition model to a target accuracy (time to "
         "accuracy, TTA), where that time went, and its energy and cost. Start with `speechperf demo`: it makes a "
         "small corpus, trains on it and ends with the TTA and a report.")
# --help's listing of the top level's commands, by what a user is doing (every ORDER name once)
SECTIONS = (("start here", ("demo",)), ("data", ("corpus", "prepare", "lm")),
            ("training", ("train", "parallel", "reproduce")),
            ("results", ("tta", "eval", "beam-sweep", "check-log", "report", "export", "platforms", "cost")),
            ("hardware", ("bench",)))


def version() -> str:
    """The installed package's version; this source tree's where it is not installed."""
    try:
        return installed("speechperf")
    except PackageNotFoundError:
        return __version__


def description(width: int = 100) -> str:
    """--help's text: :data:`ABOUT`, then each section's commands with their one-line help."""
    helps = {c.name: c.help for c in COMMANDS if c.group is None} | GROUPS
    lines = textwrap.wrap(ABOUT, width)
    for title, names in SECTIONS:
        lines += ["", f"{title}:"]
        for name in names:
            lines += textwrap.wrap(helps[name], width, initial_indent=f"  {name:<12}", subsequent_indent=" " * 14,
                                   break_on_hyphens=False)
    return "\n".join(lines + ["", "Each command's options: speechperf COMMAND --help"])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speechperf",
                                description=description(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"speechperf {version()}")
    # the commands are listed in the description, grouped; argparse's flat list is left out
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS)
    p.usage = "%(prog)s [-h] [--version] COMMAND ..."  # after add_subparsers, which names subcommands from it
    groups = {}
    for command in sorted(COMMANDS, key=lambda c: ORDER.index(c.group or c.name)):  # stable: a group's own order
        parent = sub
        if command.group is not None:
            if command.group not in groups:
                groups[command.group] = sub.add_parser(command.group, help=GROUPS[command.group]).add_subparsers(
                    dest="sub", required=True)
            parent = groups[command.group]
        add_command(parent, command)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)  # the sweep's options are checked (and shown) here
    if args.command == "parallel":  # and passed on as given to the sweep's own parser
        args.rest = [x for x in argv[argv.index(args.sub) + 1:] if x != "--json"]
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away (| head) is then caught below
        return code
    except SpeechperfError as e:  # 2: bad input; 1: a run that failed (RunFailed)
        # notes say where a multi-run command stopped (train --seeds): on the error's line
        print(f"speechperf: error: {'; '.join([str(e), *getattr(e, '__notes__', [])])}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("speechperf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return closed_stdout()


def closed_stdout() -> int:
    """The reader of stdout went away (``speechperf tta RUN | head -3``): Python's documented way
    (the signal module's "Note on SIGPIPE"): stdout pointed at /dev/null, so that the interpreter's
    own flush at exit has nowhere to fail, and the status a command killed by SIGPIPE has, 128 + 13,
    as ``yes | head`` gives; no traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a descriptor (a test's): nothing left to flush into
        pass
    finally:
        os.close(devnull)
    return 128 + signal.SIGPIPE
