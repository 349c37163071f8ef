"""The one energy rule: a source's energy comes from its counter where it has one (NVML total
energy, amdsmi's energy accumulator, RAPL ``energy_uj``), else from its sampled power integrated over time (trapezoids);
nothing is ever estimated from TDP. The sampler's summary, benchmark rows and the report's
energy to accuracy all read it.

RAPL sub-zones (``intel-rapl:0:0``, the cores of package 0) are inside their package's count:
:func:`top_level` tells them apart, so that totals add only top-level sources.
"""
from __future__ import annotations

from speechperf.errors import SpeechperfError

COUNTER, INTEGRATED = "counter", "integrated-power"
POWER_METRICS = ("power_w", "power_avg_w")  # instant first: preferred where a source has both
EPS = 1e-6  # s: a TTA moment read back from minutes (clock_s / 60 * 60) may fall an ulp before the sample at it


def top_level(source: str) -> bool:
    """False for a RAPL sub-zone, whose energy is already in its parent package."""
    if not source.startswith("rapl:"):
        return True
    return source.count(":") <= 2  # "rapl:intel-rapl:0" yes, "rapl:intel-rapl:0:0" no


def _fields(s) -> tuple[str, str, float, float, float | None]:
    """(source, metric, t, value, segment) of a sampler ``Sample`` or a stored sample row (dict);
    segment None: one process's samples, or rows stored before segments were recorded."""
    if isinstance(s, dict):
        return s["source"], s["metric"], s["t"], s["value"], s.get("segment")
    return s.source, s.metric, s.t, s.value, None


def integrate(points: list[tuple[float, float]]) -> float:
    """Joules of (t s, W) points in time order, by the trapezoid rule."""
    return sum((t1 - t0) * (a + b) / 2 for (t0, a), (t1, b) in zip(points, points[1:]))


def counted(points: list[tuple[float, float]]) -> float:
    """Joules a counter's (t s, J) readings of one process add up to, in time order. A reading
    below the one before is a counter that started again (a RAPL sampler of a new process,
    in rows stored without their process): the difference across it is not charged."""
    return sum(b - a for (_, a), (_, b) in zip(points, points[1:]) if b >= a)


def by_source(samples, until: float | None = None, top_only: bool = False) -> dict[str, tuple[float, str]]:
    """{source: (joules, COUNTER | INTEGRATED)} of the samples up to ``until`` seconds (all when None).

    A counter's energy is the sum of its differences between readings of the same process
    (the ``segment`` of a stored row: NVML counts since the driver loaded, through a resumed
    run's down time, which is not the run's; RAPL from each process's sampler start); a
    source without one integrates its instant power, else its averaged power, within each
    process. A resumed run's energy is the sum of its processes'. ``top_only`` leaves RAPL
    sub-zones out (for totals)."""
    series: dict[tuple[str, str], dict] = {}  # (source, metric) -> {segment: [(t, value)]}
    for s in samples:
        source, metric, t, value, segment = _fields(s)
        kept = until is None or t <= until + EPS
        if metric in ("energy_j",) + POWER_METRICS and kept and (top_level(source) or not top_only):
            series.setdefault((source, metric), {}).setdefault(segment, []).append((t, value))
    out = {}
    for source in sorted({src for src, _ in series}):
        if (source, "energy_j") in series:
            out[source] = (sum(counted(_in_time(p)) for p in series[(source, "energy_j")].values()), COUNTER)
            continue
        metric = next(m for m in POWER_METRICS if (source, m) in series)
        out[source] = (sum(integrate(_in_time(p)) for p in series[(source, metric)].values()), INTEGRATED)
    return out


def _in_time(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``points`` by time, those of one time in the order recorded (a process's last reading and
    the next one's first share the clock's second in rows stored without their process)."""
    return sorted(points, key=lambda p: p[0])


def total(samples, until: float | None) -> float | None:
    """Joules of all top-level sources in the first ``until`` seconds; None when nothing measured them."""
    if until is None:
        return None
    sources = by_source(samples, until, top_only=True)
    return sum(j for j, _ in sources.values()) if sources else None


def measures_energy(samples) -> bool:
    """Whether any sample is an energy counter reading or a power reading."""
    return any(_fields(s)[1] in ("energy_j",) + POWER_METRICS for s in samples)


def to_accuracy(samples, tta_s: float | None, name: str = "the run") -> float | None:
    """Energy to accuracy: joules of every top-level source from the start of the TTA clock to
    ``tta_s`` (the TTA moment on that clock; a stored sample's ``t`` is on it: results/schema.py).
    The one function ``tta``, ``tta --json``, the demo, the study and the report read it by.

    None when the target was not reached (``tta_s`` None) or no sample measures energy or power
    (:func:`why_missing` says why). A run whose samples measure energy but none of them before
    the TTA moment is an error naming ``name``: never an empty energy."""
    if tta_s is None or not measures_energy(samples):
        return None
    joules = total(samples, tta_s)
    if joules is None:
        first = min(_fields(s)[2] for s in samples if _fields(s)[1] in ("energy_j",) + POWER_METRICS)
        raise SpeechperfError(f"{name}: its power and energy samples start at {first:.1f} s of the TTA clock, "
                              "after the "
                              f"TTA moment {tta_s:.1f} s: its samples are not on the TTA clock")
    return joules


MISSING = "no energy counter or power samples"  # hardware/platforms.py's price note where energy_j is None


def explained(note: str | None, env: dict) -> str | None:
    """A price note (hardware/platforms.py) with the reason beside its missing energy."""
    return note.replace(MISSING, f"{MISSING} ({why_missing(env)})") if note else note


def why_missing(env: dict) -> str:
    """Why a run holds no energy or power sample, from the sources its sampler found unavailable
    (telemetry/sampler.py, recorded in the run's env)."""
    telemetry = env.get("telemetry")
    if telemetry is None:
        return "the run did not record which power sources were available"
    unavailable = telemetry.get("unavailable", {})
    reasons = [f"{src}: {why}" for src, why in sorted(unavailable.items())]
    return "; ".join(reasons) or "no NVML or amdsmi GPU and no readable RAPL counter"
