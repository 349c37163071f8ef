"""A run folder and everything in it: the one object that training writes and readers open.

A run folder (``train --out RUN``) is self-contained and portable: it can be copied, renamed
or moved to another machine and still opens there.

- ``run.json``: format version, run id, kind, label, where the features were (a hint only)
- ``config.json``, ``env.json``: the configuration and the machine (hardware, versions)
- ``results.db``: the run's own rows (runs, iterations, evals, samples, beam sweeps, ...)
- ``events.log`` (MLPerf style), ``sentences.jsonl``: append-only logs, cut back to the
  checkpoint's sizes on resume so that no line is doubled
- ``checkpoint.pt``: weights, optimizer, scheduler, scaler, RNG, data position, TTA clock
- ``summary.json``: written once the run finished (its presence means: finished)

Nothing recorded inside is trusted as an absolute path: the features folder is recorded as
given, resolved and relative to the run folder, used only where it exists (``--data FEATS``
points elsewhere). A shared database (``--db``) receives the same rows; a reader opens the run's.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from speechperf.atomic import atomic_write_text
from speechperf.errors import SpeechperfError
from speechperf.results import upgrade
from speechperf.results.db import ResultsDB
from speechperf.results.labels import default_label
from speechperf.results.layout import (APPEND_LOGS, CONFIG_FILE, DB_FILE, ENV_FILE, EVENTS_FILE, JSON_FILES, RUN_FILE,
                                       SENTENCES_FILE, SUMMARY_FILE, has_checkpoint)
from speechperf.results.shapes import check_file
from speechperf.results.progress import Clock, Progress  # noqa: F401 (the run's readers and writers import them here)
from speechperf.features.stats import stats_sha256
from speechperf.results.workload import workload

FORMAT = 2  # run.json "format": the only one this release reads
PLANS = ("fresh", "restart", "resume", "finished")  # a folder's admission (train/admission.py); restart: no checkpoint yet
SENTENCES_SHOWN = 3  # last logged sentence batches a reader gets


class RunError(SpeechperfError):
    """A run folder that cannot be opened as asked; the message names the folder and what is missing."""


class Run:
    """One run folder. ``Run.create`` starts one (writable), ``Run.open`` opens one (read-only
    unless ``write=True``); rows go to the folder's own database and to ``shared_db`` if given."""

    def __init__(self, folder: Path, info: dict, db_path: Path, write: bool, shared_db: Path | None = None,
                 data: Path | None = None):
        self.folder, self.info, self.db_path, self.write = Path(folder), info, Path(db_path), write
        self.shared_db = Path(shared_db) if shared_db else None
        self.data_override = Path(data) if data else None
        self._dbs: list[ResultsDB] | None = None
        self._events = None
        self._pending: list[dict] = []  # iteration rows not yet written (flushed at checkpoints)

    # ---- creating and opening -------------------------------------------------------------
    @staticmethod
    def exists(folder: Path) -> bool:
        return (Path(folder) / RUN_FILE).is_file()

    @classmethod
    def create(cls, folder: Path, *, kind: str, config: dict, env: dict, data: Path | None = None,
               label: str | None = None, shared_db: Path | None = None, run_id: str | None = None,
               started_at: float | None = None) -> "Run":
        """A new run in ``folder``: writes config.json, env.json, registers the run in its
        database(s), then writes run.json (last: its presence means a run is here, its rows
        written; a database that refuses the run leaves no run behind)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        info = {"format": FORMAT, "run_id": run_id or f"{folder.name}-{uuid.uuid4().hex[:8]}", "kind": kind,
                "label": label or default_label(env, config), "host": env.get("hostname"), "created_at": time.time()}
        if data is not None:
            info["data"] = {"given": str(data), "resolved": str(Path(data).resolve()),
                            "relative": os.path.relpath(Path(data).resolve(), folder.resolve()),
                            "stats_sha256": stats_sha256(data)}  # the normalization it trains on (features/stats.py)
        atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=1))
        atomic_write_text(folder / ENV_FILE, json.dumps(env, indent=1, default=str))
        run = cls(folder, info, folder / DB_FILE, write=True, shared_db=shared_db)
        run._register(started_at)
        atomic_write_text(folder / RUN_FILE, json.dumps(info, indent=1))
        return run

    def _register(self, started_at: float | None = None) -> None:
        """The run's row (status running) in every database it writes."""
        config, env = self._json(CONFIG_FILE), self.env  # the file as written
        self.upsert("runs", {"run_id": self.run_id, "kind": self.kind, "preset": config.get("preset"),
                             "seed": config.get("train", {}).get("seed", config.get("seed")),
                             "platform": env.get("platform") or env.get("cpu_model"),
                             "out_dir": str(self.folder.resolve()), "config_json": config, "env_json": dict(env),
                             "label": self.label, "started_at": started_at if started_at is not None else time.time(),
                             "status": "running"})

    def _check_registered(self) -> None:
        """A writer's run has its row in every database it writes: one left without it by a
        start that was refused part way (before run.json was written last) and never trained
        (no checkpoint) is registered anew; a shared database (``--db``) given later gets the
        row of the run's own. Never a run whose status cannot be written."""
        own, *shared = self.dbs()
        found = own.query("SELECT * FROM runs WHERE run_id = ?", [self.run_id])
        if not found:
            if self.has_checkpoint():
                raise RunError(f"run {self.run_id!r} ({self.folder}) is not in {own.path}: its rows are missing; "
                               "copy the run's results.db back, or remove the folder to start the run over")
            self._register()
            return
        for db in shared:
            if not db.query("SELECT 1 FROM runs WHERE run_id = ?", [self.run_id]):
                db.upsert("runs", found[0])

    @classmethod
    def begin(cls, folder: Path, plan: str, *, config: dict, env: dict, progress: Progress, data: Path,
              label: str | None = None, shared_db: Path | None = None) -> "Run":
        """The training run of ``folder`` as its admission planned it (train/admission.py):
        created (plan fresh), or opened to continue (restart, resume: the rows and log lines
        written after ``progress``, the checkpoint's, cut; a restart has no checkpoint: cut to
        nothing) and marked running again."""
        if plan == "fresh":
            return cls.create(folder, kind="train", config=config, env=env, data=data, label=label, shared_db=shared_db)
        run = cls.open(folder, data=data, shared_db=shared_db, write=True)
        run.truncate_logs(progress.log_sizes)
        run.forget_after(progress)
        run.set_status("running")
        return run

    @classmethod
    def open(cls, folder: Path, *, data: Path | None = None, shared_db: Path | None = None,
             write: bool = False) -> "Run":
        """An existing run folder. ``data``: the features folder to use instead of the recorded
        one; ``shared_db``: also write rows there (``write`` only)."""
        folder = Path(folder)
        path = folder / RUN_FILE
        if not path.is_file():
            raise RunError(f"{folder} is not a run folder (no {RUN_FILE})")
        info = read_json(path)
        if "run_id" not in info:
            raise RunError(f"{path} has no run_id: not a speechperf run folder")
        version = info.get("format")
        if isinstance(version, int) and version > FORMAT:
            raise RunError(f"{folder} was written by a newer speechperf (run folder format {version}; this release "
                           f"reads format {FORMAT}): upgrade speechperf to read it")
        if version != FORMAT:
            raise RunError(f"{path}: run folder format {version!r}; this speechperf reads format {FORMAT} only")
        run = cls(folder, info, folder / DB_FILE, write=write, shared_db=shared_db if write else None, data=data)
        run.check_files()
        if write:  # every database it will write checked (results/db.py) and holding its row
            run._check_registered()
        return run

    def check_files(self) -> None:
        """Read every JSON file the folder holds (config, env, summary) and open its database
        read-only, so that every command refuses an unreadable one by name before it shows,
        computes or writes anything (a missing summary is an unfinished run's; a database not
        speechperf's is left unchanged, results/db.py; a writer recreates a missing one)."""
        for name in JSON_FILES:
            if (self.folder / name).exists():
                self.summary() if name == SUMMARY_FILE else self._json(name)
        if not self.write or self.db_path.exists():
            ResultsDB(self.db_path, readonly=True).close()

    # ---- what the run is ------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.info["run_id"]

    @property
    def kind(self) -> str:
        return self.info.get("kind", "train")

    @property
    def format(self) -> int:
        return self.info["format"]

    @property
    def label(self) -> str:
        """The name in tables and legends (``train --label``; default machine, preset, precision)."""
        return self.info.get("label") or self.folder.name

    @property
    def config(self) -> dict:
        return upgrade.config(self._json(CONFIG_FILE))  # with the fields recorded since the run (results/upgrade.py)

    @property
    def env(self) -> dict:
        return self._json(ENV_FILE)

    def _json(self, name: str) -> dict:
        cache = self.__dict__.setdefault("_json_cache", {})
        if name not in cache:
            path = self.folder / name
            if not path.exists():
                raise RunError(f"run {self.label_hint} ({self.folder}): {name} is missing")
            cache[name] = read_json(path)
        return cache[name]

    @property
    def workload(self) -> dict:
        """{"model": name, "params": count}: :func:`workload` of the run's configuration (the
        folder's config.json)."""
        return workload(self.config)

    @property
    def label_hint(self) -> str:
        return self.info.get("label") or self.run_id

    def features(self) -> Path:
        """The prepared features folder: ``data`` given to ``open``, else the recorded one where it
        exists (relative to the run folder, as resolved, as given); else an error saying so."""
        if self.data_override is not None:
            if not (self.data_override / "features.json").is_file():
                raise RunError(f"{self.data_override} is not a prepared features folder (no features.json)")
            return self.data_override
        hint = self.info.get("data") or {}
        candidates = []
        if hint.get("relative"):
            candidates.append(Path(os.path.normpath(self.folder / hint["relative"])))
        candidates += [Path(hint[k]) for k in ("resolved", "given") if hint.get(k)]
        for c in candidates:
            if (c / "features.json").is_file():
                return c
        where = f" on {self.info['host']}" if self.info.get("host") else ""
        raise RunError(f"run {self.label_hint} ({self.folder}): its features folder is not here (recorded as "
                       f"{hint.get('given')!r}, {hint.get('resolved') or hint.get('given')}{where}); "
                       "give --data FEATS")

    @property
    def stats_sha256(self) -> str | None:
        """The sha256 of the features' stats.json the run trained on (None: not recorded)."""
        return (self.info.get("data") or {}).get("stats_sha256")

    # ---- database -------------------------------------------------------------------------
    def dbs(self) -> list[ResultsDB]:
        """The open databases: the run's own (read-only unless writable), then the shared one."""
        if self._dbs is None:
            self._dbs = [ResultsDB(self.db_path, readonly=not self.write)]
            if self.write and self.shared_db is not None and self.shared_db.resolve() != self.db_path.resolve():
                self._dbs.append(ResultsDB(self.shared_db))
        return self._dbs

    @property
    def db(self) -> ResultsDB:
        return self.dbs()[0]

    def _writable(self) -> list[ResultsDB]:
        if not self.write:
            raise RunError(f"{self.folder} was opened read-only")
        return self.dbs()

    def upsert(self, table: str, row: dict) -> None:
        for db in self._writable():
            db.upsert(table, row)

    def insert(self, table: str, rows: list[dict]) -> None:
        for db in self._writable():
            db.insert_many(table, rows)

    def execute(self, sql: str, params=()) -> None:
        for db in self._writable():
            db.execute(sql, params)

    def query(self, sql: str, params=()) -> list[dict]:
        return self.db.query(sql, params)

    def _rows(self, table: str, where: str, params=()) -> list[dict]:
        """This run's rows of ``table`` with every column recorded since (results/upgrade.py)."""
        found = self.query(f"SELECT * FROM {table} WHERE run_id = ? {where}", [self.run_id, *params])
        return upgrade.rows(table, found)

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

    def row(self) -> dict:
        rows = self._rows("runs", "")
        if not rows:
            raise RunError(f"run {self.run_id!r} ({self.folder}) is not in {self.db_path}: its rows are missing")
        return rows[0]

    def eval_split(self) -> str:
        return self.config.get("train", {}).get("eval_split", "dev-clean")

    def evals(self, final: bool = False) -> list[dict]:
        """Per-epoch validation rows in epoch order, or the final evaluations (every split)."""
        where = "AND final = 1 ORDER BY split, decoder, beam" if final else "AND final = 0 AND split = ? ORDER BY epoch"
        return self._rows("evals", where, [] if final else [self.eval_split()])

    def iterations(self) -> list[dict]:
        return self._rows("iterations", "ORDER BY iteration")

    def samples(self) -> list[dict]:
        """Every stored sample (t on the TTA clock) with its ``segment`` (the process that sampled it)."""
        return self._rows("samples", "ORDER BY t")

    def beam_sweep(self) -> list[dict]:
        return self._rows("beam_sweep", "ORDER BY decoder, beam") if self.db.has_table("beam_sweep") else []

    # ---- logs -----------------------------------------------------------------------------
    def events(self):
        """The MLPerf event log (append mode), opened once."""
        if self._events is None:
            from speechperf.results.events import EventLog

            self._events = EventLog(self.folder / EVENTS_FILE, self.run_id)
        return self._events

    def append_sentences(self, record: dict) -> None:
        with open(self.folder / SENTENCES_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def sentences(self, last: int = SENTENCES_SHOWN) -> list[dict]:
        path = self.folder / SENTENCES_FILE
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines()[-last:]:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a run killed mid-write leaves half a line: skip it
                continue
        return out

    def log_sizes(self) -> dict:
        return {n: (self.folder / n).stat().st_size for n in APPEND_LOGS if (self.folder / n).exists()}

    def truncate_logs(self, sizes: dict) -> None:
        """On resume, cut the append-only logs back to the checkpoint so that no line is doubled."""
        for name in APPEND_LOGS:
            path = self.folder / name
            size = sizes.get(name, 0)
            if path.exists() and path.stat().st_size > size:
                with open(path, "r+b") as f:
                    f.truncate(size)

    # ---- checkpoint: written and read by results/checkpoint.py ----------------------------
    def has_checkpoint(self) -> bool:
        return has_checkpoint(self.folder)

    # ---- summary --------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """A summary whose status is final: a ``failed: ...`` run (the machine stopped it: a
        full disk, say) is not finished, the same command continues it."""
        summary = self.summary()
        return summary is not None and not str(summary.get("status", "")).startswith("failed")

    def summary(self) -> dict | None:
        path = self.folder / SUMMARY_FILE
        return read_json(path) if path.exists() else None  # read anew: a writer changes it

    def write_summary(self, summary: dict, name: str = SUMMARY_FILE) -> None:
        atomic_write_text(self.folder / name, json.dumps(summary, indent=1))

    def close(self) -> None:
        if self._pending:
            self.flush()
        if self._events is not None:
            self._events.close()
            self._events = None
        for db in self._dbs or []:
            db.close()
        self._dbs = None

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_json(path: Path) -> dict:
    """The JSON object in one of a run folder's files; every reader of a run reads through
    here, so an unreadable file (cut short, not JSON, not an object) is refused by name."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not valid JSON ({e}); the run folder is damaged") from e
    except RecursionError:  # nested deeper than the parser's recursion (no file speechperf writes is)
        raise RunError(f"{path}: nested too deeply to read; the run folder is damaged") from None
    except OSError as e:
        raise RunError(f"{path}: cannot be read ({e.strerror or e})") from e
    if not isinstance(data, dict):
        raise RunError(f"{path}: not a JSON object (found {type(data).__name__}); the run folder is damaged")
    return check_file(Path(path).name, data, str(path))  # valid JSON of the wrong shape: refused by field
