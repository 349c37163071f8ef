"""Shared timing helper for the benchmark scripts: warm-up, repeats, median and spread."""
from __future__ import annotations

import statistics
import time


def measure(fn, repeats: int = 5, warmup: int = 1) -> dict:
    """Seconds per call of ``fn``: median, min, max over ``repeats`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return {"median": statistics.median(ts), "min": min(ts), "max": max(ts)}


def show(name: str, m: dict, unit: str = "s") -> str:
    return f"{name}: median {m['median']:.4f} {unit} (min {m['min']:.4f}, max {m['max']:.4f})"
