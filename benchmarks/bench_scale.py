"""`bench scale` on this machine at each at-scale workload's smallest batch: how long a row takes, and
the memory estimated before the run against the peak the same step measured.

Goals (docs/bench.md): each at-scale workload's row finishes in under 5 minutes on a 2-core CPU at
its smallest batch (a few steps), so the suite can run it small; the estimate within 15% of the
measured peak (hardware/memory.py against torch.profiler's allocator events, the same step). A
workload whose estimate exceeds ``--memory-limit-gb`` (default 8: a shared 24 GB machine) is not
run and says so; ``--sgd`` measures it with SGD (no optimizer state), which checks the estimate
at its size. Wall clock on a shared machine: noisy.

``--world 2`` also measures each workload sharded over 2 torchrun ranks (FSDP2; on a CPU each rank
takes half the cores, and so does the one-device row it is compared with): the estimate for
``fsdp`` at 2 ranks against the peak of the rank that used most, and the scaling efficiency.

Usage: python benchmarks/run.py scale [--batch-seconds 30] [--memory-limit-gb 8] [--sgd] [--world 2] [KEY=VALUE ...]
"""
from __future__ import annotations

import os
import time

from speechperf.bench.scale import WORKLOADS, Request
from speechperf.bench.scale_launch import measure

GOAL = ("docs/bench.md: bench scale finishes each at-scale workload in under 5 minutes on a 2-core CPU at its "
        "smallest batch; the memory estimate within 15% of the measured peak at 1 and 2 ranks")
REFERENCE = "the measured peak of the same step (torch.profiler's allocator events), in the same process"
RATIO = "estimate / measured peak, the worst workload"
DATA = False


def arguments(p) -> None:
    p.add_argument("--batch-seconds", type=float, default=30.0, help="seconds of audio per batch")
    p.add_argument("--memory-limit-gb", type=float, default=8.0, help="rows estimated above this are not run")
    p.add_argument("--sgd", action="store_true", help="SGD instead of the presets' AdamW (no optimizer state)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--world", type=int, default=1, help="2: also sharded over 2 torchrun ranks (FSDP2)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma separated (default: all four)")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of every workload's preset "
                   "(model.activation_checkpointing=true, say)")


def run(a) -> dict:
    # glibc's malloc settings, where given (MALLOC_MMAP_THRESHOLD_: docs/parallel.md, Canary's sizes at 2 ranks)
    figures, ratios = {"workloads": {}, "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}, []
    over = ("train.optim.name=sgd", "train.optim.impl=foreach") if a.sgd else ()  # torch has no fused SGD
    over += tuple(a.overrides)
    for w in a.workloads.split(","):
        t = time.perf_counter()
        req = Request((w,), (a.batch_seconds,), steps=a.steps, world=a.world, memory_limit_gb=a.memory_limit_gb,
                      overrides=over)
        try:
            rows = measure(req, progress=False)  # --world 2: one device's row, then 2 ranks' (wall_s: both)
        except Exception as e:  # the row that does not fit: said, not measured
            rows = [{"status": str(e), "world": a.world}]
        for row in rows:
            row["wall_s"] = time.perf_counter() - t
            figures["workloads"][w if a.world == 1 else f"{w} x{row['world']}"] = row
            if row.get("estimate_ratio"):
                ratios.append(row["estimate_ratio"])
            print(f"{w} x{row['world']}: {row['wall_s']:.0f} s, {_said(row)}")
    figures["ratio"] = max(ratios, key=lambda r: abs(r - 1)) if ratios else None
    return figures


def _said(row: dict) -> str:
    if not row.get("peak_gb"):
        return row["status"]
    eff = f", efficiency {row['scaling_efficiency']:.2f}" if row.get("scaling_efficiency") else ""
    return (f"{row['audio_s_per_s']:.2f} audio s/s, peak {row['peak_gb']:.2f} GB, estimate {row['estimate_gb']:.2f} GB"
            + eff)
