"""The one upgrade step for a run folder recorded before a field existed.

Run folder format 2 (results/formats.py's ``FORMAT``) is the only one this release reads, but a
folder of that format may hold fewer fields than this release records: a ``config.json``
without a train field added since, a database without a column added since. Every gap of that
kind is filled here, as the folder is opened, so that no reader carries a fallback of its own:

- :func:`config`: ``RunView.config`` (config.json as read) with each field of
  :data:`CONFIG_FIELDS` it lacks set to the value every run had before the field was recorded;
- :func:`rows`: the rows ``RunView.rows`` (results/rows.py) reads from a table with every column of
  :data:`ADDED_COLUMNS` present, None where the database lacks it (a reader opens it
  read-only, so nothing is added to the file);
- :func:`add_columns`: a database opened for writing (``ResultsDB``) gets those columns.

A value filled in as None means "not recorded": readers show it empty or "not measured", never 0.
"""
from __future__ import annotations

from typing import Iterable

from speechperf import metric
from speechperf.results import schema

# Columns added after the first release (NULL in the rows of a database written before them):
# evals and beam_sweep hold every declared metric's columns (speechperf/metric.py).
ADDED_COLUMNS = {"runs": ("label",), "iterations": ("model_flops", "comm_s", "comm_bytes", "data_s", "ckpt_s"),
                 "evals": schema.EVALS_PARTS + tuple(schema.EVALS_DECODE) + tuple(schema.EVALS_METRICS),
                 "samples": ("segment",), "beam_sweep": tuple(schema.EVALS_METRICS)}

# config.json fields recorded after the first release, with the value every run recorded before
# them had: the benchmark protocol (speechperf's own, scoring/targets.py) and the stop rule (the
# default target metric, no target, and the default count of evaluations whose median must reach
# it: config/training.py's TrainConfig defaults at the time).
CONFIG_FIELDS = {("train", "protocol"): "speechperf", ("train", "target_metric"): metric.DEFAULT_TARGET,
                 ("train", "target"): 0.0, ("train", "target_epochs"): 3}


def config(recorded: dict) -> dict:
    """``recorded`` (a run's config.json) with every field of :data:`CONFIG_FIELDS` it lacks; a
    new dict (the one read is left as it is). A section that is not an object is left to the
    readers' own checks."""
    out = dict(recorded)
    for (section, field), value in CONFIG_FIELDS.items():
        part = out.get(section, {})
        if isinstance(part, dict) and field not in part:
            out[section] = {**part, field: value}
    return out


def rows(table: str, found: Iterable[dict]) -> list[dict]:
    """Rows of ``table`` as read, each holding every column of :data:`ADDED_COLUMNS` (None where
    the database predates it)."""
    added = dict.fromkeys(ADDED_COLUMNS.get(table, ()))
    return [{**added, **r} for r in found]


def add_columns(conn) -> None:
    """Add to a database opened for writing (a sqlite3 connection) the columns of
    :data:`ADDED_COLUMNS` it lacks; its older rows hold NULL there."""
    for table, columns in ADDED_COLUMNS.items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        for col in columns:
            if col not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {col}")
