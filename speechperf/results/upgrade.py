"""The one upgrade step for a run folder recorded before a field existed.

Run folder format 2 (results/formats.py's ``FORMAT``) is the only one this release reads, but a
folder of that format may hold fewer fields than this release records: a ``config.json``
without a train field added since, a database without a column added since. Every gap of that
kind is filled here, as the folder is opened, so that no reader carries a fallback of its own:

- :func:`config`: ``RunView.config`` (config.json as read; a checkpoint's configuration) with
  the flat ``train`` keys of an earlier release moved into their sections (one table:
  config/training/moved.py's ``MOVED``) and each field of :data:`CONFIG_FIELDS` it lacks set to
  the value every run had before the field was recorded;
- :func:`recipe`: a reference's or a run's recipe of dotted keys (studies/rcp.py) with the old
  ``train.X`` keys named as their new ``train.SECTION.X``;
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
# it: config/training/stop_config.py's StopConfig defaults at the time).
# Paths are of this release's sections (the flat keys of the run's own release are moved first).
CONFIG_FIELDS = {("train", "protocol"): "speechperf", ("train", "stop", "target_metric"): metric.DEFAULT_TARGET,
                 ("train", "stop", "target"): 0.0, ("train", "stop", "target_epochs"): 3}


def config(recorded: dict) -> dict:
    """``recorded`` (a run's config.json, a checkpoint's configuration) with its ``train`` keys in
    this release's sections and every field of :data:`CONFIG_FIELDS` it lacks; a new dict (the
    one read is left as it is). A section that is not an object is left to the readers' own
    checks."""
    # the config package loads torch (its stages' configs); the database's readers need none
    from speechperf.config.training.moved import upgrade_train

    out = dict(recorded)
    if isinstance(out.get("train"), dict):
        out["train"] = upgrade_train(out["train"])
    for path, value in CONFIG_FIELDS.items():
        _fill(out, path, value)
    return out


def _fill(node: dict, path: tuple, value) -> None:
    """``node[path]`` set to ``value`` where it is missing (each object on the way made as needed)."""
    *parents, field = path
    for name in parents:
        part = node.get(name, {})
        if not isinstance(part, dict):
            return
        node[name] = node = dict(part)
    node.setdefault(field, value)


def recipe(flat: dict) -> dict:
    """A recipe of dotted keys (``"train.lr": 0.003``: a reference file's, config/rcp/*.json) with
    each old flat train key as this release's (``"train.optim.lr"``); a new dict."""
    from speechperf.config.training.moved import upgrade_key  # as config's: the config package loads torch

    return {upgrade_key(k): v for k, v in flat.items()}


def overrides(items) -> list[str]:
    """A reference's recorded ``key=value`` overrides (``train.final_splits=none``) with each
    old flat train key as this release's (``train.eval.final_splits=none``)."""
    from speechperf.config.training.moved import upgrade_key  # as config's: the config package loads torch

    return [upgrade_key(k) + "=" + v if "=" in item else item for item in items for k, _, v in [item.partition("=")]]


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
