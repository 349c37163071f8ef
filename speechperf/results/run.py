"""The run folder as training writes it: :class:`Run` creates one, or reopens one to
continue, and composes its writers (``run.rows``: results/rows.py, ``run.log``:
results/logs.py) beside what every reader sees (results/view.py).

- ``run.json``: format version, run id, kind, label, where the features were (a hint only)
- ``config.json``, ``env.json``: the configuration and the machine (hardware, versions)
- ``results.db``: the run's own rows (runs, iterations, evals, samples, beam sweeps, ...)
- ``events.log`` (MLPerf style), ``sentences.jsonl``: append-only logs, cut back to the
  checkpoint's sizes on resume so that no line is doubled
- ``checkpoint.pt``: weights, optimizer, scheduler, scaler, RNG, data position, TTA clock
- ``summary.json``: written once the run finished (its presence means: finished)

A shared database (``--db``) receives the same rows as the run's own, for collecting many runs
in one file; a reader opens the run's own. One process writes a folder at a time
(results/lock.py).
"""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from speechperf.atomic import atomic_write_text
from speechperf.results.formats import FORMAT, RunError, data_hint, read_info
from speechperf.results.labels import default_label
from speechperf.results.layout import CHECKPOINT_FILE, CONFIG_FILE, ENV_FILE, RUN_FILE, SUMMARY_FILE, has_checkpoint
from speechperf.results.logs import RunLog
from speechperf.results.progress import Progress
from speechperf.results.rows import Rows
from speechperf.results.view import RunView, check_files, eval_split
from speechperf.results.workload import described



class Run(RunView):
    """One run folder, written: ``Run.create`` starts one, ``Run.open`` opens one to write; rows go
    to the folder's own database and to ``shared_db`` if given."""

    def __init__(self, folder: Path, info: dict, shared_db: Path | None = None, data: Path | None = None):
        super().__init__(folder, info, data=data)
        self.rows = Rows(self.run_id, self.db_path, self.folder, lambda: eval_split(self.config), shared_db=shared_db)
        self.log = RunLog(self.folder, self.run_id)

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
            info["data"] = data_hint(data, folder)
        info["workload"] = described(config)  # what readers show, never computed again from a module it names
        atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=1))
        atomic_write_text(folder / ENV_FILE, json.dumps(env, indent=1, default=str))
        run = cls(folder, info, shared_db=shared_db)
        register(run, started_at)
        atomic_write_text(folder / RUN_FILE, json.dumps(info, indent=1))
        return run

    @classmethod
    def open(cls, folder: Path, *, data: Path | None = None, shared_db: Path | None = None,
             progress: Progress | None = None) -> "Run":
        """An existing run folder, to write: every file checked, every database it will write
        (results/db.py) holding its row. ``data``: the features folder to use instead of the
        recorded one; ``shared_db``: also write rows there; ``progress``: the checkpoint's of a run
        to continue, whose rows the database must hold (:func:`check_holds`, read-only, before
        anything is opened to write). Readers open a :class:`RunView`."""
        run = cls(Path(folder), read_info(folder), shared_db=shared_db, data=data)
        check_files(run, writer=True)
        if progress is not None:
            check_holds(run, progress)
        check_registered(run)
        return run

    def continue_from(self, progress: Progress) -> None:
        """Continue this run from ``progress``, its checkpoint's (a restart, without one: a new
        run's): the rows and log lines written after it cut, the status running again (``Run.open``
        with ``progress`` refused a database short of it)."""
        self.log.truncate_logs(progress.log_sizes)
        self.rows.forget_after(progress)
        self.rows.set_status("running")

    def checkpoint_writer(self, save=None):
        """The writer of this run's checkpoint file (results/checkpoint_writer.py), bound to it here:
        the one place a writer's path is made from the folder. ``save``: the atomic write (tests
        slow it down or break it)."""
        from speechperf.results.checkpoint_writer import CheckpointWriter  # torch: only for a run that trains

        return CheckpointWriter(self.folder / CHECKPOINT_FILE, save)

    def write_summary(self, summary: dict, name: str = SUMMARY_FILE) -> None:
        atomic_write_text(self.folder / name, json.dumps(summary, indent=1))

    def close(self) -> None:
        """The run's end (finished, failed or stopped): rows written, logs closed, its database sealed
        (complete in one file: reading it writes nothing, results/db.py)."""
        self.rows.flush()
        self.log.close()
        self.rows.seal()
        self.rows.close()


def register(run: Run, started_at: float | None = None) -> None:
    """The run's row (status running) in every database it writes."""
    config, env = run._json(CONFIG_FILE), run.env  # the file as written
    run.rows.upsert("runs", {"run_id": run.run_id, "kind": run.kind, "preset": config.get("preset"),
                             "seed": config.get("train", {}).get("seed", config.get("seed")),
                             "platform": env.get("platform") or env.get("cpu_model"),
                             "out_dir": str(run.folder.resolve()), "config_json": config, "env_json": dict(env),
                             "label": run.label, "started_at": started_at if started_at is not None else time.time(),
                             "status": "running"})


def check_holds(run: RunView, progress: Progress) -> None:
    """Refuse to continue a run whose database holds fewer rows than its checkpoint's ``progress``
    (results/rows.py ``short_of``; exit 2): a run folder SIGKILLed and copied without its
    results.db-wal continued from checkpoint.pt and ended as a success, iterations and an evaluation
    missing from its database. Read through a read-only view: a refused database is left as it was."""
    if not progress.iteration and not progress.evals:
        return
    with RunView(run.folder, run.info) as view:
        short = view.rows.short_of(progress.iteration, len(progress.evals), run.folder / CHECKPOINT_FILE)
    if short:
        raise RunError(f"run {run.run_id!r} cannot continue: {short}")


def check_registered(run: Run) -> None:
    """A writer's run has its row in every database it writes: one left without it by a
    start that was refused part way (before run.json was written last) and never trained
    (no checkpoint) is registered anew; a shared database (``--db``) given later gets the
    row of the run's own. Never a run whose status cannot be written."""
    own, *shared = run.rows.dbs()
    found = own.query("SELECT * FROM runs WHERE run_id = ?", [run.run_id])
    if not found:
        if has_checkpoint(run.folder):
            raise RunError(f"run {run.run_id!r} ({run.folder}) is not in {own.path}: its rows are missing; "
                           "copy the run's results.db back, or remove the folder to start the run over")
        register(run)
        return
    for db in shared:
        if not db.query("SELECT 1 FROM runs WHERE run_id = ?", [run.run_id]):
            db.upsert("runs", found[0])
