import importlib.util
from dataclasses import replace
from functools import partial

import pytest
import torch

from speechperf.bench import zoo
from speechperf.errors import SpeechperfError
from speechperf.tables import write_csv
from speechperf.hardware import capability as cap


HAVE_TV = importlib.util.find_spec("torchvision") is not None
AVX512_NO_BF16 = frozenset({"avx", "avx2", "fma"}) | cap.AVX512_CORE


@pytest.mark.parametrize("name", ["lstm", "ds2", "transformer"])
def test_parameter_counts_within_10_percent_of_paper(name):
    params = zoo.parameter_millions(zoo.ZOO[name].build())
    assert abs(params - zoo.PAPER_PARAMS_M[name]) / zoo.PAPER_PARAMS_M[name] < 0.10, params


def _narrow(monkeypatch) -> None:
    """The LSTM and the Transformer narrowed for the tests that run them (their full sizes:
    test_parameter_counts_within_10_percent_of_paper), the vocabularies their steps draw tokens from kept."""
    for name, narrow in (("lstm", partial(zoo.LSTMLanguageModel, hidden=64)), ("transformer", partial(zoo.TransformerMT, d=64))):
        monkeypatch.setitem(zoo.ZOO, name, replace(zoo.ZOO[name], build=narrow))


def test_a_few_iterations_per_model_on_cpu(monkeypatch):
    from speechperf.bench import acoustic
    from speechperf.config import load_preset

    monkeypatch.setattr(acoustic, "FRAMES", (24, 40))  # DS2's row through the acoustic path, at the tiny preset's size
    monkeypatch.setattr(acoustic, "config", lambda name: load_preset("tiny").model)
    _narrow(monkeypatch)
    rows = zoo.run_zoo(models=["lstm", "ds2", "transformer"], batches=[2], iters=1, warmup=0)
    assert [r["status"] for r in rows] == ["ok"] * 3
    by = {r["model"]: r for r in rows}
    assert by["transformer"]["unit"] == "tokens" and by["transformer"]["samples_per_s"] > 0
    assert all(r["samples_per_s"] > 0 and r["step_s"] > 0 for r in rows)
    assert by["lstm"]["params_m"] > 1 and by["transformer"]["params_m"] > 1 and by["ds2"]["params_m"] > 0
    from speechperf.telemetry.sampler import availability

    avail = availability()
    if not avail["gpus"] and not avail["rapl_zones"]:  # nothing to measure power with: each row says so
        assert all(r["power_w"] is None and r["energy"].startswith("unavailable") for r in rows)


@pytest.mark.skipif(not HAVE_TV, reason="torchvision not installed (pip install 'speechperf[zoo]')")
@pytest.mark.parametrize("name", ["resnet50", "inception_v3", "vgg16"])
def test_torchvision_parameter_counts_within_10_percent(name):
    params = zoo.parameter_millions(zoo.ZOO[name].build())
    assert abs(params - zoo.PAPER_PARAMS_M[name]) / zoo.PAPER_PARAMS_M[name] < 0.10, params


def test_cnns_run_or_say_why():
    rows = zoo.run_zoo(models=["resnet50", "inception_v3"], batches=[2], iters=1, warmup=0)
    if HAVE_TV:
        assert [r["status"] for r in rows] == ["ok", "ok"]
        assert all(r["samples_per_s"] > 0 and r["unit"] == "images" for r in rows)
    else:
        assert all(r["status"].startswith("skipped: torchvision not installed") for r in rows)


def test_unknown_model_and_device():
    with pytest.raises(SpeechperfError, match="unknown zoo"):
        zoo.run_zoo(models=["alexnet"])
    if not torch.cuda.is_available():
        with pytest.raises(SpeechperfError, match="no CUDA"):
            zoo.run_zoo(models=["lstm"], device="cuda:0")


def test_table8_layout_and_csv(tmp_path):
    rows = [zoo._row("lstm", 64, p, "cpu", 66.0, {"samples_per_s": s, "step_s": 1.0, "iters": 2, "spread_pct": 0.5, "power_w": w,
                                                   "joules_per_sample": j, "energy": "x"})
            for p, s, w, j in (("fp32", 10.0, 100.0, 10.0), ("amp", 20.0, 80.0, 4.0))]
    rows.append(zoo._row("vgg16", None, None, "cpu", None, None, "skipped: torchvision not importable"))
    lines = zoo.table8(rows)
    assert lines[0] == {"device": "cpu", "model": "lstm", "batch": 64, "unit": "sentences", "status": "ok",
                        "PERF_fp32": 10.0, "POW_fp32": 100.0, "NRG_fp32": 10.0,
                        "PERF_amp": 20.0, "POW_amp": 80.0, "NRG_amp": 4.0}
    assert lines[1]["status"] == "-: skipped: torchvision not importable"
    text = write_csv(tmp_path / "t8.csv", lines).read_text().splitlines()
    assert text[0].startswith("device,model,batch,unit,status,PERF_fp32") and len(text) == 3


NO_BF16_LSTM = "unsupported on this CPU: torch's oneDNN LSTM has no bf16 kernel without AVX-512 (this CPU: AVX2)"
ONEDNN_LSTM = "could not create a primitive descriptor for the LSTM forward propagation primitive"


def test_mixed_precision_row_beside_fp32_where_the_cpu_has_no_bf16_lstm(monkeypatch):
    """A CPU without AVX-512 (forced, so on any CPU): the bf16 row says why, in words, and is not tried."""
    monkeypatch.setenv(cap.FORCE_ENV, "avx512f")
    real, tried = zoo.measure, []
    monkeypatch.setattr(zoo, "measure", lambda *a: tried.append(a[3]) or real(*a))
    rows = zoo.run_zoo(models=["lstm"], batches=[2], precisions=["fp32", "amp"], iters=1, warmup=0, progress=False)
    assert [(r["precision"], r["status"]) for r in rows] == [("fp32", "ok"), ("amp", NO_BF16_LSTM)]
    assert tried == ["fp32"] and rows[1]["samples_per_s"] is None and rows[1]["precision_note"] is None
    assert f"not measured: lstm batch 2 amp: {NO_BF16_LSTM}" in zoo.notes(rows)
    assert zoo.table8(rows)[0]["status"] == f"amp: {NO_BF16_LSTM}"


def test_mixed_precision_row_beside_fp32_where_the_cpu_emulates_bf16(monkeypatch):
    """A CPU with AVX-512 but no bf16 units (forced): the bf16 row is measured and flagged. On a
    CPU that really lacks AVX-512 oneDNN then refuses the LSTM: the row says so in whole words."""
    monkeypatch.setattr(cap, "_real_cpu_flags", lambda: AVX512_NO_BF16)
    really_runs = cap.probe("lstm", "bf16") is None
    monkeypatch.setattr(cap, "probe", lambda kernel, dtype: None)
    rows = zoo.run_zoo(models=["lstm"], batches=[2], precisions=["fp32", "amp"], iters=1, warmup=0, progress=False)
    fp32, amp = rows
    assert (fp32["status"], fp32["precision_note"]) == ("ok", None)
    assert amp["precision_note"] == "emulated: no native bf16 on this CPU (AVX-512)"
    if really_runs:
        assert amp["status"] == "ok" and amp["samples_per_s"] > 0
        assert "amp on cpu: emulated: no native bf16 on this CPU (AVX-512)" in zoo.notes(rows)
    else:
        assert amp["status"] == f"failed: {ONEDNN_LSTM}"


def test_bench_zoo_exit_status_names_the_cause(monkeypatch, capsys):
    from speechperf.cli import main

    monkeypatch.setenv(cap.FORCE_ENV, "avx512f")
    args = ["bench", "zoo", "--models", "lstm", "--batch", "2", "--iters", "1", "--warmup", "0", "--json"]
    assert main(args + ["--precision", "fp32,amp"]) == 0  # one row measured: unsupported rows are no failure
    capsys.readouterr()
    assert main(args + ["--precision", "amp"]) == 1
    err = capsys.readouterr().err
    assert f"bench zoo: nothing measured: every one of the 1 rows is unsupported here or skipped: {NO_BF16_LSTM}" in err

    def broken(*a):
        raise RuntimeError(ONEDNN_LSTM + ". Run workload with environment variable ONEDNN_VERBOSE=all to get "
                           "additional diagnostic information.")

    monkeypatch.setattr(zoo, "measure", broken)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"speechperf: error: bench zoo: every one of the 1 rows failed: failed: {ONEDNN_LSTM}"


def test_cli_bench_zoo_writes_table8_csv(tmp_path, capsys):
    import csv
    import json

    from speechperf.cli import main

    code = main(["bench", "zoo", "--models", "lstm", "--batch", "2", "--iters", "1", "--warmup", "0", "--json",
                 "--csv", str(tmp_path / "t8.csv")])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["model"] == "lstm" and rows[0]["samples_per_s"] > 0
    with open(tmp_path / "t8.csv") as f:
        assert [r["model"] for r in csv.DictReader(f)] == ["lstm"]


def test_cpu_time_budget_times_every_step_and_records_math_types(monkeypatch):
    _narrow(monkeypatch)
    rows = zoo.run_zoo(models=["lstm"], batches=[2], precisions=["fp32", "amp"], warmup=0, seconds=0.3,
                       warmup_seconds=0)
    fp32, amp = rows
    assert fp32["iters"] >= 2 or fp32["step_s"] >= 0.3  # steps until the budget is spent, at least one
    assert fp32["window_s"] >= 0.3 and fp32["timer"] == "perf_counter" and fp32["warmup_steps"] == 0
    fixed = zoo.run_zoo(models=["lstm"], batches=[2], iters=3, warmup=0)[0]
    assert fixed["iters"] == 3 and fixed["spread_pct"] >= 0 and fixed["step_s"] > 0
    assert zoo.run_zoo(models=["lstm"], batches=[2], iters=1, warmup=0)[0]["spread_pct"] is None
    assert (fp32["multiply"], fp32["accumulate"]) == ("fp32", "fp32")
    assert (amp["multiply"], amp["accumulate"]) == ("bf16", "fp32")  # CPU autocast
    assert fp32["libraries"] and fp32["threads"] >= 1 and fp32["torch"]
    assert zoo.math_types("amp", "cuda:0") == ("fp16", "fp32")


@pytest.mark.cuda
def test_quick_sweep_on_cuda_in_both_precisions():
    rows = zoo.run_zoo(models=["lstm", "ds2"], batches=[2], precisions=["fp32", "amp"], device="cuda:0", iters=3,
                       warmup=1)
    assert [r["status"] for r in rows] == ["ok"] * 4 and all(r["device"].startswith("cuda") for r in rows)
    assert all(r["samples_per_s"] > 0 and r["iters"] == 3 for r in rows)
    assert {(r["multiply"], r["accumulate"]) for r in rows if r["precision"] == "amp"} == {("fp16", "fp32")}


def test_an_interrupted_zoo_sweep_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    from speechperf.results import ResultsDB

    real, calls = zoo.measure, []

    def interrupted(*a):
        calls.append(a[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(zoo, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        zoo.run_zoo(models=["lstm"], batches=[2, 3], iters=1, warmup=0, db_path=tmp_path / "r.db", progress=False)
    with ResultsDB(tmp_path / "r.db") as db:
        rows = db.query("SELECT model, batch, status, samples_per_s, iters FROM bench_zoo")
    assert [(r["model"], r["batch"], r["status"], r["iters"]) for r in rows] == [("lstm", 2, "ok", 1)]
    assert (tmp_path / "bench_zoo_table8.csv").read_text().count("lstm") == 1  # the Table 8 CSV of what was measured


def _known_peak(monkeypatch, tmp_path):
    """The CPU's GEMM peak, a fixed figure in a cache of this test: the rows' MFU columns are
    not what it checks (tests/hardware/test_measured_peak.py measures the peak). Measured, a 2-thread
    peak beside the suite's other worker is contended, never cached, and measured again for each
    model: 7 times, 66 s of this test (bf16 emulated: 18 s each)."""
    from speechperf.hardware import measured_peak

    monkeypatch.setenv("SPEECHPERF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measured_peak, "measure_gemm", lambda threads, dtype="fp32": {
        "tflops": 0.1, "n": 1024, "threads": threads, "dtype": dtype, "at": "now", "others_busy_pct": 0.0,
        "library": "torch.mm"})


def test_every_registered_acoustic_model_has_a_row_through_the_contract(monkeypatch, tmp_path):
    """Rows for ds2, dnn, cldnn, conformer and any model registered later, with no zoo code of
    its own; bf16 on a CPU without AVX-512 and without bf16 units (forced, so on any CPU):
    refused for DS2's oneDNN LSTM, measured and flagged as emulated for the others."""
    from speechperf.bench import acoustic
    from speechperf.config import load_preset
    from speechperf.models import MODELS, model_config

    monkeypatch.setattr(acoustic, "FRAMES", (24, 40))  # seconds on 2 cores, not minutes
    _known_peak(monkeypatch, tmp_path)
    small = {"dnn": {"hidden": 64, "layers": 2},  # small widths: the emulated bf16 rows of the paper's sizes took a minute
             "cldnn": {"conv_maps": 8, "lstm_cells": 64, "lstm_proj": 32, "dnn_hidden": 64},
             "conformer": {"d_model": 32, "layers": 1, "heads": 2, "subsampling_channels": 8},
             "fastconformer": {"d_model": 32, "layers": 1, "heads": 2, "subsampling_channels": 8},
             "transducer": {"d_model": 32, "layers": 1, "heads": 2, "subsampling_channels": 8, "pred_dim": 32,
                            "joint_dim": 32, "pred": "stateless"}}  # no LSTM: an LSTM predictor is refused as DS2
    monkeypatch.setattr(acoustic, "config", lambda name: load_preset("tiny").model if name == "ds2"
                        else model_config({"name": name, **small.get(name, {})}))
    monkeypatch.setenv(cap.FORCE_ENV, "avx512f,avx512_bf16,amx_bf16")
    # the transducer's row runs its objective's loss (speechperf/objectives/rnnt_loss.py) where it is in
    names = [n for n in MODELS.names() if n != "transducer" or importlib.util.find_spec("speechperf.objectives.rnnt_loss")]
    assert {"ds2", "dnn", "cldnn"} <= set(names) and set(names) <= set(zoo.ZOO)
    rows = zoo.run_zoo(models=names, batches=[1], precisions=["fp32", "amp"], iters=1, warmup=0, progress=False)
    by = {(r["model"], r["precision"]): r for r in rows}
    assert all(by[(n, "fp32")]["status"] == "ok" and by[(n, "fp32")]["samples_per_s"] > 0 for n in names)
    assert all(r["unit"] == "utterances" and r["params_m"] > 0 for r in rows)
    assert by[("ds2", "amp")]["status"] == NO_BF16_LSTM
    for n in set(names) - {"ds2"}:
        assert (by[(n, "amp")]["status"], by[(n, "amp")]["precision_note"]) == \
            ("ok", "emulated: no native bf16 on this CPU (AVX2)"), n


def test_acoustic_rows_carry_mfu_beside_samples_per_s(monkeypatch):
    """The MFU columns of an acoustic row: the batch's model FLOPs (the MFU module's FLOP
    model at the row's exact lengths) over the measured step time, against its peak."""
    import importlib.util
    import sys
    import types

    from speechperf.bench import acoustic
    from speechperf.config import load_preset

    monkeypatch.setattr(acoustic, "config", lambda name: load_preset("tiny").model)
    row = zoo.run_zoo(models=["ds2"], batches=[3], iters=1, warmup=0, progress=False)[0]
    if importlib.util.find_spec("speechperf.hardware.mfu") is None:
        assert row["mfu_pct"] is None and row["mfu_note"].startswith("not computed: speechperf.hardware.mfu")
    fitted, seen = [], []

    class Flops:
        def batch(self, lens):
            seen.append(lens.tolist())
            return 1e9 * float(lens.sum())

    fake = types.ModuleType("speechperf.hardware.mfu")
    fake.flop_model = lambda cfg: fitted.append(cfg.name) or Flops()
    fake.zoo_mfu = lambda flops, step_s, dev, precision: {"tflops": flops / step_s / 1e12, "peak_tflops": 2.0,
                                                          "mfu_pct": 50 * flops / step_s / 1e12, "peak_source": precision}
    monkeypatch.setitem(sys.modules, "speechperf.hardware.mfu", fake)
    rows = zoo.run_zoo(models=["ds2"], batches=[3, 2], iters=1, warmup=0, progress=False)
    assert fitted == ["ds2"] and seen == [[400, 250, 100], [400, 100]]  # fitted once; the batches' own lengths
    for r, frames in zip(rows, (750, 500)):
        assert r["mfu_pct"] == pytest.approx(50 * 1e9 * frames / r["step_s"] / 1e12) and r["peak_source"] == "fp32"
    assert "MFU (fp32): peak fp32" in zoo.notes(rows)
