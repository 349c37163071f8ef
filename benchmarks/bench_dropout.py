"""A preset's training step with speechperf's CPU dropout (models/dropout.py) against the same
step with torch's ``nn.Dropout``, alternated in one process, in each precision asked.

Why: torch's CPU dropout draws its mask with ATen's ``bernoulli_(p)``, which takes MKL's
vectorized VSL stream on an Intel CPU and one draw of torch's generator per element elsewhere
(docs/reproduce.md), so on an AMD CPU the masks cost the DS2 step of the ``cpu`` preset (dropout
after the convolution and each LSTM) a share its model does not need, and the two makers drop
other elements. The step is bench_mfu's (the preset's model, optimizer and ``train_step`` on one
real-shaped batch); the one model swaps its dropout modules between rounds (the same weights
and batch), one step of each per round, so a neighbour's load falls on both alike. Also timed
alone: one mask of the step's largest dropout shape, forward and backward. The ratio:
speechperf's step over torch's in the first precision (below 1: faster).

Usage: python benchmarks/run.py dropout [--preset cpu] [--data FEATS] [--rounds 9] [--precision fp32 bf16]
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_mfu import real_step
from speechperf.config import load_preset
from speechperf.hardware.capability import cpu_flags, isa
from speechperf.models.dropout import Dropout, dropout
from speechperf.train.step import train_step

GOAL = ("docs/bench.md: the CPU step's code costs removed (issue 60): speechperf's dropout takes less of the "
        "cpu preset's step than torch's on any CPU maker")
REFERENCE = "the same step with torch's nn.Dropout, alternated with it in this process"
RATIO = "speechperf's dropout step / torch's dropout step (the first precision; below 1: faster)"
DATA = False


def swap(model: nn.Module, torchs: bool) -> int:
    """Every dropout module of ``model`` made torch's (``torchs``) or speechperf's; how many."""
    n = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, (nn.Dropout, Dropout)) and child.p > 0:
                setattr(parent, name, nn.Dropout(child.p) if torchs else Dropout(child.p))
                n += 1
    return n


def mask_seconds(shape: tuple, p: float, dtype: torch.dtype, rounds: int) -> dict:
    """Median seconds of one dropout's forward and backward at ``shape``, torch's and speechperf's."""
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    fns = {"torch": lambda: F.dropout(x, p, True), "speechperf": lambda: dropout(x, p, True)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds + 1):  # the first round warms up
        for k, fn in fns.items():
            t = time.perf_counter()
            fn().backward(torch.ones(shape, dtype=dtype))
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def one_precision(preset: str, data: Path | None, precision: str, rounds: int) -> dict:
    cfg = load_preset(preset, [f"train.system.precision={precision}"])
    model, batch, optimizer, scaler = real_step(cfg, data)
    lengths = batch.feat_lens.tolist()
    n = swap(model, torchs=True)
    if not n:
        raise SystemExit(f"{preset}: its model has no dropout to compare")
    times: dict[str, list[float]] = {"torch": [], "speechperf": []}
    for r in range(rounds + 1):  # round 0 warms both up (the optimizer's state, the allocator)
        for kind in times:
            swap(model, torchs=kind == "torch")
            t = time.perf_counter()
            train_step(model, batch, optimizer, scaler, torch.device("cpu"), cfg.train)
            if r:
                times[kind].append(time.perf_counter() - t)
    step = {k: statistics.median(v) for k, v in times.items()}
    frames = int(model.output_lengths(batch.feat_lens).max())  # the largest dropout input: (T', B, channels)
    width = max(getattr(cfg.model, k, 0) for k in ("conv_channels", "lstm_hidden", "d_model"))
    mask = mask_seconds((frames, len(lengths), width), cfg.model.dropout, torch.bfloat16 if precision == "bf16"
                        else torch.float32, rounds)
    print(f"{preset} {precision}: {n} dropout modules (p {cfg.model.dropout}), batch {len(lengths)} x "
          f"{max(lengths)} frames; step median torch {1000 * step['torch']:.1f} ms, speechperf "
          f"{1000 * step['speechperf']:.1f} ms ({step['speechperf'] / step['torch']:.3f}x); one mask "
          f"{frames}x{len(lengths)}x{width} forward+backward torch {1000 * mask['torch']:.2f} ms, speechperf "
          f"{1000 * mask['speechperf']:.2f} ms")
    spread = {k: 100 * (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
    return {"step_s": step, "spread_pct": spread, "mask_s": mask, "modules": n,
            "ratio": step["speechperf"] / step["torch"]}


def arguments(p) -> None:
    p.add_argument("--preset", default="cpu", help="a registered preset whose model has dropout (cpu, conformer-cpu)")
    p.add_argument("--rounds", type=int, default=9, help="timed rounds (one step of each per round)")
    p.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (training's)")


def run(a) -> dict:
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s), CPU {isa(cpu_flags())}")
    figures = {p: one_precision(a.preset, a.data, p, a.rounds) for p in a.precision}
    return {"preset": a.preset, "threads": a.threads, **figures, "ratio": figures[a.precision[0]]["ratio"]}
