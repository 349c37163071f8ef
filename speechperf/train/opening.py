"""The run-opening stage: one ``train`` command's run opened in one place, and the Trainer made complete.

:func:`opened` (a context, on every rank) reads the request's configuration
(``TrainRequest.configuration``), sets the process up (determinism, threads, the process group:
train/distributed.py), has rank 0 admit the run folder (train/admission.py: fresh, restart, resume
or finished, under the folder's lock) and every other rank follow rank 0's decision, reads a
resumed run's checkpoint and settles ``train.system.precision=auto`` (train/auto_precision.py); it yields
the :class:`Opening` the loop needs and, at its end, releases the lock and the process group (an
OS error on the run's folder raised as the run's named fault, train/faults.py). Between the two,
the loop builds what the process trains with (``trainer.build``, before the clock and the stop
signals' handlers), then :func:`begin` makes the Run (rank 0: ``Admission.begin``), its recorder
(rank 0: ``RunRecorder``; the others: progress and clock only) and the :class:`Trainer`, complete,
and initializes it: the TTA clock starts. Nothing here calls back into the loop.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Iterator

import torch

from speechperf.algorithms import check_launch
from speechperf.config import RunConfig
from speechperf.data.batching import Batching
from speechperf.errors import SpeechperfError
from speechperf.features.checksum import OVER, features_sha256
from speechperf.hardware.environment import capture_env
from speechperf.train import distributed
from speechperf.train.admission import Admission, admit, follow
from speechperf.train.auto_precision import settle
from speechperf.train.recorder import Recorder, RunRecorder
from speechperf.train.request import TrainRequest
from speechperf.train.stop import StopSignals
from speechperf.train.trainer import Built, Trainer, run_initialization
from speechperf.train.warmup import check_precision


@dataclass(frozen=True)
class Opening:
    """A run opened on this process: what the loop builds the Trainer from (:func:`begin`)."""

    request: TrainRequest  # what the command line asked
    cfg: RunConfig  # the run's configuration, its precision settled (auto: the recorded or the chosen one)
    batching: Batching  # the run's batches over its processes (data/batching.py)
    group: distributed.Group  # this process's device and process group
    admission: Admission  # rank 0: its own (the folder's lock held); other ranks: rank 0's decision (follow)
    init_t0: float  # perf_counter() at init_start
    init_ms: int  # wall-clock milliseconds at init_start (events.log's init_start)
    ckpt: dict | None = None  # a resumed run's checkpoint, read by every rank (rank 0 alone writes it)
    choice: dict | None = None  # a new run at train.system.precision=auto: its choice (train/auto_precision.py)
    finished: dict | None = None  # plan finished: the run's summary (rank 0's, on every rank); nothing to train

    @property
    def plan(self) -> str:
        """fresh, restart (no checkpoint yet), resume or finished (train/admission.py's PLANS)."""
        return self.admission.plan

    @property
    def features(self) -> Path:
        """The features folder the run trains on (a new run's --data, a continued run's own)."""
        return Path(self.admission.features)


@contextmanager
def opened(request: TrainRequest) -> Iterator[Opening]:
    """The run ``request`` asks for, opened on this process (see the module's docstring); rank 0's
    refusal of the folder stops every rank (SpeechperfError, exit 2)."""
    init_t0, init_ms = time.perf_counter(), int(time.time() * 1000)  # init_start
    denv = distributed.DistEnv.from_env()
    cfg = request.configuration()
    tc = cfg.train
    batching = Batching(cfg.loader, tc.seed, denv.world)  # the run's batches, described once for every reader
    distributed.configure_determinism(tc.system.deterministic)  # before CUDA starts (cuBLAS workspace)
    if tc.system.threads > 0:
        torch.set_num_threads(tc.system.threads)
    group = distributed.setup(tc.system.device, tc.system.dist_backend, denv)  # the launch checked against the GPUs
    admission = verdict = None
    try:
        check_precision(cfg, group.device, request.allow_emulated)  # one this device cannot run (or emulates): exit 2
        launch = partial(check_launch, train=cfg.train)  # fsdp refuses what it cannot combine with (compile)
        admission = admit(request, cfg, batching, launch) if denv.rank == 0 else None
        decision = group.broadcast(admission.decision if admission is not None else None)
        verdict = admission or follow(request, decision)  # other ranks: rank 0's verdict on the folder, no lock
        if verdict.error:
            raise SpeechperfError(verdict.error)
        opening = partial(Opening, request=request, cfg=cfg, batching=batching, group=group, admission=verdict,
                          init_t0=init_t0, init_ms=init_ms)
        if verdict.plan == "finished":
            yield opening(finished=group.broadcast(admission.summary() if admission is not None else None))
            return
        ckpt = verdict.checkpoint() if verdict.plan == "resume" else None  # every rank reads it; rank 0 alone writes
        cfg, choice = settle(cfg, group, verdict)  # precision auto: measured now (a new run) or the recorded one
        yield opening(cfg=cfg, ckpt=ckpt, choice=choice)
    except OSError as e:  # before the run exists (a disk full as the run is made, say): named, exit 1
        if isinstance(e, SpeechperfError) or verdict is None:  # admit names its own (a read-only --out)
            raise
        raise verdict.fault(e) from e
    finally:
        if admission is not None:
            admission.release()
        group.close()


def begin(o: Opening, built: Built, stop: StopSignals) -> Trainer:
    """The run as admitted, under the stop signals' handlers: rank 0's Run (``Admission.begin``:
    created, or reopened and cut back to the checkpoint, as planned) and its recorder, the other
    ranks' recorder of progress and clock only (their messages naming the run from the admission);
    the Trainer, complete; then its initialization (``trainer.run_initialization``): the clock starts."""
    request, group = o.request, o.group
    if group.env.rank == 0:
        env = _env(o, built)
        config = o.cfg.to_dict()
        run = o.admission.begin(config=config, env=env, progress=built.prog, data=o.features,
                                label=request.run_label(env, config), shared_db=request.db_path)
        rec = RunRecorder.begin(run, o.plan, o.cfg, built.prog, world=group.world, splits=built.splits,
                                init_ms=o.init_ms, quiet=request.quiet, check=request.check,
                                batch=o.batching.mlperf_batch(built.index), units=built.units)
    else:
        run, rec = None, Recorder(built.prog, o.admission)
    b = built
    t = Trainer(cfg=o.cfg, batching=o.batching, group=group, data=o.features, plan=o.plan, splits=b.splits,
                index=b.index, units=b.units, local=b.local, model=b.model, algo=b.algo, state=b.state,
                resident=b.resident, planned=b.planned, run=run, rec=rec, stop=stop, precision_choice=o.choice)
    run_initialization(t, o.init_t0)
    return t


def _env(o: Opening, built: Built) -> dict:
    """The run's env.json: the machine, the launch, and what a reproduction compares (the features)."""
    device = o.group.device
    return {**capture_env(str(device)), "world_size": o.group.world, "platform": o.request.platform,
            "precision_note": check_precision(o.cfg, device), "precision_choice": o.choice,
            "features": {"sha256": features_sha256(o.features, units=o.cfg.loader.units), "over": OVER,
                         "units": built.units.describe()}}
