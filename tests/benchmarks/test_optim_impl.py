"""benchmarks/bench_optim_impl.py: the three optimizer implementations train the same numbers (why
``train.optim.impl`` stays out of a reference's recipe), and a run through the suite's runner."""
import importlib
import sys
from pathlib import Path

import torch

from speechperf.config import load_preset
from speechperf.train.step import train_step

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
runner = importlib.import_module("run")
floor = importlib.import_module("bench_step_floor")

SMALL = ["model.d_model=32", "model.layers=1", "model.heads=2", "model.pred_dim=32", "model.joint_dim=16",
         "train.system.threads=1", "train.system.precision=fp32"]


def test_default_foreach_and_fused_adamw_train_the_same_parameters(tiny_features):
    cpu, trained, start = torch.device("cpu"), {}, None
    for impl in ("default", "foreach", "fused"):
        cfg = load_preset("transducer-cpu", [*SMALL, f"train.optim.impl={impl}"])
        model, opt, scaler = floor.setup(cfg, cpu)  # the run's seed: the same initial parameters each time
        if start is None:
            start = flat(model)
        for b in floor.first_batches(tiny_features, cfg, 3):
            train_step(model, b, opt, scaler, cpu, cfg.train)
        trained[impl] = flat(model)
    moved = (trained["default"] - start).abs()
    assert moved.max() > 1e-4 and (moved > 0).float().mean() > 0.5  # the steps were taken, by most parameters
    for impl in ("foreach", "fused"):  # the same updates up to float rounding (Adam's 1/sqrt(v) scales it up
        # where a gradient is near 0: 1.8e-6 on one parameter of 40,844 after 3 steps, measured)
        torch.testing.assert_close(trained[impl] - start, trained["default"] - start, rtol=1e-4, atol=1e-5)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_a_run_prints_each_implementation_against_the_copy_back(tiny_features, capsys):
    assert runner.main(["optim_impl", "--no-ledger", "--data", str(tiny_features), "--steps", "2", "--rounds", "1",
                        *SMALL]) == 0
    out = capsys.readouterr().out
    for arm in ("copy-back", "default", "foreach", "fused"):
        assert f"\n{arm} " in out
    assert "optim_impl: default / copy-back (median pass) = " in out


def test_the_floors_model_is_the_runs_in_fp8_too():
    """benchmarks/bench_step_floor.py's ``setup`` makes fp8's float8 Linear layers as a run does (it
    timed a model without them, in bf16 autocast, as if fp8's)."""
    from speechperf.models import fp8

    cfg = load_preset("fastconformer-l", ["model.layers=1", "model.d_model=64", "model.heads=2",
                                          "model.subsampling_channels=16", "train.system.precision=fp8"])
    model, _, _ = floor.setup(cfg, torch.device("cpu"))
    assert fp8.swapped(model) > 0
