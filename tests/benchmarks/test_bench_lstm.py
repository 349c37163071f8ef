"""benchmarks/bench_lstm.py: one LSTM layer at the gpu preset's widths and at widths cuDNN may run
persistently, each against the preset's layer of its kind at the same batch; bad input exits 2."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_lstm", ROOT / "benchmarks" / "bench_lstm.py")
bl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bl)


def test_a_small_cpu_run_gives_every_row_against_the_preset(capsys):
    assert bl.main(["--device", "cpu", "--scale", "8", "--frames", "12", "--batches", "8", "16", "--repeats", "1",
                    "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = got["rows"]
    assert [(r["input"], r["hidden"], r["batch"]) for r in rows] == [
        (75, 100, 8), (100, 100, 8), (80, 96, 8), (96, 96, 8), (75, 100, 16), (100, 100, 16), (80, 96, 16), (96, 96, 16)]
    assert all(r["vs preset"] == 1.0 for r in rows if (r["input"], r["hidden"]) in ((75, 100), (100, 100)))
    assert all(r["ms"] > 0 and r["min ms"] <= r["ms"] <= r["max ms"] for r in rows)
    assert all(r["kernels"] is None and not r["persistent eligible"] for r in rows)  # a CPU: no kernels, no cuDNN
    assert "fp32, CPU" in got["head"]


def test_bad_input_exits_2(capsys):
    assert bl.main(["--device", "cpu", "--frames", "0"]) == 2
    assert bl.main(["--device", "cpu", "--precision", "fp16"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
