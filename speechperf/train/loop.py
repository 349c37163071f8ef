"""The training loop: the paper's state machine (SPEC C), top to bottom.

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
(train/algorithm.py) trains: ``sync`` (the default) wraps the model in DDP; bsp, bmuf,
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
from pathlib import Path

import torch

from speechperf.config import ConfigError, RunConfig, load_preset
from speechperf.data.check import parse_splits, verify_splits
from speechperf.errors import SpeechperfError
from speechperf.features.stats import check_trained_on, read_stats
from speechperf.models import build_model
from speechperf.results.lock import RunFolderBusy, RunLock
from speechperf.results.run import Run, read_checkpoint
from speechperf.train import distributed
from speechperf.train.algorithm import Algorithm, make_algorithm
from speechperf.train.checkpoint import TrainState
from speechperf.train.evaluate import evaluate
from speechperf.train.faults import as_fault, check_trained
from speechperf.train.progress import Progress
from speechperf.train.recorder import Recorder, RunRecorder, train_utterances
from speechperf.train.schedule import make_scheduler, schedule_ended, steps_per_epoch
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
    worker; ``yes`` insists on continuing, ``no`` refuses an existing run. A run folder (the
    previous release's ``--resume RUN``) continues that run with its own configuration.
    ``db_path``: a shared database that receives the rows too (the run folder keeps its own).
    ``label_suffix``: appended to the new run's label, given or derived (train/seeds.py: " seed 2").
    """
    # ---- configuration and run folder -------------------------------------------------
    init_t0, init_ms = time.perf_counter(), int(time.time() * 1000)  # init_start
    denv = distributed.DistEnv.from_env()
    rank, world = denv.rank, denv.world
    mode = "auto" if resume is None else str(resume)
    if mode not in RESUME_MODES:  # --resume RUN: that run, with its recorded configuration
        if overrides:
            raise ConfigError("a resumed run keeps its configuration; overrides are not allowed with --resume RUN")
        out, mode = Path(resume), "yes"
        cfg = RunConfig.from_dict(Run.open(out).config)
    else:
        if out is None:
            raise ConfigError("train needs --out RUN (and --data FEATS for a new run)")
        out, cfg = Path(out), load_preset(preset, overrides, platform)
    tc = cfg.train
    distributed.configure_determinism(tc.deterministic)  # before CUDA starts (cuBLAS workspace)
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    group = distributed.setup(tc.device, tc.dist_backend, denv)  # checks the launch against the GPUs first
    lock = None
    try:
        check_precision(cfg, group.device)  # a precision this device cannot run: refused now, exit 2
        # rank 0 alone looks at the folder (across machines only its disk holds it), holding its
        # lock for the whole run, and tells every rank what to do, or the error that stops them all
        full = f"{label}{label_suffix}" if label is not None else None  # the label a new run would get
        planned, lock = _plan_locked(out, cfg, mode, data, world, full) if rank == 0 else (None, None)
        plan, feats, error = group.broadcast(planned)
        if error:
            raise SpeechperfError(error)
        if plan == "finished":
            return group.broadcast(Run.open(out).summary() if rank == 0 else None)
        return _train(cfg, group, Path(feats), out, plan, db_path, quiet, platform, (label, label_suffix),
                      (init_t0, init_ms))
    except OSError as e:  # before the run exists (a read-only --out, say): named, exit 1
        if isinstance(e, SpeechperfError):
            raise
        raise as_fault(e, out) from e
    finally:
        if lock is not None:
            lock.release()
        group.close()


def _plan_locked(out: Path, cfg: RunConfig, mode: str, data: Path | None, world: int,
                 label: str | None) -> tuple[tuple[str | None, str | None, str | None], RunLock | None]:
    """:func:`_plan` under the run folder's lock (results/lock.py), held from here to the end
    of the run so that a second process on the folder is refused naming the first; a new
    run's features are verified before its folder exists. Returns (plan, the held lock)."""
    first = None
    if not out.is_dir():
        first = _plan(out, cfg, mode, data, world, label)
        if first[0] != "fresh":
            return first, None
        out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out)
    try:
        lock.acquire()
    except RunFolderBusy as e:
        return (None, None, str(e)), None
    # planned again under the lock only if another process made a run here in between
    planned = first if first is not None and not Run.exists(out) else _plan(out, cfg, mode, data, world, label)
    if planned[0] in (None, "finished"):
        lock.release()
        return planned, None
    return planned, lock


def _plan(out: Path, cfg: RunConfig, mode: str, data: Path | None, world: int,
          label: str | None = None) -> tuple[str | None, str | None, str | None]:
    """(fresh | restart | resume | finished, features folder, error) for the run folder ``out``."""
    try:
        if not Run.exists(out):
            if mode == "yes":
                raise SpeechperfError(f"--resume yes but {out} holds no run")
            if data is None:
                raise ConfigError("train needs --data FEATS for a new run")
            _verify(data, cfg, world)  # a bad features folder fails before any file is written
            return "fresh", str(data), None
        if mode == "no":
            raise SpeechperfError(f"{out} already holds a run; continue it with --resume auto (the default) "
                                  "or choose another --out")
        run = Run.open(out, data=data)
        # read through today's config: a section added since (augment) takes its default there too
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
        return ("resume" if run.has_checkpoint() else "restart"), str(run.features()), None
    except SpeechperfError as e:
        return None, None, str(e)


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
                         cfg.loader.batch_size, world)


def _train(cfg: RunConfig, group: distributed.Group, data: Path, out: Path, plan: str, db_path, quiet: bool,
           platform, label, init_start: tuple[float, int]) -> dict:
    tc, device, rank, world = cfg.train, group.device, group.env.rank, group.world
    splits = _verify(data, cfg, world)  # every split this run reads, before the model and the clock exist
    algo = make_algorithm(cfg.algo, world, rank, device)  # a launch it cannot train (single x 2) stops here
    ckpt = read_checkpoint(out) if plan == "resume" else None
    prog = Progress.from_dict(ckpt["progress"]) if ckpt is not None else Progress()

    # ---- model, optimizer, state ---------------------------------------------------------
    torch.manual_seed(tc.seed)
    core = build_model(cfg.model).to(device)
    optimizer = make_optimizer(core, tc, device)
    total_steps = tc.max_epochs * steps_per_epoch(train_utterances(splits), cfg.loader.batch_size)
    state = TrainState(core, optimizer, make_scheduler(optimizer, tc, prog, total_steps),
                       torch.amp.GradScaler("cuda", enabled=tc.precision == "fp16"))
    if ckpt is not None:
        state.load(ckpt)
    local = torch.compile(core) if tc.compile else core  # without DDP's hooks: what the warm-up runs
    model = algo.wrap(local)  # sync: DDP (several processes); the others: the model, from rank 0's weights
    if ckpt is not None:
        algo.load_state_dict(ckpt, state)  # bsp...easgd: this rank's own model, optimizer, RNG; the global state

    with StopSignals() as stop:
        rec = _recorder(rank, plan, out, cfg, prog, data, device, world, splits, platform, label, db_path, quiet,
                        init_start[1])
        try:  # initialization: one-time work outside the TTA clock and outside the run's RNG (a first
            # run on a machine measures and caches what later runs read: both must train alike)
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                init_parts = initialize(local, cfg, data, device) if rank == 0 else warm_model(local, cfg, device) or {}
                init_parts.update(rec.count_flops(cfg, device))
        except BaseException as e:  # the run exists: it ends recorded as failed, not "running"
            _raise(e, rec.fail(e))
        rec.initialized(plan, time.perf_counter() - init_start[0], init_parts)
        meter = StepMeter()
        try:
            status = _epochs(cfg, group, data, splits, model, algo, state, rec, meter, stop)
            evaluated = algo.before_eval(rec.prog.start_batch)  # every rank: a stop inside an epoch synchronizes
            if rank == 0:
                _final_eval(evaluated, data, splits["final"], cfg, device, rec, stop)
            rec.checkpoint(state, algo.state_dict(state))
            asked = max(group.gather_int(stop.requested or 0))  # a signal during the final evaluation
            if asked:  # stops it (saved: the same command evaluates again), never ends as a success
                raise interrupted(asked, f"in {rec.out} during the final evaluation")
            rec.stopped(status)
            group.barrier()  # the other ranks wait for rank 0's final evaluation: tear down together
            algo.close()  # asgd, easgd: the parameter server's rpc ends
        except BaseException as e:
            algo.close(graceful=False)  # asgd, easgd: this rank's rpc ends without waiting for the others
            _raise(e, rec.fail(e, meter))
        return group.broadcast(rec.finish(status))  # rank 0's summary on every rank (one exit status)


def _epochs(cfg: RunConfig, group, data: Path, splits: dict, model, algo: Algorithm, state: TrainState, rec,
            meter: StepMeter, stop: StopSignals) -> str:
    """The state machine (SPEC C): train epoch after epoch until a stopping rule holds; returns
    why training stopped (success, time_cap, max_epochs). A signal stops it at a read point."""
    from speechperf.data.loader import make_loader

    tc, device, prog, rank = cfg.train, group.device, rec.prog, group.env.rank
    model.train()
    # newbob's stopping rule ends training as the last epoch would (train/schedule.py)
    last_epoch = min(tc.max_epochs, tc.stop_after_epochs or tc.max_epochs)  # stop_after_epochs: the schedule stays max_epochs
    while prog.status is None and prog.epoch <= last_epoch and not schedule_ended(tc, prog.eval_losses):
        loader = make_loader(data, splits["train"], cfg.loader, epoch=prog.epoch, seed=tc.seed,
                             start_batch=prog.start_batch, rank=rank, world=group.world)
        rec.epoch_started()
        last = time.perf_counter()
        for batch in loader:
            # -- training
            if prog.iteration:  # the learning rate of this step (train/schedule.py)
                state.scheduler.step()
            prog.iteration += 1
            step = train_step(model, batch, state.optimizer, state.scaler, device, tc, cfg.augment)
            prog.start_batch += 1
            algo.after_step(prog.start_batch)  # local SGD: the ranks' models combined every algo.sync_every batches
            prog.impossible_utts += step.impossible
            now = time.perf_counter()
            batch_s, last = now - last, now
            meter.add(prog.iteration, step, rec.iteration_row(batch, batch_s, algo.comm.take()))
            if not read_point(prog.iteration, tc):
                continue
            _settle(meter, rec, tc)
            # -- generating sentences
            if prog.iteration % tc.sentence_every == 0:
                rec.sentences(batch, step)
            # -- saving checkpoint
            if prog.iteration % tc.checkpoint_every == 0:
                rec.checkpoint(state, algo.state_dict(state))
            asked = _stop_asked(group, stop, rec, tc)
            if asked > 1:  # a signal: saved where it stopped, recorded as interrupted
                if prog.iteration % tc.checkpoint_every:
                    rec.checkpoint(state, algo.state_dict(state))
                raise interrupted(asked, f"in {rec.out} at iteration {prog.iteration} (epoch {prog.epoch})")
            if asked:
                prog.status = "time_cap"
                break
        else:
            _settle(meter, rec, tc)
            evaluated = algo.before_eval(prog.start_batch)  # every rank: local SGD ends the epoch on a common model
            check_trained(state.model, prog, tc)  # a run that cannot train stops here, as diverged
            # -- evaluating (the model stays resident; its seconds are recorded apart)
            rec.epoch_ended()
            prog.status, loss = group.broadcast(_epoch_eval(evaluated, data, cfg, device, rec) if rank == 0 else None)
            prog.eval_losses.append(loss)  # every rank: the newbob schedule reads it (train/schedule.py)
            prog.epoch += 1
            prog.start_batch = 0
            rec.checkpoint(state, algo.state_dict(state))
            asked = max(group.gather_int(stop.requested or 0))
            if asked and prog.status is None:
                raise interrupted(asked, f"in {rec.out} after epoch {prog.epoch - 1}")
    prog.status = prog.status or ("max_epochs" if tc.target > 0 else "success")
    return prog.status


def _recorder(rank: int, plan: str, out: Path, cfg: RunConfig, prog: Progress, data: Path, device, world: int,
              splits: dict, platform, label: tuple[str | None, str], db_path, quiet: bool, init_ms: int) -> Recorder:
    """Rank 0's recorder of the run folder (created or opened); a no-op one on other ranks.
    ``label``: (the label given or None, a suffix for it or for the derived one)."""
    if rank != 0:
        return Recorder(prog, out)
    from speechperf.results.run import default_label
    from speechperf.features.checksum import OVER, features_sha256
    from speechperf.telemetry.environment import capture_env

    env = {**capture_env(str(device)), "world_size": world, "platform": platform,
           "precision_note": check_precision(cfg, device),
           "features": {"sha256": features_sha256(data), "over": OVER}}  # what a reproduction compares (issue 31)
    given, suffix = label
    label = f"{given or default_label(env, cfg.to_dict())}{suffix}" if suffix else given
    return RunRecorder.begin(plan, out, cfg, prog, data=data, env=env, splits=splits, init_ms=init_ms, label=label,
                             db_path=db_path, quiet=quiet)


def _settle(meter: StepMeter, rec: Recorder, tc) -> None:
    """The one host read: the pending steps' losses and skip flags, recorded and counted in
    step order (a divergence aborts here)."""
    reads = meter.read()
    rec.steps_read(reads)
    count_steps(rec.prog, reads, tc.max_bad_losses)


def _stop_asked(group, stop: StopSignals, rec: Recorder, tc) -> int:
    """At a read point, all ranks together: the number of a signal any rank was sent, 1 when
    the time cap passed, else 0."""
    cap = tc.time_cap_minutes > 0 and rec.now() >= 60 * tc.time_cap_minutes
    return max(group.gather_int(stop.requested or int(cap)))


def _raise(e: BaseException, err: BaseException):
    """Raise ``err`` (``e`` itself, or ``e`` named as a machine fault)."""
    if err is not e:
        raise err from e
    raise e


# ---- evaluation ------------------------------------------------------------------------
def _evaluate(model, data: Path, split: str, cfg: RunConfig, device, beam: int, **kw) -> dict:
    tc = cfg.train
    return evaluate(model, data, split, cfg.loader, device, decoder=tc.eval_decoder, beam=beam,
                    precision=tc.precision, mode=tc.eval_mode, **kw)


def _epoch_eval(model, data: Path, cfg: RunConfig, device, rec: Recorder) -> tuple[str | None, float]:
    """The epoch's validation (rank 0): (``success`` once the target is reached, else None; its loss)."""
    tc = cfg.train
    rec.eval_started()
    r = _evaluate(model, data, tc.eval_split, cfg, device, tc.eval_beam, keep_pairs=3)
    rec.evaluated(r, final=False)
    if tc.target > 0:
        from speechperf.metrics.tta import tta_minutes

        idx = 1 if tc.target_metric == "wer" else 2
        if tta_minutes([(e[0], e[idx]) for e in rec.prog.evals], tc.target, tc.target_epochs) is not None:
            return "success", r["loss"]
    return None, r["loss"]


def _final_eval(model, data: Path, splits: list[str], cfg: RunConfig, device, rec: Recorder,
                stop: StopSignals) -> None:
    """Table 5: the final-evaluation splits (verified before training), with the final beam
    width; a stop signal ends it between splits."""
    for split in splits:
        if stop.requested:
            return
        rec.evaluated(_evaluate(model, data, split, cfg, device, cfg.train.final_beam), final=True)
