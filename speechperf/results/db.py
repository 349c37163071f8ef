"""SQLite results database.

One file (by default ``results.db`` beside the run folders) holds every run's rows, so that
``tta``, ``report`` and the benchmarks compare runs made at different times and on
different machines. Tables of other stages (bench, parallel) are created by those stages
through :meth:`ResultsDB.ensure_schema`. WAL mode lets a reader (the report) open the file
while a run writes it.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Iterable

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,      -- unique name (the run folder's name plus a short hash)
    kind TEXT NOT NULL,           -- 'train', 'parallel', 'bench'
    preset TEXT,
    seed INTEGER,
    platform TEXT,                -- platform name (detected or given)
    out_dir TEXT,                 -- run folder
    config_json TEXT,             -- RunConfig.to_dict()
    env_json TEXT,                -- hardware and library versions
    started_at REAL,              -- unix time of model creation
    status TEXT                   -- 'running', 'success', 'aborted', 'failed'
);
CREATE TABLE IF NOT EXISTS iterations (
    run_id TEXT, iteration INTEGER, epoch INTEGER,
    clock_s REAL,                 -- TTA clock (seconds since model creation, down time excluded)
    loss REAL, batch_size INTEGER, frames INTEGER, audio_s REAL,
    step_s REAL, utts_per_s REAL, audio_s_per_s REAL,
    PRIMARY KEY (run_id, iteration)
);
CREATE TABLE IF NOT EXISTS evals (
    run_id TEXT, epoch INTEGER, split TEXT, decoder TEXT, beam INTEGER,
    clock_s REAL,                 -- TTA clock when the evaluation finished
    eval_s REAL,                  -- seconds the evaluation took (not training time)
    loss REAL, wer REAL, cer REAL, cer_paper REAL, n_utts INTEGER,
    final INTEGER DEFAULT 0,      -- 1 for the final evaluation after training
    PRIMARY KEY (run_id, epoch, split, decoder, beam, final)
);
CREATE TABLE IF NOT EXISTS samples (
    run_id TEXT, t REAL, source TEXT, metric TEXT, value REAL
);
CREATE INDEX IF NOT EXISTS samples_run ON samples (run_id, source, metric);
"""


def default_db_path(out_dir: str | Path) -> Path:
    """The database shared by all runs under ``out_dir``'s parent folder."""
    return Path(out_dir).resolve().parent / "results.db"


class ResultsDB:
    """A thin wrapper over sqlite3 with the speechperf schema."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), timeout=30.0)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(SCHEMA)

    def ensure_schema(self, ddl: str) -> None:
        """Create a stage's own tables (idempotent DDL)."""
        self.conn.executescript(ddl)

    def has_table(self, name: str) -> bool:
        """True once a stage created table ``name`` (bench, sweep and parallel tables are optional)."""
        return bool(self.query("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", [name]))

    def upsert(self, table: str, row: dict[str, Any]) -> None:
        row = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in row.items()}
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self.conn:
            self.conn.execute(f"INSERT OR REPLACE INTO {table} ({cols}) VALUES ({marks})", list(row.values()))

    def insert_many(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        cols = list(rows[0])
        marks = ", ".join("?" for _ in cols)
        with self.conn:
            self.conn.executemany(
                f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) VALUES ({marks})",
                [[r[c] for c in cols] for r in rows],
            )

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute(sql, list(params))]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
