"""Print rows as an aligned text table or, with ``--json``, as a JSON list of objects; write
them as CSV files.

A text table fits :data:`WIDTH` columns unless it is asked to be wide (``--wide``): its widest
cells are cut first, then its last columns are left out (the columns are given most important
first), and a line says which; ``--json`` and ``--wide`` always show every value whole."""
from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Sequence

from speechperf.atomic import atomic_write_text

WIDTH = 100  # the terminal columns a default text table and each note under it fit
CUT = "~"  # ends a cell cut to fit (ASCII: any terminal encoding prints it)
NARROWEST = 8  # a column is cut no narrower than this (or its whole cell), so it stays legible
LABEL = 24  # the first column is cut below this only when nothing else can be ("2-core Xeon tiny fp32 r1")
GAP = "  "  # between columns


# C0 and C1 control characters and DEL: a newline would break a row, an ANSI escape
# (ESC [ ...) would recolour or move the terminal's cursor; shown escaped, as repr() spells them
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with each control character written as its escape (``\\n``, ``\\x1b``): what
    a run folder from elsewhere names (a label, a path) is shown, never obeyed by the terminal."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "NA"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return printable(str(v))


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None, width: int | None = None) -> str:
    """``rows`` as aligned text; ``width`` (None: as wide as the cells): cut to fit it (:func:`fit`)."""
    if not rows:
        return "(no rows)"
    keys = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in keys] for r in rows]
    columns = [printable(str(c)) for c in keys]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    left_out: list[str] = []
    if width is not None:
        widths, left_out = fit(columns, widths, width)
        columns, cells = columns[:len(widths)], [row[:len(widths)] for row in cells]
    line = lambda vals: GAP.join(_cut(v, w).rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    text = [line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)]
    if left_out:
        text.append(fit_line(f"(left out: {', '.join(left_out)}; --wide shows them)", width))
    return "\n".join(text)


def fit(columns: list[str], widths: list[int], width: int) -> tuple[list[int], list[str]]:
    """Column widths whose table fits ``width``: the widest column cut by one character at a
    time, down to :data:`NARROWEST` or its header; the first column (what names a row: a run's
    label) below :data:`LABEL` only once no other can be cut; then the last columns left out.
    Returns the widths of the columns kept and the names of those left out."""
    widths = list(widths)
    total = lambda: sum(widths) + len(GAP) * (len(widths) - 1)  # noqa: E731
    floor = [NARROWEST] + [max(NARROWEST, len(c)) for c in columns[1:]]  # a header stays whole
    while total() > width:
        cuttable = [i for i in range(1, len(widths)) if widths[i] > floor[i]]
        cuttable = cuttable + [0] if widths[0] > LABEL or not cuttable else cuttable
        widest = max(cuttable, key=lambda i: widths[i])
        if widths[widest] <= floor[widest]:
            break
        widths[widest] -= 1
    left_out = []
    while len(widths) > 1 and total() > width:
        widths.pop()
        left_out.insert(0, columns[len(widths)])
    return widths, left_out


def _cut(text: str, width: int) -> str:
    """``text`` in ``width`` characters: its start, or a path's end (the folder's own name)."""
    if len(text) <= width:
        return text
    keep = max(width - len(CUT), 0)
    if "/" in text and " " not in text:
        return CUT + text[len(text) - keep:]
    return text[:keep] + CUT


def fit_line(text: str, width: int | None = WIDTH) -> str:
    """One line of at most ``width`` characters (None: as it is), cut at its end."""
    return text if width is None else _cut(text, width)


def emit(rows: Sequence[dict], as_json: bool, columns: Sequence[str] | None = None, out=None,
         width: int | None = None) -> None:
    """Write ``rows`` to ``out`` (stdout): the same rows either way, JSON for scripts (every
    key, whatever ``columns`` says); the text fits ``width`` columns (None: whole, every
    column and cell: what a benchmark's log must hold for gpu_summary.py to read it back; the
    commands pass :data:`WIDTH` unless --wide, ``cli.parsing.width``)."""
    out = out or sys.stdout
    if as_json:
        json.dump(list(rows), out, indent=1, default=str)
        out.write("\n")
    else:
        out.write(format_table(rows, columns, width) + "\n")


def pick(rows: Sequence[dict], columns: dict[str, str]) -> list[dict]:
    """The narrow form of ``rows``: only ``columns`` (key: the header shown), in their order."""
    return [{header: r.get(key) for key, header in columns.items()} for r in rows]


def notes(rows: Sequence[dict], column: str, out=None, width: int | None = None) -> None:
    """Below a text table: each run's ``column`` (a long note, e.g. why its MFU is not shown)
    once, as ``note: RUN: TEXT``; nothing where no row has one. ``width``: each note wrapped
    to lines of at most that many characters (None: one line each, however long)."""
    out = out or sys.stdout
    pairs = dict.fromkeys((r.get("run"), r[column]) for r in rows if r.get(column))
    lines = [f"note: {run}: {text}" for run, text in pairs]
    print_lines(lines, width, out)


def print_lines(lines: Sequence[str], width: int | None = WIDTH, out=None) -> None:
    """Notes under a table: each wrapped to lines of at most ``width`` characters, the lines
    after its first indented (None: each note on one line as it is, ``--wide``)."""
    out = out or sys.stdout
    for text in map(printable, lines):
        wrapped = [text] if width is None or len(text) <= width else textwrap.wrap(
            text, width, subsequent_indent="  ", break_on_hyphens=False)
        out.write("\n".join(wrapped or [""]) + "\n")


def write_csv(path: Path, rows: Sequence[dict]) -> Path:
    """Atomic CSV of ``rows`` (columns: the union of their keys, in first-seen order)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(c for r in rows for c in r)))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(Path(path), buf.getvalue())
    return Path(path)


def emit_json(obj: Any, out=None) -> None:
    """Write ``obj`` (tables in a dict) as strict JSON: an unbounded value (an interval's end)
    is written "inf" / "-inf", since JSON has no infinity."""
    def finite(v):
        if isinstance(v, float) and math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        return [finite(x) for x in v] if isinstance(v, (list, tuple)) else v

    out = out or sys.stdout
    json.dump(finite(obj), out, indent=1, default=str, allow_nan=False)
    out.write("\n")
