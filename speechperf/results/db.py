"""SQLite results database.

Every run writes its rows into its own folder (``RUN/results.db``), so that a folder copied to
another machine carries everything it measured; a shared database (``--db``) may collect the
rows of many runs as well. The schema of every table lives in :mod:`speechperf.results.schema`.
WAL mode and a busy timeout let several runs write one shared file at once and a reader (the
report) open a file while a run writes it; readers open the file read-only and never create
one. A run folder's own database is sealed when its run ends (:meth:`ResultsDB.seal`: the WAL
folded into the file, rollback-journal mode), so that reading a finished run writes nothing
beside it and works in a read-only folder; a run folder's database is opened only where it is a
file of the folder itself (``nofollow``: a symbolic link is refused, never followed out of it).
"""
from __future__ import annotations

import json
import os
import sqlite3
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

from speechperf.errors import MachineFault, SpeechperfError
from speechperf.results import schema, upgrade
from speechperf.atomic import DiskFullError, disk_full

BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another writer's transaction (several runs, one file)
SEAL_WAIT_S = 1.0  # how long a run's end waits to seal its database while a reader holds it (seal)
BESIDE = ("-wal", "-shm", "-journal")  # the files SQLite keeps beside a database, by name
# The runs table of the first release: every database speechperf ever wrote has it (a writer
# creates every table), so a file with tables but not these is another program's.
FIRST_RUNS_COLUMNS = frozenset({"run_id", "kind", "preset", "seed", "platform", "out_dir", "config_json", "env_json",
                                "started_at", "status"})


class ResultsError(SpeechperfError):
    """A results database is missing, unreadable or not a database; the message names it."""


class ResultsDB:
    """A thin wrapper over sqlite3 with the speechperf schema.

    ``readonly``: open an existing file without writing or creating it (``mode=ro``, and
    ``immutable`` where nothing could be written beside it: :func:`read_uri`); a missing or
    corrupt file raises :class:`ResultsError` naming it instead of reading as empty.
    ``nofollow``: a run folder's own database, which must be a file of the folder itself, as must
    SQLite's files beside it (:func:`refuse_links`).
    """

    def __init__(self, path: str | Path, readonly: bool = False, nofollow: bool = False):
        self.path, self.readonly = Path(path), readonly
        if nofollow:
            refuse_links(self.path)
        try:
            if readonly:
                if not self.path.is_file():
                    raise ResultsError(f"no results database at {self.path}")
                check_header(self.path)
                self.conn = sqlite3.connect(read_uri(self.path), uri=True, timeout=BUSY_TIMEOUT_S)
                self._check_ours(readonly=True)
            else:
                if self.path.is_file() and self.path.stat().st_size:
                    check_header(self.path)  # a text file: refused as it is, not handed to SQLite
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S)
                self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                self._check_ours()  # before the first write: another program's file is left as it is
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.executescript(schema.ALL)
                upgrade.add_columns(self.conn)  # a database written before a column: results/upgrade.py
        except sqlite3.OperationalError as e:
            raise _write_fault(self.path, e) from e
        except sqlite3.DatabaseError as e:
            raise ResultsError(f"{self.path} is not a readable results database ({e})") from e
        self.conn.row_factory = sqlite3.Row

    def _check_ours(self, readonly: bool = False) -> None:
        """Refuse to write into a database that is not speechperf's (it holds tables, none of
        speechperf's, or a runs table without the columns every speechperf one has): every
        writer opens through here, so none adds its tables or columns to another program's file.
        ``readonly``: a file to read, which must hold some table of speechperf's (a reader that
        reads no row, ``eval``, refuses an empty database too)."""
        tables = sorted(r[0] for r in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"))
        if not tables and not readonly:
            return  # a new or empty file
        missing = FIRST_RUNS_COLUMNS - {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")}
        why = _foreign(tables, missing, readonly)
        if why:
            self.conn.close()
            raise ResultsError(f"{self.path} is not a speechperf results database ({why})"
                               + ("" if readonly else "; nothing was written to it: give another file"))

    @contextmanager
    def _writing(self):
        """One transaction; a full disk, a read-only file or a corrupt one named, never a bare
        sqlite3 traceback."""
        try:
            with self.conn:
                yield
        except sqlite3.OperationalError as e:
            raise _write_fault(self.path, e) from e
        except sqlite3.DatabaseError as e:
            raise ResultsError(f"{self.path} is not a readable results database ({e})") from e

    def ensure_schema(self, ddl: str) -> None:
        """Create tables from idempotent DDL (every speechperf table exists already: schema.ALL)."""
        self.conn.executescript(ddl)

    def has_table(self, name: str) -> bool:
        """True when table ``name`` exists and holds rows: a writer creates every table from the
        start (an empty one: nothing recorded); a database written before a table was added lacks
        it, which reads as nothing recorded."""
        if not self.query("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", [name]):
            return False
        return bool(self.query(f"SELECT 1 FROM {name} LIMIT 1"))

    def upsert(self, table: str, row: dict[str, Any]) -> None:
        row = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in row.items()}
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self._writing():
            self.conn.execute(f"INSERT OR REPLACE INTO {table} ({cols}) VALUES ({marks})", list(row.values()))

    def insert_many(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        cols = list(rows[0])
        marks = ", ".join("?" for _ in cols)
        with self._writing():
            self.conn.executemany(
                f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) VALUES ({marks})",
                [[r[c] for c in cols] for r in rows],
            )

    def execute(self, sql: str, params: Iterable[Any] = ()) -> None:
        """One write statement in its own transaction."""
        with self._writing():
            self.conn.execute(sql, list(params))

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        try:
            return [dict(r) for r in self.conn.execute(sql, list(params))]
        except sqlite3.DatabaseError as e:
            raise ResultsError(f"{self.path}: cannot read ({e})") from e

    def seal(self) -> bool:
        """Fold the write-ahead log into the file and leave it in rollback-journal mode (a run's own
        database, as its run ends): complete in one file, which a reader opens read-only without
        writing anything beside it (in WAL mode even a read-only reader makes -wal and -shm files,
        and cannot open one in a read-only folder). The next writer turns WAL on again. False where
        another connection (a reader of the running run) holds it: it stays in WAL mode, complete
        and readable as before."""
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {int(SEAL_WAIT_S * 1000)}")
            mode = self.conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
        except sqlite3.OperationalError:  # busy: another connection reads it
            return False
        return str(mode).lower() == "delete"

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _foreign(tables: list[str], missing: set[str], readonly: bool) -> str | None:
    """Why a database holding ``tables`` (its runs table lacking ``missing``) is not speechperf's."""
    if "runs" in tables and missing:
        return f"its runs table lacks {', '.join(sorted(missing))}"
    if tables and not set(tables) & set(schema.TABLES):
        return f"it holds {', '.join(tables[:5])}{' ...' if len(tables) > 5 else ''}, no table of speechperf's"
    if readonly and not tables:
        return "it holds no table"
    return None


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
WAL_VERSION = 2  # the header's read/write version bytes (offsets 18, 19) in WAL mode; 1: rollback journal


def refuse_links(path: Path) -> None:
    """Refuse a run folder's database that is not a file of the folder itself: ``path`` or one of
    SQLite's files beside it (-wal, -shm, -journal) a symbolic link, a folder, a device or a fifo.
    SQLite resolves a link before it opens the file (and makes its -wal and -shm files beside the
    target), so a copied run folder's ``results.db -> /elsewhere/x.db`` would read, and write
    beside, a database outside the folder. Checked with lstat before SQLite opens anything."""
    for p in (path, *(path.with_name(path.name + end) for end in BESIDE)):
        try:
            mode = os.lstat(p).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ResultsError(f"{p}: cannot read ({e.strerror or e})") from e
        if stat.S_ISLNK(mode):
            raise ResultsError(f"{p} is a symbolic link (to {os.readlink(p)}): a run folder's database is read only "
                               "from the folder itself, never followed out of it; put the file itself there")
        if not stat.S_ISREG(mode):
            raise ResultsError(f"{p} is not a file: a run folder's database must be one")


def read_uri(path: Path) -> str:
    """The URI a reader opens ``path`` with: read-only (``mode=ro``); and ``immutable`` where SQLite
    could write nothing beside it and nothing is in its WAL (a database in WAL mode whose -wal file is
    gone, in a folder this process cannot write): there ``mode=ro`` alone cannot open it (a WAL reader
    needs a -shm file). A sealed database (:meth:`ResultsDB.seal`, rollback-journal mode) opens
    read-only and writes nothing; one in WAL mode with its -wal (a run that trains) is read as
    SQLite reads a database another process writes."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    with open(path, "rb") as f:
        head = f.read(20)
    wal = len(head) == 20 and head[18] == WAL_VERSION
    if wal and not path.with_name(path.name + "-wal").exists() and not os.access(path.parent, os.W_OK):
        uri += "&immutable=1"
    return uri


def check_header(path: Path) -> None:
    """Refuse a file that is not an SQLite database before SQLite opens it: SQLite takes an empty
    file for a new database, and a writer would make one of it (a damaged run folder modified)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise ResultsError(f"{path}: cannot read ({e.strerror or e})") from e
    if head != SQLITE_HEADER:
        what = "an empty file" if not head else "it does not begin with SQLite's header"
        raise ResultsError(f"{path} is not a readable results database ({what}); nothing was written to it")


def _write_fault(path: Path, e: sqlite3.OperationalError) -> Exception:
    """The error for a failed write to the database at ``path``."""
    text = str(e)
    if "full" in text or disk_full(e, path.parent):  # sqlite: "database or disk is full"
        return DiskFullError.writing(path, text)
    if "readonly" in text or "unable to open" in text or "read-only" in text:
        return MachineFault(f"{path} cannot be written ({text}): make its folder writable, or give another folder")
    return ResultsError(f"{path}: cannot write ({text})")
