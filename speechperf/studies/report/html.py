"""``speechperf report RUN... --out DIR``: one self-contained HTML page comparing runs.

It reads only the results database and the run folders (never trains): figures as PNG
files beside ``index.html``, every table also as CSV. The sections come from the registry
in :mod:`speechperf.studies.report.sections`; whatever a run did not measure (GPU, RAPL energy,
beam sweeps) is said in words instead of drawn as empty axes. All text from runs and
databases (transcripts above all) is HTML-escaped.
"""
from __future__ import annotations

import html
from itertools import takewhile
from pathlib import Path

from speechperf.atomic import atomic_write_text
from speechperf.errors import SpeechperfError
from speechperf.metric import DEFAULT_TARGET
from speechperf.studies.cost import read_cost
from speechperf.studies.report.runs import legend, load_run
from speechperf.studies.report.sections import Context, Figure, Note, Section, Table, ordered
from speechperf.results import ResultsDB
from speechperf.tables import _fmt, write_csv
from speechperf.hardware.platforms import with_price_overrides
from speechperf.scoring.targets import parse_targets
from speechperf.results.labels import unique_labels
from speechperf.results.view import RunView

# Tables as wide as the page at most (a 1280-pixel window never scrolls sideways): a long cell
# (time parts, price notes, a path: class "long") may wrap anywhere rather than widen its
# column; numbers and names stay whole, headers wrap between words; a table of many columns
# is shown in parts (html_table).
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1300px;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;max-width:100%;font-size:90%}"
         "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td.long{overflow-wrap:anywhere;min-width:6em}"
         "th{background:#f3f3f3}img{max-width:100%}.na{color:#a60}.cap{color:#555;font-size:90%}")


def build_report(runs: list[Path], out: Path, db_path: Path | None = None, price_per_hour: float | None = None,
                 platform_file: Path | None = None, targets="paper", metric: str = DEFAULT_TARGET,
                 costs: list[Path] = ()) -> Path:
    """Write ``out/index.html`` (+ PNG and CSV files) for ``runs``; returns its path.

    Each run's rows come from its own folder (runs from different machines side by side);
    ``db_path``: a shared database for the database-wide sections (benchmarks, parallel
    sweeps); default for those sections: the first run's database. ``price_per_hour``,
    ``platform_file``: prices that override what the runs recorded
    (:func:`speechperf.hardware.platforms.of_run`). ``targets``: the TTA targets, a set
    (``paper``, ``algoperf``) or numbers of ``metric`` (:func:`speechperf.scoring.targets.parse_targets`).
    ``costs``: saved ``speechperf cost --json`` outputs, drawn against device count (read before anything is written).
    """
    if not runs:
        raise SpeechperfError("report needs at least one run folder")
    out = Path(out)
    spec = parse_targets(targets, metric)
    cost_data = tuple((Path(c).name, read_cost(Path(c))) for c in costs)  # a malformed one refused first, named
    opened = [RunView.open(Path(r)) for r in runs]
    try:
        loaded = [load_run(r, label) for r, label in zip(opened, unique_labels(opened))]
        for r in loaded:  # a named target set only for runs of its protocol, before anything is written
            spec.check_run(r["config"], r["label"])
        for r in loaded:
            r["env"] = with_price_overrides(r["env"], price_per_hour, platform_file)
        shared = ResultsDB(db_path, readonly=True) if db_path else None
        db = shared or opened[0].rows.db
        try:
            out.mkdir(parents=True, exist_ok=True)
            ctx = Context(loaded, out, db, spec, cost_data)
            sections = [builder(ctx) for _, builder in ordered()]
        finally:
            if shared is not None:
                shared.close()
    finally:
        for r in opened:
            r.close()
    labels = ", ".join(legend(r) for r in ctx.runs)
    parts = [f"<h1>speechperf report: {len(ctx.runs)} run(s)</h1>",
             f"<p>Runs: {html.escape(labels)}. Benchmark and parallel sections from: {html.escape(str(db.path))}.</p>"]
    parts += [render_section(s, out) for s in sections]
    page = ("<!doctype html><html><head><meta charset=utf-8><title>speechperf report</title>"
            f"<style>{STYLE}</style></head><body>" + "\n".join(parts) + "</body></html>")
    atomic_write_text(out / "index.html", page)
    return out / "index.html"


def render_section(section: Section, out: Path) -> str:
    """HTML of one section; tables are also written as CSV files into ``out``."""
    parts = [f"<h2>{html.escape(section.title)}</h2>"]
    for block in section.blocks:
        if isinstance(block, Figure):
            if block.path is not None:
                parts.append(f'<img src="{html.escape(block.name)}" alt="{html.escape(block.caption or block.name)}">')
                if block.caption:
                    parts.append(f"<p class=cap>{html.escape(block.caption)}</p>")
            else:
                what = f" ({block.caption})" if block.caption else ""
                parts.append(f"<p class=na>Not shown{html.escape(what)}: {html.escape(block.why)}.</p>")
        elif isinstance(block, Table):
            if block.rows:
                write_csv(out / block.name, block.rows)
                parts.append(html_table(block.rows)
                             + f'<p><a href="{html.escape(block.name)}">{html.escape(block.name)}</a></p>')
            else:
                parts.append(f"<p class=na>Not measured: {html.escape(block.why or 'no rows')}.</p>")
        elif isinstance(block, Note):
            parts.append(f"<p>{html.escape(block.text)}</p>")
        else:
            raise TypeError(f"unknown report block {block!r}")
    return "\n".join(parts)


LONG = 24  # characters: a cell longer than this may wrap anywhere (STYLE's td.long)
KEYS = ("run", "metric", "group", "target", "A", "B", "platform", "model")  # leading columns that name a row
PART = 12  # columns of a table part at most, besides the naming ones: what a 1280-pixel page holds side by side


def html_table(rows: list[dict]) -> str:
    """``rows`` as HTML: a table of more than :data:`PART` columns besides its leading naming
    ones (:data:`KEYS`) as several tables of even size one under the other, each repeating
    those (the CSV file keeps one table)."""
    cols = list(dict.fromkeys(c for r in rows for c in r))  # union of keys, first-seen order
    keys = list(takewhile(lambda c: c in KEYS, cols))
    rest = cols[len(keys):]
    size = -(-len(rest) // max(1, -(-len(rest) // PART)))  # parts of even size: 28 columns as 10, 9, 9
    parts = [rest[i:i + size] for i in range(0, len(rest), size)] or [[]]
    return "".join(_table(rows, keys + part) for part in parts)


def _table(rows: list[dict], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(_fmt(r.get(c))) for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(text: str) -> str:
    return f"<td class=long>{html.escape(text)}</td>" if len(text) > LONG else f"<td>{html.escape(text)}</td>"
