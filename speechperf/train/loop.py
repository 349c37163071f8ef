"""The training loop: the paper's state machine (docs/spec.md C), top to bottom.

training batch after batch; every ``sentence_every`` iterations greedy-decode the current
batch and log hypothesis vs reference; every ``checkpoint_every`` iterations an atomic
checkpoint; after every epoch evaluate the validation split (loss, WER, both CERs) with
the evaluation seconds recorded apart from training; stop at the target (median of the
last e epochs), the time cap or the last epoch; then a final evaluation of every
validation and test split. As in MLPerf, the TTA clock starts after initialization
(``init_start``..``init_stop``: every split verified, the model built, the decoder kernels
compiled, one warm-up step; see train/warmup.py), whose seconds are reported beside the
TTA; it only runs while this process runs, so a resumed run does not count the time it was
down. What happened is written down by the recorder (train/recorder.py: progress, clock,
rows, events, checkpoint, failure), into the run folder that
:class:`speechperf.results.run.Run` owns. SIGINT and SIGTERM stop the run at the next read
point, saved and recorded (train/stop.py); the learning rate follows train/schedule.py,
set before every step.

Data parallel: launched by torchrun (``WORLD_SIZE`` > 1) the algorithm of ``algo.name``
(speechperf/algorithms) trains: ``sync`` (the default) wraps the model in DDP; bsp, bmuf,
diloco, asgd and easgd let every rank train its own model and combine them after steps
(asgd, easgd: through a parameter server) and before evaluations, and put every rank's
state into the checkpoints; their hooks are one line each below (``algo.``).
:mod:`speechperf.train.distributed` picks each process's device (``cuda:LOCAL_RANK``) and
the backend (``train.dist_backend``, gloo on CPU, gloo+NCCL on GPU) and refuses a launch
that does not fit the GPUs before any work; rank 0 alone writes files, evaluates and
decides to stop.

Host synchronization: a step leaves its loss and skip flag on the device
(:mod:`speechperf.train.step`); they are read together every ``train.sync_every`` steps
and where needed (sentences, checkpoints, epoch end), where the iteration rows, the status
line, the skip counters and the divergence abort catch up in step order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from speechperf.config import ConfigError, RunConfig, load_preset
from speechperf.data.check import parse_splits, verify_splits
from speechperf.data.index import Index
from speechperf.data.loader import load_index, make_loader, planned_steps
from speechperf.data.plan import global_batch
from speechperf.errors import SpeechperfError
from speechperf.features.checksum import OVER, features_sha256
from speechperf.features.stats import check_trained_on, read_stats
from speechperf.models import build_model
from speechperf.results.db import ResultsDB
from speechperf.results.lock import LOCK_FILE, RunFolderBusy, RunLock
from speechperf.results.run import Run, default_label, read_checkpoint
from speechperf.train import distributed
from speechperf.algorithms import check_launch, make_algorithm
from speechperf.algorithms.base import Algorithm
from speechperf.results.checkpoint import TrainState
from speechperf.train.evaluate import evaluate, release_resident, with_intervals
from speechperf.train.faults import as_fault, check_trained
from speechperf.results.progress import Progress
from speechperf.train.recorder import Recorder, RunRecorder, train_utterances
from speechperf.train.schedule import make_scheduler, schedule_ended, steps_per_epoch
from speechperf.metrics.tta import tta_minutes
from speechperf.telemetry.environment import capture_env
from speechperf.train.step import StepMeter, TrainingDiverged, count_steps, make_optimizer, read_point, train_step
from speechperf.train.stop import StopSignals, interrupted
from speechperf.train.warmup import check_precision, initialize, warm_model

__all__ = ["train", "config_diff", "TrainingDiverged", "RESUME_MODES"]

RESUME_MODES = ("auto", "yes", "no")


def train(preset: str = "cpu", data: Path | None = None, out: Path | None = None, overrides=(),
          resume: str | Path | None = "auto", db_path: Path | None = None, quiet: bool = False,
          platform: str | None = None, label: str | None = None, label_suffix: str = "") -> dict:
    """Train (or continue) the run in ``out``; returns its summary row.

    ``resume``: ``auto`` continues a run of the same configuration found in ``out`` from its
    last checkpoint (a finished one is only reported, a different configuration refused), so
    that the same command, repeated by ``torchrun --max-restarts``, recovers from a dead
    worker; ``yes`` insists on continuing, ``no`` refuses an existing run. A run folder
    (``--resume RUN``) continues that run with its own configuration.
    ``db_path``: a shared database that receives the rows too (the run folder keeps its own).
    ``label_suffix``: appended to the new run's label, given or derived (train/seeds.py: " seed 2").
    """
    # ---- configuration and run folder -------------------------------------------------
    init_t0, init_ms = time.perf_counter(), int(time.time() * 1000)  # init_start
    denv = distributed.DistEnv.from_env()
    rank, world = denv.rank, denv.world
    out, mode, cfg = _configuration(preset, out, overrides, resume, platform)
    tc = cfg.train
    distributed.configure_determinism(tc.deterministic)  # before CUDA starts (cuBLAS workspace)
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    group = distributed.setup(tc.device, tc.dist_backend, denv)  # checks the launch against the GPUs first
    lock, made = None, rank == 0 and not out.exists()  # made: a refused run leaves no folder behind
    try:
        check_precision(cfg, group.device)  # a precision this device cannot run: refused now, exit 2
        # rank 0 alone looks at the folder (across machines only its disk holds it), holding its
        # lock for the whole run, and tells every rank what to do, or the error that stops them all
        full = f"{label}{label_suffix}" if label is not None else None  # the label a new run would get
        planned, lock = _plan_locked(out, cfg, mode, data, world, full, db_path) if rank == 0 else (None, None)
        plan, feats, error = group.broadcast(planned)
        if error:
            raise SpeechperfError(error)
        if plan == "finished":
            return group.broadcast(Run.open(out).summary() if rank == 0 else None)
        launch = Launch(out, Path(feats), plan, db_path, quiet, platform, label, label_suffix, init_t0, init_ms)
        return _train(cfg, group, launch)
    except OSError as e:  # before the run exists (a read-only --out, say): named, exit 1
        if isinstance(e, SpeechperfError):
            raise
        raise as_fault(e, out) from e
    finally:
        if lock is not None:
            if not Run.exists(out):  # refused before the run existed (loader.max_duration, ...)
                _unmake(out, made)
            lock.release()
        group.close()


def _unmake(out: Path, made: bool) -> None:
    """Remove the lock file, still held (no other process can take it in between), and the
    folder if this command made it and nothing else is in it."""
    (out / LOCK_FILE).unlink(missing_ok=True)
    if made:
        try:
            out.rmdir()
        except OSError:  # something else was put there: not this command's to delete
            pass


def _configuration(preset: str, out: Path | None, overrides, resume, platform: str | None) -> tuple[Path, str, RunConfig]:
    """(run folder, resume mode, configuration): the preset with its overrides, or, for
    ``--resume RUN`` (a folder), that run's recorded configuration (mode ``yes``)."""
    mode = "auto" if resume is None else str(resume)
    if mode not in RESUME_MODES:  # --resume RUN: that run, with its recorded configuration
        if overrides:
            raise ConfigError("a resumed run keeps its configuration; overrides are not allowed with --resume RUN")
        return Path(resume), "yes", RunConfig.from_dict(Run.open(resume).config)
    if out is None:
        raise ConfigError("train needs --out RUN (and --data FEATS for a new run)")
    cfg = load_preset(preset, overrides, platform)  # an unknown algo.name is refused here, before any folder exists
    return Path(out), mode, cfg


def _plan_locked(out: Path, cfg: RunConfig, mode: str, data: Path | None, world: int, label: str | None,
                 db_path: Path | None = None) -> tuple[tuple[str | None, str | None, str | None], RunLock | None]:
    """:func:`_plan` under the run folder's lock (results/lock.py), held from here to the end
    of the run so that a second process on the folder is refused naming the first; a new
    run's features are verified before its folder exists. Returns (plan, the held lock)."""
    first = None
    if not out.is_dir():
        first = _plan(out, cfg, mode, data, world, label, db_path)
        if first[0] != "fresh":
            return first, None
        out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out)
    try:
        lock.acquire()
    except RunFolderBusy as e:
        return (None, None, str(e)), None
    # planned again under the lock only if another process made a run here in between
    planned = first if first is not None and not Run.exists(out) else _plan(out, cfg, mode, data, world, label, db_path)
    if planned[0] in (None, "finished"):
        lock.release()
        return planned, None
    return planned, lock


def _plan(out: Path, cfg: RunConfig, mode: str, data: Path | None, world: int,
          label: str | None = None, db_path: Path | None = None) -> tuple[str | None, str | None, str | None]:
    """(fresh | restart | resume | finished, features folder, error) for the run folder ``out``;
    a run to train has its shared database (``db_path``) checked before its folder exists."""
    try:
        if not Run.exists(out):
            if mode == "yes":
                raise SpeechperfError(f"--resume yes but {out} holds no run")
            if data is None:
                raise ConfigError("train needs --data FEATS for a new run")
            _verify(data, cfg, world)  # a bad features folder fails before any file is written
            _accept(cfg, world, db_path)
            return "fresh", str(data), None
        if mode == "no":
            raise SpeechperfError(f"{out} already holds a run; continue it with --resume auto (the default) "
                                  "or choose another --out")
        run = Run.open(out, data=data)
        # read through the current RunConfig: a section the run lacks (augment) takes its default there too
        differ = config_diff(RunConfig.from_dict(run.config).to_dict(), cfg.to_dict())
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
        _accept(cfg, world, db_path)
        return ("resume" if run.has_checkpoint() else "restart"), str(run.features()), None
    except SpeechperfError as e:
        return None, None, str(e)


def _accept(cfg: RunConfig, world: int, db_path: Path | None) -> None:
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


def _verify(data: Path, cfg: RunConfig, world: int) -> dict:
    """Every split the run reads (train, validation, final), verified (data/check.py: shards
    against their checksums), and the feature statistics."""
    tc = cfg.train
    if cfg.loader.normalize:  # the statistics every batch is normalized with, readable and sane
        read_stats(data)
    return verify_splits(data, parse_splits(tc.train_splits), tc.eval_split, parse_splits(tc.final_splits),
                         None if cfg.loader.max_duration else cfg.loader.batch_size, world)


@dataclass(frozen=True)
class Launch:
    """What the command asked of this process, besides the configuration."""

    out: Path  # the run folder
    data: Path  # the features folder it trains on
    plan: str  # fresh, restart (no checkpoint yet) or resume (_plan)
    db_path: Path | None  # a shared database that receives the rows too (--db)
    quiet: bool  # no progress bar or epoch lines
    platform: str | None  # the platform named on the command line (train --platform)
    label: str | None  # the label given (--label), None: derived from the machine and configuration
    label_suffix: str  # appended to the label, given or derived (train/seeds.py: " seed 2")
    init_t0: float  # perf_counter() at init_start
    init_ms: int  # wall-clock milliseconds at init_start


@dataclass
class Trainer:
    """What one process trains with, built once by :func:`_train`; the state machine's
    functions below read it (``t``)."""

    cfg: RunConfig
    group: distributed.Group
    data: Path  # the features folder
    splits: dict  # every split the run reads, verified (data/check.py)
    index: Index  # the training splits' compact index, loaded once (every epoch plans from it)
    model: torch.nn.Module  # what the step trains: the algorithm's wrap of the (compiled) model
    algo: Algorithm
    state: TrainState  # model, optimizer, scheduler, scaler
    rec: Recorder  # rank 0: the run folder's; other ranks: progress and clock only
    meter: StepMeter  # the steps' device values not yet read
    stop: StopSignals  # SIGINT / SIGTERM received

    @property
    def prog(self) -> Progress:
        return self.rec.prog

    def checkpoint(self) -> None:
        """Every rank: the algorithm's state (a collective), then rank 0 writes the checkpoint."""
        self.rec.checkpoint(self.state, self.algo.state_dict(self.state))


def _train(cfg: RunConfig, group: distributed.Group, launch: Launch) -> dict:
    splits = _verify(launch.data, cfg, group.world)  # every split this run reads, before the model and the clock exist
    index = load_index(launch.data, splits["train"])  # once, before the clock (at 960 h ~1.5 CPU s an epoch, was)
    algo = make_algorithm(cfg.algo, group.world, group.env.rank, group.device)  # a launch it cannot train (single x 2) stops here
    ckpt = read_checkpoint(launch.out) if launch.plan == "resume" else None
    prog = Progress.from_dict(ckpt["progress"]) if ckpt is not None else Progress()
    state, local, model = _model(cfg, group.device, algo, ckpt, prog, splits, index, group.world)
    with StopSignals() as stop:
        rec = _recorder(launch, cfg, group, prog, splits, index)
        t = Trainer(cfg, group, launch.data, splits, index, model, algo, state, rec, StepMeter(), stop)
        _initialize(t, local, launch)
        try:
            status = _epochs(t)
            evaluated = algo.before_eval(t.prog.start_batch)  # every rank: a stop inside an epoch synchronizes
            # saved before the final evaluation: a run stopped in it (or killed after it) continues from
            # here, its logs cut back to before any final_eval line, and evaluates every split again once
            t.checkpoint()
            if group.env.rank == 0:
                _final_eval(evaluated, launch.data, splits["final"], cfg, group.device, rec, stop)
            asked = max(group.gather_int(stop.requested or 0))  # a signal during the final evaluation
            if asked:  # stops it (saved: the same command evaluates again), never ends as a success
                raise interrupted(asked, f"in {rec.out} during the final evaluation")
            rec.stopped(status)
            group.barrier()  # the other ranks wait for rank 0's final evaluation: tear down together
            algo.close()  # asgd, easgd: the parameter server's rpc ends
        except BaseException as e:
            algo.close(graceful=False)  # asgd, easgd: this rank's rpc ends without waiting for the others
            _raise(e, rec.fail(e, t.meter))
        return group.broadcast(rec.finish(status))  # rank 0's summary on every rank (one exit status)


def _model(cfg: RunConfig, device, algo: Algorithm, ckpt: dict | None, prog: Progress, splits: dict, index: Index,
           world: int):
    """(state, the model without DDP's hooks: what the warm-up runs, the module the step trains),
    restored from ``ckpt`` when resuming."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    core = build_model(cfg.model).to(device)
    optimizer = make_optimizer(core, tc, device)
    planned = planned_steps(index, cfg.loader, tc.seed, world)  # None: fixed counts (ceil(utterances / batch_size))
    total_steps = tc.max_epochs * (planned or steps_per_epoch(train_utterances(splits), cfg.loader.batch_size))
    state = TrainState(core, optimizer, make_scheduler(optimizer, tc, prog, total_steps),
                       torch.amp.GradScaler("cuda", enabled=tc.precision == "fp16"))
    if ckpt is not None:
        state.load(ckpt)
    local = torch.compile(core) if tc.compile else core
    model = algo.wrap(local)  # sync: DDP (several processes); the others: the model, from rank 0's weights
    if ckpt is not None:
        algo.load_state_dict(ckpt, state)  # bsp...easgd: this rank's own model, optimizer, RNG; the global state
    return state, local, model


def _initialize(t: Trainer, local: torch.nn.Module, launch: Launch) -> None:
    """One-time work outside the TTA clock and outside the run's RNG (a first run on a machine
    measures and caches what later runs read: both must train alike); then the clock starts."""
    device = t.group.device
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if t.group.env.rank == 0:
                init_parts = initialize(local, t.cfg, t.data, device)
            else:
                init_parts = warm_model(local, t.cfg, device) or {}
            init_parts.update(t.rec.count_flops(t.cfg, device))
    except BaseException as e:  # the run exists: it ends recorded as failed, not "running"
        _raise(e, t.rec.fail(e))
    t.rec.initialized(launch.plan, time.perf_counter() - launch.init_t0, init_parts)


def _epochs(t: Trainer) -> str:
    """The state machine (docs/spec.md C): train epoch after epoch until a stopping rule holds; returns
    why training stopped (success, time_cap, max_epochs). A signal stops it at a read point."""
    tc, prog = t.cfg.train, t.prog
    t.model.train()
    # newbob's stopping rule ends training as the last epoch would (train/schedule.py)
    last_epoch = min(tc.max_epochs, tc.stop_after_epochs or tc.max_epochs)  # stop_after_epochs: the schedule stays max_epochs
    while prog.status is None and prog.epoch <= last_epoch and not schedule_ended(tc, prog.eval_losses):
        if _train_epoch(t):
            _end_epoch(t)
    prog.status = prog.status or ("max_epochs" if tc.target > 0 else "success")
    return prog.status


def _train_epoch(t: Trainer) -> bool:
    """The epoch's batches from ``prog.start_batch`` on; False when the time cap stopped it."""
    tc, prog, state = t.cfg.train, t.prog, t.state
    loader = make_loader(t.data, t.splits["train"], t.cfg.loader, epoch=prog.epoch, seed=tc.seed,
                         start_batch=prog.start_batch, rank=t.group.env.rank, world=t.group.world, index=t.index)
    t.rec.epoch_started()
    last = time.perf_counter()
    for batch in t.rec.batches(loader):  # timed: each wait for data is the recorder's
        # -- training
        if prog.iteration:  # the learning rate of this step (train/schedule.py)
            state.scheduler.step()
        prog.iteration += 1
        step = train_step(t.model, batch, state.optimizer, state.scaler, t.group.device, tc, t.cfg.augment)
        prog.start_batch += 1
        t.algo.after_step(prog.start_batch)  # local SGD: the ranks' models combined every algo.sync_every batches
        prog.impossible_utts += step.impossible
        now = time.perf_counter()
        batch_s, last = now - last, now
        t.meter.add(prog.iteration, step, t.rec.iteration_row(batch, batch_s, t.algo.comm.take()))
        if not read_point(prog.iteration, tc):
            continue
        _settle(t)
        # -- generating sentences
        if prog.iteration % tc.sentence_every == 0:
            t.rec.sentences(batch, step)
        # -- saving checkpoint
        if prog.iteration % tc.checkpoint_every == 0:
            t.checkpoint()
        if _time_cap_passed(t):  # a signal stops the run there (saved, recorded as interrupted)
            prog.status = "time_cap"
            return False
    _settle(t)
    return True


def _end_epoch(t: Trainer) -> None:
    """Every rank at an epoch's end: a common model, the divergence check, rank 0's validation
    (its verdict and loss broadcast), the checkpoint; a signal received meanwhile stops the run."""
    tc, prog = t.cfg.train, t.prog
    evaluated = t.algo.before_eval(prog.start_batch)  # every rank: local SGD ends the epoch on a common model
    check_trained(t.state.model, prog, tc)  # a run that cannot train stops here, as diverged
    # -- evaluating (the model stays resident; its seconds are recorded apart)
    t.rec.epoch_ended()
    verdict = _epoch_eval(evaluated, t.data, t.cfg, t.group.device, t.rec) if t.group.env.rank == 0 else None
    prog.status, loss = t.group.broadcast(verdict)
    prog.eval_losses.append(loss)  # every rank: the newbob schedule reads it (train/schedule.py)
    prog.epoch += 1
    prog.start_batch = 0
    t.checkpoint()
    asked = max(t.group.gather_int(t.stop.requested or 0))
    if asked and prog.status is None:
        raise interrupted(asked, f"in {t.rec.out} after epoch {prog.epoch - 1}")


def _recorder(launch: Launch, cfg: RunConfig, group: distributed.Group, prog: Progress, splits: dict,
              index: Index) -> Recorder:
    """Rank 0's recorder of the run folder (created or opened); a no-op one on other ranks."""
    if group.env.rank != 0:
        return Recorder(prog, launch.out)
    device = group.device
    env = {**capture_env(str(device)), "world_size": group.world, "platform": launch.platform,
           "precision_note": check_precision(cfg, device),
           "features": {"sha256": features_sha256(launch.data), "over": OVER}}  # what a reproduction compares
    given, suffix = launch.label, launch.label_suffix
    label = f"{given or default_label(env, cfg.to_dict())}{suffix}" if suffix else given
    return RunRecorder.begin(launch.plan, launch.out, cfg, prog, data=launch.data, env=env, splits=splits,
                             init_ms=launch.init_ms, label=label, db_path=launch.db_path, quiet=launch.quiet,
                             global_batch=global_batch(index, cfg.loader, cfg.train.seed, group.world))


def _settle(t: Trainer) -> None:
    """The one host read: the pending steps' losses and skip flags, recorded and counted in
    step order (a divergence aborts here)."""
    reads = t.meter.read()
    t.rec.steps_read(reads)
    count_steps(t.prog, reads, t.cfg.train.max_bad_losses)


def _time_cap_passed(t: Trainer) -> bool:
    """At a read point, all ranks together: whether the time cap passed. A signal any rank was
    sent stops the run here instead: saved where it stopped, recorded as interrupted."""
    tc, prog = t.cfg.train, t.prog
    cap = tc.time_cap_minutes > 0 and t.rec.now() >= 60 * tc.time_cap_minutes
    asked = max(t.group.gather_int(t.stop.requested or int(cap)))
    if asked > 1:
        if prog.iteration % tc.checkpoint_every:
            t.checkpoint()
        raise interrupted(asked, f"in {t.rec.out} at iteration {prog.iteration} (epoch {prog.epoch})")
    return bool(asked)


def _raise(e: BaseException, err: BaseException):
    """Raise ``err`` (``e`` itself, or ``e`` named as a machine fault)."""
    if err is not e:
        raise err from e
    raise e


# ---- evaluation ------------------------------------------------------------------------
def _evaluate(model, data: Path, split: str, cfg: RunConfig, device, beam: int, **kw) -> dict:
    tc = cfg.train
    return evaluate(model, data, split, cfg.loader, device, decoder=tc.eval_decoder, beam=beam,
                    precision=tc.precision, mode=tc.eval_mode, workers=tc.eval_threads, **kw)


def _epoch_eval(model, data: Path, cfg: RunConfig, device, rec: Recorder) -> tuple[str | None, float]:
    """The epoch's validation (rank 0): (``success`` once the target is reached, else None; its loss)."""
    tc = cfg.train
    rec.eval_started()
    r = _evaluate(model, data, tc.eval_split, cfg, device, tc.eval_beam, keep_pairs=3, intervals=False)
    if "errors" in r:  # the per-utterance counts; the stop rule reads the point values only, so the
        with rec.off_clock():  # intervals are no time to accuracy
            r = with_intervals(r)
    rec.evaluated(r, final=False)
    if tc.target > 0:
        history = [(e["clock_s"], e[tc.target_metric]) for e in rec.prog.evals]  # speechperf/metric.py's names
        if tta_minutes(history, tc.target, tc.target_epochs) is not None:
            return "success", r["loss"]
    return None, r["loss"]


def _final_eval(model, data: Path, splits: list[str], cfg: RunConfig, device, rec: Recorder,
                stop: StopSignals) -> None:
    """Table 5: the final-evaluation splits (verified before training), with the final beam
    width; a stop signal ends it between splits. The kept evaluation batches are freed after it."""
    try:
        for split in splits:
            if stop.requested:
                return
            rec.evaluated(_evaluate(model, data, split, cfg, device, cfg.train.final_beam), final=True)
    finally:
        release_resident()  # their device memory is no longer the run's
