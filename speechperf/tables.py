"""Print rows as an aligned text table or, with ``--json``, as a JSON list of objects."""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Sequence


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
