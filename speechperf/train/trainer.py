"""What one process trains with: built once, before the TTA clock, for the loop (train/loop.py).

:func:`build` verifies every split the run reads, loads the training index, makes the
data-parallel algorithm (speechperf/algorithms/) and the model, optimizer, scheduler and scaler,
restored from the checkpoint when resuming (results/checkpoint.py); :func:`start` opens the
run folder's recorder (rank 0: the run created or reopened by its admission,
results/admission.py; other ranks: progress and clock only) and does initialization's
one-time work, after which the clock starts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from speechperf.config import RunConfig
from speechperf.data.index import Index
from speechperf.data.loader import Loader, load_index, make_loader
from speechperf.data.plan import global_batch, steps_per_epoch
from speechperf.features.checksum import OVER, features_sha256
from speechperf.models import build_model
from speechperf.results import checkpoint
from speechperf.results.admission import Admission, verify
from speechperf.results.checkpoint import TrainState
from speechperf.results.progress import Progress
from speechperf.results.request import TrainRequest
from speechperf.telemetry.environment import capture_env
from speechperf.train import distributed
from speechperf.algorithms import make_algorithm
from speechperf.algorithms.base import Algorithm
from speechperf.train.recorder import Recorder, RunRecorder, train_utterances
from speechperf.train.schedule import make_scheduler
from speechperf.train.step import StepMeter, make_optimizer
from speechperf.train.stop import StopSignals
from speechperf.train.warmup import check_precision, initialize, warm_model


@dataclass(frozen=True)
class Launch:
    """What rank 0's admission told this process, besides the configuration."""

    request: TrainRequest  # as configured: out is the run folder
    admission: Admission | None  # rank 0: the folder's verdict and lock; other ranks: None
    data: Path  # the features folder it trains on
    plan: str  # fresh, restart (no checkpoint yet) or resume (results/admission.py)
    init_t0: float  # perf_counter() at init_start
    init_ms: int  # wall-clock milliseconds at init_start


@dataclass
class Trainer:
    """What one process trains with, built once by :func:`build`; the state machine's
    functions (train/loop.py) read it (``t``)."""

    cfg: RunConfig
    group: distributed.Group
    data: Path  # the features folder
    splits: dict  # every split the run reads, verified (data/check.py)
    index: Index  # the training splits' compact index, loaded once (every epoch plans from it)
    local: torch.nn.Module  # the model without DDP's hooks: what the warm-up runs
    model: torch.nn.Module  # what the step trains: the algorithm's wrap of the (compiled) model
    algo: Algorithm
    state: TrainState  # model, optimizer, scheduler, scaler
    prog_start: Progress  # where the run stands at the start (the checkpoint's, or a new run's)
    rec: Recorder | None = None  # rank 0: the run folder's; other ranks: progress and clock only (start)
    meter: StepMeter | None = None  # the steps' device values not yet read
    stop: StopSignals | None = None  # SIGINT / SIGTERM received
    ahead: tuple[int, Loader] | None = None  # (epoch, its loader) started during the evaluation before it

    @property
    def prog(self) -> Progress:
        return self.rec.prog

    def loader(self) -> Loader:
        """This epoch's batches from ``prog.start_batch`` on: the loader started ahead when it is
        this epoch's from its first batch, else a new one."""
        prog, (epoch, ahead) = self.prog, self.ahead or (None, None)
        self.ahead = None
        if epoch == prog.epoch and prog.start_batch == 0:
            return ahead
        if ahead is not None:
            ahead.close()
        return self._make_loader(prog.epoch, prog.start_batch)

    def start_ahead(self, epoch: int) -> None:
        """Start ``epoch``'s readers now, before the evaluation: on a GPU their start and first
        windows (seconds with 8 readers) would otherwise be the next epoch's wait for data."""
        self.close_ahead()
        self.ahead = (epoch, self._make_loader(epoch, 0).start())

    def close_ahead(self) -> None:
        """The readers started ahead stopped: training ended before their epoch."""
        if self.ahead is not None:
            self.ahead[1].close()
            self.ahead = None

    def _make_loader(self, epoch: int, start_batch: int) -> Loader:
        return make_loader(self.data, self.splits["train"], self.cfg.loader, epoch=epoch, seed=self.cfg.train.seed,
                           start_batch=start_batch, rank=self.group.env.rank, world=self.group.world, index=self.index)

    def checkpoint(self) -> None:
        """Every rank: the algorithm's state (a collective), then rank 0 writes the checkpoint."""
        self.rec.checkpoint(self.state, self.algo.state_dict(self.state))


def build(cfg: RunConfig, group: distributed.Group, launch: Launch) -> Trainer:
    """Everything before the recorder and the clock: splits, index, algorithm, model (restored)."""
    splits = verify(launch.data, cfg, group.world)  # every split this run reads, before the model and the clock exist
    index = load_index(launch.data, splits["train"])  # once, before the clock (every epoch plans from it)
    algo = make_algorithm(cfg.algo, group.world, group.env.rank, group.device)  # a launch it cannot train (single x 2) stops here
    ckpt = checkpoint.load(launch.request.out) if launch.plan == "resume" else None
    prog = Progress.from_dict(ckpt[checkpoint.PROGRESS]) if ckpt is not None else Progress()
    state, local, model = _model(cfg, group.device, algo, ckpt, prog, splits, index, group.world)
    return Trainer(cfg, group, launch.data, splits, index, local, model, algo, state, prog)


def start(t: Trainer, launch: Launch, stop: StopSignals) -> None:
    """The recorder, then initialization: the clock starts."""
    t.rec, t.meter, t.stop = _recorder(launch, t.cfg, t.group, t.prog_start, t.splits, t.index), StepMeter(), stop
    _initialize(t, launch)


def _model(cfg: RunConfig, device, algo: Algorithm, ckpt: dict | None, prog: Progress, splits: dict, index: Index,
           world: int):
    """(state, the model without DDP's hooks: what the warm-up runs, the module the step trains),
    restored from ``ckpt`` when resuming."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    core = build_model(cfg.model).to(device)
    optimizer = make_optimizer(core, tc, device)
    total_steps = tc.max_epochs * steps_per_epoch(index, cfg.loader, tc.seed, world, train_utterances(splits))
    state = TrainState(core, optimizer, make_scheduler(optimizer, tc, prog, total_steps),
                       torch.amp.GradScaler("cuda", enabled=tc.precision == "fp16"))
    if ckpt is not None:
        state.load(ckpt)
    local = torch.compile(core) if tc.compile else core
    model = algo.wrap(local)  # sync: DDP (several processes); the others: the model, from rank 0's weights
    if ckpt is not None:
        algo.load_state_dict(ckpt, state)  # bsp...easgd: this rank's own model, optimizer, RNG; the global state
    return state, local, model


def _recorder(launch: Launch, cfg: RunConfig, group: distributed.Group, prog: Progress, splits: dict,
              index: Index) -> Recorder:
    """Rank 0's recorder of the run folder (created or opened by its admission); a no-op one on other ranks."""
    if launch.admission is None:
        return Recorder(prog, launch.request.out)
    device = group.device
    env = {**capture_env(str(device)), "world_size": group.world, "platform": launch.request.platform,
           "precision_note": check_precision(cfg, device),
           "features": {"sha256": features_sha256(launch.data), "over": OVER}}  # what a reproduction compares
    run = launch.admission.begin(cfg.to_dict(), env, prog, launch.data)
    return RunRecorder.begin(run, launch.plan, cfg, prog, world=group.world, splits=splits, init_ms=launch.init_ms,
                             quiet=launch.request.quiet,
                             global_batch=global_batch(index, cfg.loader, cfg.train.seed, group.world))


def _initialize(t: Trainer, launch: Launch) -> None:
    """One-time work outside the TTA clock and outside the run's RNG (a first run on a machine
    measures and caches what later runs read: both must train alike); then the clock starts."""
    device = t.group.device
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if t.group.env.rank == 0:
                init_parts = initialize(t.local, t.cfg, t.data, device)
            else:
                init_parts = warm_model(t.local, t.cfg, device) or {}
            init_parts.update(t.rec.count_flops(t.cfg, device))
    except BaseException as e:  # the run exists: it ends recorded as failed, not "running"
        raise_as(e, t.rec.fail(e))
    t.rec.initialized(launch.plan, time.perf_counter() - launch.init_t0, init_parts)


def raise_as(e: BaseException, err: BaseException):
    """Raise ``err`` (``e`` itself, or ``e`` named as a machine fault)."""
    if err is not e:
        raise err from e
    raise e
