"""What an export holds, read from one run folder, in neither tool's terms: the writers
(``tensorboard_writer``, ``mlflow_writer``) only translate a :class:`RunSeries`.

Scalars carry a tag, an integer step and the TTA clock in seconds where they have one:
iteration rows (step: the iteration), validation evaluations (step: the epoch), telemetry
(step: milliseconds of the TTA clock at the start of a bin of ``sample_s`` seconds, the bin's
mean: the sampler takes a CPU reading every 0.03 s, 120,000 an hour, more than either tool
draws). The summary values (TTA per target, MFU, energy to accuracy, the final evaluations)
come from the same function ``tta`` prints them with (studies/tta.py's ``tta_table``), so an
exported TTA is the table's, never a second computation.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from speechperf.errors import SpeechperfError
from speechperf.metric import METRICS
from speechperf.studies.tta import tta_table
from speechperf.results.lock import held
from speechperf.results.view import RunView
from speechperf.telemetry.energy import POWER_METRICS

# iteration columns exported per step, each under train/NAME (throughput: utterances and audio seconds per second)
ITERATION_COLUMNS = ("loss", "utts_per_s", "audio_s_per_s", "step_s", "data_s")
COUNTER = "energy_j"  # a cumulative counter: exported as the power between its readings, never as itself


class ExportError(SpeechperfError):
    """An export that cannot be made: a missing extra, an unusable destination (named)."""


@dataclass(frozen=True)
class Point:
    tag: str
    step: int
    value: float
    clock_s: float | None = None  # the TTA clock (s) where the value has one; summary values have none


@dataclass
class RunSeries:
    """One run folder's export, read at once (the folder may be a partial run still training)."""

    run_id: str
    label: str
    folder: Path
    started_at: float  # unix time the run began: wall time = started_at + clock_s
    params: dict  # config.json flattened ("model.name": "ds2") and the run's workload
    tags: dict[str, str]  # words: status, machine, label, and each target's TTA where it is NA
    points: list[Point] = field(default_factory=list)  # the curves
    summary: dict[str, float] = field(default_factory=dict)  # one value each: TTA, MFU, final errors
    # recorded running and a process holds the folder's lock (results/lock.py; or the system cannot
    # say): still training. Recorded running with no holder: it was killed before it recorded its end
    training: bool = False


def flatten(config: dict, prefix: str = "") -> dict:
    """``{"model": {"name": "ds2"}}`` -> ``{"model.name": "ds2"}``; numbers, text and booleans kept
    (TensorBoard's HParams filters on them), lists and None as JSON text."""
    out: dict = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value)
    return out


def collect(folder: Path, metric: str, targets, epochs: int, sample_s: float) -> RunSeries:
    """The export of the run in ``folder``; its TTA of ``metric`` at ``targets`` (median of ``epochs``)."""
    with RunView.open(Path(folder)) as run:
        row = run.rows.row()
        series = RunSeries(run_id=run.run_id, label=run.label, folder=run.folder, started_at=row["started_at"] or 0.0,
                           params={**flatten(run.config), **flatten(run.workload, "workload.")},
                           tags={"speechperf.run_id": run.run_id, "label": run.label,
                                 "status": str(row["status"]), "folder": str(run.folder)},
                           training=row["status"] == "running" and held(run.folder) is not False)
        series.points += iteration_points(run.rows.iterations())
        series.points += epoch_points(run.rows.evals())
        series.points += sample_points(run.rows.samples(), sample_s)
        series.summary.update(final_values(run.rows.evals(final=True)))
    add_tta(series, tta_table([folder], metric=metric, targets=targets, epochs=epochs))
    return series


def iteration_points(rows: list[dict]) -> list[Point]:
    """Loss and throughput per iteration, and the achieved TFLOPS of the step (its FLOPs / its seconds)."""
    points = [Point(f"train/{c}", r["iteration"], r[c], r["clock_s"])
              for r in rows for c in ITERATION_COLUMNS if r.get(c) is not None]
    points += [Point("train/tflops", r["iteration"], r["model_flops"] / r["step_s"] / 1e12, r["clock_s"])
               for r in rows if r.get("model_flops") is not None and r.get("step_s")]
    return points


def epoch_points(rows: list[dict]) -> list[Point]:
    """Each validation evaluation's loss and every declared metric it holds, with its interval's
    ends (``valid/cer``, ``valid/cer_lo``, ``valid/cer_hi``); a metric a row predates is left out."""
    keys = ["loss", *(c for m in METRICS.values() for c in m.columns)]
    return [Point(f"valid/{k}", r["epoch"], r[k], r["clock_s"]) for r in rows for k in keys if r.get(k) is not None]


def final_values(rows: list[dict]) -> dict[str, float]:
    """The final evaluations (every split the run ended on) as summary values ``final/SPLIT/NAME``."""
    keys = ["loss", *(c for m in METRICS.values() for c in m.columns)]
    return {f"final/{r['split']}/{k}": r[k] for r in rows for k in keys if r.get(k) is not None}


def sample_points(samples: list[dict], sample_s: float) -> list[Point]:
    """Telemetry as ``telemetry/SOURCE/METRIC``, the mean of each ``sample_s`` bin of the TTA
    clock; an energy counter as its power between readings of one segment (a process: counters
    restart), ``telemetry/SOURCE/power_from_energy_w``, where the source has no power reading."""
    series: dict[str, list[tuple[float, float]]] = {}
    powered = {s["source"] for s in samples if s["metric"] in POWER_METRICS}
    last: dict[tuple, tuple[float, float]] = {}
    for s in samples:
        if s["metric"] != COUNTER:
            series.setdefault(f"telemetry/{s['source']}/{s['metric']}", []).append((s["t"], s["value"]))
            continue
        key = (s["source"], s["segment"])
        if key in last and s["t"] > last[key][0] and s["source"] not in powered:
            t0, j0 = last[key]
            series.setdefault(f"telemetry/{s['source']}/power_from_energy_w", []).append(
                (s["t"], (s["value"] - j0) / (s["t"] - t0)))
        last[key] = (s["t"], s["value"])
    return [p for tag, values in series.items() for p in binned(tag, values, sample_s)]


def binned(tag: str, values: list[tuple[float, float]], sample_s: float) -> list[Point]:
    """The mean of each ``sample_s`` bin of (t, value) pairs; step: the bin's start in ms of the TTA clock."""
    bins: dict[int, list[float]] = {}
    for t, v in values:
        bins.setdefault(int(t // sample_s), []).append(v)
    return [Point(tag, round(b * sample_s * 1000), sum(vs) / len(vs), b * sample_s) for b, vs in sorted(bins.items())]


def add_tta(series: RunSeries, rows: list[dict]) -> None:
    """``tta_table``'s rows of the run as summary values (``tta/METRIC_TARGET_min`` and its epochs,
    the error at the TTA), the run's TFLOPS, MFU and energy to accuracy; a target never reached
    is a tag saying so (NA is no number)."""
    for row in rows:
        name = f"tta/{row['metric']}_{row['target']:g}"
        if row["minutes"] is None:
            series.tags[name] = "not reached"
            continue
        series.summary[f"{name}_min"] = row["minutes"]
        series.summary[f"{name}_epochs"] = row["epochs to target"]
        for key, suffix in (("error at TTA", "error"), ("error 95% low", "error_lo"), ("error 95% high", "error_hi"),
                            ("energy to accuracy kWh", "energy_kwh")):
            if row.get(key) is not None:
                series.summary[f"{name}_{suffix}"] = row[key]
    first = rows[0] if rows else {}
    for key, name in (("TFLOPS", "tflops"), ("MFU %", "mfu_pct")):
        if first.get(key) is not None:
            series.summary[name] = first[key]
    series.tags.update({"workload": str(first.get("workload")), "machine": str(first.get("machine"))})


def safe_name(name: str) -> str:
    """A key both tools accept: MLflow allows letters, digits and ``_-. /`` only (a source ``gpu:0``)."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)
