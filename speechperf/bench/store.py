"""A sweep's rows into the results database the moment each is measured.

Every row of one sweep carries the sweep's start time in ``at`` (the report's "latest
sweep" is the rows of the largest ``at``); each insert is committed on its own, so an
interrupted sweep keeps every row it measured.
"""
from __future__ import annotations

import time
from speechperf.results import ResultsDB


class SweepStore:
    """``add`` each row as it comes; ``replace`` the sweep's rows when columns computed over
    the whole sweep (a measured peak) are known. Without a database path it does nothing."""

    def __init__(self, db_path, table: str, schema: str, example: dict, extra: dict | None = None):
        self.db, self.table, self.extra, self.at = None, table, extra or {}, time.time()
        if db_path:
            self.db = ResultsDB(db_path)
            self.db.ensure_schema(schema)
            add_missing_columns(self.db, table, {**example, **self.extra})

    def add(self, row: dict) -> None:
        if self.db is not None:
            self.db.insert_many(self.table, [{"at": self.at, **row, **self.extra}])

    def replace(self, rows: list[dict]) -> None:
        if self.db is not None and rows:
            with self.db.conn:
                self.db.conn.execute(f"DELETE FROM {self.table} WHERE at = ?", [self.at])
            self.db.insert_many(self.table, [{"at": self.at, **r, **self.extra} for r in rows])

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


def add_missing_columns(db, table: str, row: dict) -> None:
    """A database written by an older version lacks the newer columns (power, measured peak, timing)."""
    have = {c["name"] for c in db.query(f"PRAGMA table_info({table})")}
    for col in row:
        if col not in have:
            db.conn.execute(f"ALTER TABLE {table} ADD COLUMN {col}")
