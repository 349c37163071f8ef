"""The training loop: the paper's state machine (SPEC C), top to bottom.

training batch after batch; every ``sentence_every`` iterations greedy-decode the current
batch and log hypothesis vs reference; every ``checkpoint_every`` iterations an atomic
checkpoint; after every epoch evaluate the validation split (loss, WER, both CERs) with
the evaluation seconds recorded apart from training; stop at the target (median of the
last e epochs), the time cap or the last epoch; then a final evaluation of every
validation and test split. The TTA clock starts when the model is created and only runs
while this process runs, so a resumed run does not count the time it was down.

Data parallel: launched by torchrun (``WORLD_SIZE`` > 1) the model is wrapped in DDP
(gloo on CPU, NCCL on GPU); rank 0 alone writes files, evaluates and decides to stop.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from speechperf.config import ConfigError, RunConfig, load_preset
from speechperf.data import alphabet
from speechperf.errors import SpeechperfError
from speechperf.models import build_model
from speechperf.results.run import Clock, Progress, Run, read_checkpoint
from speechperf.telemetry.status import StatusLine
from speechperf.train.checkpoint import set_rng_state
from speechperf.train.evaluate import autocast, evaluate
from speechperf.train.events import C, EventLog

FINAL_SPLITS = ("dev-clean", "dev-other", "test-clean", "test-other")


class TrainingDiverged(SpeechperfError):
    """Too many consecutive steps had non-finite losses or gradients."""


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
    rank, world, local_rank = _dist_env()
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
    device = _device(tc.device, local_rank)
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    if tc.precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision=fp16 needs a CUDA device; use bf16 on CPU")
    if world > 1:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    try:
        # rank 0 alone looks at the folder (across machines only its disk holds it) and tells
        # every rank what to do, or the error that stops them all
        plan, feats, error = _broadcast(_plan(out, cfg, mode, data) if rank == 0 else None, world)
        if error:
            raise SpeechperfError(error)
        if plan == "finished":
            return _broadcast(Run.open(out).summary() if rank == 0 else None, world)
        return _train(cfg, device, Path(feats), out, plan, rank, world, db_path, quiet, platform, label)
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _plan(out: Path, cfg: RunConfig, mode: str, data: Path | None) -> tuple[str | None, str | None, str | None]:
    """(fresh | restart | resume | finished, features folder, error) for the run folder ``out``."""
    try:
        if not Run.exists(out):
            if mode == "yes":
                raise SpeechperfError(f"--resume yes but {out} holds no run")
            if data is None:
                raise ConfigError("train needs --data FEATS for a new run")
            _train_splits(data)  # a bad features folder fails before any file is written
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


def _train(cfg: RunConfig, device, data: Path, out: Path, plan: str, rank: int, world: int, db_path, quiet: bool,
           platform, label) -> dict:
    tc = cfg.train
    train_splits = _train_splits(data)
    ckpt = read_checkpoint(out) if plan == "resume" else None

    # ---- model, optimizer, state ---------------------------------------------------------
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model).to(device)
    clock = Clock()  # the model exists: TTA time starts now
    optimizer = _optimizer(model, tc)
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
        clock = Clock(prog.clock_s)
    core = model
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    # ---- the run folder (rank 0) ---------------------------------------------------------
    lead = rank == 0
    run = sampler = None
    if lead:
        if plan == "fresh":
            from speechperf.telemetry.environment import capture_env

            env = {**capture_env(str(device)), "world_size": world, "platform": platform}
            run = Run.create(out, kind="train", config=cfg.to_dict(), env=env, data=data, label=label,
                             shared_db=db_path, started_at=time.time() - clock.now())
        else:
            run = Run.open(out, data=data, shared_db=db_path, write=True)
            run.truncate_logs(prog.log_sizes)  # a restart without checkpoint: cut to nothing
            run.forget_after(prog)
            run.set_status("running")
        if plan == "resume":
            run.events().event("resume", clock_s=round(clock.now(), 3), iteration=prog.iteration, epoch=prog.epoch)
        else:
            _log_run_start(run.events(), cfg, world, len(train_splits))
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
    model.train()
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
                loss, log_probs, out_lens = _step(model, batch, optimizer, scaler, device, tc, prog)
                now = time.perf_counter()
                batch_s, last = now - last, now
                prog.start_batch += 1
                if lead:
                    row = _iteration_row(run.run_id, prog, clock.now(), loss, batch, batch_s)
                    run.add_iteration(row)
                    if status_line:
                        status_line.update(prog.epoch, prog.iteration, loss, row["utts_per_s"],
                                           prog.evals[-1][2] if prog.evals else None, clock.now())
                # -- generating sentences
                if lead and prog.iteration % tc.sentence_every == 0:
                    if status_line:
                        status_line.clear()
                    _log_sentences(run, prog, batch, log_probs, out_lens, loss, quiet)
                # -- saving checkpoint
                if prog.iteration % tc.checkpoint_every == 0:
                    checkpoint()
                if _agree(tc.time_cap_minutes > 0 and clock.now() >= 60 * tc.time_cap_minutes, world):
                    prog.status = "time_cap"
                    break
            else:
                # -- evaluating (the model stays resident; its seconds are recorded apart)
                if lead:
                    if status_line:
                        status_line.clear()
                    run.events().end(C.EPOCH_STOP, epoch_num=prog.epoch)
                    prog.status = _epoch_eval(core, data, cfg, device, prog, clock, run, quiet)
                prog.status = _broadcast(prog.status, world)
                scheduler.step()
                prog.epoch += 1
                prog.start_batch = 0
                checkpoint()
        status = prog.status = prog.status or ("max_epochs" if tc.target > 0 else "success")
        if lead:
            _final_eval(core, data, cfg, device, prog, clock, run, quiet)
            checkpoint()
            run.events().end(C.RUN_STOP, None, status="success" if status == "success" else "aborted", reason=status)
        if world > 1:  # the other ranks wait for rank 0's final evaluation: tear down together
            dist.barrier()
    except BaseException as e:
        if lead:
            run.flush()
            run.set_status("failed")
            run.events().end(C.RUN_STOP, None, status="aborted", reason=f"{type(e).__name__}: {e}")
        raise
    finally:
        if sampler is not None:
            sampler.stop()
            _store_samples(run, sampler.samples)
            run.close()
    summary = _summary(run.run_id if run else None, out, status, prog, clock)
    if lead:
        run.set_status(status)
        run.write_summary(summary)  # last: its presence means the run finished
        run.close()
    return summary


# ---- one optimizer step ------------------------------------------------------------------
def _step(model, batch, optimizer, scaler, device, tc, prog: Progress):
    """Forward, CTC, backward, clip, step; skips (and counts) non-finite steps."""
    x, lens = batch.feats.to(device, non_blocking=True), batch.feat_lens.to(device)
    labels, label_lens = batch.labels.to(device), batch.label_lens.to(device)
    with autocast(device, tc.precision):
        log_probs, out_lens = model(x, lens)
    log_probs = log_probs.float()  # (T', B, C): CTC in fp32 whatever the autocast dtype
    # Labels never repeat a symbol (the separator splits doubles), so an alignment exists
    # iff out_len >= label_len; impossible ones give inf, zeroed and counted, never averaged in.
    impossible = out_lens < label_lens
    prog.impossible_utts += int(impossible.sum())
    losses = F.ctc_loss(log_probs, labels, out_lens, label_lens, blank=0, reduction="none", zero_infinity=True)
    valid = max(int((~impossible).sum()), 1)
    loss = losses.sum() / valid
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()  # always: DDP needs every rank to reach the all-reduce
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip if tc.grad_clip > 0 else float("inf"))
    if torch.isfinite(loss) and torch.isfinite(norm):
        scaler.step(optimizer)
        scaler.update()
        prog.consecutive_bad = 0
    else:
        scaler.update()
        prog.skipped_steps += 1
        prog.consecutive_bad += 1
        if prog.consecutive_bad > tc.max_bad_losses:
            raise TrainingDiverged(f"{prog.consecutive_bad} consecutive steps with non-finite loss or gradients "
                                   f"(iteration {prog.iteration}); the last checkpoint is kept")
    return float(loss.detach()), log_probs.detach(), out_lens


def _optimizer(model, tc):
    if tc.optimizer == "adadelta":
        return torch.optim.Adadelta(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)


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


def _final_eval(model, data, cfg, device, prog, clock, run: Run, quiet) -> None:
    """Table 5: every validation and test split present, with the final beam width."""
    tc = cfg.train
    for split in [s for s in FINAL_SPLITS if (Path(data) / s / "index.json").exists()]:
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


def _log_run_start(events, cfg, world, n_splits) -> None:
    events.event(C.SUBMISSION_BENCHMARK, "speechperf_ds2")
    events.event(C.GLOBAL_BATCH_SIZE, cfg.loader.batch_size)
    events.event(C.OPT_NAME, cfg.train.optimizer)
    events.event(C.OPT_BASE_LR, cfg.train.lr)
    events.event(C.SEED, cfg.train.seed)
    events.event("world_size", world)
    events.event("preset", cfg.preset)
    events.start(C.RUN_START)


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
            "iterations": prog.iteration, "clock_min": clock.now() / 60, "last_wer": last[1], "last_cer": last[2],
            "skipped_steps": prog.skipped_steps, "impossible_utts": prog.impossible_utts}


# ---- devices and distributed -------------------------------------------------------------
def _dist_env() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def _device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but no CUDA device is available")
    return torch.device(name)


def _agree(flag: bool, world: int) -> bool:
    """All ranks stop together: any rank's True is everyone's."""
    if world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _broadcast(value, world: int):
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _train_splits(data: Path) -> list[str]:
    data = Path(data)
    if not (data / "features.json").exists():
        raise SpeechperfError(f"{data} is not a prepared features folder (no features.json); run speechperf prepare")
    splits = sorted(p.name for p in data.iterdir() if p.name.startswith("train") and (p / "index.json").exists())
    if not splits:
        raise SpeechperfError(f"{data} has no prepared train-* split")
    return splits
