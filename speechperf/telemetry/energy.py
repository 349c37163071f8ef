"""The one energy rule: a source's energy comes from its counter where it has one (NVML total
energy, RAPL ``energy_uj``), else from its sampled power integrated over time (trapezoids);
nothing is ever estimated from TDP. The sampler's summary, benchmark rows and the report's
energy to accuracy all read it.

RAPL sub-zones (``intel-rapl:0:0``, the cores of package 0) are inside their package's count:
:func:`top_level` tells them apart, so that totals add only top-level sources.
"""
from __future__ import annotations

COUNTER, INTEGRATED = "counter", "integrated-power"
POWER_METRICS = ("power_w", "power_avg_w")  # instant first: preferred where a source has both


def top_level(source: str) -> bool:
    """False for a RAPL sub-zone, whose energy is already in its parent package."""
    if not source.startswith("rapl:"):
        return True
    return source.count(":") <= 2  # "rapl:intel-rapl:0" yes, "rapl:intel-rapl:0:0" no


def _fields(s) -> tuple[str, str, float, float]:
    """(source, metric, t, value) of a sampler ``Sample`` or a stored sample row (dict)."""
    if isinstance(s, dict):
        return s["source"], s["metric"], s["t"], s["value"]
    return s.source, s.metric, s.t, s.value


def integrate(points: list[tuple[float, float]]) -> float:
    """Joules of (t s, W) points in time order, by the trapezoid rule."""
    return sum((t1 - t0) * (a + b) / 2 for (t0, a), (t1, b) in zip(points, points[1:]))


def by_source(samples, until: float | None = None, top_only: bool = False) -> dict[str, tuple[float, str]]:
    """{source: (joules, COUNTER | INTEGRATED)} of the samples up to ``until`` seconds (all when None).

    A counter's energy is its last reading minus its first (NVML counts since the driver
    loaded, RAPL from the sampler's start); a source without one integrates its instant power,
    else its averaged power. ``top_only`` leaves RAPL sub-zones out (for totals)."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in samples:
        source, metric, t, value = _fields(s)
        if metric in ("energy_j",) + POWER_METRICS and (until is None or t <= until) and (top_level(source) or not top_only):
            series.setdefault((source, metric), []).append((t, value))
    out = {}
    for source in sorted({src for src, _ in series}):
        if (source, "energy_j") in series:
            pts = sorted(series[(source, "energy_j")])
            out[source] = (pts[-1][1] - pts[0][1], COUNTER)
            continue
        metric = next(m for m in POWER_METRICS if (source, m) in series)
        out[source] = (integrate(sorted(series[(source, metric)])), INTEGRATED)
    return out


def total(samples, until: float | None) -> float | None:
    """Joules of all top-level sources in the first ``until`` seconds; None when nothing measured them."""
    if until is None:
        return None
    sources = by_source(samples, until, top_only=True)
    return sum(j for j, _ in sources.values()) if sources else None
