"""`bench scale` on this machine at each at-scale workload's smallest batch: how long a row takes, and
the memory estimated before the run against the peak the same step measured.

Goals (docs/bench.md): each at-scale workload's row finishes in under 5 minutes on a 2-core CPU at
its smallest batch (a few steps), so the suite can run it small; the estimate within 15% of the
measured peak (hardware/memory.py against torch.profiler's allocator events, the same step). A
workload whose estimate exceeds ``--memory-limit-gb`` (default 8: a shared 24 GB machine) is not
run and says so; ``--sgd`` measures it with SGD (no optimizer state), which checks the estimate
at its size. Wall clock on a shared machine: noisy.

Usage: python benchmarks/run.py scale [--batch-seconds 30] [--memory-limit-gb 8] [--sgd]
"""
from __future__ import annotations

import time

from speechperf.bench.scale import WORKLOADS, Request, run_scale

GOAL = ("docs/bench.md: bench scale finishes each at-scale workload in under 5 minutes on a 2-core CPU at its "
        "smallest batch; the memory estimate within 15% of the measured peak")
REFERENCE = "the measured peak of the same step (torch.profiler's allocator events), in the same process"
RATIO = "estimate / measured peak, the worst workload"
DATA = False


def arguments(p) -> None:
    p.add_argument("--batch-seconds", type=float, default=30.0, help="seconds of audio per batch")
    p.add_argument("--memory-limit-gb", type=float, default=8.0, help="rows estimated above this are not run")
    p.add_argument("--sgd", action="store_true", help="SGD instead of the presets' AdamW (no optimizer state)")
    p.add_argument("--steps", type=int, default=3)


def run(a) -> dict:
    figures, ratios = {"workloads": {}}, []
    over = ("train.optim.name=sgd",) if a.sgd else ()
    for w in WORKLOADS:
        t = time.perf_counter()
        req = Request((w,), (a.batch_seconds,), steps=a.steps, memory_limit_gb=a.memory_limit_gb, overrides=over)
        try:
            (row,) = run_scale(req, progress=False)
        except Exception as e:  # the row that does not fit: said, not measured
            row = {"status": str(e)}
        row["wall_s"] = time.perf_counter() - t
        figures["workloads"][w] = row
        if row.get("estimate_ratio"):
            ratios.append(row["estimate_ratio"])
        print(f"{w}: {row['wall_s']:.0f} s, " + (f"{row['audio_s_per_s']:.2f} audio s/s, peak {row['peak_gb']:.2f} GB, "
              f"estimate {row['estimate_gb']:.2f} GB" if row.get("peak_gb") else row["status"]))
    figures["ratio"] = max(ratios, key=lambda r: abs(r - 1)) if ratios else None
    return figures
