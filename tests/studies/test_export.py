"""``speechperf export``: the session's trained run into TensorBoard and MLflow, read back with
each tool's own reader (TensorBoard's EventAccumulator, MLflow's client on a file store): one
point per epoch per error rate with its interval, the TTA as ``tta`` computes it, the
configuration as parameters, telemetry, the report; a second export replaces the first."""
import json
import time

import pytest

from speechperf import metric
from speechperf.cli import main
from speechperf.results.view import RunView
from speechperf.studies.export.collect import ExportError, Point, flatten, sample_points
from speechperf.studies.tta import tta_table
from tests.conftest import cli

TARGET = 90.0  # the tiny run's CER reaches it (it never reaches the paper's 10)
EPOCHS = 1  # the TTA's median of the last 1 epoch: the tiny run trains 2 (a median of 3 needs 3)
EXPORT = ["--targets", f"{TARGET:g}", "--epochs", str(EPOCHS), "--sample-s", "0.1", "--json"]


def recorded(run_folder):
    """The run's own rows, as the tests expect them back."""
    with RunView.open(run_folder) as run:
        return run.run_id, run.rows.evals(), run.rows.iterations(), run.config


def expected_tta(run_folder) -> float:
    (row,) = tta_table([run_folder], targets=f"{TARGET:g}", epochs=EPOCHS)
    assert row["minutes"] is not None  # the test is about a reached target
    return row["minutes"]


def held_columns(evals) -> list[str]:
    return [c for m in metric.METRICS.values() for c in m.columns if evals[0].get(c) is not None]


def test_tensorboard_holds_each_epochs_error_rates_the_tta_and_a_second_export_replaces_the_first(tiny_run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    run_id, evals, iterations, config = recorded(tiny_run)
    out = tmp_path / "tb"
    first = json.loads(cli("export", tiny_run, "--tensorboard", out, *EXPORT, check=True).stdout)
    again = json.loads(cli("export", tiny_run, "--tensorboard", out, *EXPORT, check=True).stdout)
    assert [r["replaced"] for r in first + again] == [False, True]
    assert len(list((out / run_id).glob("events.out.tfevents.*"))) == 1
    acc = EventAccumulator(str(out / run_id), size_guidance={"scalars": 0})
    acc.Reload()
    columns = held_columns(evals)
    assert {metric.DEFAULT_TARGET, f"{metric.DEFAULT_TARGET}_lo", f"{metric.DEFAULT_TARGET}_hi"} <= set(columns)
    for column in columns:  # one point per epoch, its value the database's (float32 in events)
        points = acc.Scalars(f"valid/{column}")
        assert [p.step for p in points] == [e["epoch"] for e in evals]
        assert [p.value for p in points] == pytest.approx([e[column] for e in evals], rel=1e-6)
    assert [p.step for p in acc.Scalars("train/loss")] == [r["iteration"] for r in iterations]
    (tta,) = acc.Scalars(f"tta/{metric.DEFAULT_TARGET}_{TARGET:g}_min")
    assert tta.value == pytest.approx(expected_tta(tiny_run), rel=1e-6)
    assert acc.Scalars("mfu_pct")[0].value > 0
    assert any(t.startswith("telemetry/cpu/") for t in acc.Tags()["scalars"])
    start = HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["model.name"].string_value == config["model"]["name"]  # the config


def test_mlflow_holds_one_run_with_each_epoch_the_tta_the_config_and_the_report(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store (the export opts in itself)
    from mlflow import MlflowClient

    run_id, evals, iterations, config = recorded(tiny_run)
    uri = f"file:{tmp_path / 'mlruns'}"
    for _ in range(2):  # the second replaces the first
        cli("export", tiny_run, "--mlflow", uri, "--experiment", "tiny", *EXPORT, check=True)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tiny")
    (found,) = client.search_runs([exp.experiment_id])  # active runs only: the first export's is deleted
    rid = found.info.run_id
    assert found.data.tags["speechperf.run_id"] == run_id and found.info.status == "FINISHED"
    for column in held_columns(evals):
        history = sorted(client.get_metric_history(rid, f"valid/{column}"), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(e["epoch"], pytest.approx(e[column])) for e in evals]
    assert len(client.get_metric_history(rid, "train/loss")) == len(iterations)
    assert found.data.metrics[f"tta/{metric.DEFAULT_TARGET}_{TARGET:g}_min"] == pytest.approx(expected_tta(tiny_run))
    assert found.data.params["model.name"] == config["model"]["name"]
    assert found.data.params["train.seed"] == str(config["train"]["seed"])
    assert "report/index.html" in [f.path for f in client.list_artifacts(rid, "report")]


def test_a_sigterm_while_the_report_is_built_stops_the_export_and_removes_its_folder(tiny_run, tmp_path):
    """SIGTERM to the export's process group while it builds the report it logs to MLflow: exit
    143, said, the report's temporary folder gone."""
    import os

    from tests.conftest import cli_start, sigterm_when_ready

    env = {**os.environ, "TMPDIR": str(tmp_path), "MLFLOW_ALLOW_FILE_STORE": "true"}
    p = cli_start("export", tiny_run, "--mlflow", f"file:{tmp_path / 'mlruns'}", *EXPORT, session=True, fresh=True,
                  env=env)
    rc, err = sigterm_when_ready(p, lambda: bool(list(tmp_path.glob("speechperf-export-*"))))
    assert rc == 143, err[-2000:]
    assert "speechperf: error: stopped by SIGTERM" in err and "Traceback" not in err
    assert not list(tmp_path.glob("speechperf-export-*"))


def test_a_target_never_reached_is_said_not_drawn(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    cli("export", tiny_run, "--mlflow", uri, "--no-report", "--targets", "1", "--epochs", str(EPOCHS), check=True)
    (found,) = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("speechperf").experiment_id])
    assert found.data.tags[f"tta/{metric.DEFAULT_TARGET}_1"] == "not reached"
    assert not [k for k in found.data.metrics if k.startswith("tta/")]


@pytest.mark.parametrize("missing, extra", [("torch.utils.tensorboard", "tensorboard"), ("mlflow", "mlflow")])
def test_without_its_extra_the_command_names_the_extra_and_exits_2(tmp_path, monkeypatch, capsys,
                                                                    missing, extra):
    monkeypatch.setitem(__import__("sys").modules, missing, None)  # import raises ImportError
    where = ["--tensorboard", str(tmp_path / "tb")] if extra == "tensorboard" else ["--mlflow", f"file:{tmp_path}"]
    assert main(["export", str(tmp_path / "run"), *where]) == 2  # refused before any run is read
    err = capsys.readouterr().err
    assert f"speechperf[{extra}]" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, says", [([], "needs a destination"), (["--sample-s", "0"], "--sample-s 0")])
def test_bad_input_is_one_line_and_exit_2(tiny_run, tmp_path, capsys, args, says):
    where = [] if not args else ["--tensorboard", str(tmp_path / "tb")]
    assert main(["export", str(tiny_run), *where, *args]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "tb").exists() or not any((tmp_path / "tb").iterdir())


def test_a_folder_that_is_no_run_is_refused_before_anything_is_written(tiny_run, tmp_path, capsys):
    assert main(["export", str(tiny_run), str(tmp_path / "nothing"), "--tensorboard", str(tmp_path / "tb")]) == 2
    assert "nothing" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists()  # a refused export makes no folder (issue 61: it left an empty one)


def test_a_destination_that_is_a_file_is_refused_before_anything_is_made(tmp_path, capsys):
    import os

    (tmp_path / "f").write_text("not a folder")
    os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
    for where, says in ((["--tensorboard", str(tmp_path / "f")], f"--tensorboard: cannot write into {tmp_path / 'f'}"),
                        (["--tensorboard", str(tmp_path / "f" / "tb")], f"cannot make {tmp_path / 'f' / 'tb'} in"),
                        (["--mlflow", f"file:{tmp_path / 'f'}"], f"--mlflow file:{tmp_path / 'f'}: cannot write into"),
                        (["--mlflow", str(tmp_path / "f" / "mlruns")], "it is a file, not a folder")):
        assert main(["export", str(tmp_path / "nothing"), *where]) == 2  # before any run is read
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # nothing made: no mlruns, no experiment


def _can_mount() -> bool:
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(__import__("os").geteuid() == 0 and not _can_mount(),
                    reason="as root a read-only folder needs a read-only mount (unshare -m)")
def test_a_read_only_destination_is_refused_by_name_and_no_experiment_is_made(tiny_run, tmp_path):
    """As a user, a folder without write permission; as root (who writes anywhere), a read-only
    tmpfs in a private mount namespace. Was a traceback, exit 1, after MLflow made its experiment."""
    import os
    import subprocess
    import sys

    ro = tmp_path / "ro"
    (ro / "mlruns").mkdir(parents=True)
    wheres = (["--tensorboard", str(ro / "tb")], ["--mlflow", f"file:{ro / 'mlruns'}"], ["--mlflow", str(ro / "new")])
    exports = [[sys.executable, "-m", "speechperf", "export", str(tiny_run), *where] for where in wheres]
    if os.geteuid() != 0:
        ro.chmod(0o555)
        (ro / "mlruns").chmod(0o555)
        done = [subprocess.run(cmd, capture_output=True, text=True, timeout=300) for cmd in exports]
        codes, err = [p.returncode for p in done], "".join(p.stderr for p in done)
    else:
        script = (f"mount -t tmpfs tmpfs {ro} && mkdir {ro / 'mlruns'} && mount -o remount,ro {ro} && "
                  + " ; ".join(" ".join(cmd) + " ; echo rc=$?" for cmd in exports))
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                           text=True, timeout=300)
        codes, err = [int(line[3:]) for line in p.stdout.splitlines() if line.startswith("rc=")], p.stderr
    assert codes == [2, 2, 2] and "Traceback" not in err, err
    assert f"--tensorboard: cannot make {ro / 'tb'} in {ro}: permission denied" in err
    assert f"--mlflow file:{ro / 'mlruns'}: cannot write into {ro / 'mlruns'}: permission denied" in err
    assert f"--mlflow {ro / 'new'}: cannot make {ro / 'new'} in {ro}" in err


def test_telemetry_is_binned_and_a_counter_becomes_power_within_its_segment():
    samples = [{"source": "cpu", "metric": "util_core_pct", "t": t, "value": v, "segment": 1.0}
               for t, v in ((0.01, 10.0), (0.05, 30.0), (0.12, 50.0))]
    samples += [{"source": "rapl:package-0", "metric": "energy_j", "t": t, "value": j, "segment": seg}
                for t, j, seg in ((0.0, 100.0, 1.0), (0.15, 105.0, 1.0), (0.25, 3.0, 2.0), (0.35, 7.0, 2.0))]
    points = sample_points(samples, 0.1)
    assert points[:2] == [Point("telemetry/cpu/util_core_pct", 0, 20.0, 0.0),
                          Point("telemetry/cpu/util_core_pct", 100, 50.0, 0.1)]
    power = [(p.step, p.value) for p in points if p.tag == "telemetry/rapl:package-0/power_from_energy_w"]
    assert power == [(100, pytest.approx(5 / 0.15)), (300, pytest.approx(40.0))]  # no power across the restart


def test_config_is_flattened_to_dotted_names():
    assert flatten({"model": {"name": "ds2", "layers": 2}, "splits": ["a"], "none": None}) == {
        "model.name": "ds2", "model.layers": 2, "splits": '["a"]', "none": "null"}


def test_export_error_is_bad_input():
    assert ExportError("x").exit_code == 2


def test_a_run_still_training_exports_its_rows_so_far_and_stays_running_in_mlflow(tiny_run, tmp_path, monkeypatch):
    """Recorded running while a process holds the folder's lock (results/lock.py): RUNNING; the same
    rows with no process left (a SIGKILLed run: nobody will ever record its end): KILLED."""
    import shutil
    import sqlite3
    import subprocess
    import sys

    from mlflow import MlflowClient

    from speechperf.studies.export.exporter import export_runs

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    partial = tmp_path / "partial"
    shutil.copytree(tiny_run, partial)
    (partial / "summary.json").unlink()  # no summary: not finished
    with sqlite3.connect(partial / "results.db") as db:  # as the loop leaves it mid-run
        db.execute("UPDATE runs SET status = 'running'")
        db.execute("DELETE FROM evals WHERE epoch > 1 OR final = 1")
    log = (partial / "events.log").read_text().splitlines(keepends=True)  # the log as far as epoch 1's evaluation
    first_eval = next(i for i, line in enumerate(log) if '"key": "eval_accuracy"' in line)
    (partial / "events.log").write_text("".join(log[: first_eval + 1]))
    uri = f"file:{tmp_path / 'mlruns'}"
    hold = "import fcntl, os, sys, time\nfcntl.lockf(os.open(sys.argv[1], os.O_RDWR), fcntl.LOCK_EX)\n"
    holder = subprocess.Popen([sys.executable, "-c", hold + "print(flush=True)\ntime.sleep(120)",
                               str(partial / ".speechperf.lock")], stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()  # the lock is held: a training process
        (row,) = export_runs([partial], mlflow=uri, report=False, targets=f"{TARGET:g}", epochs=EPOCHS)
    finally:
        holder.kill()
        holder.wait()
    assert row["to"] == "mlflow" and row["replaced"] is False
    client = MlflowClient(tracking_uri=uri)
    (found,) = client.search_runs([client.get_experiment_by_name("speechperf").experiment_id])
    assert found.info.status == "RUNNING" and found.data.tags["status"] == "running"
    export_runs([partial], mlflow=uri, report=False, targets=f"{TARGET:g}", epochs=EPOCHS)  # its process gone
    (found,) = client.search_runs([client.get_experiment_by_name("speechperf").experiment_id])
    assert found.info.status == "KILLED" and found.data.tags["status"] == "running"
    assert [m.step for m in client.get_metric_history(found.info.run_id, f"valid/{metric.DEFAULT_TARGET}")] == [1]
    assert not [k for k in found.data.metrics if k.startswith("final/")]


def test_an_unusable_mlflow_uri_or_deleted_experiment_refuses_before_tensorboard_gets_anything(tiny_run, tmp_path,
                                                                                               monkeypatch, capsys):
    from mlflow import MlflowClient

    tb = tmp_path / "tb"
    assert main(["export", str(tiny_run), "--tensorboard", str(tb), "--mlflow", "bogus://x"]) == 2
    assert "MLflow at 'bogus://x'" in capsys.readouterr().err
    began = time.monotonic()  # a server that does not answer: said within seconds, not MLflow's minutes of retries
    assert main(["export", str(tiny_run), "--tensorboard", str(tb), "--mlflow", "http://127.0.0.1:9"]) == 2
    assert "MLflow at 'http://127.0.0.1:9'" in capsys.readouterr().err and time.monotonic() - began < 60
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    client = MlflowClient(tracking_uri=uri)
    client.delete_experiment(client.create_experiment("gone"))
    assert main(["export", str(tiny_run), "--tensorboard", str(tb), "--mlflow", uri, "--experiment", "gone"]) == 2
    err = capsys.readouterr().err
    assert "'gone'" in err and "is deleted" in err
    assert not list(tb.rglob("events.out.tfevents.*"))
