"""Average power and energy of one benchmark measurement, from a telemetry Sampler summary.

Energy per source comes from the device's counter when it has one (NVML total energy,
RAPL ``energy_uj``), else from integrating sampled power; the label says which. RAPL
sub-zones (``intel-rapl:0:0``, the cores of package 0) are inside their package's count,
so only top-level zones are added up, to avoid counting the same joules twice.
"""
from __future__ import annotations

import time


def top_level(source: str) -> bool:
    """False for a RAPL sub-zone, whose energy is already in its parent package."""
    if not source.startswith("rapl:"):
        return True
    return source.count(":") <= 2  # "rapl:intel-rapl:0" yes, "rapl:intel-rapl:0:0" no


def energy_of(summary: dict, seconds: float) -> dict:
    """{"power_w", "energy_j", "energy"}: summed over sources; None and the reasons when none.

    ``summary`` is ``Sampler.summary()``; ``seconds`` the measured interval.
    """
    sources = sorted(s for s in summary.get("energy_j", {}) if top_level(s))
    if not sources:
        why = "; ".join(f"{k}: {v}" for k, v in summary.get("unavailable", {}).items()) or "no power source"
        return {"power_w": None, "energy_j": None, "energy": f"unavailable: {why}"}
    joules = sum(summary["energy_j"][s] for s in sources)
    label = ", ".join(f"{s}: {summary['energy_method'].get(s, '?')}" for s in sources)
    return {"power_w": joules / seconds if seconds > 0 else None, "energy_j": joules, "energy": label}


class PowerMeter:
    """Runs the telemetry sampler around a timed block: ``with PowerMeter() as m: ...``.

    After the block, ``m.seconds`` is its wall time and ``m.result(samples)`` the power,
    energy and joules per sample of the samples (images, tokens, ...) it processed.
    """

    def __init__(self, interval: float = 0.05, sampler=None):
        from speechperf.telemetry.sampler import Sampler, SamplerConfig

        # 50 ms: the sampler's own CPU cost stays small beside the benchmark on 2 cores
        self.sampler = sampler or Sampler(config=SamplerConfig(interval=interval))
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> "PowerMeter":
        self.sampler.start()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.sampler.stop()

    def result(self, samples: float | None = None) -> dict:
        out = energy_of(self.sampler.summary(), self.seconds)
        out["joules_per_sample"] = out["energy_j"] / samples if out["energy_j"] is not None and samples else None
        return out
