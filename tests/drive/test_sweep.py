"""``speechperf parallel sweep``: runs of ``speechperf train``, one per algorithm and worker
count, and its table against the one worker; run again, it only reports."""
import csv
import json
import sys

import pytest

from speechperf.cli import main
from speechperf.errors import SpeechperfError
from speechperf.cli.train_commands import sweep_request
from speechperf.drive import sweep
from speechperf.studies import speedups
from tests.conftest import cli, torchrun

SETS = ["--set", "max_epochs=1", "--set", "threads=1", "--set", "device=cpu", "--set", "final_splits=none"]


def _forked_launches(monkeypatch) -> list[list[str]]:
    """The sweep's ``python -m speechperf train`` and ``python -m torch.distributed.run`` commands
    started as conftest's cli() and torchrun() start them (forked from the preloaded server,
    torchrun's workers too, which its agent starts), with their command lines as given; the list
    of them returned."""
    commands, start = [], {"speechperf": cli, "torch.distributed.run": torchrun}

    def run(cmd, **kwargs):
        commands.append(cmd)
        env = kwargs.pop("env")
        assert cmd[:2] == [sys.executable, "-m"] and cmd[2] in start, cmd
        assert kwargs == {"capture_output": True, "text": True}, kwargs
        return start[cmd[2]](*cmd[3:], env=env)

    monkeypatch.setattr(sweep.subprocess, "run", run)
    return commands


@pytest.mark.timeout(600)
def test_a_sweep_trains_each_algorithm_through_train_and_tabulates_it(tiny_features, tmp_path, capsys, monkeypatch):
    launched = _forked_launches(monkeypatch)
    argv = ["--data", str(tiny_features), "--out", str(tmp_path / "sw"), "--algos", "sync,diloco", "--workers", "2",
            "--sync-every", "3", *SETS]
    rows = sweep.run_sweep(sweep_request(argv))
    by = {(r["algorithm"], r["workers"]): r for r in rows}
    assert [r["run"] for r in rows] == ["one-worker", "sync-n2", "diloco-n2-h3"]
    one, ddp, diloco = by[("sync", 1)], by[("sync", 2)], by[("diloco", 2)]
    assert one["speedup"] == 1 and one["comm %"] == 0 and one["sync every"] is None
    for r in (ddp, diloco):
        assert r["speedup"] > 0 and 0 < r["comm %"] < 100 and r["MFU %"] > 0 and r["status"] == "success"
        assert r["WER"] is not None and r["CER"] is not None and r["epochs"] == 1
    assert diloco["sync every"] == 3
    assert [c[2] for c in launched] == ["speechperf", "torch.distributed.run", "torch.distributed.run"]
    config = json.loads((tmp_path / "sw" / "diloco-n2-h3" / "config.json").read_text())
    assert (config["algo"]["name"], config["algo"]["sync_every"], config["train"]["stop"]["max_epochs"]) == ("diloco", 3, 1)
    checkpoints = {r["run"]: (tmp_path / "sw" / r["run"] / "checkpoint.pt").stat().st_mtime_ns for r in rows}
    # again, through the command: every run finished, none is trained (or recorded) twice, the same table
    assert main(["parallel", "sweep", *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(rows))
    assert {r: (tmp_path / "sw" / r / "checkpoint.pt").stat().st_mtime_ns for r in checkpoints} == checkpoints
    folders = [str(tmp_path / "sw" / r["run"]) for r in rows]  # the report shows the same table beside the runs
    assert main(["report", *folders, "--out", str(tmp_path / "rep")]) == 0
    table = list(csv.DictReader((tmp_path / "rep" / "algorithms.csv").open()))
    assert [(t["algorithm"], t["workers"]) for t in table] == [("sync", "1"), ("sync", "2"), ("diloco", "2")]
    assert float(table[2]["speedup"]) == pytest.approx(diloco["speedup"])


def test_the_grid_names_every_run_and_a_failed_run_says_how_to_continue(tiny_features, tmp_path):
    a = sweep_request(["--data", "F", "--out", "O", "--algos", "sync,bsp,bmuf", "--workers", "2,4",
                     "--sync-every", "1,20"])
    names = [name for name, _, _ in sweep.grid(a)]
    assert names == ["one-worker", "sync-n2", "sync-n4", "bsp-n2-h1", "bsp-n2-h20", "bsp-n4-h1", "bsp-n4-h20",
                     "bmuf-n2-h1", "bmuf-n2-h20", "bmuf-n4-h1", "bmuf-n4-h20"]
    with pytest.raises(SpeechperfError, match=r"one-worker x1: train failed \(exit 2\)(.|\n)*train.optim.lr=-1.0 must be > 0"
                                              "(.|\n)*the same sweep command continues it"):
        sweep.run_sweep(sweep_request(["--data", str(tiny_features), "--out", str(tmp_path / "bad"), "--set", "lr=-1"]))


def _loaded(label, algo, workers, step_s, comm_s, comm_bytes, cers, model="ds2", cpu="EPYC"):
    """A report.runs.load_run dict of a finished run: 2 epochs of 2 steps each, one evaluation an epoch."""
    return {"label": label, "workload": {"model": model, "params": 1000}, "workload_label": f"{model}, 0.001 M params",
            "summary": {"epochs": 2, "last_cer": cers[-1], "last_wer": 2 * cers[-1], "mfu_pct": 10.0,
                        "status": "success"},
            "config": {"train": {"stop": {"target": 30.0, "target_metric": "cer", "target_epochs": 1}},
                       "algo": {"name": algo, "sync_every": 20}},
            "env": {"world_size": workers, "cpu_model": cpu},
            "iterations": [{"step_s": step_s, "comm_s": comm_s, "comm_bytes": comm_bytes}] * 4,
            "evals": [{"clock_s": 60.0 * (e + 1), "cer": c} for e, c in enumerate(cers)]}


def test_the_report_table_compares_each_workloads_algorithms_with_its_one_process_run():
    runs = [_loaded("one", "sync", 1, 1.0, 0.0, 0, [40.0, 29.0]),
            _loaded("bmuf", "bmuf", 2, 0.5, 0.1, 2_000_000, [29.5, 25.0]),
            _loaded("alone", "sync", 1, 1.0, 0.0, 0, [40.0, 35.0], model="conformer")]  # nothing parallel: no rows
    one, bmuf = speedups.report_rows(runs)
    assert (one["run"], one["speedup"], one["comm %"], one["TTA min"], one["sync every"]) == ("one", 1.0, 0.0, 2.0, None)
    # 4 steps of 0.5 s over 2 epochs: 1 s an epoch against 2; 0.4 of 2 s communicating; 2 MB a step
    assert bmuf["train s/epoch"] == 1.0 and bmuf["speedup"] == 2.0 and bmuf["comm %"] == pytest.approx(20.0)
    assert bmuf["comm MB/step"] == 2.0 and bmuf["TTA min"] == 1.0 and bmuf["sync every"] == 20
    assert bmuf["workload"] == "ds2, 0.001 M params" and bmuf["algorithm"] == "bmuf" and bmuf["workers"] == 2
    assert speedups.report_rows(runs[:1] + runs[2:]) == []  # one-process runs only: no table
    no_base = speedups.report_rows(runs[1:2])
    assert no_base[0]["speedup"] is None  # no one-process run of the workload to divide by
    elsewhere = _loaded("xeon", "sync", 1, 0.1, 0.0, 0, [40.0, 29.0], cpu="Xeon")
    (row,) = speedups.report_rows([elsewhere, runs[1]])
    assert row["speedup"] is None and row["machine"] == "no GPU, EPYC"  # never divided by another machine's run


def test_a_free_port_has_its_neighbour_free_for_the_parameter_server():
    import socket

    port = sweep.free_port()
    for p in (port, port + 1):  # torchrun's store, then asgd/easgd's server (MASTER_PORT + 1)
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
