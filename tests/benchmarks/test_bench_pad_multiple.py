"""benchmarks/bench_pad_multiple.py: the replayed plan's shapes under each variant, its counts, and a
run through the suite's runner (a fresh process per replay)."""
import importlib
import json
import sys
from pathlib import Path

from speechperf.config import load_preset
from tests.conftest import run_benchmark

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bench = importlib.import_module("bench_pad_multiple")


def test_the_plan_figures_count_shapes_new_ones_and_padded_frames():
    epochs = [[([5, 3], 8), ([4], 8), ([2, 2], 8)], [([5, 3], 8), ([6], 32)]]
    assert bench.plan_figures(epochs) == {"distinct": [2, 2], "new": [2, 1], "padded_frames": 16 + 8 + 16 + 16 + 32}


def test_the_verbose_log_counts_primitives_created_per_epoch(tmp_path):
    log = tmp_path / "v.log"
    log.write_text("onednn_verbose,info,oneDNN v3\n"
                   "onednn_verbose,primitive,create:cache_miss,cpu,matmul,brg,undef,src:bf16,,,1x2:2x3,0.5\n"
                   "EPOCH 1\n"
                   "onednn_verbose,primitive,create:cache_miss,cpu,matmul,brg,undef,src:bf16,,,1x2:2x3,0.25\n"
                   "onednn_verbose,primitive,create:cache_hit,cpu,matmul,brg,undef,src:bf16,,,1x2:2x3,0.01\n"
                   "onednn_verbose,primitive,create:cache_miss,cpu,reorder,jit,undef,src:f32,,,2x3,1.5\n"
                   "EPOCH 2\n"
                   "onednn_verbose,primitive,create:cache_hit,cpu,matmul,brg,undef,src:bf16,,,1x2:2x3,0.01\n")
    assert bench.created(log, 2) == {"primitives_created": [2, 0], "create_s": [0.002, 0.0]}  # before EPOCH 1: not counted


def test_each_variant_replays_the_plan_padded_as_its_loader_pads(tiny_features):
    plain = bench.shapes(load_preset("tiny", ["loader.pad_multiple=1"]), tiny_features, 2)
    rounded = bench.shapes(load_preset("tiny", ["loader.pad_multiple=128"]), tiny_features, 2)
    assert len(plain) == len(rounded) == 2 and all(plain) and all(rounded)
    assert all(width == max(lengths) for epoch in plain for lengths, width in epoch)
    assert all(width % 128 == 0 and max(lengths) <= width < max(lengths) + 128 for epoch in rounded
               for lengths, width in epoch)
    fewer = bench.plan_figures(rounded)["distinct"], bench.plan_figures(plain)["distinct"]  # 10 batches an epoch
    assert all(r < p for r, p in zip(*fewer)), fewer


def test_a_run_replays_both_variants_and_prints_the_ratio(tiny_features, tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    assert run_benchmark("pad_multiple", "--ledger", ledger, "--data", tiny_features, "--preset", "tiny",
                         "--epochs", "2", "--rounds", "1", "--precision", "fp32", "--threads", "1", "--multiple", "128") == 0
    out = capsys.readouterr().out
    assert "tiny fp32 pad_multiple 128: shapes per epoch [" in out and "tiny fp32: rounded / unrounded step " in out
    figures = json.loads(ledger.read_text().splitlines()[-1])["figures"]
    v = figures["fp32"]["variants"]
    assert figures["ratio"] == v["128"]["later_step_s"] / v["1"]["later_step_s"] and figures["fp32"]["frames_ratio"] > 1
    for m in ("1", "128"):  # the counting replay read oneDNN's verbose lines of every epoch
        assert len(v[m]["primitives_created"]) == 2 and v[m]["primitives_created"][0] > 0, v[m]
    assert sum(v["128"]["primitives_created"]) < sum(v["1"]["primitives_created"])
    assert run_benchmark("pad_multiple", "--no-ledger", "--data", tiny_features, "--epochs", "1") == 2
