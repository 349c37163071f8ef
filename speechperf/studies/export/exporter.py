"""``speechperf export RUN... --tensorboard DIR --mlflow URI``: finished or partial run folders
into the tools runs are watched in (docs/export.md).

An export of run folders, not a hook in the training loop: the folder is the source of truth
(a run from another machine, or one still training, exports the same way), and the loop
imports neither optional library. Every run given is read before anything is written, so a
bad folder leaves both destinations as they were.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

from speechperf.children import sigterm_stops
from speechperf.metric import DEFAULT_TARGET
from speechperf.studies.export import mlflow_writer, tensorboard_writer
from speechperf.studies.export.collect import ExportError, collect
from speechperf.studies.report.html import build_report

EXPERIMENT = "speechperf"  # the MLflow experiment where none is named
SAMPLE_S = 1.0  # telemetry bins, s: 3,600 points an hour per series


def export_runs(runs: Sequence[Path], tensorboard: Path | None = None, mlflow: str | None = None,
                experiment: str = EXPERIMENT, metric: str = DEFAULT_TARGET, targets="paper", epochs: int = 3,
                sample_s: float = SAMPLE_S, report: bool = True) -> list[dict]:
    """Export each run to TensorBoard (events under ``tensorboard/RUN_ID``) and/or MLflow (a run of
    ``experiment`` at the tracking URI ``mlflow``, with the run's HTML report as an artifact unless
    ``report`` is False); one row per run and destination. ``metric``, ``targets``, ``epochs``: the
    TTA's, as ``tta`` takes them. An earlier export of the same run is replaced in either place."""
    if tensorboard is None and mlflow is None:
        raise ExportError("export needs a destination: --tensorboard DIR and/or --mlflow URI")
    if not sample_s > 0:
        raise ExportError(f"--sample-s {sample_s}: the telemetry bin must be a positive number of seconds")
    if tensorboard is not None:
        tensorboard_writer.require()
        check_folder(Path(tensorboard), "--tensorboard")
    if mlflow is not None:
        mlflow_writer.require()
        store = mlflow_writer.file_store(mlflow)
        if store is not None:  # MLflow's file store: a folder, checked as the TensorBoard one is
            check_folder(store, f"--mlflow {mlflow}")
    every = [collect(Path(r), metric, targets, epochs, sample_s) for r in runs]  # all read before any is written
    opened = mlflow_writer.Experiment(mlflow, experiment) if mlflow is not None else None  # a bad URI: nothing written
    rows = []
    for series in every:
        if tensorboard is not None:
            rows.append(tensorboard_writer.write(series, Path(tensorboard)))
        if opened is not None:
            rows.append(to_mlflow(series, opened, report, metric, targets))
    return rows


def to_mlflow(series, experiment: mlflow_writer.Experiment, report: bool, metric: str, targets) -> dict:
    """The MLflow run of ``series``, its report built for it alone into a folder that goes once logged."""
    if not report:
        return experiment.write(series, None)
    with sigterm_stops(), tempfile.TemporaryDirectory(prefix="speechperf-export-") as tmp:  # SIGTERM: removed too
        build_report([series.folder], Path(tmp), targets=targets, metric=metric)
        return experiment.write(series, Path(tmp))


def check_folder(out: Path, option: str) -> None:
    """A destination folder that the export can write, asked before anything is read or made
    (a refused export leaves no folder behind): an existing one must be a writable folder, a
    missing one must be creatable in the nearest folder above it that exists; a file, a
    read-only place, or a file on the way is refused by name. The writers make it."""
    if out.exists():
        place, made = out, "write into"
    else:
        place = next((p for p in out.parents if p.exists()), Path("."))
        made = f"make {out} in"
    if not place.is_dir():
        raise ExportError(f"{option}: cannot {made} {place}: it is a file, not a folder")
    if not os.access(place, os.W_OK | os.X_OK):
        raise ExportError(f"{option}: cannot {made} {place}: permission denied (a read-only folder)")
