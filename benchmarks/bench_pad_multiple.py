"""A preset's training epochs with each bucket batch's frames rounded up to a multiple
(``loader.pad_multiple``) against the same epochs unrounded, each in fresh processes, alternated.

Why: on a CPU, oneDNN creates (JIT-compiles) primitives for every batch shape it has not seen,
dozens per new shape (docs/presets.md), and a bucketed epoch of the embedded corpus has a new
longest utterance in most of its batches. Rounding the frames to a multiple leaves a few dozen
shapes, at the price of computing a few per cent more frames. Only a whole epoch's sequence of
shapes shows this, so each variant replays the real plan: the batches ``plan_epoch`` gives epochs
1..E of the run's training splits (``--data FEATS``, required) under that variant's loader,
as random features of each batch's own lengths, padded as the loader pads them, through the real
training step (bench_mfu's model and optimizer from seed 0, ``train.step.train_step``). A fresh
process per replay (its primitive cache empty, as a run's), variants alternated over
``--rounds``, so a neighbour's load falls on both. Not replayed: evaluation batches, the loader.

The ratio: the rounded variant's mean step over the unrounded one's, epochs 2..E (the epochs after
the first, whose shapes are all new in both), median over rounds, in the first precision asked.

Usage: python benchmarks/run.py pad_multiple --data FEATS [--preset cpu] [--multiple 32]
       [--epochs 3] [--rounds 2] [--precision bf16 fp32] [--threads N]
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench_mfu import make_batch
from speechperf.config import load_preset
from speechperf.data.check import parse_splits, train_splits_of
from speechperf.data.loader import load_index
from speechperf.data.plan import batch_frames, plan_epoch
from speechperf.errors import SpeechperfError
from speechperf.hardware.capability import cpu_flags, isa
from speechperf.models import build_model
from speechperf.train.step import make_optimizer, train_step

GOAL = ("docs/presets.md: loader.pad_multiple makes a CPU preset's epochs faster than unrounded batches, "
        "the frames it adds included (issue 60, the CPU step close to its hardware)")
REFERENCE = "the same epochs' batches unrounded (pad_multiple 1), replayed in fresh processes alternated with them"
RATIO = "rounded / unrounded mean training step over epochs 2..E (the first precision; below 1: faster)"
DATA = True
LIBC = ctypes.CDLL(None)  # fflush: oneDNN prints with C's buffered stdout


def shapes(cfg, features: Path, epochs: int) -> list[list[tuple[list[int], int]]]:
    """Per epoch, each planned batch as (its utterances' frames, the frames it is padded to)."""
    index = load_index(features, parse_splits(cfg.train.train_splits) or train_splits_of(features))
    plans = (plan_epoch(index, cfg.loader, epoch=e, seed=cfg.train.seed).batches for e in range(1, epochs + 1))
    return [[(index.frames[b].tolist(), batch_frames(index.frames[b], cfg.loader)) for b in plan] for plan in plans]


def replay(preset: str, overrides: list[str], epochs_shapes: list, threads: int,
           log: str | None = None) -> list[list[float]]:
    """In a fresh process: the step seconds of every batch, per epoch. ``log``: a file that takes
    this process's standard output (oneDNN's verbose lines), a line ``EPOCH n`` before each epoch's."""
    torch.set_num_threads(threads)
    cfg = load_preset(preset, overrides)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = build_model(cfg.model).train()
    optimizer = make_optimizer(model, cfg.train, torch.device("cpu"))
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    if log is not None:
        os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)  # C's printf, where oneDNN writes
    seconds = []
    for n, epoch in enumerate(epochs_shapes, 1):
        if log is not None:
            LIBC.fflush(None)  # the verbose lines printf buffered belong to the epoch before
            os.write(1, f"EPOCH {n}\n".encode())
        times = []
        for lengths, width in epoch:
            out_lens, _ = model.plan(torch.tensor(lengths), width)
            batch = make_batch(lengths, out_lens, rng, width)
            t = time.perf_counter()
            train_step(model, batch, optimizer, scaler, torch.device("cpu"), cfg.train)
            times.append(time.perf_counter() - t)
        seconds.append(times)
    LIBC.fflush(None)
    return seconds


def created(log: Path, epochs: int) -> dict:
    """Per epoch, the primitives oneDNN created (its primitive cache missed) and their creation
    seconds by oneDNN's own clock (ONEDNN_VERBOSE=profile_create: the last field, ms)."""
    count, ms, epoch = [0] * epochs, [0.0] * epochs, 0
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("EPOCH "):
            epoch = int(line.split()[1])
        elif epoch and line.startswith("onednn_verbose") and ",create:cache_miss," in line:
            count[epoch - 1] += 1
            ms[epoch - 1] += float(line.rsplit(",", 1)[1])
    return {"primitives_created": count, "create_s": [round(x / 1000, 3) for x in ms]}


def in_child(*args, env: dict | None = None):
    """``replay(*args)`` in a fresh process (spawned: oneDNN's caches empty), with ``env`` added to
    the environment it starts with."""
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(replay, *args).result()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def plan_figures(epochs_shapes: list) -> dict:
    """Distinct shapes per epoch, those new to the run, and the frames computed (padded)."""
    seen: set = set()
    distinct, new = [], []
    for epoch in epochs_shapes:
        here = {(len(lengths), width) for lengths, width in epoch}
        distinct.append(len(here))
        new.append(len(here - seen))
        seen |= here
    padded = sum(len(lengths) * width for epoch in epochs_shapes for lengths, width in epoch)
    return {"distinct": distinct, "new": new, "padded_frames": padded}


def one_precision(a, precision: str) -> dict:
    base = [f"train.system.precision={precision}"]
    variants = {1: base + ["loader.pad_multiple=1"], a.multiple: base + [f"loader.pad_multiple={a.multiple}"]}
    plans = {m: shapes(load_preset(a.preset, o), a.data, a.epochs) for m, o in variants.items()}
    steps: dict[int, list[list[list[float]]]] = {m: [] for m in variants}
    for _ in range(a.rounds):
        for m, overrides in variants.items():
            steps[m].append(in_child(a.preset, overrides, plans[m], a.threads))
    counts = {}
    with tempfile.TemporaryDirectory(prefix="speechperf-pad-") as tmp:
        for m, overrides in variants.items():  # not timed: the verbose lines cost time of their own
            log = Path(tmp) / f"{m}.log"
            in_child(a.preset, overrides, plans[m], a.threads, str(log), env={"ONEDNN_VERBOSE": "profile_create"})
            counts[m] = created(log, a.epochs)
    out = {}
    for m in variants:
        later = [statistics.mean(s for e in r[1:] for s in e) for r in steps[m]]  # per round, epochs 2..E
        first = [statistics.mean(r[0]) for r in steps[m]]
        out[m] = {**plan_figures(plans[m]), **counts[m], "first_epoch_step_s": statistics.median(first),
                  "later_step_s": statistics.median(later), "later_rounds_s": later}
        f = out[m]
        print(f"{a.preset} {precision} pad_multiple {m}: shapes per epoch {f['distinct']} (new {f['new']}); "
              f"mean step epoch 1 {1000 * f['first_epoch_step_s']:.1f} ms, epochs 2-{a.epochs} "
              f"{1000 * f['later_step_s']:.1f} ms (rounds {', '.join(f'{1000 * x:.1f}' for x in later)}); oneDNN "
              f"primitives created per epoch {f['primitives_created']} in {f['create_s']} s")
    ratio = out[a.multiple]["later_step_s"] / out[1]["later_step_s"]
    frames = out[a.multiple]["padded_frames"] / out[1]["padded_frames"]
    print(f"{a.preset} {precision}: rounded / unrounded step {ratio:.3f}x, frames computed {frames:.3f}x")
    return {"variants": {str(m): f for m, f in out.items()}, "ratio": ratio, "frames_ratio": frames}


def arguments(p) -> None:
    p.add_argument("--preset", default="cpu", help="a registered preset with bucket batches (cpu, conformer-cpu)")
    p.add_argument("--multiple", type=int, default=32, help="loader.pad_multiple of the rounded variant")
    p.add_argument("--epochs", type=int, default=3, help="epochs replayed (>= 2: the ratio reads epochs 2..E)")
    p.add_argument("--rounds", type=int, default=2, help="replays of each variant, alternated")
    p.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["bf16", "fp32"])
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (training's)")


def run(a) -> dict:
    if a.epochs < 2 or a.multiple < 2 or a.rounds < 1:
        raise SpeechperfError(f"--epochs {a.epochs} (>= 2), --multiple {a.multiple} (>= 2), "
                              f"--rounds {a.rounds} (>= 1)")
    print(f"torch {torch.__version__}, {a.threads} thread(s), CPU {isa(cpu_flags())}; {a.epochs} epochs of "
          f"{a.data}, {a.rounds} round(s) of each variant, each in a fresh process")
    figures = {p: one_precision(a, p) for p in a.precision}
    return {"preset": a.preset, "multiple": a.multiple, "threads": a.threads, **figures,
            "ratio": figures[a.precision[0]]["ratio"]}
