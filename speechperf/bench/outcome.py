"""Whether a benchmark sweep measured anything, for its exit status.

A sweep with at least one measured row succeeds (exit 0): rows a device cannot run say
"unsupported on this CPU: ..." and are not failures. A sweep that measured nothing fails
(``RunFailed``, exit 1) with the causes in words, so a script never reads an empty table
as a result.
"""
from __future__ import annotations

from speechperf.errors import RunFailed

SHOWN = 3  # distinct causes named in the message


def cause(status: str) -> str:
    """The kind of a row's status: "ok", "unsupported", "skipped", "out of memory", "failed"."""
    if status.startswith("unsupported"):
        return "unsupported"
    return status.split(":", 1)[0]


def check_measured(rows: list[dict], what: str) -> None:
    """Raise ``RunFailed`` naming the causes when no row of ``rows`` has status "ok"."""
    if any(r["status"] == "ok" for r in rows):
        return
    if not rows:
        raise RunFailed(f"{what}: nothing to measure (no rows)")
    causes = list(dict.fromkeys(r["status"] for r in rows))
    named = "; ".join(causes[:SHOWN]) + (f"; and {len(causes) - SHOWN} more" if len(causes) > SHOWN else "")
    kinds = {cause(s) for s in causes}
    if kinds <= {"unsupported", "skipped"}:
        head = f"nothing measured: every one of the {len(rows)} rows is unsupported here or skipped"
    else:
        head = f"every one of the {len(rows)} rows failed"
    raise RunFailed(f"{what}: {head}: {named}")
