"""A :class:`~speechperf.studies.export.collect.RunSeries` as TensorBoard events, written with
torch's own ``SummaryWriter`` (it needs the ``tensorboard`` package: the ``tensorboard`` extra).

Each run goes to ``DIR/RUN_ID`` (the run id: unique and the same on every machine), which
TensorBoard lists as one run. An export replaces what an earlier export of the same run wrote
there (its ``events.out.tfevents.*`` files; nothing else in the folder is touched): a partial
run exported again shows its newer rows once, never twice.
"""
from __future__ import annotations

from pathlib import Path

from speechperf.studies.export.collect import ExportError, RunSeries, safe_name

EVENTS_GLOB = "events.out.tfevents.*"  # the files SummaryWriter writes (and TensorBoard reads)


def require() -> None:
    """Refuse (exit 2, before any run is read) where the ``tensorboard`` package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401  torch's module imports tensorboard
    except ImportError as e:
        raise ExportError(f"--tensorboard needs the tensorboard package ({e}): "
                          "pip install 'speechperf[tensorboard]'") from None


def write(series: RunSeries, out: Path) -> dict:
    """Write ``series`` under ``out/RUN_ID``; returns the row the command prints."""
    from torch.utils.tensorboard import SummaryWriter  # here: the extra is optional (require() checked it)

    folder = Path(out) / safe_name(series.run_id)
    replaced = clear(folder)
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for p in series.points:
            writer.add_scalar(safe_name(p.tag), p.value, global_step=p.step, walltime=walltime(series, p.clock_s))
        last = walltime(series, max((p.clock_s for p in series.points if p.clock_s is not None), default=0.0))
        for name, value in series.summary.items():  # one point each, at step 0
            writer.add_scalar(safe_name(name), value, global_step=0, walltime=last)
        write_hparams(writer, series)
    finally:
        writer.close()
    return {"run": series.label, "to": "tensorboard", "where": str(folder), "points": len(series.points),
            "summary values": len(series.summary), "parameters": len(series.params), "replaced": replaced}


def walltime(series: RunSeries, clock_s: float | None) -> float:
    """The run's start plus the TTA clock: TensorBoard's Relative axis then reads the TTA clock."""
    return series.started_at + (clock_s or 0.0)


def clear(folder: Path) -> bool:
    """Remove an earlier export's event files from ``folder``; whether there were any."""
    old = sorted(folder.glob(EVENTS_GLOB)) if folder.is_dir() else []
    for path in old:
        path.unlink()
    return bool(old)


def write_hparams(writer, series: RunSeries) -> None:
    """The configuration and the run's words (status, machine, NA targets) as the HParams
    dashboard's session, its summary values as the session's metrics (their scalars are above)."""
    from torch.utils.tensorboard.summary import hparams  # the optional extra (require() checked it)

    values = {**series.params, **series.tags}
    metrics = {safe_name(name): value for name, value in series.summary.items()}
    for summary in hparams(values, metrics):
        writer.file_writer.add_summary(summary)
