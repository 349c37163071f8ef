"""The TTA tables as a person reads them in a terminal: a few columns that fit 100 characters
(``tta``, ``demo``), and notes of one line each that say what to do. ``--wide`` and ``--json``
show the rows of studies/tta.py and studies/aggregate.py whole; nothing here computes a figure,
it only picks and joins the ones those rows hold."""
from __future__ import annotations

from speechperf.metric import metric as metric_of
from speechperf.scoring.bootstrap import with_interval
from speechperf.studies.time_parts import PARTS, SHORT
from speechperf.studies.precisions import precision_notes

# the TTA table's columns, most important first (tables.fit leaves out the last ones first); prec: the
# precision the run trained in (a comparison of runs in different ones is each at its best: studies/precisions.py)
COLUMNS = ("run", "prec", "target", "TTA min", "error [95%]", "epochs", "MFU %", "to accuracy", "most time")
UNMETERED = "none: unmetered"  # reached, but neither energy nor a price was known
GROUP_COLUMNS = ("group", "target", "reached", "median TTA min", "olympic TTA min", "median epochs", "min/epoch")
COMPARISON_COLUMNS = ("A", "B", "target", "TTA ratio A/B [95%]", "verdict")


def short_rows(rows: list[dict]) -> list[dict]:
    """One narrow row per TTA row (studies/tta.py's ``tta_table``), in :data:`COLUMNS`."""
    return [{"run": r["run"], "prec": r.get("precision"), "target": target_text(r), "TTA min": tta_text(r),
             "error [95%]": error_text(r), "epochs": r["epochs to target"], "MFU %": _3g(r.get("MFU %")),
             "to accuracy": to_accuracy(r),
             "most time": largest_part(r.get("time parts s"))} for r in rows]


def columns(short: list[dict]) -> tuple[str, ...]:
    """:data:`COLUMNS` for these :func:`short_rows`, less ``prec`` where every run's name already says
    its precision (the default label: machine, preset, precision) and so 100 columns keep the rest."""
    named = all(r["prec"] is None or r["prec"] in str(r["run"]).split() for r in short)
    return tuple(c for c in COLUMNS if c != "prec" or not named)


def tta_text(row: dict) -> str | None:
    """The TTA, flagged ``shared`` where other processes took cores the run needed
    (telemetry/contention.py): such a TTA times the neighbours too."""
    tta = _3g(row["minutes"])
    return f"{tta} shared" if tta and str(row.get("shared") or "").startswith("yes") else tta


def _3g(value: float | None) -> str | None:
    """Three significant digits: a terminal's table, not a measurement's precision (--json)."""
    return None if value is None else f"{value:.3g}"


def error_text(row: dict) -> str | None:
    """``9.4 [8.1,10.7]``: the error where the target was declared and its 95% interval, to a
    tenth of a point (--wide: hundredths); no space after the comma, so that a two-digit error's
    cell (16 characters) leaves the demo's table within 100 columns whole."""
    value, low, high = row["error at TTA"], row["error 95% low"], row["error 95% high"]
    if value is None:
        return None
    return f"{value:.1f}" + (f" [{low:.1f},{high:.1f}]" if low is not None and high is not None else "")


def target_text(row: dict) -> str:
    """``CER 10``: the metric's label and the target."""
    return f"{metric_of(row['metric']).label} {row['target']:g}"


def to_accuracy(row: dict) -> str:
    """What reaching the target took beyond time: ``0.0021 kWh``, ``$0.013`` or both; else
    ``none`` and one word why (the row's price note says it whole, ``--wide``): a run still going
    (or cut off before it finished) has not failed to reach the target yet."""
    if row.get("minutes") is None:
        return "none yet: unfinished" if row.get("state") == "unfinished" else "none: unreached"
    kwh, usd = row.get("energy to accuracy kWh"), row.get("cost to accuracy $")
    parts = ([f"{kwh:.2g} kWh"] if kwh is not None else []) + ([f"${usd:.2g}"] if usd is not None else [])
    return " ".join(parts) or UNMETERED


def largest_part(parts: dict | None) -> str:
    """``steps 71%``: the largest share of where the time went (studies/time_parts.py); ``none``
    where the run has no evaluation to time up to."""
    if not parts or not parts.get("total s"):
        return "none"
    name = max(PARTS, key=lambda p: parts[f"{p} s"])
    return f"{SHORT[name]} {100 * parts[f'{name} s'] / parts['total s']:.0f}%"


def short_groups(groups: list[dict]) -> list[dict]:
    """The seed groups in :data:`GROUP_COLUMNS` (reached: ``2/3`` of the runs)."""
    return [{"group": g["group"], "target": g["target"], "reached": f"{g['reached']}/{g['runs']}",
             "median TTA min": g["median TTA min"], "olympic TTA min": g["olympic TTA min"],
             "median epochs": g["median epochs to target"], "min/epoch": g["median min/epoch"]} for g in groups]


def short_comparisons(comparisons: list[dict]) -> list[dict]:
    """The comparisons between groups in :data:`COMPARISON_COLUMNS` (the ratio with its interval in one cell)."""
    return [{"A": c["A"], "B": c["B"], "target": c["target"],
             "TTA ratio A/B [95%]": with_interval(c.get("TTA ratio A/B"), c.get("95% low"), c.get("95% high")),
             "verdict": c["verdict"]} for c in comparisons]


def several_seeds(groups: list[dict]) -> bool:
    """Whether a group holds more than one run (else the groups table repeats the TTA table)."""
    return any(g["runs"] > 1 for g in groups)


def short_notes(study: dict) -> list[str]:
    """The lines under the narrow tables: what a reader can act on, each under 100 characters
    where its run's name is; the explanations stay with ``--wide``."""
    runs = study["runs"]
    lines = [f"{r['run']}: {_mfu_note(r['MFU note'])}" for r in _once(runs, "MFU note")]
    lines += [f"{r['run']}: no energy or cost to accuracy: give --price-per-hour or --platform-file"
              for r in _once(runs, "run") if to_accuracy(r) == UNMETERED]
    lines += [f"{r['run']}: {r['reproduction']}" for r in _once(runs, "reproduction")]
    lines += [f"{r['run']}: {r['shared note']}" for r in _once(runs, "shared note")]
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    if len(workloads) > 1:
        lines.append(f"{len(workloads)} workloads, each run ranked within its own: {'; '.join(workloads)}")
    lines += precision_notes(runs)
    if runs:
        lines.append("every column and what each means: --wide; every value: --json")
    return lines


def _mfu_note(note: str) -> str:
    """Why a run's MFU is not shown, said once ("no MFU: ..." notes say it themselves)."""
    return note if note.startswith("no MFU") else f"MFU not shown: {note}"


def _once(rows: list[dict], column: str) -> list[dict]:
    """The first row of each run that holds ``column``."""
    seen: dict = {}
    for r in rows:
        if r.get(column) and r["run"] not in seen:
            seen[r["run"]] = r
    return list(seen.values())
