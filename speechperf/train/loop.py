"""The training loop: the paper's state machine (SPEC C), top to bottom.

training batch after batch; every ``sentence_every`` iterations greedy-decode the current
batch and log hypothesis vs reference; every ``checkpoint_every`` iterations an atomic
checkpoint; after every epoch evaluate the validation split (loss, WER, both CERs) with
the evaluation seconds recorded apart from training; stop at the target (median of the
last e epochs), the time cap or the last epoch; then a final evaluation of every
validation and test split. As in MLPerf, the TTA clock starts after initialization
(``init_start``..``init_stop``: the model built, the decoder kernels compiled, one warm-up
step; see train/warmup.py), whose seconds are reported beside the TTA; it only runs while
this process runs, so a resumed run does not count the time it was down.

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

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speechperf.atomic import atomic_write_text
from speechperf.config import ConfigError, RunConfig, load_preset
from speechperf.data import alphabet
from speechperf.data.check import parse_splits, verify_splits
from speechperf.errors import SpeechperfError
from speechperf.models import build_model
from speechperf.results import ResultsDB, default_db_path
from speechperf.telemetry.status import StatusLine
from speechperf.train import distributed
from speechperf.train.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from speechperf.train.evaluate import evaluate
from speechperf.train.events import C, EventLog
from speechperf.train.mlperf import log_submission
from speechperf.train.step import StepMeter, TrainingDiverged, count_steps, make_optimizer, read_point, train_step
from speechperf.train.warmup import initialize, warm_model, warn_if_slow


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    epoch: int = 1  # current epoch (1-based)
    start_batch: int = 0  # next batch of the current epoch
    iteration: int = 0  # optimizer steps attempted so far
    clock_s: float = 0.0  # TTA clock at the last checkpoint
    skipped_steps: int = 0  # steps skipped for non-finite loss or gradients
    consecutive_bad: int = 0  # skipped steps in a row (abort at max_bad_losses)
    impossible_utts: int = 0  # utterances whose labels cannot fit the output frames
    evals: list = field(default_factory=list)  # per-epoch (clock_s, wer, cer) history
    log_sizes: dict = field(default_factory=dict)  # byte sizes of append-only logs at checkpoint
    status: str | None = None  # why training stopped: success, time_cap, max_epochs (None: running)
    init_s: float = 0.0  # initialization seconds outside the TTA clock, summed over (re)starts


class Clock:
    """Seconds since model creation, counting only time this process (or its predecessors) ran."""

    def __init__(self, base: float = 0.0):
        self.base, self.t0 = base, time.perf_counter()

    def now(self) -> float:
        return self.base + time.perf_counter() - self.t0


def train(preset: str = "cpu", data: Path | None = None, out: Path | None = None, overrides=(),
          resume: Path | None = None, db_path: Path | None = None, quiet: bool = False,
          platform: str | None = None) -> dict:
    """Train (or resume) a run; returns its summary row."""
    # ---- configuration and run folder -------------------------------------------------
    init_t0, init_ms = time.perf_counter(), int(time.time() * 1000)  # init_start
    env = distributed.DistEnv.from_env()
    rank, world = env.rank, env.world
    if resume is not None:
        ckpt = load_checkpoint(resume)
        if overrides:
            raise ConfigError("a resumed run keeps its configuration; overrides are not allowed with --resume")
        cfg, out, data, run_id = RunConfig.from_dict(ckpt["config"]), Path(resume), Path(ckpt["data"]), ckpt["run_id"]
    else:
        if data is None or out is None:
            raise ConfigError("train needs --data FEATS and --out RUN (or --resume RUN)")
        ckpt, cfg = None, load_preset(preset, overrides, platform)
        out, data = Path(out), Path(data)
        if (out / "run.json").exists():
            raise SpeechperfError(f"{out} already holds a run; continue it with --resume {out} or choose another --out")
        run_id = f"{out.name}-{uuid.uuid4().hex[:8]}"
    tc = cfg.train
    # every split this run reads, verified before the model and the clock exist
    splits = verify_splits(data, parse_splits(tc.train_splits), tc.eval_split, parse_splits(tc.final_splits),
                           cfg.loader.batch_size, world)
    train_splits = splits["train"]
    distributed.configure_determinism(tc.deterministic)  # before CUDA starts (cuBLAS workspace)
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    group = distributed.setup(tc.device, tc.dist_backend, env)  # checks the launch against the GPUs first
    device = group.device
    if tc.precision == "fp16" and device.type != "cuda":
        group.close()
        raise ConfigError("train.precision=fp16 needs a CUDA device; use bf16 on CPU")

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
        prog = Progress(**ckpt["progress"])
        set_rng_state(ckpt["rng"])
    core = model
    if tc.compile:
        model = torch.compile(model)
    local = model  # compiled or not, without DDP's hooks: what the warm-up runs
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    # ---- outputs (rank 0) ----------------------------------------------------------------
    lead = rank == 0
    db_path = Path(db_path) if db_path else default_db_path(out)
    db = events = sampler = None
    if lead:
        out.mkdir(parents=True, exist_ok=True)
        _truncate_logs(out, prog.log_sizes)
        db = ResultsDB(db_path)
        events = EventLog(out / "events.log", run_id)
        if ckpt is None:
            _write_run_files(out, run_id, cfg, data, db_path, device, world, platform)
            events.start(C.INIT_START, time_ms=init_ms)
            _log_run_config(events, cfg, world, data, train_splits, platform or _platform_name(out))
            events.event("data_splits", splits)
        else:
            db.conn.execute("DELETE FROM iterations WHERE run_id = ? AND iteration > ?", [run_id, prog.iteration])
            db.conn.execute("DELETE FROM evals WHERE run_id = ? AND (epoch >= ? OR final = 1)", [run_id, prog.epoch])
            db.conn.commit()

    # ---- initialization: one-time work outside the TTA clock -----------------------------
    init_parts = initialize(local, cfg, data, device) if lead else {}
    if not lead:
        warm_model(local, cfg, device)
    init_s = time.perf_counter() - init_t0
    prog.init_s += init_s
    clock = Clock(prog.clock_s)  # TTA time starts now (continues where a resumed run stopped)
    if lead:
        warn_if_slow(init_s, str(out))
        parts = {k: round(v, 3) for k, v in init_parts.items()}
        if ckpt is None:
            _db_register(db, run_id, cfg, out, device, world, started=time.time())
            events.end(C.INIT_STOP, init_s=round(init_s, 3), **parts)
            events.start(C.RUN_START)
        else:  # MLPerf has no resume: init_start/init_stop/run_start stay exactly once
            events.event("resume", clock_s=round(clock.now(), 3), iteration=prog.iteration, epoch=prog.epoch,
                         init_s=round(init_s, 3), **parts)
        sampler = _start_sampler()

    def checkpoint() -> None:
        if not lead:
            return
        _flush(db, rows)
        prog.clock_s = clock.now()
        # Logged before the log sizes are taken, so a resume keeps this line.
        events.event("checkpoint", iteration=prog.iteration, epoch=prog.epoch, clock_s=round(prog.clock_s, 3))
        prog.log_sizes = _log_sizes(out)
        save_checkpoint(out, {
            "config": cfg.to_dict(), "data": str(data), "run_id": run_id, "progress": prog.__dict__,
            "model": core.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict()})

    # ---- the state machine ---------------------------------------------------------------
    from speechperf.data.loader import make_loader

    rows: list[dict] = []
    status_line = StatusLine() if lead and not quiet else None
    meter = StepMeter()

    def settle() -> None:
        """The one host read: pending steps' losses and skip flags, applied in step order."""
        reads = meter.read()
        if lead:
            rows.extend(r.row for r in reads)
        count_steps(prog, reads, tc.max_bad_losses)
        if status_line and reads:
            status_line.update(prog.epoch, reads[-1].iteration, reads[-1].loss, rows[-1]["utts_per_s"],
                               prog.evals[-1][2] if prog.evals else None, clock.now())

    model.train()
    try:
        while prog.status is None and prog.epoch <= tc.max_epochs:
            loader = make_loader(data, train_splits, cfg.loader, epoch=prog.epoch, seed=tc.seed,
                                 start_batch=prog.start_batch, rank=rank, world=world)
            if lead and prog.start_batch == 0:  # a resumed epoch already logged its start
                events.start(C.EPOCH_START, epoch_num=prog.epoch)
            last = time.perf_counter()
            for batch in loader:
                # -- training
                prog.iteration += 1
                step = train_step(model, batch, optimizer, scaler, device, tc)
                prog.impossible_utts += step.impossible
                now = time.perf_counter()
                batch_s, last = now - last, now
                prog.start_batch += 1
                meter.add(prog.iteration, step, _iteration_row(run_id, prog, clock.now(), None, batch, batch_s)
                          if lead else None)
                if not read_point(prog.iteration, tc):
                    continue
                settle()
                # -- generating sentences
                if lead and prog.iteration % tc.sentence_every == 0:
                    if status_line:
                        status_line.clear()
                    _log_sentences(out, prog, batch, step.log_probs, step.out_lens, rows[-1]["loss"], quiet)
                # -- saving checkpoint
                if prog.iteration % tc.checkpoint_every == 0:
                    checkpoint()
                if group.agree(tc.time_cap_minutes > 0 and clock.now() >= 60 * tc.time_cap_minutes):
                    prog.status = "time_cap"
                    break
            else:
                settle()
                # -- evaluating (the model stays resident; its seconds are recorded apart)
                if lead:
                    if status_line:
                        status_line.clear()
                    events.end(C.EPOCH_STOP, epoch_num=prog.epoch)
                    prog.status = _epoch_eval(core, data, cfg, device, prog, clock, db, events, run_id, quiet)
                prog.status = group.broadcast(prog.status)
                scheduler.step()
                prog.epoch += 1
                prog.start_batch = 0
                checkpoint()
        status = prog.status = prog.status or ("max_epochs" if tc.target > 0 else "success")
        if lead:
            _final_eval(core, data, splits["final"], cfg, device, prog, clock, db, events, run_id, quiet)
            checkpoint()
            events.end(C.RUN_STOP, None, status="success" if status == "success" else "aborted", reason=status)
        group.barrier()  # the other ranks wait for rank 0's final evaluation: tear down together
    except BaseException as e:
        if lead:
            try:  # the steps since the last read, when the device still answers
                rows.extend(r.row for r in meter.read())
            except Exception:  # noqa: BLE001 (the original error is re-raised below)
                pass
            _flush(db, rows)
            db.upsert("runs", {**_run_row(db, run_id), "status": "failed"})
            events.end(C.RUN_STOP, None, status="aborted", reason=f"{type(e).__name__}: {e}")
        raise
    finally:
        if sampler is not None:
            sampler.stop()
            _store_samples(db, run_id, sampler.samples)
            events.close()
        group.close()
    summary = _summary(run_id, out, status, prog, clock)
    if lead:
        db.upsert("runs", {**_run_row(db, run_id), "status": status})
        db.close()
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    return summary


# ---- optimizer --------------------------------------------------------------------------
def _lr_lambda(tc):
    """Per-epoch multiplicative decay (the scheduler steps once per epoch)."""
    return lambda epochs_done: tc.lr_decay ** epochs_done


# ---- evaluation ------------------------------------------------------------------------
def _epoch_eval(model, data, cfg, device, prog, clock, db, events, run_id, quiet) -> str | None:
    tc = cfg.train
    events.start(C.EVAL_START, epoch_num=prog.epoch)
    r = evaluate(model, data, tc.eval_split, cfg.loader, device, decoder=tc.eval_decoder,
                 beam=tc.eval_beam, precision=tc.precision, keep_pairs=3, mode=tc.eval_mode)
    now = clock.now()
    prog.evals.append((now, r["wer"], r["cer"]))
    db.upsert("evals", {"run_id": run_id, "epoch": prog.epoch, "split": r["split"], "decoder": r["decoder"],
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


def _final_eval(model, data, splits, cfg, device, prog, clock, db, events, run_id, quiet) -> None:
    """Table 5: the final-evaluation splits (verified before training), with the final beam width."""
    tc = cfg.train
    for split in splits:
        r = evaluate(model, data, split, cfg.loader, device, decoder=tc.eval_decoder, beam=tc.final_beam,
                     precision=tc.precision, mode=tc.eval_mode)
        db.upsert("evals", {"run_id": run_id, "epoch": prog.epoch - 1, "split": split, "decoder": r["decoder"],
                            "beam": r["beam"], "clock_s": clock.now(), "eval_s": r["eval_s"], "loss": r["loss"],
                            "wer": r["wer"], "cer": r["cer"], "cer_paper": r["cer_paper"], "n_utts": r["n_utts"],
                            "final": 1})
        events.event("final_eval", r["wer"], split=split, cer=round(r["cer"], 3), decoder=r["decoder"], beam=r["beam"])
        if not quiet:
            print(f"final {split}: WER {r['wer']:.2f} CER {r['cer']:.2f} ({r['decoder']}, beam {r['beam']})", flush=True)


# ---- logging helpers ---------------------------------------------------------------------
def _iteration_row(run_id, prog, clock_s, loss, batch, batch_s) -> dict:
    b = len(batch.ids)
    return {"run_id": run_id, "iteration": prog.iteration, "epoch": prog.epoch, "clock_s": clock_s, "loss": loss,
            "batch_size": b, "frames": int(batch.feat_lens.sum()), "audio_s": float(batch.audio_seconds),
            "step_s": batch_s, "utts_per_s": b / batch_s, "audio_s_per_s": float(batch.audio_seconds) / batch_s}


def _log_sentences(out, prog, batch, log_probs, out_lens, loss, quiet) -> None:
    paths = log_probs.argmax(-1).cpu()  # (T', B)
    pairs = []
    for b in range(min(3, paths.shape[1])):
        hyp = alphabet.decode(alphabet.collapse(paths[: int(out_lens[b]), b].tolist()))
        pairs.append({"ref": batch.transcripts[b], "hyp": hyp})
    with open(out / "sentences.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"iteration": prog.iteration, "epoch": prog.epoch, "loss": loss, "pairs": pairs}) + "\n")
    if not quiet:
        print(f"iter {prog.iteration} epoch {prog.epoch} loss {loss:.3f}\n  ref: {pairs[0]['ref']}\n  hyp: {pairs[0]['hyp']}",
              flush=True)


def _flush(db, rows: list[dict]) -> None:
    if db is not None and rows:
        db.insert_many("iterations", rows)
        rows.clear()


APPEND_LOGS = ("events.log", "sentences.jsonl")


def _log_sizes(out: Path) -> dict:
    return {n: (out / n).stat().st_size for n in APPEND_LOGS if (out / n).exists()}


def _truncate_logs(out: Path, sizes: dict) -> None:
    """On resume, cut append-only logs back to the checkpoint so events are not doubled."""
    for name, size in sizes.items():
        path = out / name
        if path.exists() and path.stat().st_size > size:
            with open(path, "r+b") as f:
                f.truncate(size)


def _write_run_files(out, run_id, cfg, data, db_path, device, world, platform) -> None:
    from speechperf.telemetry.environment import capture_env

    atomic_write_text(out / "run.json", json.dumps({"run_id": run_id, "db": str(db_path.resolve()), "data": str(data)}))
    atomic_write_text(out / "config.json", json.dumps(cfg.to_dict(), indent=1))
    env = {**capture_env(str(device)), "world_size": world, "platform": platform}
    atomic_write_text(out / "env.json", json.dumps(env, indent=1, default=str))


def _db_register(db, run_id, cfg, out, device, world, started) -> None:
    env = json.loads((out / "env.json").read_text())
    db.upsert("runs", {"run_id": run_id, "kind": "train", "preset": cfg.preset, "seed": cfg.train.seed,
                       "platform": env.get("platform") or env.get("cpu_model"), "out_dir": str(out.resolve()),
                       "config_json": cfg.to_dict(), "env_json": env, "started_at": started, "status": "running"})


def _run_row(db, run_id) -> dict:
    rows = db.query("SELECT * FROM runs WHERE run_id = ?", [run_id])
    return rows[0] if rows else {"run_id": run_id, "kind": "train"}


def _log_run_config(events, cfg, world, data, train_splits, platform: str) -> None:
    """The submission keys and hyperparameters MLPerf's training rules ask for (train/mlperf.py)."""
    log_submission(events, platform)
    events.event(C.GLOBAL_BATCH_SIZE, cfg.loader.batch_size)
    events.event(C.GRADIENT_ACCUMULATION_STEPS, 1)
    events.event(C.OPT_NAME, cfg.train.optimizer)
    events.event(C.OPT_BASE_LR, cfg.train.lr)
    events.event(C.SEED, cfg.train.seed)
    events.event(C.TRAIN_SAMPLES, sum(_utterances(data, s) for s in train_splits), splits=list(train_splits))
    events.event(C.EVAL_SAMPLES, _utterances(data, cfg.train.eval_split), split=cfg.train.eval_split)
    events.event("world_size", world)
    events.event("preset", cfg.preset)


def _utterances(data: Path, split: str) -> int:
    """Utterances in a prepared split's index (0 when the split is missing)."""
    index = Path(data) / split / "index.json"
    return len(json.loads(index.read_text(encoding="utf-8"))["utterances"]) if index.exists() else 0


def _platform_name(out: Path) -> str:
    """The machine the run's env.json describes (the submission platform of its log)."""
    from speechperf.telemetry.platforms import of_run

    return of_run(json.loads((out / "env.json").read_text(encoding="utf-8"))).name


def _start_sampler():
    from speechperf.telemetry.sampler import Sampler

    s = Sampler(os.getpid())
    s.start()
    return s


def _store_samples(db, run_id, samples) -> None:
    if samples:
        db.insert_many("samples", [{"run_id": run_id, "t": s.t, "source": s.source, "metric": s.metric,
                                    "value": s.value} for s in samples])


def _summary(run_id, out, status, prog, clock) -> dict:
    last = prog.evals[-1] if prog.evals else (None, None, None)
    return {"run": str(out), "run_id": run_id, "status": status, "epochs": len(prog.evals),
            "iterations": prog.iteration, "clock_min": clock.now() / 60, "init_s": prog.init_s, "last_wer": last[1], "last_cer": last[2],
            "skipped_steps": prog.skipped_steps, "impossible_utts": prog.impossible_utts}


