"""One telemetry reading (CPU, GPU, RAPL), and the period each series of readings achieved."""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the sampler started
    source: str  # "cpu", "gpu0" (NVML index, or amdsmi's HIP index), "rapl:intel-rapl:0" (package 0),
    #              "rapl:intel-rapl:0:1" (its DRAM)
    metric: str  # "util_machine_pct", "util_core_pct" (cpu); "util_pct", "mem_mb" (gpu); "power_w" (instant),
    #              "power_avg_w" (driver-averaged or buffered), "energy_j"
    value: float


def achieved_periods(samples, asked: dict[str, float | None] | None = None) -> dict[str, dict]:
    """{"source:metric": {"asked_s", "median_s", "count"}} from Samples or sample dicts: the
    median interval between consecutive samples of each series (RAPL's counters excluded:
    they are read as often as needed to undo wraps, not sampled)."""
    times: dict[str, list[float]] = {}
    for s in samples:
        src, metric, t = (s.source, s.metric, s.t) if isinstance(s, Sample) else (s["source"], s["metric"], s["t"])
        if not src.startswith("rapl:"):
            times.setdefault(f"{src}:{metric}", []).append(t)
    out = {}
    for key, ts in sorted(times.items()):
        ts.sort()
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        out[key] = {"asked_s": (asked or {}).get(key), "median_s": statistics.median(gaps) if gaps else None,
                    "count": len(ts)}
    return out
