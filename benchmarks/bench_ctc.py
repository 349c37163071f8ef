"""The CTC loss's CPU kernel (speechperf/objectives/ctc_cpu.py) against torch's ``F.ctc_loss``.

Two measurements, each alternated call by call in one process after a warm-up round (numba's
compile or cache load, the allocator's first pages), so a neighbour's load falls on both alike:

1. The loss alone, forward and backward (and forward only, as the evaluation calls it), on
   log-probabilities of the preset's real batch: bench_mfu's median batch of the run's plan
   (``--data``; else synthetic lengths), its labels, and random logits through a log-softmax.
2. The preset's whole training step (bench_mfu's: its model, optimizer and ``train_step`` on that
   batch) with ``train.system.ctc_kernel=torch`` and ``numba``: what the kernel saves a step.

The ratio: torch's loss over the kernel's, forward and backward (the goal: >= 3x).

Usage: python benchmarks/run.py ctc [--preset cpu] [--data FEATS] [--rounds 15] [--precision fp32 bf16]
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import torch

from bench_mfu import real_step
from speechperf.config import load_preset
from speechperf.hardware.capability import cpu_flags, isa
from speechperf.objectives.ctc import ctc_losses
from speechperf.objectives.ctc_cpu import warm
from speechperf.train.step import train_step

GOAL = ("docs/workloads.md: the CTC loss's CPU kernel >= 3x faster than torch's F.ctc_loss (forward + backward, the "
        "preset's real batch, one process)")
REFERENCE = "torch's F.ctc_loss on the same log-probabilities, alternated with the kernel in this process"
RATIO = "torch's / the kernel's seconds per forward + backward (the loss alone)"
DATA = False
KERNELS = ("torch", "numba")


def alternated(calls: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each call per round, the calls alternated; round 0 warms them up and is dropped."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(rounds + 1):
        for k, fn in calls.items():
            t = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t)
    return times


def loss_alone(batch, out_lens, classes: int, rounds: int) -> dict:
    """Median seconds of each kernel's loss, forward + backward and forward only, on (T', B, C)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(int(out_lens.max()), len(out_lens), classes, generator=g)  # (T', B, C)
    lp = logits.log_softmax(-1).requires_grad_()

    def both(kernel):
        def call():
            ctc_losses(lp, batch.labels, out_lens, batch.label_lens, kernel, zero_infinity=True).sum().backward()
            lp.grad = None
        return call

    def forward(kernel):
        return lambda: ctc_losses(lp.detach(), batch.labels, out_lens, batch.label_lens, kernel, zero_infinity=False)

    fb = alternated({k: both(k) for k in KERNELS}, rounds)
    fwd = alternated({k: forward(k) for k in KERNELS}, rounds)
    return {"fwd_bwd_s": {k: statistics.median(v) for k, v in fb.items()},
            "fwd_s": {k: statistics.median(v) for k, v in fwd.items()},
            "spread_pct": {k: 100 * (max(v) - min(v)) / statistics.median(v) for k, v in fb.items()}}


def one_precision(preset: str, data: Path | None, precision: str, rounds: int) -> dict:
    cfg = load_preset(preset, [f"train.system.precision={precision}"])
    model, batch, optimizer, scaler = real_step(cfg, data)
    out_lens = model.output_lengths(batch.feat_lens)
    warm()
    loss = loss_alone(batch, out_lens, cfg.model.num_classes, rounds)
    tcs = {k: dataclasses.replace(cfg.train, system=dataclasses.replace(cfg.train.system, ctc_kernel=k))
           for k in KERNELS}
    steps = alternated({k: (lambda tc=tc: train_step(model, batch, optimizer, scaler, torch.device("cpu"), tc))
                        for k, tc in tcs.items()}, rounds)
    step = {k: statistics.median(v) for k, v in steps.items()}
    fb, fwd = loss["fwd_bwd_s"], loss["fwd_s"]
    print(f"{preset} {precision}: batch {len(out_lens)} x {int(out_lens.max())} output frames, labels "
          f"{int(batch.label_lens.min())}-{int(batch.label_lens.max())}, {cfg.model.num_classes} classes")
    print(f"  loss forward+backward: torch {1000 * fb['torch']:.2f} ms, numba {1000 * fb['numba']:.2f} ms "
          f"({fb['torch'] / fb['numba']:.1f}x); forward only: torch {1000 * fwd['torch']:.2f} ms, numba "
          f"{1000 * fwd['numba']:.2f} ms ({fwd['torch'] / fwd['numba']:.1f}x)")
    print(f"  training step: torch's CTC {1000 * step['torch']:.1f} ms, numba's {1000 * step['numba']:.1f} ms "
          f"({step['numba'] / step['torch']:.3f}x)")
    return {**loss, "step_s": step, "step_ratio": step["numba"] / step["torch"],
            "ratio": fb["torch"] / fb["numba"]}


def arguments(p) -> None:
    p.add_argument("--preset", default="cpu", help="a registered preset whose objective is CTC (cpu, conformer-cpu)")
    p.add_argument("--rounds", type=int, default=15, help="timed rounds (one call of each kernel per round)")
    p.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32"])
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (training's)")


def run(a) -> dict:
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s), CPU {isa(cpu_flags())}")
    figures = {p: one_precision(a.preset, a.data, p, a.rounds) for p in a.precision}
    return {"preset": a.preset, "threads": a.threads, **figures, "ratio": figures[a.precision[0]]["ratio"]}
