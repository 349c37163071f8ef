"""Print rows as an aligned text table or, with ``--json``, as a JSON list of objects; write
them as CSV files."""
from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from speechperf.atomic import atomic_write_text


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "NA"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def emit(rows: Sequence[dict], as_json: bool, columns: Sequence[str] | None = None, out=None) -> None:
    """Write ``rows`` to ``out`` (stdout): the same rows either way, JSON for scripts."""
    out = out or sys.stdout
    if as_json:
        json.dump(list(rows), out, indent=1, default=str)
        out.write("\n")
    else:
        out.write(format_table(rows, columns) + "\n")


def notes(rows: Sequence[dict], column: str, out=None) -> None:
    """Below a text table: each run's ``column`` (a long note, e.g. why its MFU is not shown)
    once, as ``note: RUN: TEXT``; nothing where no row has one."""
    out = out or sys.stdout
    for run, text in dict.fromkeys((r.get("run"), r[column]) for r in rows if r.get(column)):
        out.write(f"note: {run}: {text}\n")


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
