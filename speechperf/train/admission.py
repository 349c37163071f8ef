"""Whether a run folder takes a run, and how: fresh, restart, resume or finished, under its lock.

One call, :func:`admit`, on rank 0 (across machines only its disk holds the folder): it reads
the folder (results/run.py), refuses what cannot be trained (a run of another configuration or
label, a damaged features folder, a shared database that cannot be written, a launch the
algorithm cannot run) before any file is written, and holds the folder's lock
(results/lock.py) from there to the end of the run, so that a second process on the folder
is refused naming the first. The training loop broadcasts :attr:`Admission.decision` to every
rank, and every other rank holds it as its own :class:`Admission` without the lock (:func:`follow`);
every rank reads a resumed run's checkpoint through its admission (:meth:`Admission.checkpoint`).
On rank 0 :meth:`Admission.begin` then makes the run it planned (results/run.py's ``Run.create``,
or ``Run.open`` and ``Run.continue_from``), so that the trainer holds a Run, never the folder.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from speechperf.atomic import remove_leftovers
from speechperf.config import ConfigError, RunConfig
from speechperf.config.training import AUTO_PRECISION
from speechperf.data.batching import Batching
from speechperf.data.check import verify_run
from speechperf.errors import SpeechperfError
from speechperf.features.stats import check_trained_on
from speechperf.models import external
from speechperf.results import checkpoint
from speechperf.results.db import ResultsDB
from speechperf.results.lock import LOCK_FILE, RunFolderBusy, RunLock
from speechperf.results.progress import Progress
from speechperf.results.run import Run
from speechperf.train.faults import as_fault
from speechperf.train.request import TrainRequest
from speechperf.results.layout import has_checkpoint, is_run
from speechperf.results.view import RunView

PLANS = ("fresh", "restart", "resume", "finished")  # what admit decides for a folder; restart: no checkpoint yet


@dataclass
class Admission:
    """Rank 0's verdict on the run folder, and its lock while the run trains."""

    folder: Path  # the run folder (the request's out)
    plan: str | None  # one of PLANS; None: refused (error)
    features: str | None  # the features folder the run trains on
    error: str | None  # why the folder was refused, in words
    lock: RunLock | None = None  # held from admit to release (a run to train only)
    made: bool = False  # admit made the folder: a run refused after it (loader.max_duration, ...) leaves none

    @property
    def decision(self) -> tuple[str | None, str | None, str | None]:
        """(plan, features, error): what every rank is told."""
        return self.plan, self.features, self.error

    def begin(self, *, config: dict, env: dict, progress: Progress, data: Path, label: str | None,
              shared_db: Path | None) -> Run:
        """The run as planned (fresh: created; restart, resume: reopened, cut back to ``progress``,
        the checkpoint's; a restart has none: cut to nothing), to write under the lock this admission holds."""
        if self.plan == "fresh":
            return Run.create(self.folder, kind="train", config=config, env=env, data=data, label=label,
                              shared_db=shared_db)
        run = Run.open(self.folder, data=data, shared_db=shared_db, progress=progress)  # its rows checked read-only
        run.continue_from(progress)
        return run

    def checkpoint(self) -> dict:
        """The checkpoint of the run to resume (plan resume), read as data (results/checkpoint.py):
        every rank reads the same file; rank 0 alone writes it."""
        return checkpoint.load(self.folder)

    def recorded_precision(self) -> str:
        """The precision the run in the folder trains in (plan resume or restart): its config.json's,
        kept whatever ``train.system.precision=auto`` would choose now (train/auto_precision.py)."""
        return RunView.open(self.folder).config["train"]["system"]["precision"]

    def fault(self, e: OSError) -> SpeechperfError:
        """``e``, an OS error on this run's folder or disk, as the named failure of the run (train/faults.py)."""
        return as_fault(e, self.folder)

    def summary(self) -> dict | None:
        """A finished run's summary (plan finished)."""
        return RunView.open(self.folder).summary()

    def release(self) -> None:
        """The lock released; a run refused before it existed leaves no lock file, nor the folder
        admit made for it."""
        if self.lock is not None:
            if not is_run(self.folder):  # refused before the run existed (loader.max_duration, ...)
                _unmake(self.folder, self.made)
            self.lock.release()
            self.lock = None


def _unmake(out: Path, made: bool) -> None:
    """Remove the lock file, still held (no other process can take it in between), and the
    folder if this command made it and nothing else is in it."""
    (out / LOCK_FILE).unlink(missing_ok=True)
    if made:
        try:
            out.rmdir()
        except OSError:  # something else was put there: not this command's to delete
            pass


def follow(request: TrainRequest, decision: tuple[str | None, str | None, str | None]) -> Admission:
    """Another rank's admission: rank 0's ``decision`` on the request's folder, without its lock."""
    return Admission(request.out, *decision)


def admit(request: TrainRequest, cfg: RunConfig, batching: Batching,
          check_launch: Callable[[object, int], None]) -> Admission:
    """:func:`_plan` under the run folder's lock (``request.out``), held from here to the end of the
    run; a new run's features are verified before its folder exists. ``cfg``: the request's
    configuration (TrainRequest.configuration); ``batching``: the run's batches over its processes
    (data/batching.py), which the training splits must hold; ``check_launch(cfg.algo, world)``: the
    algorithm's refusal of a launch it cannot train (speechperf/algorithms/), asked of a run to
    train only. An OS error on the folder (a read-only --out, say) is raised named (train/faults.py)."""
    try:
        return _admit(request, cfg, batching, check_launch)
    except OSError as e:
        if isinstance(e, SpeechperfError):
            raise
        raise as_fault(e, request.out) from e


def _admit(request: TrainRequest, cfg: RunConfig, batching: Batching, check_launch) -> Admission:
    """:func:`admit`'s plan and lock (the folder made for a new run first)."""
    out = request.out
    made = not out.exists()

    def plan():
        return Admission(out, *_plan(request, cfg, batching, check_launch))

    first = None
    if not out.is_dir():
        first = plan()
        if first.plan != "fresh":
            return first
        out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out)
    try:
        lock.acquire()
    except RunFolderBusy as e:
        return Admission(out, None, None, str(e))
    # planned again under the lock only if another process made a run here in between
    planned = first if first is not None and not is_run(out) else plan()
    if planned.plan in (None, "finished"):
        lock.release()
        return planned
    remove_leftovers(out)  # a killed writer's half-written checkpoint or summary; this process holds the lock
    return replace(planned, lock=lock, made=made)


def _plan(request: TrainRequest, cfg: RunConfig, batching: Batching,
          check_launch) -> tuple[str | None, str | None, str | None]:
    """(fresh | restart | resume | finished, features folder, error) for the run folder ``out``;
    a run to train has its shared database (``db_path``) checked before its folder exists."""
    out, mode, data, label = request.out, request.mode, request.data, request.given_label()
    try:
        if not is_run(out):
            if mode == "yes":
                raise SpeechperfError(f"--resume yes but {out} holds no run")
            if data is None:
                raise ConfigError("train needs --data FEATS for a new run")
            verify_splits_of(data, cfg, batching)  # a bad features folder fails before any file is written
            _accept(cfg, batching.world, request.db_path, check_launch)
            return "fresh", str(data), None
        if mode == "no":
            raise SpeechperfError(f"{out} already holds a run; continue it with --resume auto (the default) "
                                  "or choose another --out")
        run = RunView.open(out, data=data)
        # read through the current RunConfig: a section the run lacks (augment) takes its default there too
        differ = _differs(run, cfg)
        if differ:
            raise ConfigError(f"{out} holds a run of another configuration ({'; '.join(differ)}): repeat its "
                              "configuration to continue it, or choose another --out")
        if label is not None and label != run.label:  # a label is the run's from its creation on
            raise ConfigError(f"{out} holds a run labelled {run.label!r}, not {label!r}: omit --label (or give "
                              "that one) to continue it, or choose another --out for a run of that label")
        if run.finished:
            return "finished", None, None
        if cfg.loader.normalize:  # the normalization it trained on, or refused (features/stats.py)
            check_trained_on(run.features(), run.stats_sha256, out)
        _accept(cfg, batching.world, request.db_path, check_launch)
        return ("resume" if has_checkpoint(run.folder) else "restart"), str(run.features()), None
    except SpeechperfError as e:
        return None, None, str(e)


def _accept(cfg: RunConfig, world: int, db_path: Path | None, check_launch) -> None:
    """The last checks of a run to train, before its folder exists: the launch fits the
    algorithm (single in one process; asgd/easgd's port free), and the shared database
    (``--db``) can be written (not a text file, another program's database, a read-only folder)."""
    check_launch(cfg.algo, world)
    if db_path is not None:
        try:
            ResultsDB(db_path).close()
        except OSError as e:  # its folder cannot be made: named as the --db it is, not as a stopped run
            raise SpeechperfError(f"--db {db_path}: cannot be written ({e.strerror or e}); give a database in a "
                                  "writable folder") from None


def _as_recorded(here: dict, there: dict) -> dict:
    """The request's configuration ``here`` as the run ``there`` recorded it: ``train.system.precision=auto``
    is the precision chosen at the run's start (config.json records that one; a run never chooses again)."""
    if here["train"]["system"]["precision"] != AUTO_PRECISION:
        return here
    system = {**here["train"]["system"], "precision": there["train"]["system"]["precision"]}
    return {**here, "train": {**here["train"], "system": system}}


def _differs(run: RunView, cfg: RunConfig) -> list[str]:
    """How the folder's recorded configuration differs from ``cfg``, read through the current
    RunConfig; another model is told by its name alone (the folder's ``MODULE:NAME`` never
    imported for it; the same one is the module this command trusted: models/external.py)."""
    model = run.config.get("model")
    there = model.get("name", "ds2") if isinstance(model, dict) else "ds2"
    if there != cfg.model.name:
        return [f"model.name: {there!r} there, {cfg.model.name!r} now"]
    with external.reading(f"run folder {run.folder}"):
        there = RunConfig.from_dict(run.config).to_dict()
        return config_diff(there, _as_recorded(cfg.to_dict(), there))


def config_diff(there: dict, here: dict, prefix: str = "") -> list[str]:
    """``key: X there, Y now`` for every field where two configurations differ."""
    out = []
    for key in sorted(set(there) | set(here)):
        a, b = there.get(key), here.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, f"{prefix}{key}.")
        elif a != b and not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b)):
            out.append(f"{prefix}{key}: {a!r} there, {b!r} now")
    return out


def verify_splits_of(data: Path, cfg: RunConfig, batching: Batching) -> dict:
    """The splits ``cfg`` trains and evaluates on, and its statistics (data/check.py's ``verify_run``)."""
    tc = cfg.train
    return verify_run(data, batching, tc.train_splits, tc.eval.split, tc.eval.final_splits)
