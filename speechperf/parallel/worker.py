"""One worker of a parallel training run (paper 003), started by torchrun:

    torchrun --nproc-per-node N -m speechperf.parallel --algo bmuf --sync-period 20 \
        --data FEATS --out RUN [--model dnn|cldnn|PRESET] [--init INIT.pt]

Every worker trains its slice of each batch with plain SGD, the algorithm synchronizes,
rank 0 measures the cross-validation loss after every epoch and the newbob schedule (the
same for every algorithm) sets the rate or stops; at the end rank 0 decodes test-clean and
test-other (greedy) and writes the run's rows to the results database.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from speechperf.data.config import LoaderConfig
from speechperf.errors import SpeechperfError
from speechperf.parallel.algorithms import ALGORITHMS, AlgoConfig, make_algorithm
from speechperf.parallel.newbob import NewBob

SCHEMA = """
CREATE TABLE IF NOT EXISTS parallel_runs (
    run_id TEXT PRIMARY KEY, algo TEXT, workers INTEGER, sync_period INTEGER, batch INTEGER, model TEXT,
    epochs INTEGER, train_s REAL, s_per_epoch REAL, comm_s REAL, comm_bytes INTEGER, syncs INTEGER,
    cv_loss REAL, wer_test_clean REAL, wer_test_other REAL, device TEXT, status TEXT, env_json TEXT
);
CREATE TABLE IF NOT EXISTS parallel_epochs (
    run_id TEXT, epoch INTEGER, train_s REAL, cv_loss REAL, lr REAL, PRIMARY KEY (run_id, epoch)
);
"""


def parse(argv: list[str]) -> argparse.Namespace:
    import speechperf.parallel.server  # noqa: F401  (registers the asynchronous algorithms)

    p = argparse.ArgumentParser(prog="speechperf.parallel", description=__doc__.splitlines()[0])
    p.add_argument("--algo", required=True, choices=sorted(ALGORITHMS))
    p.add_argument("--sync-period", type=int, default=1)
    p.add_argument("--data", required=True, help="prepared features folder")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--model", default="dnn", help="dnn, cldnn, or a DS2 preset name")
    p.add_argument("--hidden", type=int, default=None, help="override hidden width (dnn/cldnn) for small runs")
    p.add_argument("--batch-size", type=int, default=16, help="utterances per worker per step")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--epochs", type=int, default=10, help="at most this many epochs (newbob may stop earlier)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--init", help="starting model (state dict) shared by every algorithm")
    p.add_argument("--save-init", help="write the trained model here (to make the shared start)")
    p.add_argument("--db", help="results database (default: results.db beside the run folder)")
    p.add_argument("--block-momentum", type=float, default=None)
    p.add_argument("--classical", action="store_true", help="classical BMUF instead of Nesterov")
    p.add_argument("--alpha", type=float, default=0.1, help="EASGD moving rate alpha")
    return p.parse_args(argv)


def build(args):
    from speechperf.config import load_preset
    from speechperf.models import build_model
    from speechperf.models.cldnn import CLDNNConfig
    from speechperf.models.dnn import DNNConfig

    if args.model == "dnn":
        cfg = DNNConfig() if args.hidden is None else DNNConfig(hidden=args.hidden)
    elif args.model == "cldnn":
        cfg = CLDNNConfig() if args.hidden is None else CLDNNConfig(lstm_cells=args.hidden, dnn_hidden=args.hidden,
                                                                     lstm_proj=max(1, args.hidden // 2))
    else:
        cfg = load_preset(args.model).model
    torch.manual_seed(args.seed)
    model = build_model(cfg)
    if args.init:
        model.load_state_dict(torch.load(args.init, map_location="cpu"))
    return model


def ctc(model, batch):
    """CTC per label, averaged over utterances: a scale plain SGD tolerates at rates ~0.1."""
    lp, ol = model(batch.feats, batch.feat_lens)
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
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        code = _run(args, rank, world)
        if world > 1:
            dist.barrier()  # rank 0 writes the report last: tear the group down together
        return code
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(args, rank: int, world: int) -> int:
    from speechperf.data.loader import load_records, make_loader

    data, out = Path(args.data), Path(args.out)
    splits = sorted(p.name for p in data.iterdir() if p.name.startswith("train") and (p / "index.json").exists())
    shards = {r["key"] for r in load_records(data, splits)[0]}
    if world > len(shards):
        raise SpeechperfError(f"{world} workers but only {len(shards)} shards in {data}: use fewer workers")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    algo = make_algorithm(args.algo, AlgoConfig(sync_period=args.sync_period, block_momentum=args.block_momentum,
                                                nesterov=not args.classical, easgd_alpha=args.alpha), world, rank)
    asynchronous = args.algo in ("asgd", "easgd")
    if asynchronous:
        from speechperf.parallel.server import start_rpc

        start_rpc(rank, world)
    model = algo.setup(build(args))
    core = model.module if hasattr(model, "module") else model
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    schedule = NewBob(lr=args.lr)
    loader_cfg = LoaderConfig(batch_size=args.batch_size * world, readers=0)
    epochs, train_s, loss = [], 0.0, None
    for epoch in range(1, args.epochs + 1):
        t = time.perf_counter()
        for batch in make_loader(data, splits, loader_cfg, epoch, args.seed, rank=rank, world=world):
            opt.zero_grad(set_to_none=True)
            ctc(model, batch).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)  # the same clip for every algorithm
            opt.step()
            algo.after_step(model, int(batch.feat_lens.sum()))
        algo.end_epoch(core)
        train_s += time.perf_counter() - t
        saved = parameters_to_vector(core.parameters()).detach().clone()
        vector_to_parameters(algo.eval_vector(core), core.parameters())
        loss = cv_loss(core, data, loader_cfg) if rank == 0 else 0.0
        vector_to_parameters(saved, core.parameters())
        loss = _broadcast(loss, world)
        lr = schedule.step(loss)
        for g in opt.param_groups:
            g["lr"] = lr
        epochs.append({"epoch": epoch, "train_s": train_s, "cv_loss": loss, "lr": lr})
        if rank == 0:
            print(f"[{args.algo} x{world}] epoch {epoch}: CV loss {loss:.3f}, next lr {lr:.4g}, train {train_s:.1f}s",
                  flush=True)
        if schedule.stop:
            break
    algo.finish(core)
    vector_to_parameters(algo.eval_vector(core), core.parameters())
    if args.save_init and rank == 0:
        from speechperf.atomic import atomic_torch_save

        atomic_torch_save(core.state_dict(), args.save_init)
    if rank == 0:
        _report(args, out, data, core, loader_cfg, algo, world, epochs, train_s, loss)
    if asynchronous:
        import torch.distributed.rpc as rpc

        rpc.shutdown()  # waits for every worker's outstanding calls
    return 0


def _broadcast(value: float, world: int) -> float:
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(t, 0)
    return float(t)


def _report(args, out, data, model, loader_cfg, algo, world, epochs, train_s, loss) -> None:
    from speechperf.results import ResultsDB, default_db_path
    from speechperf.telemetry.environment import capture_env
    from speechperf.train.evaluate import evaluate

    out.mkdir(parents=True, exist_ok=True)
    wer = {}
    for split in ("test-clean", "test-other"):
        if (data / split / "index.json").exists():
            wer[split] = evaluate(model, data, split, loader_cfg, torch.device("cpu"))["wer"]
    run_id = f"{out.name}-{uuid.uuid4().hex[:8]}"
    row = {"run_id": run_id, "algo": args.algo, "workers": world, "sync_period": args.sync_period,
           "batch": args.batch_size, "model": args.model, "epochs": len(epochs), "train_s": train_s,
           "s_per_epoch": train_s / max(len(epochs), 1), "comm_s": algo.stats.seconds, "comm_bytes": algo.stats.bytes,
           "syncs": algo.stats.syncs, "cv_loss": loss, "wer_test_clean": wer.get("test-clean"),
           "wer_test_other": wer.get("test-other"), "device": "cpu", "status": "success",
           "env_json": json.dumps(capture_env("cpu"))}
    with ResultsDB(Path(args.db) if args.db else default_db_path(out)) as db:
        db.ensure_schema(SCHEMA)
        db.upsert("parallel_runs", row)
        db.insert_many("parallel_epochs", [{"run_id": run_id, **e} for e in epochs])
    (out / "parallel.json").write_text(json.dumps({k: v for k, v in row.items() if k != "env_json"}, indent=1))
