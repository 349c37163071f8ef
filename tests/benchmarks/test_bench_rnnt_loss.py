"""benchmarks/bench_rnnt_loss.py at a tiny shape: both losses timed (RNN-T's and TDT's), their peak memory and ratio
reported, the CUDA part said not run where there is no GPU."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
bench = importlib.import_module("bench_rnnt_loss")


def test_the_benchmark_times_both_losses_and_reports_their_memory(capsys):
    p = argparse.ArgumentParser()
    bench.arguments(p)
    a = p.parse_args(["--shapes", "2x8x3x6,2x20x2x10000", "--repeats", "2"])
    figures = bench.run(a)
    rows = figures["cpu"]
    assert [r["shape BxTxUxV"] for r in rows] == ["2x8x3x6", "2x20x2x10000"]
    for r in rows:
        assert r["kernel_s"] > 0 and r["reference_s"] > 0
        assert r["ratio"] == pytest.approx(r["reference_s"] / r["kernel_s"])
    if sys.platform == "linux":  # the resident high-water mark
        # the larger joint, (2, 20, 3, 10000) float32 = 4.8 MB: the kernel adds its gradient buffer (10% slack:
        # the resident size before the call moves too), the reference its log-softmax and more
        assert rows[1]["kernel_peak_mb"] >= 0.9 * 2 * 20 * 3 * 10000 * 4 / 1e6
        assert rows[1]["reference_peak_mb"] > rows[1]["kernel_peak_mb"]
    assert figures["ratio"] == rows[0]["ratio"]
    tdt = figures["tdt_cpu"]  # the TDT loss's rows: the same shapes, 5 duration logits more
    assert [r["shape BxTxUxV"] for r in tdt] == ["2x8x3x6", "2x20x2x10000"]
    assert all(r["kernel_s"] > 0 and r["ratio"] == pytest.approx(r["reference_s"] / r["kernel_s"]) for r in tdt)
    if sys.platform == "linux":
        assert tdt[1]["kernel_peak_mb"] >= 0.9 * 2 * 20 * 3 * 10005 * 4 / 1e6
    out = capsys.readouterr().out
    assert "rnnt cpu" in out and "tdt cpu" in out and "x wall" in out and ("no GPU here" in out) == (not torch.cuda.is_available())
