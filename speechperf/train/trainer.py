"""What one process trains with: built once, before the TTA clock, for the loop (train/loop.py).

:func:`build` verifies every split the run reads, loads the training index, makes the
data-parallel algorithm (speechperf/algorithms/) and the model, optimizer, scheduler and scaler,
restored from the checkpoint the opening read when resuming (results/checkpoint.py): a
:class:`Built`. The run-opening stage (train/opening.py's ``begin``) then makes the Run and its
recorder and the :class:`Trainer` from them, complete (no field of it is filled in later), and
:func:`run_initialization` does initialization's one-time work, after which the clock starts.
Nothing here takes the run folder: the trainer holds the run: :meth:`Trainer.checkpoint` hands it
to results/checkpoint.py's ``save``, the file's one owner.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speechperf.config import RunConfig
from speechperf.data.index import Index
from speechperf.data.loader import Loader, load_index, make_loader
from speechperf.data.resident import Resident, check_fits, feature_dims
from speechperf.data.units import Units, ensure_units
from speechperf.data.batching import Batching
from speechperf.models import build_model, fp8
from speechperf.models.contract import compiled
from speechperf.results import checkpoint
from speechperf.telemetry.device_gpus import run_gpus
from speechperf.train.admission import verify_splits_of
from speechperf.results.checkpoint import TrainState
from speechperf.results.progress import Progress
from speechperf.results.run import Run
from speechperf.errors import ConfigError
from speechperf.train import distributed
from speechperf.train.graphs import GraphedModel, check_memory, graphed, planned_shapes
from speechperf.train.evaluate import resident_shapes
from speechperf.algorithms import make_algorithm
from speechperf.algorithms.base import Algorithm
from speechperf.train.recorder import Recorder, train_utterances
from speechperf.train.schedule import make_scheduler
from speechperf.train.step import StepMeter, make_optimizer
from speechperf.objectives import objective_of
from speechperf.hardware import memory
from speechperf.train.stop import StopSignals
from speechperf.train.warmup import FEATURE_DIM, initialize, warm_model


@dataclass(frozen=True)
class Built:
    """What :func:`build` makes before the run exists: the model side of a :class:`Trainer`."""

    splits: dict  # every split the run reads, verified (data/check.py)
    index: Index  # the training splits' compact index, loaded once (every epoch plans from it)
    units: Units  # the output units (loader.units: characters, or the folder's BPE model; data/units.py)
    algo: Algorithm
    state: TrainState  # model, optimizer, scheduler, scaler
    local: torch.nn.Module  # the model without DDP's hooks: what the warm-up runs
    model: torch.nn.Module  # what the step trains: the algorithm's wrap of the (compiled) model
    prog: Progress  # where the run stands at the start (the checkpoint's, or a new run's)
    resident: Resident | None  # loader.resident: the training split on the device (data/resident.py)
    planned: set | None  # train.system.cuda_graphs: the (utterances, frames) shapes the epochs plan (train/graphs.py)


@dataclass
class Trainer:
    """What one process trains with, complete when made (train/opening.py's ``begin``); the state
    machine's functions (train/loop.py) read it (``t``). Only its own methods change it: the
    readers started ahead, the resident split released."""

    cfg: RunConfig
    batching: Batching  # the run's batches (data/batching.py): epochs, schedule, MLPerf's batch, evaluation
    group: distributed.Group
    data: Path  # the features folder
    plan: str  # fresh, restart (no checkpoint yet) or resume (train/admission.py)
    splits: dict  # every split the run reads, verified (data/check.py)
    index: Index  # the training splits' compact index, loaded once (every epoch plans from it)
    units: Units  # the output units (loader.units: characters, or the folder's BPE model; data/units.py)
    local: torch.nn.Module  # the model without DDP's hooks: what the warm-up runs
    model: torch.nn.Module  # what the step trains: the algorithm's wrap of the (compiled) model
    algo: Algorithm
    state: TrainState  # model, optimizer, scheduler, scaler
    resident: Resident | None  # loader.resident: the training split on the device (data/resident.py)
    planned: set | None  # train.system.cuda_graphs: the batch shapes to capture before the clock (train/graphs.py)
    run: Run | None  # rank 0: the run folder it writes; other ranks: None
    rec: Recorder  # rank 0: the run's recorder; other ranks: progress and clock only
    stop: StopSignals  # SIGINT / SIGTERM received
    precision_choice: dict | None  # a new run at train.system.precision=auto: its choice (train/auto_precision.py)
    meter: StepMeter = field(default_factory=StepMeter)  # the steps' device values not yet read
    ahead: tuple[int, Loader] | None = field(default=None, init=False)  # (epoch, its loader) started ahead

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
        return self.epoch_loader(prog.epoch, prog.start_batch)

    def start_ahead(self, epoch: int) -> None:
        """Start ``epoch``'s readers now, before the evaluation: on a GPU their start and first
        windows (seconds with 8 readers) would otherwise be the next epoch's wait for data."""
        self.close_ahead()
        self.ahead = (epoch, self.epoch_loader(epoch, 0).start())

    def close_ahead(self) -> None:
        """The readers started ahead stopped: training ended before their epoch."""
        if self.ahead is not None:
            self.ahead[1].close()
            self.ahead = None

    def epoch_loader(self, epoch: int, start_batch: int = 0, readers: int | None = None) -> Loader:
        """``epoch``'s batches from ``start_batch`` on (the seed's plan: the same batches whenever made);
        with the training split resident, epoch 1 fills it and later epochs are cut from it (a run that
        starts after epoch 1 reads the whole split into it first, on the clock). ``readers``: other
        than the run's (0: read in this process, as the floor's few batches are)."""
        loader = self.batching.loader
        loader_cfg = loader if readers is None else dataclasses.replace(loader, readers=readers)
        stream = make_loader(self.data, self.splits["train"], loader_cfg, epoch=epoch, seed=self.batching.seed,
                             start_batch=start_batch, rank=self.group.env.rank, world=self.group.world,
                             index=self.index, pin_memory=self.group.device.type == "cuda")
        return stream if self.resident is None else self.resident.loader(stream, first=epoch == 1)

    def release_data(self) -> None:
        """Training is over: the resident training split's memory is the final evaluation's."""
        self.resident = None
        if self.group.device.type == "cuda":
            torch.cuda.empty_cache()

    def checkpoint(self) -> None:
        """Every rank: the algorithm's state (a collective); then rank 0 saves its run's checkpoint
        (results/checkpoint.py), which its recorder records around the save (clock, events line, samples)."""
        algo_state = self.algo.state_dict(self.state)
        whole = self.algo.whole_state(self.state.optimizer) if self.algo.shards else None  # fsdp's: a collective
        if self.run is not None:
            state = self.state.state_dict(*(whole or ()))  # a sharded model's state: the whole one gathered
            with self.rec.checkpointing() as writer:
                checkpoint.save(self.run, self.prog, {**state, **(algo_state or {})}, writer)


def build(cfg: RunConfig, batching: Batching, group: distributed.Group, data: Path, ckpt: dict | None) -> Built:
    """Everything before the run, its recorder and the clock: splits, index, algorithm, model
    (restored from ``ckpt``, a resumed run's loaded checkpoint); ``data``: the features folder."""
    splits = verify_splits_of(data, cfg, batching)  # every split this run reads, before the model and the clock
    units = ensure_units(data, cfg.loader.units, splits["train"])  # BPE trained once beside the features
    index = load_index(data, splits["train"])  # once, before the clock (every epoch plans from it)
    algo = make_algorithm(cfg.algo, group.world, group.env.rank, group.device,
                          train=cfg.train)  # a launch it cannot train (single x 2) stops here
    prog = Progress.from_dict(ckpt[checkpoint.PROGRESS]) if ckpt is not None else Progress()
    state, local, model, planned = _model(cfg, batching, group.device, algo, ckpt, prog, splits, index)
    objective_of(local).check_memory(local, cfg, batching, index, units, group.device)  # a transducer's joint
    check_fits_device(cfg, batching, index, group.device, group.world, algo.shards,  # at-scale models' whole step
                      local_ranks=group.env.local_world)
    return Built(splits, index, units, algo, state, local, model, prog, _resident(batching, group, data, index, units),
                 planned)


def check_fits_device(cfg: RunConfig, batching: Batching, index: Index, device: torch.device, world: int,
                      sharded: bool, free_bytes: int | None = None, local_ranks: int = 1) -> None:
    """A model whose step memory hardware/memory.py can estimate (the FastConformer sizes) refused before
    the run exists when its widest batch would not fit the device's free memory (``free_bytes``, default
    the device's; a CPU's shared by the ``local_ranks`` processes on its host): exit 2 naming the gigabytes
    and what would fit (more ranks, checkpointing, shorter batches)."""
    if not memory.has_rule(cfg.model):
        return
    longest = float(index.duration.max())
    seconds = batching.batch_seconds
    batch = memory.duration_batch(seconds if seconds > 0 else longest * max(1, cfg.loader.batch_size // world), longest)
    setup = memory.run_setup(cfg, device.type, world, "fsdp" if sharded else "none")
    if free_bytes is None:
        free_bytes = memory.free_bytes(device, local_ranks)
    memory.check_fits(memory.estimate(cfg.model, batch, setup), free_bytes)


def _resident(batching: Batching, group: distributed.Group, data: Path, index: Index, units: Units) -> Resident | None:
    """loader.resident's buffer, allocated beside the built model (nothing read yet), or the run
    refused before it exists when it does not fit (a CPU run's processes on this host each hold one)."""
    if not batching.resident:
        return None
    dims = feature_dims(data)
    check_fits(index, dims, group.device, group.env.local_world if group.device.type == "cpu" else 1, units=units)
    return Resident(index, data, batching.loader, group.device, dims, units=units)


def _model(cfg: RunConfig, batching: Batching, device, algo: Algorithm, ckpt: dict | None, prog: Progress,
           splits: dict, index: Index):
    """(state, the model without DDP's hooks: what the warm-up runs, the module the step trains, the
    batch shapes train.system.cuda_graphs captures before the clock or None), restored from ``ckpt`` when resuming."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    core = build_model(cfg.model).to(device)
    fp8.prepare(core, tc.system.precision, device)  # fp8: torchao's float8 Linear layers, before any wrap or shard
    if algo.shards:
        return (*_sharded(cfg, batching, device, algo, core, ckpt, prog, splits, index), None)
    state = _train_state(core, tc, device, batching, prog, splits, index)
    if ckpt is not None:
        state.load(ckpt)
    local, planned = compiled(core) if tc.system.compile else core, None
    if tc.system.cuda_graphs:
        if device.type != "cuda" or batching.world > 1:
            raise ConfigError(f"train.system.cuda_graphs=true needs one CUDA device, not {batching.world} process(es) "
                              f"on {device}")
        local = graphed(core, tc, device)
        planned = planned_shapes(local, index, batching, tc.stop.max_epochs)
        check_memory(local, planned, FEATURE_DIM, torch.cuda.mem_get_info(device)[0])  # before the run exists
    model = algo.wrap(local)  # sync: DDP (several processes); the others: the model, from rank 0's weights
    if ckpt is not None:
        algo.load_state_dict(ckpt, state)  # bsp...easgd: this rank's own model, optimizer, RNG; the global state
    return state, local, model, planned


def _train_state(core: torch.nn.Module, tc, device, batching: Batching, prog: Progress, splits: dict,
                 index: Index) -> TrainState:
    """The model's optimizer (over its parameters as they are now), scheduler and scaler."""
    optimizer = make_optimizer(core, tc, device)
    total_steps = tc.stop.max_epochs * batching.steps_per_epoch(index, train_utterances(splits))
    return TrainState(core, optimizer, make_scheduler(optimizer, tc, prog, total_steps),
                      torch.amp.GradScaler("cuda", enabled=tc.system.precision == "fp16"))


def _sharded(cfg: RunConfig, batching: Batching, device, algo: Algorithm, core: torch.nn.Module, ckpt: dict | None,
             prog: Progress, splits: dict, index: Index):
    """:func:`_model` for an algorithm that shards the model (fsdp): sharded first, so that the
    optimizer holds the shards; resumed from the checkpoint's whole model and optimizer, whatever
    world wrote them (its own keys, scheduler, scaler and RNG as for every run)."""
    model = algo.wrap(core)  # fully_shard in place: core's parameters are this rank's shards from here on
    state = _train_state(core, cfg.train, device, batching, prog, splits, index)
    if ckpt is not None:
        algo.load_whole_state(ckpt[checkpoint.MODEL], ckpt[checkpoint.OPTIMIZER], state.optimizer)
        state.load(ckpt, model_and_optimizer=False)
        algo.load_state_dict(ckpt, state)
    return state, core, model


def run_initialization(t: Trainer, init_t0: float) -> None:
    """One-time work outside the TTA clock and outside the run's RNG (a first run on a machine
    measures and caches what later runs read: both must train alike); then the clock starts."""
    device = t.group.device
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if t.group.env.rank == 0:
                init_parts = initialize(t.local, t.cfg, t.batching, t.data, device)
            else:
                init_parts = warm_model(t.local, t.cfg, device) or {}
            init_parts.update(t.rec.count_flops(t.cfg, device))
            if t.precision_choice is not None:  # made before the model was built, inside the initialization
                init_parts["precision_s"] = t.precision_choice["seconds"]
            if isinstance(t.local, GraphedModel):  # every planned shape captured before the clock
                init_parts.update(t.local.prepare(t.planned, FEATURE_DIM, device))  # planned in _model
                init_parts.update(t.local.prepare_eval(resident_shapes(), FEATURE_DIM, device))  # kept by initialize
    except BaseException as e:  # the run exists: it ends recorded as failed, not "running"
        raise_as(e, t.rec.fail(e))
    t.algo.comm.take()  # the warm-up's collectives (fsdp's gathers) are no step's
    t.rec.initialized(t.plan, time.perf_counter() - init_t0, init_parts,
                      run_gpus(device, t.group.env.local_world))  # the GPUs rank 0 samples


def raise_as(e: BaseException, err: BaseException):
    """Raise ``err`` (``e`` itself, or ``e`` named as a machine fault)."""
    if err is not e:
        raise err from e
    raise e
