"""A finished (or running) run as analyses read it: opening one never writes, never creates
a database, and refuses an unreadable file by name before anything is shown.

A run folder (``train --out RUN``) is self-contained and portable: it can be copied, renamed
or moved to another machine and still opens there; results/layout.py names its files. Nothing
recorded inside is trusted as an absolute path: the features folder is recorded as given,
resolved and relative to the run folder, and used only where it exists (readers take
``--data FEATS`` to point elsewhere). The run's rows are read from its own database
(``view.rows``: results/rows.py), its logs through ``view.log`` (results/logs.py).
"""
from __future__ import annotations

import os
from pathlib import Path

from speechperf.results.db import ResultsDB
from speechperf.results import upgrade
from speechperf.results.formats import RunError, features_folder, label_hint, read_info, read_json
from speechperf.results.layout import CONFIG_FILE, DB_FILE, ENV_FILE, EVENTS_FILE, JSON_FILES, SUMMARY_FILE
from speechperf.results.logs import LogReader
from speechperf.results.rows import RowQueries
from speechperf.results.workload import workload


class RunView:
    """One run folder, read-only: its facts (run.json), files (config, env, summary), rows and logs."""

    def __init__(self, folder: Path, info: dict, data: Path | None = None):
        self.folder, self.info, self.db_path = Path(folder), info, Path(folder) / DB_FILE
        self.data_override = Path(data) if data else None
        self.rows = RowQueries(self.run_id, self.db_path, self.folder, lambda: eval_split(self.config))
        self.log = LogReader(self.folder)
        self._json_cache: dict[str, dict] = {}

    @classmethod
    def open(cls, folder: Path, *, data: Path | None = None) -> "RunView":
        """An existing run folder, every file checked (:func:`check_files`). ``data``: the features
        folder to use instead of the recorded one."""
        view = cls(Path(folder), read_info(folder), data=data)
        check_files(view)
        return view

    @property
    def run_id(self) -> str:
        return self.info["run_id"]

    @property
    def kind(self) -> str:
        return self.info.get("kind", "train")

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
        if name not in self._json_cache:
            path = self.folder / name
            if not path.exists():
                raise RunError(f"run {label_hint(self.info)} ({self.folder}): {name} is missing")
            self._json_cache[name] = read_json(path)
        return self._json_cache[name]

    @property
    def workload(self) -> dict:
        """{"model": name, "params": count}: :func:`workload` as run.json recorded it (else from
        config.json, without importing a module it names)."""
        return workload(self.config, self.info.get("workload"))

    def features(self) -> Path:
        """The prepared features folder (results/formats.py ``features_folder``)."""
        return features_folder(self.folder, self.info, self.data_override)

    @property
    def stats_sha256(self) -> str | None:
        """The sha256 of the features' stats.json the run trained on (None: not recorded)."""
        return (self.info.get("data") or {}).get("stats_sha256")

    @property
    def finished(self) -> bool:
        """A summary whose status is final: a ``failed: ...`` run (the machine stopped it: a
        full disk, say) is not finished, the same command continues it."""
        summary = self.summary()
        return summary is not None and not str(summary.get("status", "")).startswith("failed")

    def summary(self) -> dict | None:
        path = self.folder / SUMMARY_FILE
        return read_json(path) if path.exists() else None  # read anew: a writer changes it

    def check_rows(self) -> None:
        """Refuse a run whose database holds fewer rows than the run did (results/rows.py
        ``short_of``), as its summary says, or where it has none (a killed run), as its events.log
        says: the last checkpoint written (rows are committed before a checkpoint is) and the
        evaluations logged (each logged after its row). Its TTA would be read from what is left."""
        summary = self.summary() or {}
        if isinstance(summary.get("iterations"), int) and isinstance(summary.get("epochs"), int):
            short = self.rows.short_of(summary["iterations"], summary["epochs"], self.folder / SUMMARY_FILE)
        else:
            iterations, epochs = self.log.done()
            short = self.rows.short_of(iterations, epochs, self.folder / EVENTS_FILE)
        if short:
            raise RunError(f"run {label_hint(self.info)}: {short}")

    def close(self) -> None:
        self.rows.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def eval_split(config: dict) -> str:
    """The split a run's per-epoch validation rows are of."""
    return config.get("train", {}).get("eval", {}).get("split", "dev-clean")


def check_files(view: RunView, writer: bool = False) -> None:
    """Read every JSON file the folder holds (config, env, summary) and open its database
    read-only, so that every command refuses an unreadable one by name before it shows,
    computes or writes anything (a missing summary is an unfinished run's; a database not
    speechperf's is left unchanged, results/db.py; a ``writer`` recreates a missing one). A database
    that is a symbolic link is refused, for a writer too, before anything opens it."""
    for name in JSON_FILES:
        if (view.folder / name).exists():
            view.summary() if name == SUMMARY_FILE else view._json(name)
    if not writer or os.path.lexists(view.db_path):
        ResultsDB(view.db_path, readonly=True, nofollow=True).close()
