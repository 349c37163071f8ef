"""Average power and energy of one benchmark measurement, from a telemetry Sampler summary.

Energy per source comes from the device's counter when it has one (NVML total energy,
RAPL ``energy_uj``), else from integrating sampled power (telemetry/energy.py, the one
rule); the label says which. RAPL
sub-zones (``intel-rapl:0:0``, the cores of package 0) are inside their package's count,
so only top-level zones are added up, to avoid counting the same joules twice.

A window shorter than ``min_seconds`` (default 2 s) is not measured at all: energy counters
update in steps (NVML's about every 100 ms), so a short window reads 0 J, which is not a
measurement of zero. Such rows, and sources whose counter did not move, get None with the
reason, never 0 W.
"""
from __future__ import annotations

import time

from speechperf.telemetry.device_gpus import RunGpu
from speechperf.telemetry.energy import top_level
from speechperf.telemetry.sampler import Sampler, SamplerConfig

# Shortest window whose energy is reported, s: NVML's counter steps about every 100 ms and
# its averaged power over 1 s, so 2 s keeps the step error of one window under ~5%.
ENERGY_MIN_SECONDS = 2.0


def energy_of(summary: dict, seconds: float, min_seconds: float = 0.0) -> dict:
    """{"power_w", "energy_j", "energy"}: summed over sources; None and the reasons when none.

    ``summary`` is ``Sampler.summary()``; ``seconds`` the measured interval. A window under
    ``min_seconds``, or a source whose energy is not positive (a counter that did not step,
    fewer than two power samples), is left out with the reason: never 0 W.
    """
    sources = sorted(s for s in summary.get("energy_j", {}) if top_level(s))
    if not sources:
        why = "; ".join(f"{k}: {v}" for k, v in summary.get("unavailable", {}).items()) or "no power source"
        return {"power_w": None, "energy_j": None, "energy": f"unavailable: {why}"}
    if seconds < min_seconds:
        return {"power_w": None, "energy_j": None,
                "energy": f"window too short for the energy counter ({seconds:.2f} s < {min_seconds:g} s)"}
    still = [s for s in sources if not summary["energy_j"][s] > 0]
    sources = [s for s in sources if s not in still]
    if not sources:
        return {"power_w": None, "energy_j": None,
                "energy": f"unavailable: {', '.join(still)}: no energy counted in {seconds:.2f} s "
                          "(counter did not step)"}
    joules = sum(summary["energy_j"][s] for s in sources)
    label = ", ".join(f"{s}: {summary['energy_method'].get(s, '?')}" for s in sources)
    if still:
        label += f" ({', '.join(still)}: no energy counted, left out)"
    return {"power_w": joules / seconds if seconds > 0 else None, "energy_j": joules, "energy": label}


class PowerMeter:
    """Runs the telemetry sampler around a timed block: ``with PowerMeter() as m: ...``.

    After the block, ``m.seconds`` is its wall time and ``m.result(samples)`` the power,
    energy and joules per sample of the samples (images, tokens, ...) it processed, or None
    with the reason for a block shorter than ``min_seconds``; and the GPUs' mean utilization.
    """

    def __init__(self, interval: float = 0.05, sampler=None, min_seconds: float = ENERGY_MIN_SECONDS,
                 run_gpus: list[RunGpu] | None = None):
        # 50 ms: the sampler's own CPU cost stays small beside the benchmark on 2 cores; run_gpus: the
        # GPUs measured (None: every GPU of the node), so that an idle neighbour's watts are not counted
        self.sampler = sampler or Sampler(config=SamplerConfig(interval=interval), run_gpus=run_gpus)
        self.min_seconds = min_seconds
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
        summary = self.sampler.summary()
        out = energy_of(summary, self.seconds, self.min_seconds)
        out["joules_per_sample"] = out["energy_j"] / samples if out["energy_j"] is not None and samples else None
        out["gpu_util_pct"] = gpu_util(summary)
        return out


def gpu_util(summary: dict) -> float | None:
    """The GPUs' mean utilization over the window (the driver's: the share of time a kernel ran),
    averaged over the GPUs sampled; None where no GPU reported one."""
    utils = [g["util_mean"] for g in summary.get("gpus", {}).values() if g.get("util_mean") is not None]
    return sum(utils) / len(utils) if utils else None
