"""``bench scale``'s rows for the transducer and the attention encoder-decoder at a tiny size: the
objective's own step, the FLOPs behind the MFU against torch's counter, the estimate beside the peak."""
from __future__ import annotations

import json

import pytest
import torch

from speechperf.bench import scale
from speechperf.cli import main
from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.hardware import measured_peak
from speechperf.hardware.mfu import count_step_flops

ENCODER = ["model.d_model=32", "model.layers=1", "model.heads=2", "model.subsampling_channels=8"]
TINY = {"parakeet-rnnt-sizes": [*ENCODER, "model.pred_dim=16", "model.pred_layers=1", "model.joint_dim=16"],
        "canary-aed-sizes": [*ENCODER, "model.dec_layers=1", "model.dec_heads=2"]}


@pytest.fixture
def known_peak(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEECHPERF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measured_peak, "measure_gemm", lambda threads, dtype="fp32": {
        "tflops": 0.1, "n": 1024, "threads": threads, "dtype": dtype, "at": "now", "others_busy_pct": 0.0,
        "library": "torch.mm"})


@pytest.mark.parametrize("workload", TINY)
def test_bench_scale_measures_each_objective_end_to_end(workload, known_peak, capsys):
    assert main(["bench", "scale", "--workloads", workload, "--batch-seconds", "20", "--steps", "1", "--warmup", "0",
                 "--json", *TINY[workload]]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "ok" and row["workload"] == workload and row["utterances"] >= 1
    assert row["audio_s_per_s"] > 0 and row["mfu_pct"] > 0 and row["nemo_params_m"] > row["params_m"]
    assert 0.75 < row["estimate_ratio"] < 1.25 and row["peak_gb"] > 0  # at one block what no rule counts weighs more


@pytest.mark.parametrize("workload", TINY)
def test_the_mfu_numerator_is_torchs_count_of_the_training_step(workload):
    cfg = load_preset(workload, [*TINY[workload], "model.dropout=0", "model.attention_dropout=0"]).model
    torch.manual_seed(0)
    model = build_model(cfg)
    for frames, labels in ((160, 9), (211, 30)):
        assert scale.utterance_flops(cfg, frames, labels) == count_step_flops(model, [frames], 93, [labels])


def test_the_default_workloads_are_the_three_objective_families():
    names = {load_preset(w).model.name for w in scale.WORKLOADS}
    assert names == {"fastconformer", "transducer", "aed"}
