"""benchmarks/bench_dropout.py: the step with speechperf's dropout against torch's, one model swapping its
dropout modules, and a run through the suite's runner."""
import importlib
import json
import sys
from pathlib import Path

import torch.nn as nn

from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.models.dropout import Dropout
from tests.conftest import run_benchmark

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bench = importlib.import_module("bench_dropout")


def test_swap_makes_every_dropout_module_torchs_or_speechperfs_keeping_its_rate():
    model = build_model(load_preset("conformer-cpu").model)
    ours = [m for m in model.modules() if isinstance(m, Dropout)]
    assert ours and not any(type(m) is nn.Dropout for m in model.modules())
    assert bench.swap(model, torchs=True) == len(ours)
    theirs = [m for m in model.modules() if type(m) is nn.Dropout]
    assert len(theirs) == len(ours) and {m.p for m in theirs} == {0.1}
    assert not any(isinstance(m, Dropout) for m in model.modules())
    assert bench.swap(model, torchs=False) == len(ours) and not any(type(m) is nn.Dropout for m in model.modules())
    assert bench.swap(build_model(load_preset("tiny").model), torchs=True) == 0  # p 0: nothing to swap


def test_a_run_times_both_dropouts_and_prints_the_ratio(tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    assert run_benchmark("dropout", "--ledger", ledger, "--rounds", "1", "--precision", "fp32", "--threads", "1") == 0
    out = capsys.readouterr().out
    assert "cpu fp32: 1 dropout modules (p 0.05), batch 24 x " in out
    figures = json.loads(ledger.read_text().splitlines()[-1])["figures"]
    step = figures["fp32"]["step_s"]
    assert figures["ratio"] == step["speechperf"] / step["torch"] and set(figures["fp32"]["mask_s"]) == set(step)
