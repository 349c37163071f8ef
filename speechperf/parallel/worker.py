"""One worker of a parallel training run (paper 003), started by torchrun:

    torchrun --nproc-per-node N -m speechperf.parallel --algo bmuf --sync-period 20 \
        --data FEATS --out RUN [--model dnn|cldnn|PRESET] [--init INIT.pt] [--resume auto|yes|no]

Every worker trains its slice of each batch with plain SGD, the algorithm synchronizes,
rank 0 measures the cross-validation loss after every epoch and the newbob schedule (the
same for every algorithm) sets the rate or stops; at the end rank 0 decodes test-clean and
test-other (greedy) and writes the run's rows (``parallel_runs``, and ``parallel_epochs``
with the CV loss of every epoch) to the run folder's own database (``RUN/results.db``, and
``--db`` if given) and ``RUN/parallel.json``. The folder is a :class:`speechperf.results.Run`.

After every epoch rank 0 writes ``RUN/checkpoint.pt`` atomically: the evaluated model (the
global model of BMUF, the server's of asgd/easgd), the rate, the newbob state, the epochs so
far, the training seconds, the algorithm's state and the arguments that define the run. If
a worker dies, the same command continues at the next epoch (``--resume auto``, the
default, when the checkpoint's arguments match and it is unfinished; ``yes`` insists,
``no`` starts over); the data order is a function of (seed, epoch), so nothing else is
needed, and a resumed bsp/bmuf/sync run equals the uninterrupted one. ``parallel.json``
lists the epochs after which the run was resumed.

Devices: the worker trains on the CPU (the paper's clusters were CPU clusters) over gloo,
whatever GPUs the machine has; its process group and collective helpers are the training
loop's (:mod:`speechperf.train.distributed`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from speechperf.atomic import atomic_torch_save
from speechperf.data.config import LoaderConfig
from speechperf.errors import SpeechperfError
from speechperf.models.contract import planned_forward
from speechperf.parallel.algorithms import ALGORITHMS, AlgoConfig, Algorithm, make_algorithm
from speechperf.train.newbob import NewBob
from speechperf.train import distributed
from speechperf.train.distributed import Group
from speechperf.results.run import CHECKPOINT_FILE as CHECKPOINT
from speechperf.results.run import Progress, Run, read_checkpoint


def parse(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The worker's options (also those of ``speechperf parallel run``)."""
    p = argparse.ArgumentParser(prog="speechperf.parallel", description=__doc__.splitlines()[0], add_help=add_help,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algo", required=True, choices=ALGORITHMS.names(), help="parallel training algorithm")
    p.add_argument("--sync-period", type=int, default=1, help="local steps between synchronizations (tau)")
    p.add_argument("--data", required=True, help="prepared features folder")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--model", default="dnn", help="a registered model (its default sizes: dnn, cldnn, ds2, ...) "
                                                  "or a preset name (its model)")
    p.add_argument("--hidden", type=int, default=None, help="override hidden width (dnn/cldnn) for small runs")
    p.add_argument("--batch-size", type=int, default=16, help="utterances per worker per step")
    p.add_argument("--lr", type=float, default=0.2, help="learning rate (newbob halves it when the CV loss stalls)")
    p.add_argument("--momentum", type=float, default=0.0,
                   help="momentum of every worker's local SGD (paper: 0, plain SGD)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                   help="every worker's local optimizer (paper: sgd); the algorithms act on the models it produces")
    p.add_argument("--epochs", type=int, default=10, help="at most this many epochs (newbob may stop earlier)")
    p.add_argument("--seed", type=int, default=1, help="model initialization and data order")
    p.add_argument("--init", help="starting model (state dict) shared by every algorithm")
    p.add_argument("--save-init", help="write the trained model here (to make the shared start)")
    p.add_argument("--db", help="a shared results database that also receives the rows (the run folder keeps its own)")
    p.add_argument("--label", help="the run's name in tables (default: machine, algorithm x workers, model)")
    p.add_argument("--block-momentum", type=float, default=None, help="BMUF block momentum (default: 1 - 1/workers)")
    p.add_argument("--classical", action="store_true", help="classical BMUF instead of Nesterov")
    p.add_argument("--alpha", type=float, default=0.1, help="EASGD moving rate alpha")
    p.add_argument("--resume", choices=("auto", "yes", "no"), default="auto",
                   help="continue from OUT/checkpoint.pt: auto (if there is an unfinished one of the same run), "
                        "yes (insist), no (start over)")
    return p


def build(args):
    """The worker's model: a registered model's defaults or a preset's model (``--model``),
    ``--hidden`` narrowing the DNN or CLDNN for small runs."""
    from speechperf.config import load_preset
    from speechperf.models import MODELS, build_model, model_config

    if args.model in MODELS.names():
        cfg = model_config({"name": args.model, **_hidden_fields(args.model, args.hidden)})
    else:
        if args.hidden is not None:
            raise SpeechperfError(f"--hidden narrows the dnn and cldnn models, not preset {args.model!r}")
        cfg = load_preset(args.model).model
    torch.manual_seed(args.seed)
    model = build_model(cfg)
    if args.init:
        # data only: a state dict of tensors; a file whose unpickling would run code is refused
        model.load_state_dict(_load_init(Path(args.init)))
    return model


def _load_init(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for missing, truncated or code-carrying files
        first = (str(e).strip().splitlines() or [""])[0]
        raise SpeechperfError(f"--init {path} is not a state dict of tensors ({type(e).__name__}: {first})") from e


def _hidden_fields(model: str, hidden: int | None) -> dict:
    if hidden is None:
        return {}
    if model == "dnn":
        return {"hidden": hidden}
    if model == "cldnn":
        return {"lstm_cells": hidden, "dnn_hidden": hidden, "lstm_proj": max(1, hidden // 2)}
    raise SpeechperfError(f"--hidden narrows the dnn and cldnn models, not {model!r}")


def ctc(model, batch):
    """CTC per label, averaged over utterances: a scale plain SGD tolerates at rates ~0.1."""
    lp, ol = planned_forward(model, batch.feats, batch.feat_lens)
    return F.ctc_loss(lp, batch.labels, ol, batch.label_lens, zero_infinity=True, reduction="mean")


@torch.no_grad()
def cv_loss(model, data: Path, loader_cfg) -> float:
    from speechperf.data.loader import make_loader

    model.eval()
    total, n = 0.0, 0
    for b in make_loader(data, "dev-clean", replace(loader_cfg, shuffle=False), 0, 0):
        total += float(ctc(model, b)) * len(b.ids)
        n += len(b.ids)
    model.train()
    return total / max(n, 1)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv if argv is not None else __import__("sys").argv[1:])
    # the CPU and gloo, also on a GPU machine (where NCCL would put every rank on one GPU)
    group = distributed.setup(device="cpu", backend="gloo")
    try:
        code = _run(args, group)
        group.barrier()  # rank 0 writes the report last: tear the group down together
        return code
    finally:
        group.close()


@dataclass
class Job:
    """One worker's fixed surroundings, shared by the steps of ``_run``."""
    args: argparse.Namespace
    rank: int
    world: int
    data: Path
    out: Path
    splits: list[str]
    loader_cfg: LoaderConfig
    algo: Algorithm
    group: Group  # the process group's collective helpers
    run: Run | None = None  # the run folder, on rank 0 (the only rank that writes)


def _run(args, group: Group) -> int:
    rank, world = group.env.rank, group.world
    data, out = Path(args.data), Path(args.out)
    splits = _train_splits(data, world, args.batch_size * world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    algo = make_algorithm(args.algo, AlgoConfig(sync_period=args.sync_period, block_momentum=args.block_momentum,
                                                nesterov=not args.classical, easgd_alpha=args.alpha), world, rank)
    job = Job(args, rank, world, data, out, splits, LoaderConfig(batch_size=args.batch_size * world, readers=0), algo,
              group)
    asynchronous = args.algo in ("asgd", "easgd")
    if asynchronous:
        from speechperf.parallel.server import start_rpc

        start_rpc(rank, world)
    ckpt = _resume_point(args, out, group)
    model = build(args)
    if ckpt is not None and rank == 0:
        model.load_state_dict(ckpt["model"])  # the other ranks receive it from setup's broadcast
    model = algo.setup(model)
    core = model.module if hasattr(model, "module") else model
    # momentum buffers stay local to each worker and are not checkpointed: a resumed run with
    # momentum > 0 restarts them at zero (with the paper's 0 a resume is exact)
    # AdamW: a DNN with a CTC head stays on the all-blank plateau for 1,000+ plain-SGD steps
    # on the embedded corpus but leaves it after ~400 AdamW steps (measured), so short sweeps
    # that must learn use it; its moment estimates stay local to each worker like the buffers
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    schedule, prog = NewBob(lr=args.lr), Progress()
    if ckpt is not None:
        schedule, prog = _restore(job, ckpt, core, opt)
    if rank == 0:
        job.run = _open_run(job, ckpt)
    try:
        loss = _train(job, model, core, opt, schedule, prog)
        algo.finish(core)
        vector_to_parameters(algo.eval_vector(core), core.parameters())
        if args.save_init and rank == 0:
            atomic_torch_save(core.state_dict(), args.save_init)
        if rank == 0:
            _report(job, core, prog, loss)
    finally:
        if job.run is not None:
            job.run.close()
    if asynchronous:
        import torch.distributed.rpc as rpc

        rpc.shutdown()  # waits for every worker's outstanding calls
    return 0


def _train_splits(data: Path, world: int, batch_size: int) -> list[str]:
    from speechperf.data.check import verify_splits
    from speechperf.data.loader import load_records

    # every split this run reads (train-*, dev-clean for the CV loss, test-* decoded at the end)
    splits = verify_splits(data, None, "dev-clean", None, batch_size, world, ("test-clean", "test-other"))["train"]
    shards = {r["key"] for r in load_records(data, splits)[0]}
    if world > len(shards):
        raise SpeechperfError(f"{world} workers but only {len(shards)} shards in {data}: use fewer workers")
    return splits


def _train(job: Job, model, core, opt, schedule: NewBob, prog: Progress) -> float | None:
    """The epochs left (all of them on a fresh start); returns the last CV loss."""
    from speechperf.data.loader import make_loader

    args, algo = job.args, job.algo
    for epoch in range(prog.epoch, args.epochs + 1):
        t = time.perf_counter()
        # the order is a pure function of (seed, epoch): a restart at epoch k needs nothing else
        batches = make_loader(job.data, job.splits, job.loader_cfg, epoch, args.seed, rank=job.rank, world=job.world)
        for batch in batches:
            opt.zero_grad(set_to_none=True)
            ctc(model, batch).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)  # the same clip for every algorithm
            opt.step()
            algo.after_step(model, int(batch.feat_lens.sum()))
        algo.end_epoch(core)
        prog.clock_s += time.perf_counter() - t  # training seconds: evaluation and down time excluded
        loss, state = _evaluate(job, core)
        lr = schedule.step(loss)
        for g in opt.param_groups:
            g["lr"] = lr
        prog.evals.append({"epoch": epoch, "train_s": prog.clock_s, "cv_loss": loss, "lr": lr})
        prog.epoch = epoch + 1
        _checkpoint(job, state, schedule, prog)
        if job.rank == 0:
            print(f"[{args.algo} x{job.world}] epoch {epoch}: CV loss {loss:.3f}, next lr {lr:.4g}, "
                  f"train {prog.clock_s:.1f}s", flush=True)
        if schedule.stop:
            break
    return prog.evals[-1]["cv_loss"] if prog.evals else None


def _evaluate(job: Job, core) -> tuple[float, dict | None]:
    """CV loss of the algorithm's evaluated model (BMUF: the global model; asgd/easgd: the
    server's) and, on rank 0, that model's state: the one the checkpoint keeps."""
    saved = parameters_to_vector(core.parameters()).detach().clone()
    vector_to_parameters(job.algo.eval_vector(core), core.parameters())
    loss, state = 0.0, None
    if job.rank == 0:
        loss = cv_loss(core, job.data, job.loader_cfg)
        state = {k: v.detach().clone() for k, v in core.state_dict().items()}
    vector_to_parameters(saved, core.parameters())
    return job.group.broadcast_float(loss), state


# --- checkpoint and restart ------------------------------------------------------------

# The arguments a restart must share with the checkpointed run (--epochs may grow, --lr and
# --init only matter at the start, --data may have moved).
RUN_KEYS = ("algo", "workers", "sync_period", "batch_size", "model", "hidden", "seed", "block_momentum",
            "classical", "alpha", "momentum", "optimizer")


def run_key(args: argparse.Namespace, world: int) -> dict:
    return {k: world if k == "workers" else getattr(args, k) for k in RUN_KEYS}


def _open_run(job: Job, ckpt: dict | None) -> Run:
    """Rank 0's run folder: the checkpointed run's, or a new one (config.json: the run's key)."""
    out, args = job.out, job.args
    if ckpt is not None and Run.exists(out):
        run = Run.open(out, data=job.data, shared_db=args.db, write=True)
        if run.run_id == ckpt["run_id"]:
            return run
        run.close()
    from speechperf.telemetry.environment import capture_env

    env = {**capture_env("cpu"), "world_size": job.world}
    config = {**run_key(args, job.world), "epochs": args.epochs, "lr": args.lr}
    return Run.create(out, kind="parallel", config=config, env=env, data=job.data, label=args.label,
                      shared_db=args.db, run_id=ckpt["run_id"] if ckpt else None)


def _checkpoint(job: Job, state: dict | None, schedule: NewBob, prog: Progress) -> None:
    """Rank 0 writes OUT/checkpoint.pt atomically: a worker dying while it is written leaves
    the previous epoch's checkpoint."""
    algo_state = job.algo.state_dict()
    algo_state["steps"] = job.group.gather_int(job.algo.steps)  # ranks with less data took fewer steps
    if job.rank != 0:
        return
    job.run.save_checkpoint(prog, args=run_key(job.args, job.world), epoch=prog.evals[-1]["epoch"],
                            stopped=schedule.stop, model=state, lr=schedule.lr, newbob=asdict(schedule),
                            algo=algo_state)


def check_checkpoint(path: Path, args: argparse.Namespace, world: int) -> dict | None:
    """The checkpoint at ``path`` if this command continues it; None if it starts over (none
    there, ``--resume no``, or the checkpointed run already finished). Raises when the
    checkpoint is of another run, or when ``--resume yes`` finds nothing to continue."""
    if args.resume == "no" or not path.exists():
        if args.resume == "yes":
            raise SpeechperfError(f"--resume yes but there is no checkpoint {path}")
        return None
    ckpt = read_checkpoint(path.parent)
    _same_run(path, ckpt, args, world)
    if _finished(ckpt, args):
        if args.resume == "yes":
            why = "newbob stopped it" if ckpt["stopped"] else f"--epochs {args.epochs} reached"
            raise SpeechperfError(f"{path} is of a finished run ({why} after epoch {ckpt['epoch']}): nothing to "
                                  "resume; raise --epochs, or start over with --resume no")
        return None
    return ckpt


def _same_run(path: Path, ckpt: dict, args: argparse.Namespace, world: int) -> None:
    for key, here in run_key(args, world).items():
        there = ckpt["args"].get(key)
        if there != here:
            flag = "workers (--nproc-per-node)" if key == "workers" else f"--{key.replace('_', '-')}"
            raise SpeechperfError(f"{path} is of another run: {flag} = {there!r} there, {here!r} now; repeat its "
                                  "arguments, choose another --out, or start over with --resume no")


def _finished(ckpt: dict, args: argparse.Namespace) -> bool:
    return ckpt["stopped"] or ckpt["epoch"] >= args.epochs


def finished_run(out: Path, argv: list[str], world: int) -> bool:
    """Whether ``out`` holds a finished and reported run of these arguments: a sweep run again
    after a failure keeps it instead of training it anew (and doubling its rows)."""
    path, summary = Path(out) / CHECKPOINT, Path(out) / "parallel.json"
    if not (path.exists() and summary.exists()):
        return False
    args = parse(argv)
    try:
        ckpt = read_checkpoint(path.parent)
        _same_run(path, ckpt, args, world)
        reported = json.loads(summary.read_text()).get("run_id")
    except (SpeechperfError, OSError, RuntimeError, KeyError, ValueError):  # another run, or unreadable: train
        return False
    return args.resume != "no" and _finished(ckpt, args) and reported == ckpt["run_id"]


def _resume_point(args, out: Path, group: Group) -> dict | None:
    """Rank 0 reads the checkpoint (across machines only its disk holds OUT) and sends every
    rank the small part (the model itself travels with setup's broadcast); an error is sent
    too, so that every rank stops with it instead of waiting for rank 0."""
    rank, world = group.env.rank, group.world
    found, error = None, None
    if rank == 0:
        try:
            found = check_checkpoint(out / CHECKPOINT, args, world)
        except SpeechperfError as e:
            error = str(e)
        if found is None and error is None and (out / CHECKPOINT).exists() and args.resume == "auto":
            print(f"{out / CHECKPOINT} is of a finished run: training from the start", flush=True)
    if world > 1:
        sent = group.broadcast((None if found is None else {k: v for k, v in found.items() if k != "model"}, error))
        if rank != 0:
            found, error = sent
    if error:
        raise SpeechperfError(error)
    return found


def _restore(job: Job, ckpt: dict, core, opt) -> tuple[NewBob, Progress]:
    job.algo.load_state_dict({**ckpt["algo"], "steps": ckpt["algo"]["steps"][job.rank]}, core)
    schedule = NewBob(**ckpt["newbob"])
    for g in opt.param_groups:
        g["lr"] = ckpt["lr"]
    prog = Progress.from_dict(ckpt["progress"])
    prog.resumed_after = [*prog.resumed_after, ckpt["epoch"]]
    if job.rank == 0:
        print(f"[{job.args.algo} x{job.world}] resumed from epoch {ckpt['epoch']} ({job.out / CHECKPOINT}): "
              f"continuing at epoch {ckpt['epoch'] + 1}", flush=True)
    return schedule, prog


def resume_note(out: Path, argv: list[str], world: int) -> str:
    """For a failed run's message: whether the same command continues it, and from which epoch."""
    path = Path(out) / CHECKPOINT
    try:
        ckpt = check_checkpoint(path, parse(argv), world)
    except (SpeechperfError, OSError, RuntimeError, KeyError) as e:  # unreadable or of another run
        return f"{path} cannot be resumed: {e}" if path.exists() else ""
    if ckpt is None:
        return ""
    return f"{path} exists (epoch {ckpt['epoch']}): the same command resumes from epoch {ckpt['epoch'] + 1}"


def launch(common: list[str], algo: str, workers: int, extra: list[str], out: Path, port: int | None = None) -> None:
    """Run one worker set under torchrun (a finished run of these arguments is kept); a failure
    names the rank that failed first and how the same command resumes."""
    from speechperf.parallel.sweep import free_port

    argv = ["--algo", algo, "--out", str(out), *common, *extra]
    if finished_run(out, argv, workers):  # the same sweep again continues where it failed
        return
    port = port or free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(workers), "--master-port", str(port),
           "-m", "speechperf.parallel", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode != 0:
        # torchrun names the first failure under "Root Cause"; the other ranks fail after it
        root = p.stderr.split("Root Cause", 1)[-1]
        ranks = sorted(set(re.findall(r"rank\s*:\s*(\d+)", root)))
        who = f"worker rank {', '.join(ranks)} failed first" if ranks else "a worker failed"
        # the workers' own error lines, not torchrun's summary
        said = [ln for ln in p.stderr.splitlines() if re.search(r"(Error|error:)", ln) and "torch/distributed" not in ln
                and "ChildFailedError" not in ln]
        tail = "\n".join(dict.fromkeys(said[-4:])) or "\n".join(p.stderr.strip().splitlines()[-6:])
        note = resume_note(out, argv, workers)  # the epochs done are not lost: say how to continue
        raise SpeechperfError(f"{algo} x{workers} ({out}): {who} (exit {p.returncode})\n{tail}"
                              + (f"\n{note}" if note else ""))


def _report(job: Job, model, prog: Progress, loss: float | None) -> None:
    from speechperf.train.evaluate import evaluate

    args, run, algo, epochs = job.args, job.run, job.algo, prog.evals
    wer = {}
    for split in ("test-clean", "test-other"):
        if (job.data / split / "index.json").exists():
            wer[split] = evaluate(model, job.data, split, job.loader_cfg, torch.device("cpu"))["wer"]
    row = {"run_id": run.run_id, "algo": args.algo, "workers": job.world, "sync_period": args.sync_period,
           "batch": args.batch_size, "model": args.model, "epochs": len(epochs), "train_s": prog.clock_s,
           "s_per_epoch": prog.clock_s / max(len(epochs), 1), "comm_s": algo.stats.seconds,
           "comm_bytes": algo.stats.bytes, "syncs": algo.stats.syncs, "cv_loss": loss,
           "wer_test_clean": wer.get("test-clean"), "wer_test_other": wer.get("test-other"), "device": "cpu",
           "status": "success", "env_json": json.dumps(run.env), "shared_start": int(bool(args.save_init))}
    run.upsert("parallel_runs", row)
    run.insert("parallel_epochs", [{"run_id": run.run_id, **e} for e in epochs])
    run.set_status("success")
    summary = {k: v for k, v in row.items() if k != "env_json"}
    run.write_summary({**summary, "resumed_after": prog.resumed_after}, name="parallel.json")
