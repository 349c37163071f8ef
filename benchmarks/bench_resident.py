"""Training steps of epochs 2+ with the training split resident (``loader.resident``) against
streaming readers (the reference), side by side in one process, on the same model, features and
planned batches.

Epoch 1 streams and fills the buffer (data/resident.py), as a run's first epoch does. Then each
later epoch is trained twice, once per loader, the order alternating from epoch to epoch so that
the machine's other load and the model's progress fall on both alike. The streaming loader is
started ahead (``Loader.start``, as the training loop starts it during the evaluation), with a
sleep of ``--eval-s`` seconds standing in for that evaluation. Timed per step: the wall time from
asking for the batch to the step's end (the training loop's ``step_s``: data wait and compute),
its data wait apart, and the mean of each epoch's first 5 steps (where the readers' start and
first windows show). While each epoch trains, the process's child processes are counted: the
resident epochs must start none. Both loaders' batches are checked equal by their ids.

CPU steps compete with reader processes for the cores: on a machine others are using, the
figures are noisy (the load average is printed); compare ratios from one run.

Usage: python benchmarks/run.py resident [--data FEATS] [--preset cpu] [--set KEY=VALUE ...] [--epochs 3]
       [--steps 0] [--threads 2] [--device cpu|cuda] [--eval-s 0.8]
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import psutil
import torch

from speechperf.config import load_preset
from speechperf.train.auto_precision import settled
from speechperf.errors import SpeechperfError
from speechperf.data.loader import load_index, make_loader
from speechperf.data.resident import Resident, feature_dims, needed_bytes
from speechperf.models import build_model
from speechperf.train.step import make_optimizer, train_step

GOAL = "docs/data.md: loader.resident's epochs 2+ start no reader process and step no slower than streaming"
REFERENCE = "the streaming loader (readers started ahead) on the same model and planned batches, alternating"
RATIO = "resident / streaming mean step, epochs 2+"
DATA = True

FIRST = 5  # the epoch-start steps reported apart


def train_splits(feats: Path) -> list[str]:
    return sorted(p.name for p in feats.iterdir() if p.name.startswith("train") and (p / "index.json").exists())


def timed_epoch(loader, model, state: tuple, cfg, steps: int, device: torch.device) -> dict:
    """Train ``loader``'s batches (its first ``steps``; 0: all): per-step seconds, data waits, ids,
    and the most child processes seen."""
    optimizer, scaler = state
    me, it = psutil.Process(), iter(loader)
    step_s, wait_s, ids, children = [], [], [], 0
    while not steps or len(step_s) < steps:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        out = train_step(model, batch, optimizer, scaler, device, cfg.train, cfg.augment)
        float(out.loss)  # the step done (on a GPU: finished), its loss read as the loop reads it at a read point
        step_s.append(time.perf_counter() - t0)
        wait_s.append(t1 - t0)
        ids.append(batch.ids)
        children = max(children, len(me.children()))
    loader.close()
    return {"step_s": step_s, "wait_s": wait_s, "ids": ids, "children": children}


def row(epoch: int, name: str, r: dict) -> dict:
    s = r["step_s"]
    return {"epoch": epoch, "loader": name, "steps": len(s), "step_ms_median": 1e3 * statistics.median(s),
            "step_ms_mean": 1e3 * statistics.fmean(s), "first5_ms_mean": 1e3 * statistics.fmean(s[:FIRST]),
            "wait_ms_mean": 1e3 * statistics.fmean(r["wait_s"]), "child_processes": r["children"]}


def measure(a) -> dict:
    cfg = load_preset(a.preset, a.set)
    splits, feats = train_splits(a.data), a.data
    index = load_index(feats, splits)
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    cfg = settled(cfg, device)  # train.system.precision=auto (the preset's): what a run here would train in
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model).to(device)
    model.train()
    state = (make_optimizer(model, cfg.train, device),
             torch.amp.GradScaler("cuda", enabled=cfg.train.system.precision == "fp16"))
    dims = feature_dims(feats)
    res = Resident(index, feats, cfg.loader, device, dims)

    def stream(epoch):
        return make_loader(feats, splits, cfg.loader, epoch=epoch, seed=cfg.train.seed, index=index,
                           pin_memory=device.type == "cuda")

    t0 = time.perf_counter()
    first = timed_epoch(res.loader(stream(1), first=True), model, state, cfg, a.steps, device)
    fill_s = time.perf_counter() - t0
    res.complete()  # an epoch cut short by --steps: the rest read now, off the timed steps
    rows, ratios = [row(1, "stream+fill", first)], []
    for epoch in range(2, a.epochs + 1):
        got = {}
        for name in (("stream", "resident") if epoch % 2 == 0 else ("resident", "stream")):
            if name == "stream":
                loader = stream(epoch).start()  # started ahead, during the stood-in evaluation
                time.sleep(a.eval_s)
            else:
                loader = res.loader(stream(epoch), first=False)
            got[name] = timed_epoch(loader, model, state, cfg, a.steps, device)
        if got["stream"]["ids"] != got["resident"]["ids"]:
            raise SystemExit(f"epoch {epoch}: the loaders' batches differ")
        rows += [row(epoch, n, got[n]) for n in ("stream", "resident")]
        ratios.append([f(got["resident"]["step_s"]) / f(got["stream"]["step_s"])
                       for f in (statistics.fmean, statistics.median)])
    return {"preset": a.preset, "feats": str(feats), "device": str(device), "threads": a.threads,
            "readers": cfg.loader.readers,
            "buffer_mb": needed_bytes(index, dims) / 1e6, "epoch1_s": fill_s, "rows": rows,
            "resident_over_stream_mean_step": statistics.fmean(r[0] for r in ratios) if ratios else None,
            "resident_over_stream_median_step": statistics.fmean(r[1] for r in ratios) if ratios else None,
            "resident_child_processes": max((r["child_processes"] for r in rows if r["loader"] == "resident"),
                                            default=None),
            "load_average": os.getloadavg()}


def arguments(p) -> None:
    p.add_argument("--preset", default="cpu")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a preset override (repeatable)")
    p.add_argument("--epochs", type=int, default=3, help="epochs in all; epochs 2.. are timed both ways")
    p.add_argument("--steps", type=int, default=0, help="steps per epoch and loader; 0: every batch")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the step")
    p.add_argument("--device", default="cpu", help="cpu (the goal's measurement) or cuda (the buffer in GPU memory)")
    p.add_argument("--eval-s", type=float, default=0.8, help="the evaluation the ahead readers start during")


def run(a) -> dict:
    r = measure(a)
    print(f"{r['preset']} on {r['feats']}, {r['device']}: {a.threads} step threads, {r['readers']} reader(s), buffer "
          f"{r['buffer_mb']:.1f} MB, epoch 1 (stream + fill) {r['epoch1_s']:.1f} s")
    print(f"{'epoch':>5} {'loader':<12} {'steps':>5} {'median ms':>9} {'mean ms':>8} {'first 5':>8} {'wait ms':>8} "
          f"{'children':>8}")
    for x in r["rows"]:
        print(f"{x['epoch']:>5} {x['loader']:<12} {x['steps']:>5} {x['step_ms_median']:>9.1f} "
              f"{x['step_ms_mean']:>8.1f} {x['first5_ms_mean']:>8.1f} {x['wait_ms_mean']:>8.1f} "
              f"{x['child_processes']:>8}")
    if r["resident_over_stream_mean_step"] is None:
        raise SpeechperfError("no epoch after the first: give --epochs 2 or more")
    print(f"resident / stream, epochs 2+: mean step {r['resident_over_stream_mean_step']:.3f}, median step "
          f"{r['resident_over_stream_median_step']:.3f}; child processes while resident epochs trained: "
          f"{r['resident_child_processes']} (must be 0); load average "
          f"{', '.join(f'{x:.2f}' for x in r['load_average'])}")
    r.pop("feats")  # the ledger names the features by the command's FEATS, never a path of the machine
    return {**r, "ratio": r["resident_over_stream_mean_step"]}
