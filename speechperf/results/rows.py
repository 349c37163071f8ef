"""A run's rows in its results database: what analyses query, and what training writes.

:class:`RowQueries` reads the run's own database, opened read-only on first use (a reader
never writes or creates one: results/db.py). :class:`Rows` is the writer's: the same queries
on its own database opened for writing, and every write sent to the run's own database and
to the shared one (``--db``) where given. Iteration rows are buffered and written at each
checkpoint (``flush``), so that a run killed between checkpoints leaves none that its resume
would measure again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from speechperf.results import upgrade
from speechperf.results.db import ResultsDB
from speechperf.results.formats import RunError
from speechperf.results.progress import Progress


class RowQueries:
    """The rows of run ``run_id`` in ``db_path``, read-only; ``eval_split`` gives the split
    its per-epoch validation rows are of (the run's config)."""

    def __init__(self, run_id: str, db_path: Path, folder: Path, eval_split: Callable[[], str]):
        self.run_id, self.db_path, self.folder, self.eval_split = run_id, Path(db_path), Path(folder), eval_split
        self._dbs: list[ResultsDB] | None = None

    def dbs(self) -> list[ResultsDB]:
        """The open databases, the run's own first (queried); a reader opens only that one."""
        if self._dbs is None:
            self._dbs = [ResultsDB(self.db_path, readonly=True, nofollow=True)]
        return self._dbs

    @property
    def db(self) -> ResultsDB:
        return self.dbs()[0]

    def query(self, sql: str, params=()) -> list[dict]:
        return self.db.query(sql, params)

    def _rows(self, table: str, where: str, params=()) -> list[dict]:
        """This run's rows of ``table`` with every column recorded since (results/upgrade.py)."""
        found = self.query(f"SELECT * FROM {table} WHERE run_id = ? {where}", [self.run_id, *params])
        return upgrade.rows(table, found)

    def row(self) -> dict:
        """The run's row in the runs table; a run missing there is an error, not an empty table."""
        rows = self._rows("runs", "")
        if not rows:
            raise RunError(f"run {self.run_id!r} ({self.folder}) is not in {self.db_path}: its rows are missing")
        return rows[0]

    def evals(self, final: bool = False) -> list[dict]:
        """Per-epoch validation rows in epoch order, or the final evaluations (every split)."""
        where = "AND final = 1 ORDER BY split, decoder, beam" if final else "AND final = 0 AND split = ? ORDER BY epoch"
        return self._rows("evals", where, [] if final else [self.eval_split()])

    def iterations(self) -> list[dict]:
        return self._rows("iterations", "ORDER BY iteration")

    def samples(self) -> list[dict]:
        """Every stored sample (t on the TTA clock) with its ``segment`` (the process that sampled it)."""
        return self._rows("samples", "ORDER BY t")

    def short_of(self, iterations: int, epochs: int, by: Path) -> str | None:
        """What the database lacks of a run that ``by`` (its checkpoint or summary) says did
        ``iterations`` steps and ``epochs`` per-epoch evaluations (None: it holds them). A run folder
        copied without its ``results.db-wal`` (or a database put back from an older copy) holds fewer
        rows than its progress: a run continued over it, or a TTA read from it, would lack them."""
        have = self.query("SELECT COUNT(*) AS n FROM iterations WHERE run_id = ? AND iteration <= ?",
                          [self.run_id, iterations])[0]["n"]
        evals = self.query("SELECT COUNT(DISTINCT epoch) AS n FROM evals WHERE run_id = ? AND final = 0 AND split = ?",
                           [self.run_id, self.eval_split()])[0]["n"]
        if have >= iterations and evals >= epochs:
            return None
        return (f"{self.db_path} holds {have} of the {iterations} iterations and {evals} of the {epochs} evaluations "
                f"that {by} records: its rows were lost (a copy without results.db-wal?); copy the run's results.db "
                "back with its results.db-wal, or remove the folder to start the run over")

    def beam_sweep(self) -> list[dict]:
        return self._rows("beam_sweep", "ORDER BY decoder, beam") if self.db.has_table("beam_sweep") else []

    def close(self) -> None:
        for db in self._dbs or []:
            db.close()
        self._dbs = None

    def seal(self) -> None:
        """The run's own database left complete in one file (results/db.py ``ResultsDB.seal``), as its
        run ends; a shared one (``--db``), which other runs write, stays as it is."""
        if self._dbs:
            self._dbs[0].seal()


class Rows(RowQueries):
    """A writer's rows: its own database opened for writing (and queried), then ``shared_db``."""

    def __init__(self, run_id: str, db_path: Path, folder: Path, eval_split: Callable[[], str],
                 shared_db: Path | None = None):
        super().__init__(run_id, db_path, folder, eval_split)
        self.shared_db = Path(shared_db) if shared_db else None
        self._pending: list[dict] = []  # iteration rows not yet written (flushed at checkpoints)

    def dbs(self) -> list[ResultsDB]:
        if self._dbs is None:
            self._dbs = [ResultsDB(self.db_path, nofollow=True)]
            if self.shared_db is not None and self.shared_db.resolve() != self.db_path.resolve():
                self._dbs.append(ResultsDB(self.shared_db))
        return self._dbs

    def upsert(self, table: str, row: dict) -> None:
        for db in self.dbs():
            db.upsert(table, row)

    def insert(self, table: str, rows: list[dict]) -> None:
        for db in self.dbs():
            db.insert_many(table, rows)

    def execute(self, sql: str, params=()) -> None:
        for db in self.dbs():
            db.execute(sql, params)

    def add_iteration(self, row: dict) -> None:
        """Buffer a training iteration's row; written at the next ``flush`` (every checkpoint)."""
        self._pending.append({"run_id": self.run_id, **row})

    def flush(self) -> None:
        if self._pending:
            self.insert("iterations", self._pending)
            self._pending.clear()

    def set_status(self, status: str) -> None:
        self.execute("UPDATE runs SET status = ? WHERE run_id = ?", [status, self.run_id])

    def forget_after(self, progress: Progress) -> None:
        """On resume: drop rows written after the checkpoint (they are measured again)."""
        self.execute("DELETE FROM iterations WHERE run_id = ? AND iteration > ?", [self.run_id, progress.iteration])
        self.execute("DELETE FROM evals WHERE run_id = ? AND (epoch >= ? OR final = 1)", [self.run_id, progress.epoch])
        self.execute("DELETE FROM samples WHERE run_id = ? AND t > ?", [self.run_id, progress.clock_s])
