"""A tiny training run records its model FLOPs per iteration and its TFLOPS and MFU in
summary.json, and ``tta --json`` shows them."""
import json
import math

from speechperf.cli import main
from speechperf.config import load_preset
from speechperf.hardware.mfu import flop_model
from speechperf.results import ResultsDB
from speechperf.train.loop import TrainRequest, train


def test_run_summary_and_tta_row_hold_mfu(tiny_features, tmp_path, capsys):
    run = tmp_path / "run"
    summary = train(TrainRequest("tiny", tiny_features, run, ["max_epochs=1", "threads=1"], quiet=True))
    assert summary == json.loads((run / "summary.json").read_text())
    assert math.isfinite(summary["tflops"]) and summary["tflops"] > 0
    assert 0 < summary["mfu_pct"] <= 100
    assert summary["peak_tflops"] > 0 and summary["peak_source"].startswith("measured fp32 GEMM")
    assert summary["model_flops_steps"] == summary["iterations"]

    fm = flop_model(load_preset("tiny").model)  # ds2: linear in length, so a batch is a B + b frames
    assert fm.c == 0.0
    with ResultsDB(run / "results.db", readonly=True) as db:
        rows = db.query("SELECT batch_size, frames, step_s, model_flops FROM iterations ORDER BY iteration")
    assert [r["model_flops"] for r in rows] == [fm.a * r["batch_size"] + fm.b * r["frames"] for r in rows]
    total = sum(r["model_flops"] for r in rows) / sum(r["step_s"] for r in rows)
    assert math.isclose(summary["tflops"], total / 1e12, rel_tol=1e-9)

    capsys.readouterr()
    assert main(["tta", str(run), "--targets", "100", "--epochs", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["runs"][0]
    assert row["TFLOPS"] == summary["tflops"] and row["MFU %"] == summary["mfu_pct"]
    assert row["peak source"] == summary["peak_source"]
    assert main(["tta", str(run), "--targets", "100", "--epochs", "1"]) == 0
    assert "MFU %" in capsys.readouterr().out


def test_a_summary_above_its_peak_shows_no_mfu_and_says_why(tiny_run, tmp_path, capsys):
    """A run written before the check, whose CPU peak was measured on a busy machine (a demo read
    MFU 204%): the table shows no MFU and a note under it names the run and why."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    summary = json.loads((run / "summary.json").read_text())
    summary.update(tflops=0.0415, mfu_pct=204.2, peak_tflops=0.0203)
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["tta", str(run), "--targets", "100", "--epochs", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["runs"][0]
    assert row["MFU %"] is None and row["MFU note"].startswith("no MFU: the steps achieved 0.0415 TFLOPS, above")
    assert main(["tta", str(run), "--targets", "100", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    said = " ".join(out.split())  # the narrow table's notes, wrapped at 100 columns
    assert f"{row['run']}: no MFU: the steps achieved 0.0415 TFLOPS" in said
    assert said.count("no MFU:") == 1  # once, whatever else a note says (a busy machine adds its own)


def test_rank_0_samples_the_gpus_its_run_uses(tiny_features, tmp_path, monkeypatch):
    """The trainer names its node's GPUs by UUID (telemetry/device_gpus.py) and rank 0's sampler reads
    those, not every GPU of the node (a stand-in driver here), and the summary says which."""
    from speechperf.train import machine_record, trainer

    from speechperf.telemetry.device_gpus import RunGpu
    from tests.telemetry.test_sampler import UuidNVML  # a node of two GPUs, UUIDs aaaa-0 and bbbb-1

    asked = []
    monkeypatch.setattr(trainer, "run_gpus", lambda device, local_world: asked.append(
        (str(device), local_world)) or [RunGpu("bbbb-1", None)])
    real = machine_record.Sampler
    monkeypatch.setattr(machine_record, "Sampler", lambda pid, run_gpus=None: real(pid, nvml=UuidNVML(),
                                                                                   run_gpus=run_gpus))
    summary = train(TrainRequest("tiny", tiny_features, tmp_path / "run", ["max_epochs=1", "threads=1"], quiet=True))
    assert asked == [("cpu", 1)]
    assert summary["sampled_gpus"] == {"sources": ["gpu1"], "selection": None}  # the run's GPU alone, said

