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
down. Persistence (folder, checkpoint, event log, rows, summary) is the run's
(:class:`speechperf.results.run.Run`).

Data parallel: launched by torchrun (``WORLD_SIZE`` > 1) the model is wrapped in DDP;
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

import os
import time
from pathlib import Path

import torch

from speechperf.config import ConfigError, RunConfig, load_preset
from speechperf.data import alphabet
from speechperf.data.check import parse_splits, verify_splits
from speechperf.errors import SpeechperfError
from speechperf.models import build_model
from speechperf.results.run import Clock, Progress, Run, read_checkpoint
from speechperf.telemetry.status import StatusLine
from speechperf.train import distributed
from speechperf.train.checkpoint import set_rng_state
from speechperf.train.evaluate import evaluate
from speechperf.train.faults import as_fault, check_trained, failure_status, record_failure
from speechperf.train.events import C
from speechperf.train.mlperf import log_submission
from speechperf.train.step import StepMeter, TrainingDiverged, count_steps, make_optimizer, read_point, train_step
from speechperf.train.warmup import check_precision, initialize, warm_model, warn_if_slow

__all__ = ["train", "config_diff", "TrainingDiverged", "RESUME_MODES"]

RESUME_MODES = ("auto", "yes", "no")


def train(preset: str = "cpu", data: Path | None = None, out: Path | None = None, overrides=(),
          resume: str | Path | None = "auto", db_path: Path | None = None, quiet: bool = False,
          platform: str | None = None, label: str | None = None) -> dict:
    """Train (or continue) the run in ``out``; returns its summary row.

    ``resume``: ``auto`` continues a run of the same configuration found in ``out`` from its
    last checkpoint (a finished one is only reported, a different configuration refused), so
    that the same command, repeated by ``torchrun --max-restarts``, recovers from a dead
    worker; ``yes`` insists on continuing, ``no`` refuses an existing run. A run folder (the
    previous release's ``--resume RUN``) continues that run with its own configuration.
    ``db_path``: a shared database that receives the rows too (the run folder keeps its own).
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
    try:
        check_precision(cfg, group.device)  # a precision this device cannot run: refused now, exit 2
        # rank 0 alone looks at the folder (across machines only its disk holds it) and tells
        # every rank what to do, or the error that stops them all
        plan, feats, error = group.broadcast(_plan(out, cfg, mode, data, world) if rank == 0 else None)
        if error:
            raise SpeechperfError(error)
        if plan == "finished":
            return group.broadcast(Run.open(out).summary() if rank == 0 else None)
        return _train(cfg, group, Path(feats), out, plan, db_path, quiet, platform, label, (init_t0, init_ms))
    except OSError as e:  # before the run exists (a read-only --out, say): named, exit 1
        if isinstance(e, SpeechperfError):
            raise
        raise as_fault(e, out) from e
    finally:
        group.close()


def _plan(out: Path, cfg: RunConfig, mode: str, data: Path | None,
          world: int) -> tuple[str | None, str | None, str | None]:
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
        differ = config_diff(run.config, cfg.to_dict())
        if differ:
            raise ConfigError(f"{out} holds a run of another configuration ({'; '.join(differ)}): repeat its "
                              "configuration to continue it, or choose another --out")
        if run.finished:
            return "finished", None, None
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
    """Every split the run reads (train, validation, final), verified (data/check.py)."""
    tc = cfg.train
    return verify_splits(data, parse_splits(tc.train_splits), tc.eval_split, parse_splits(tc.final_splits),
                         cfg.loader.batch_size, world)


def _train(cfg: RunConfig, group: distributed.Group, data: Path, out: Path, plan: str, db_path, quiet: bool,
           platform, label, init_start: tuple[float, int]) -> dict:
    tc, device, rank, world = cfg.train, group.device, group.env.rank, group.world
    # every split this run reads, verified before the model and the clock exist
    splits = _verify(data, cfg, world)
    train_splits = splits["train"]
    ckpt = read_checkpoint(out) if plan == "resume" else None

    # ---- model, optimizer, state ---------------------------------------------------------
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model).to(device)
    optimizer = make_optimizer(model, tc, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(tc))
    scaler = torch.amp.GradScaler("cuda", enabled=tc.precision == "fp16")
    prog = Progress()
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        prog = Progress.from_dict(ckpt["progress"])
        set_rng_state(ckpt["rng"])
    core = model
    if tc.compile:
        model = torch.compile(model)
    local = model  # compiled or not, without DDP's hooks: what the warm-up runs
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    # ---- the run folder (rank 0) ---------------------------------------------------------
    lead = rank == 0
    run = sampler = None
    if lead:
        if plan == "fresh":
            from speechperf.telemetry.environment import capture_env

            env = {**capture_env(str(device)), "world_size": world, "platform": platform,
                   "precision_note": check_precision(cfg, device)}
            run = Run.create(out, kind="train", config=cfg.to_dict(), env=env, data=data, label=label,
                             shared_db=db_path)
        else:
            run = Run.open(out, data=data, shared_db=db_path, write=True)
            run.truncate_logs(prog.log_sizes)  # a restart without checkpoint: cut to nothing
            run.forget_after(prog)
            run.set_status("running")
        if plan != "resume":  # MLPerf has no resume: init_start..run_start stay exactly once
            run.events().start(C.INIT_START, time_ms=init_start[1])
            _log_run_config(run.events(), cfg, world, splits, run.label)

    # ---- initialization: one-time work outside the TTA clock -----------------------------
    try:
        init_parts = initialize(local, cfg, data, device) if lead else {}
        if not lead:
            warm_model(local, cfg, device)
    except BaseException as e:  # the run exists: it ends recorded as failed, not "running"
        err = _end_failed(run, out, e, prog, Clock(prog.clock_s))
        if run is not None:
            run.close()
        if err is not e:
            raise err from e
        raise
    init_s = time.perf_counter() - init_start[0]
    prog.init_s += init_s
    clock = Clock(prog.clock_s)  # TTA time starts now (continues where a resumed run stopped)
    if lead:
        warn_if_slow(init_s, str(out))
        parts = {k: round(v, 3) for k, v in init_parts.items()}
        if plan == "resume":
            run.events().event("resume", clock_s=round(clock.now(), 3), iteration=prog.iteration, epoch=prog.epoch,
                               init_s=round(init_s, 3), **parts)
        else:
            run.events().end(C.INIT_STOP, init_s=round(init_s, 3), **parts)
            run.events().start(C.RUN_START)
        sampler = _start_sampler()

    def checkpoint() -> None:
        if not lead:
            return
        prog.clock_s = clock.now()
        # Logged before the log sizes are taken, so a resume keeps this line.
        run.events().event("checkpoint", iteration=prog.iteration, epoch=prog.epoch, clock_s=round(prog.clock_s, 3))
        run.save_checkpoint(prog, model=core.state_dict(), optimizer=optimizer.state_dict(),
                            scheduler=scheduler.state_dict(), scaler=scaler.state_dict())

    # ---- the state machine ---------------------------------------------------------------
    from speechperf.data.loader import make_loader

    status_line = StatusLine() if lead and not quiet else None
    meter = StepMeter()
    last_row: dict = {}

    def settle() -> None:
        """The one host read: pending steps' losses and skip flags, applied in step order."""
        nonlocal last_row
        reads = meter.read()
        if lead:
            for r in reads:
                run.add_iteration(r.row)
                last_row = r.row
        count_steps(prog, reads, tc.max_bad_losses)
        if status_line and reads:
            status_line.update(prog.epoch, reads[-1].iteration, reads[-1].loss, last_row["utts_per_s"],
                               prog.evals[-1][2] if prog.evals else None, clock.now())

    model.train()
    failed = False
    try:
        while prog.status is None and prog.epoch <= tc.max_epochs:
            loader = make_loader(data, train_splits, cfg.loader, epoch=prog.epoch, seed=tc.seed,
                                 start_batch=prog.start_batch, rank=rank, world=world)
            if lead and prog.start_batch == 0:  # a resumed epoch already logged its start
                run.events().start(C.EPOCH_START, epoch_num=prog.epoch)
            last = time.perf_counter()
            for batch in loader:
                # -- training
                prog.iteration += 1
                step = train_step(model, batch, optimizer, scaler, device, tc)
                prog.impossible_utts += step.impossible
                now = time.perf_counter()
                batch_s, last = now - last, now
                prog.start_batch += 1
                meter.add(prog.iteration, step, _iteration_row(run.run_id, prog, clock.now(), None, batch, batch_s)
                          if lead else None)
                if not read_point(prog.iteration, tc):
                    continue
                settle()
                # -- generating sentences
                if lead and prog.iteration % tc.sentence_every == 0:
                    if status_line:
                        status_line.clear()
                    _log_sentences(run, prog, batch, step.log_probs, step.out_lens, last_row["loss"], quiet)
                # -- saving checkpoint
                if prog.iteration % tc.checkpoint_every == 0:
                    checkpoint()
                if group.agree(tc.time_cap_minutes > 0 and clock.now() >= 60 * tc.time_cap_minutes):
                    prog.status = "time_cap"
                    break
            else:
                settle()
                check_trained(core, prog, tc)  # a run that cannot train stops here, as diverged
                # -- evaluating (the model stays resident; its seconds are recorded apart)
                if lead:
                    if status_line:
                        status_line.clear()
                    run.events().end(C.EPOCH_STOP, epoch_num=prog.epoch)
                    prog.status = _epoch_eval(core, data, cfg, device, prog, clock, run, quiet)
                prog.status = group.broadcast(prog.status)
                scheduler.step()
                prog.epoch += 1
                prog.start_batch = 0
                checkpoint()
        status = prog.status = prog.status or ("max_epochs" if tc.target > 0 else "success")
        if lead:
            _final_eval(core, data, splits["final"], cfg, device, prog, clock, run, quiet)
            checkpoint()
            run.events().end(C.RUN_STOP, None, status="success" if status == "success" else "aborted", reason=status)
        group.barrier()  # the other ranks wait for rank 0's final evaluation: tear down together
    except BaseException as e:
        failed = True
        if lead:
            try:  # the steps since the last read, when the device still answers
                for r in meter.read():
                    run.add_iteration(r.row)
            except Exception:  # noqa: BLE001 (the original error is re-raised below)
                pass
        err = _end_failed(run, out, e, prog, clock)
        if err is not e:
            raise err from e
        raise
    finally:
        if sampler is not None:
            sampler.stop()
            try:
                _store_samples(run, sampler.samples)
            except Exception:  # noqa: BLE001
                if not failed:
                    raise
                # a failed run reports its own cause, not this consequence of it (a full disk)
            finally:
                run.close()
    summary = {**_summary(run.run_id if run else None, out, status, prog, clock),
               "precision_note": check_precision(cfg, device)}  # an emulated precision says so beside the result
    if lead:
        run.set_status(status)
        run.write_summary(summary)  # last: its presence means the run finished
        run.close()
    return summary


def _end_failed(run: Run | None, out: Path, e: BaseException, prog: Progress, clock: Clock) -> BaseException:
    """Record a run that stopped on ``e`` (rank 0: ``run``; faults.py) and return the error to
    raise: ``e`` named as a machine fault where it is one (a full disk: exit 1), else ``e``."""
    fault = as_fault(e, out)
    if run is not None:
        status = failure_status(fault or e)
        unsaved = record_failure(run, _summary(run.run_id, out, status, prog, clock), str(fault or e))
        if unsaved and fault is not None:
            fault = type(fault)(f"{fault} (not recorded: {'; '.join(unsaved)})")
    return fault if fault is not None else e


# ---- optimizer --------------------------------------------------------------------------
def _lr_lambda(tc):
    """Per-epoch multiplicative decay (the scheduler steps once per epoch)."""
    return lambda epochs_done: tc.lr_decay ** epochs_done


# ---- evaluation ------------------------------------------------------------------------
def _epoch_eval(model, data, cfg, device, prog, clock, run: Run, quiet) -> str | None:
    tc, events = cfg.train, run.events()
    events.start(C.EVAL_START, epoch_num=prog.epoch)
    r = evaluate(model, data, tc.eval_split, cfg.loader, device, decoder=tc.eval_decoder,
                 beam=tc.eval_beam, precision=tc.precision, keep_pairs=3, mode=tc.eval_mode)
    now = clock.now()
    prog.evals.append((now, r["wer"], r["cer"]))
    run.upsert("evals", {"run_id": run.run_id, "epoch": prog.epoch, "split": r["split"], "decoder": r["decoder"],
                        "beam": r["beam"], "clock_s": now, "eval_s": r["eval_s"], "loss": r["loss"], "wer": r["wer"],
                        "cer": r["cer"], "cer_paper": r["cer_paper"], "n_utts": r["n_utts"], "final": 0})
    events.event(C.EVAL_ACCURACY, r["cer"], epoch_num=prog.epoch, metric="cer", wer=round(r["wer"], 3),
                 cer_paper=round(r["cer_paper"], 3), loss=round(r["loss"], 4), eval_s=round(r["eval_s"], 3))
    events.end(C.EVAL_STOP, epoch_num=prog.epoch)
    if not quiet:
        print(f"epoch {prog.epoch}: {tc.eval_split} loss {r['loss']:.3f} WER {r['wer']:.2f} CER {r['cer']:.2f} "
              f"(paper CER {r['cer_paper']:.2f}) eval {r['eval_s']:.1f}s clock {now / 60:.2f} min", flush=True)
    if tc.target > 0:
        from speechperf.metrics.tta import tta_minutes

        idx = 1 if tc.target_metric == "wer" else 2
        if tta_minutes([(e[0], e[idx]) for e in prog.evals], tc.target, tc.target_epochs) is not None:
            return "success"
    return None


def _final_eval(model, data, splits, cfg, device, prog, clock, run: Run, quiet) -> None:
    """Table 5: the final-evaluation splits (verified before training), with the final beam width."""
    tc = cfg.train
    for split in splits:
        r = evaluate(model, data, split, cfg.loader, device, decoder=tc.eval_decoder, beam=tc.final_beam,
                     precision=tc.precision, mode=tc.eval_mode)
        run.upsert("evals", {"run_id": run.run_id, "epoch": prog.epoch - 1, "split": split, "decoder": r["decoder"],
                            "beam": r["beam"], "clock_s": clock.now(), "eval_s": r["eval_s"], "loss": r["loss"],
                            "wer": r["wer"], "cer": r["cer"], "cer_paper": r["cer_paper"], "n_utts": r["n_utts"],
                            "final": 1})
        run.events().event("final_eval", r["wer"], split=split, cer=round(r["cer"], 3), decoder=r["decoder"], beam=r["beam"])
        if not quiet:
            print(f"final {split}: WER {r['wer']:.2f} CER {r['cer']:.2f} ({r['decoder']}, beam {r['beam']})", flush=True)


# ---- logging helpers ---------------------------------------------------------------------
def _iteration_row(run_id, prog, clock_s, loss, batch, batch_s) -> dict:
    b = len(batch.ids)
    return {"run_id": run_id, "iteration": prog.iteration, "epoch": prog.epoch, "clock_s": clock_s, "loss": loss,
            "batch_size": b, "frames": int(batch.feat_lens.sum()), "audio_s": float(batch.audio_seconds),
            "step_s": batch_s, "utts_per_s": b / batch_s, "audio_s_per_s": float(batch.audio_seconds) / batch_s}


def _log_sentences(run: Run, prog, batch, log_probs, out_lens, loss, quiet) -> None:
    paths = log_probs.argmax(-1).cpu()  # (T', B)
    pairs = []
    for b in range(min(3, paths.shape[1])):
        hyp = alphabet.decode(alphabet.collapse(paths[: int(out_lens[b]), b].tolist()))
        pairs.append({"ref": batch.transcripts[b], "hyp": hyp})
    run.append_sentences({"iteration": prog.iteration, "epoch": prog.epoch, "loss": loss, "pairs": pairs})
    if not quiet:
        print(f"iter {prog.iteration} epoch {prog.epoch} loss {loss:.3f}\n  ref: {pairs[0]['ref']}\n  hyp: {pairs[0]['hyp']}",
              flush=True)


def _log_run_config(events, cfg, world, splits: dict, platform: str) -> None:
    """The submission keys and hyperparameters MLPerf's training rules ask for (train/mlperf.py),
    and the splits the run reads (verified)."""
    log_submission(events, platform)
    events.event(C.GLOBAL_BATCH_SIZE, cfg.loader.batch_size)
    events.event(C.GRADIENT_ACCUMULATION_STEPS, 1)
    events.event(C.OPT_NAME, cfg.train.optimizer)
    events.event(C.OPT_BASE_LR, cfg.train.lr)
    events.event(C.SEED, cfg.train.seed)
    facts = splits["splits"]
    events.event(C.TRAIN_SAMPLES, sum(facts[s]["utterances"] for s in splits["train"]), splits=list(splits["train"]))
    events.event(C.EVAL_SAMPLES, facts[splits["valid"]]["utterances"], split=splits["valid"])
    events.event("world_size", world)
    events.event("preset", cfg.preset)
    events.event("data_splits", splits)


def _start_sampler():
    from speechperf.telemetry.sampler import Sampler

    s = Sampler(os.getpid())
    s.start()
    return s


def _store_samples(run: Run, samples) -> None:
    if samples:
        run.insert("samples", [{"run_id": run.run_id, "t": s.t, "source": s.source, "metric": s.metric,
                                    "value": s.value} for s in samples])


def _summary(run_id, out, status, prog, clock) -> dict:
    last = prog.evals[-1] if prog.evals else (None, None, None)
    return {"run": str(out), "run_id": run_id, "status": status, "epochs": len(prog.evals),
            "iterations": prog.iteration, "clock_min": clock.now() / 60, "init_s": prog.init_s,
            "last_wer": last[1], "last_cer": last[2],
            "skipped_steps": prog.skipped_steps, "impossible_utts": prog.impossible_utts}
