"""A :class:`~speechperf.studies.export.collect.RunSeries` as one MLflow run (the ``mlflow``
extra: mlflow-skinny is enough), through ``MlflowClient`` at a tracking URI.

The MLflow run is named by the run's label and tagged ``speechperf.run_id``. An export replaces
the experiment's earlier MLflow run of the same run id (deleted, then logged anew): MLflow keeps
every logged point of a metric and refuses a parameter logged again with another value, so
appending would double the curves of a partial run exported twice.

A ``file:`` URI (or a plain folder) is MLflow's file store, which MLflow 3 keeps in maintenance
mode and refuses unless ``MLFLOW_ALLOW_FILE_STORE=true``: naming one is that opt-in, so the
export sets it for its own calls. mlflow-skinny has no SQL store (``sqlite:`` needs sqlalchemy,
which full ``mlflow`` brings); a tracking server (``http://``) needs nothing more.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from speechperf.errors import in_words
from speechperf.studies.export.collect import ExportError, RunSeries, safe_name

RUN_ID_TAG = "speechperf.run_id"
PARAMS_PER_CALL, METRICS_PER_CALL = 100, 1000  # log_batch's limits
# speechperf's statuses (the runs table) as MLflow's; "running" is RUNNING or KILLED (mlflow_status)
STATUS = {"success": "FINISHED", "time_cap": "FINISHED", "max_epochs": "FINISHED"}


def require() -> None:
    """Refuse (exit 2, before any run is read) where mlflow is missing."""
    try:
        import mlflow  # noqa: F401  the optional extra: checked here
    except ImportError as e:
        raise ExportError(f"--mlflow needs MLflow ({e}): pip install 'speechperf[mlflow]'") from None


@contextmanager
def environment(**values: str):
    """MLflow's settings (environment variables, read at each call) while the block runs; a
    variable the user set is kept."""
    added = [name for name in values if name not in os.environ]
    os.environ.update({name: values[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def file_store_allowed(uri: str):
    """MLflow 3's opt-in to its file store, for a ``file:`` URI or a folder only."""
    return environment(**({"MLFLOW_ALLOW_FILE_STORE": "true"} if urlparse(uri).scheme in ("", "file") else {}))


def file_store(uri: str) -> Path | None:
    """The folder of a file-store URI (``file:/x/mlruns``, ``file:///x``, a plain path); None for a
    tracking server or a database."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    return Path(url2pathname(parsed.path) if parsed.scheme == "file" else uri)


# The first call to a tracking server: MLflow's defaults retry an unreachable one for minutes (7 retries with
# backoff, 120 s timeouts: still waiting after 200 s here); the export's first call says so within seconds.
FIRST_CALL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


class Experiment:
    """An MLflow experiment at a tracking URI, opened (made where missing) before any run is
    written, so that an unusable URI refuses the export before TensorBoard gets anything."""

    def __init__(self, uri: str, name: str):
        from mlflow import MlflowClient  # here: the extra is optional (require() checked it)

        self.uri, self.name = uri, name
        with self.calls():
            self.client = MlflowClient(tracking_uri=uri)
            with environment(**FIRST_CALL):
                exp = self.client.get_experiment_by_name(name)
            if exp is not None and exp.lifecycle_stage != "active":
                raise ExportError(f"MLflow experiment {name!r} at {uri!r} is deleted: restore it "
                                  "(mlflow experiments restore) or name another with --experiment")
            self.id = exp.experiment_id if exp is not None else self.client.create_experiment(name)

    @contextmanager
    def calls(self):
        """MLflow's calls: its file store allowed for a file URI, its errors one line (exit 2)."""
        from mlflow.exceptions import MlflowException  # the optional extra (require() checked it)

        with file_store_allowed(self.uri):
            try:
                yield
            except MlflowException as e:
                raise ExportError(f"MLflow at {self.uri!r}: {in_words(e)}") from None

    def write(self, series: RunSeries, report: Path | None) -> dict:
        """Log ``series`` (and the folder ``report``, as the artifact folder ``report``) as a run of
        the experiment; returns the row the command prints."""
        with self.calls():
            replaced = delete_earlier(self.client, self.id, series.run_id)
            run_id = log_run(self.client, self.id, series, report)
        return {"run": series.label, "to": "mlflow", "where": f"{self.uri} experiment {self.name!r} run {run_id}",
                "points": len(series.points), "summary values": len(series.summary),
                "parameters": len(series.params), "replaced": replaced}


def delete_earlier(client, exp_id: str, run_id: str) -> bool:
    """Delete the experiment's MLflow runs of ``run_id`` (an earlier export); whether there were any."""
    old = client.search_runs([exp_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")
    for run in old:
        client.delete_run(run.info.run_id)
    return bool(old)


def log_run(client, exp_id: str, series: RunSeries, report: Path | None) -> str:
    """Create the MLflow run and log everything into it; its MLflow id."""
    from mlflow.entities import Metric, Param  # the optional extra (require() checked it)

    tags = {safe_name(k): v for k, v in series.tags.items()}
    run = client.create_run(exp_id, run_name=series.label, start_time=ms(series.started_at),
                            tags={**tags, RUN_ID_TAG: series.run_id})
    rid = run.info.run_id
    # values as config.json spells them (true, not Python's True)
    params = [Param(safe_name(k), v if isinstance(v, str) else json.dumps(v)) for k, v in series.params.items()]
    for i in range(0, len(params), PARAMS_PER_CALL):
        client.log_batch(rid, params=params[i:i + PARAMS_PER_CALL])
    end = series.started_at + max((p.clock_s for p in series.points if p.clock_s is not None), default=0.0)
    metrics = [Metric(safe_name(p.tag), float(p.value), ms(series.started_at + (p.clock_s or 0.0)), p.step)
               for p in series.points]
    metrics += [Metric(safe_name(k), float(v), ms(end), 0) for k, v in series.summary.items()]
    for i in range(0, len(metrics), METRICS_PER_CALL):
        client.log_batch(rid, metrics=metrics[i:i + METRICS_PER_CALL])
    if report is not None:
        client.log_artifacts(rid, str(report), "report")
    status = mlflow_status(series)
    if status != "RUNNING":  # a run still training stays RUNNING: unfinished
        client.set_terminated(rid, status, end_time=ms(end))
    return rid


def mlflow_status(series: RunSeries) -> str:
    """MLflow's status of the run: FINISHED (ended by its own rule), FAILED (diverged, failed),
    RUNNING (recorded running and a process trains it), KILLED (recorded running, and no process
    holds its folder: SIGKILLed, the machine lost, before it could record its end)."""
    status = series.tags.get("status", "")
    if status in STATUS:
        return STATUS[status]
    if status.startswith(("diverged", "failed")):
        return "FAILED"
    return "KILLED" if status == "running" and not series.training else "RUNNING"


def ms(unix_s: float) -> int:
    return int(round(unix_s * 1000))
