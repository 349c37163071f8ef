"""Whether a run shared its machine: other processes' CPU share, from the run's own samples.

The sampler records, once a second, the share of the machine's CPUs that processes other than
the run (its process and its loader readers) used: ``cpu:others_pct``, from the machine's busy
CPU seconds (/proc/stat: user, system, nice, irq, softirq, steal) less the run's own. One rule
says when that share took cores the run needed (:func:`took_needed`, also the one the CPU's
measured peak uses, hardware/measured_peak.py): more than the cores the run's training threads left
free, plus :data:`SLACK` of the machine (a daemon's blips). On 2 cores with 2 training threads,
another process using more than 0.2 of a core is contention; with 1 thread, one using the other
core is not.

A run *shared its machine* when such seconds make up at least :data:`SHARED_MIN_PCT` % of its
sampled clock (to its TTA where it reached one): a slow stretch of that size moves a TTA, and
its steps' times then describe the neighbour as much as the hardware. The figures say how much
and when: ``contended %`` of the sampled seconds, the others' mean share over them, and the first
and last contended second on the TTA clock.
"""
from __future__ import annotations

SLACK = 0.1  # of the machine's CPUs, what other processes may take beyond the cores the run left free
SHARED_MIN_PCT = 5.0  # contended seconds, % of the sampled clock, from which a run is said to have shared its machine
METRIC = "others_pct"  # the sample (source "cpu"): % of the machine's CPUs other processes used


def took_needed(others_pct: float, threads: int, cpus: int) -> bool:
    """Whether other processes, using ``others_pct`` % of the machine's ``cpus``, took cores that
    ``threads`` threads needed: more than the cores they left free plus :data:`SLACK` of the machine."""
    return others_pct / 100.0 * cpus > max(0, cpus - threads) + SLACK * cpus


def others_pct(machine_s: float, own_s: float, wall_s: float, cpus: int) -> float:
    """The share (%) of ``cpus`` CPUs that other processes used in ``wall_s`` seconds in which the
    machine ran ``machine_s`` busy CPU seconds and the run ``own_s``; in [0, 100] (two clocks that
    tick apart can make the difference slightly negative or high)."""
    if wall_s <= 0:
        return 0.0
    return min(100.0, max(0.0, 100.0 * (machine_s - own_s) / (wall_s * cpus)))


def shared(samples: list[dict], threads: int | None, cpus: int | None, until: float | None = None) -> dict | None:
    """Whether the run whose ``samples`` (rows with ``t``, ``source``, ``metric``, ``value``; t on the
    TTA clock, each the end of its second) these are shared its machine, up to ``until`` s (None:
    all): ``{"shared", "contended %", "others % mean", "samples", "first s", "last s", "threads",
    "cpus"}``; None where the run holds no others' share samples, or no threads or CPUs."""
    xs = sorted(((s["t"], s["value"]) for s in samples if s["source"] == "cpu" and s["metric"] == METRIC),
                key=lambda x: x[0])
    if until is not None:  # the sample whose span holds ``until`` counts for the part before it
        after = next((i for i, (t, _) in enumerate(xs) if t > until), len(xs))
        xs = xs[:after] + ([(until, xs[after][1])] if after < len(xs) else [])
    if not xs or not threads or not cpus:
        return None
    spans = [(t, t - prev, v) for (prev, _), (t, v) in zip([(0.0, None), *xs], xs)]  # each sample's seconds
    total = sum(w for _, w, _ in spans)
    hit = [(t, w, v) for t, w, v in spans if took_needed(v, threads, cpus)]
    contended = 100.0 * sum(w for _, w, _ in hit) / total if total > 0 else 0.0
    return {"shared": contended >= SHARED_MIN_PCT, "contended %": contended,
            "others % mean": sum(w * v for _, w, v in spans) / total if total > 0 else 0.0, "samples": len(xs),
            "first s": hit[0][0] if hit else None, "last s": hit[-1][0] if hit else None,
            "threads": threads, "cpus": cpus}


def short(figures: dict | None) -> str | None:
    """The flag beside a TTA: ``yes 34%`` (the contended share of the clock), ``no``, None: not recorded."""
    if figures is None:
        return None
    return f"yes {figures['contended %']:.0f}%" if figures["shared"] else "no"


def words(figures: dict | None) -> str | None:
    """The flag in words for a note, one short line: how much of the clock others took cores
    the run needed, and what to do (the figures themselves: ``shared machine``, --json); None
    where not shared."""
    if not figures or not figures["shared"]:
        return None
    return f"shared its machine ({figures['contended %']:.0f}% of its clock): rerun it alone"