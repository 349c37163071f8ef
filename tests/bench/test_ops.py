import pytest
import torch

from speechperf.bench import ops
from speechperf.hardware.peaks import cpu_peak, flops_per_cycle, gpu_peak
from speechperf.telemetry.timing import method
from speechperf.errors import SpeechperfError


def test_flop_formulas_against_hand_counts():
    assert ops.matmul_op(2048, 2048, 2048).flops == pytest.approx(1.72e10, rel=0.01)  # docs/spec.md E
    assert ops.matmul_op(4096, 4096, 4096).flops == pytest.approx(1.37e11, rel=0.01)
    assert ops.matmul_op(8192, 8192, 8192).flops == pytest.approx(1.10e12, rel=0.01)
    # F(256,224,224,3) K(7,7,3,64) S(2,2): output 112 x 112 with padding 3
    c = ops.conv_op(256, 224, 3, 7, 64, 2)
    assert c.flops == 2 * 256 * 64 * 3 * 7 * 7 * 112 * 112
    # the formula matches the tensor the op really produces
    small = ops.conv_op(2, 16, 3, 3, 4, 2)
    y = small.make(torch.device("cpu"), torch.float32)()
    assert small.flops == 2 * y.shape[0] * y.shape[1] * 3 * 3 * 3 * y.shape[2] * y.shape[3]


def test_middle_third_aggregation():
    times = [9.0] * 10 + [1.0] * 10 + [5.0] * 10  # warm-up spike, steady state, drift
    assert ops.middle_third(times) == 1.0
    assert ops.middle_third([2.0, 4.0]) == 3.0
    with pytest.raises(SpeechperfError):
        ops.middle_third([])


def test_peak_table_and_cpu_derivation():
    assert gpu_peak("Tesla V100-PCIE-16GB", "fp32").tflops == 14.13
    # today's GPUs: the dense datasheet peak of the platform profile naming the device exactly
    h100 = gpu_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert h100.tflops == 989.5 and "profile h100-sxm" in h100.source and "dense bf16" in h100.source
    assert gpu_peak("NVIDIA H100 PCIe", "bf16").tflops == 756.5  # not the SXM board's figure
    assert gpu_peak("NVIDIA A100-SXM4-40GB", "tf32").tflops == 156.0
    assert gpu_peak("NVIDIA GeForce GTX 1080 Ti", "fp32").tflops == 11.34
    for name in ("P100", "TITAN X (Pascal)", "Radeon VII", "RTX 2070", "NVIDIA A100-SXM4-40GB", "NVIDIA H200"):
        assert gpu_peak(name, "fp32").tflops > 0, name
    assert gpu_peak("Some GPU", "fp32").tflops is None
    assert gpu_peak("NVIDIA H100 NVL", "bf16").tflops is None  # no profile: no guessed figure
    assert gpu_peak("Tesla P100", "bf16").tflops is None
    assert flops_per_cycle({"avx2", "fma"}) == 32 and flops_per_cycle({"avx512f"}) == 64
    p = cpu_peak(2, 2.5, {"avx", "avx2", "fma"})
    assert p.tflops == pytest.approx(2 * 2.5 * 32 / 1000) and p.source.startswith("derived")
    assert cpu_peak(2, 2.5, set(), "tf32").tflops is None


def test_a_cpu_sweep_times_the_product_through_onednn_too():
    """MKL's float32 product takes its AVX2 code on an AMD EPYC with AVX-512 (0.43x oneDNN's there):
    the CPU sweep has oneDNN's beside it, a GPU's does not."""
    names = [op.name for op in ops.default_ops(cpu=True)]
    assert ("matmul (oneDNN)" in names) == torch.backends.mkldnn.is_available()
    assert "matmul (oneDNN)" not in [op.name for op in ops.default_ops()]


def test_quick_sweep_rows_and_unsupported_dtype():
    rows = ops.run_ops("cpu", dtypes=["fp32", "tf32"], threads=[1], quick=True, seconds=0.05, warmup_seconds=0)
    ok = [r for r in rows if r["dtype"] == "fp32"]
    assert len(ok) == 3 and all(r["status"] == "ok" and r["tflops"] > 0 and r["iters"] >= 6 for r in ok)
    assert all(r["threads"] == 1 and r["accumulate"] == "fp32" and r["torch"] for r in ok)
    tf32 = [r for r in rows if r["dtype"] == "tf32"]
    assert tf32 and all(r["status"] == "unsupported on this CPU: tf32 is a CUDA tensor-core mode" for r in tf32)
    assert all(r["precision_note"] is None for r in ok)  # fp32 is native


def test_an_emulated_dtype_is_flagged_in_its_rows_and_notes(monkeypatch):
    from speechperf.hardware import capability as cap

    monkeypatch.setattr(cap, "_real_cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "avx512_bf16"}))
    monkeypatch.setenv(cap.FORCE_ENV, "avx512_bf16")  # bf16 products run everywhere, natively only with these
    rows = ops.run_ops("cpu", dtypes=["bf16"], threads=[1], quick=True, iters=1, warmup_seconds=0)
    assert {(r["status"], r["precision_note"]) for r in rows} == {("ok", "emulated: no native bf16 on this CPU (AVX2)")}
    assert "bf16 on cpu: emulated: no native bf16 on this CPU (AVX2)" in ops.notes(rows)


def test_bench_ops_exits_1_when_nothing_was_measured(monkeypatch, capsys):
    from speechperf.cli import main

    args = ["bench", "ops", "--quick", "--threads", "1", "--iters", "1", "--json", "--dtype", "fp32"]
    assert main(args + ["--dtype", "fp32,tf32"]) == 0
    capsys.readouterr()
    assert main(args + ["--dtype", "tf32"]) == 1
    assert ("bench ops: nothing measured: every one of the 3 rows is unsupported here or skipped: unsupported on "
            "this CPU: tf32 is a CUDA tensor-core mode") in capsys.readouterr().err

    def broken(*a):
        raise RuntimeError("could not create a primitive descriptor for a matmul primitive. Run workload with "
                           "environment variable ONEDNN_VERBOSE=all")

    monkeypatch.setattr(ops, "run_op", broken)
    assert main(args) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("speechperf: error: bench ops: every one of the 3 rows failed: failed: "
                                               "could not create a primitive descriptor for a matmul primitive")


def test_out_of_memory_gives_a_row_and_the_sweep_continues(monkeypatch):
    real = ops.run_op
    calls = []

    def flaky(op, *a):
        calls.append(op.name)
        if op.name == "conv2d":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(op, *a)

    monkeypatch.setattr(ops, "run_op", flaky)
    rows = ops.run_ops("cpu", dtypes=["fp32"], threads=[1], quick=True, seconds=0.05, warmup_seconds=0)
    assert [r["status"].split(":")[0] for r in rows] == ["ok", "out of memory", "ok"]


def test_bad_device():
    with pytest.raises(SpeechperfError):
        ops.run_ops("tpu:0", quick=True)
    if not torch.cuda.is_available():
        with pytest.raises(SpeechperfError, match="no CUDA"):
            ops.run_ops("cuda:0", quick=True)


def test_measured_peak_and_power_columns():
    rows = ops.run_ops("cpu", dtypes=["fp32"], threads=[1], quick=True, seconds=0.05, warmup_seconds=0)
    best = max(r["tflops"] for r in rows)
    assert all(r["measured_peak_tflops"] == best for r in rows)
    assert max(r["pct_measured_peak"] for r in rows) == pytest.approx(100.0)
    assert all("power_w" in r and r["energy"] and r["libraries"] for r in rows)  # a reason when no power source


def test_thread_scaling_pass_skips_big_ops_and_says_so():
    big, small = ops.matmul_op(512, 512, 512), ops.matmul_op(64, 64, 64)  # 0.27 and 0.0005 GFLOP
    m = method("ops", "cpu", iters=6, warmup_seconds=0)
    rows = ops.sweep(torch.device("cpu"), ["fp32"], [1, 2], [big, small], m, scaling_max_gflop=0.1)
    status = [(r["threads"], r["shape"].split()[0], r["status"][:22]) for r in rows]
    assert status == [(1, "512x512", "skipped: over 0.1 GFLO"), (1, "64x64", "ok"), (2, "512x512", "ok"), (2, "64x64", "ok")]


def test_cli_bench_ops_writes_json_csv_and_db(tmp_path, capsys):
    import csv
    import json

    from speechperf.cli import main
    from speechperf.results import ResultsDB

    code = main(["bench", "ops", "--quick", "--threads", "1", "--cpu-seconds", "0.05", "--json", "--dtype", "fp32",
                 "--csv", str(tmp_path / "ops.csv"), "--db", str(tmp_path / "r.db")])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    with open(tmp_path / "ops.csv") as f:
        written = list(csv.DictReader(f))
    assert [r["op"] for r in written] == [r["op"] for r in rows] and len(rows) == 3
    assert float(written[0]["tflops"]) == pytest.approx(rows[0]["tflops"])
    with ResultsDB(tmp_path / "r.db") as db:
        assert len(db.query("SELECT * FROM bench_ops")) == 3


@pytest.mark.cuda
def test_quick_sweep_on_cuda():
    rows = ops.run_ops("cuda:0", dtypes=["fp32", "tf32", "bf16"], quick=True)
    assert rows and all(r["status"] == "ok" and r["tflops"] > 0 for r in rows)
    assert {r["dtype"] for r in rows} == {"fp32", "tf32", "bf16"}
    assert all(r["peak_source"] for r in rows)  # a vendor peak, or why there is none


def test_an_interrupted_sweep_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    from speechperf.results import ResultsDB

    real, calls = ops.run_op, []

    def interrupted(op, *a):
        calls.append(op.name)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stopped by hand during row 2
        return real(op, *a)

    monkeypatch.setattr(ops, "run_op", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ops.run_ops("cpu", threads=[1], quick=True, seconds=0.05, warmup_seconds=0, db_path=tmp_path / "r.db",
                    progress=False)
    with ResultsDB(tmp_path / "r.db") as db:
        rows = db.query("SELECT op, status, tflops, env_json, warmup_steps, timer FROM bench_ops")
    assert [(r["op"], r["status"]) for r in rows] == [("matmul", "ok")] and rows[0]["tflops"] > 0
    assert rows[0]["env_json"] and rows[0]["warmup_steps"] == 1 and rows[0]["timer"] == "perf_counter"


def test_rows_carry_the_method_and_the_database_the_measured_peak(tmp_path, capsys):
    from speechperf.results import ResultsDB

    rows = ops.run_ops("cpu", dtypes=["fp32"], threads=[1], quick=True, seconds=0.3, warmup_seconds=0.1, repeats=3,
                       db_path=tmp_path / "r.db")
    assert "bench ops" in capsys.readouterr().err  # the progress bar, on stderr
    r = rows[0]
    assert r["repeats"] == 3 and r["window_s"] > 0 and r["iters"] >= 6 and r["noisy"] in (0, 1)
    assert r["energy"].startswith("unavailable")  # no power source on this machine: the reason, not 0 W
    with ResultsDB(tmp_path / "r.db") as db:
        stored = db.query("SELECT op, measured_peak_tflops, repeats FROM bench_ops")
    assert len(stored) == 3 and all(x["measured_peak_tflops"] == rows[0]["measured_peak_tflops"] for x in stored)


def test_bf16_is_measured_by_default_where_native_and_its_peak_shown_beside_fp32(monkeypatch):
    from speechperf.hardware import capability as cap

    avx512 = frozenset({"avx", "avx2", "fma"}) | cap.AVX512_CORE
    monkeypatch.setattr(cap, "probe", lambda kernel, dtype: None)
    monkeypatch.setattr(cap, "_real_cpu_flags", lambda: avx512 | {"avx512_bf16"})
    assert ops.default_dtypes("cpu") == ["fp32", "bf16"]
    monkeypatch.setenv(cap.FORCE_ENV, "avx512_bf16")  # emulated: measured only when asked
    assert ops.default_dtypes("cpu") == ["fp32"]
    monkeypatch.delenv(cap.FORCE_ENV)
    rows = ops.run_ops("cpu", threads=[1], quick=True, iters=1, warmup_seconds=0, progress=False)
    assert {r["dtype"] for r in rows} == {"fp32", "bf16"}
    (line,) = ops.precision_lines(rows)
    assert line.startswith("bf16 beside fp32 on cpu, 1 thread(s): best measured ") and line.endswith(
        "x); native (AVX512-BF16)")
    emulated = [{**r, "precision_note": "emulated: no native bf16 on this CPU (AVX2)"} if r["dtype"] == "bf16" else r
                for r in rows]
    assert ops.precision_lines(emulated)[0].endswith("x); emulated: no native bf16 on this CPU (AVX2)")
    assert ops.precision_lines([r for r in rows if r["dtype"] == "fp32"]) == []  # fp32 alone: nothing beside it


def test_the_derived_bf16_peak_names_its_unit():
    flags = frozenset({"avx2", "fma", "avx512f"})
    assert flops_per_cycle(flags | {"avx512_bf16"}, "bf16") == 128 and flops_per_cycle(flags, "bf16") == 64
    assert flops_per_cycle(flags | {"avx512_bf16", "amx_bf16"}, "bf16") == 1024
    assert "bf16 on AMX-BF16, AMX tile multiply" in cpu_peak(2, 2.0, flags | {"amx_bf16"}, "bf16").source
    assert "bf16 on AVX-512 (no native bf16: emulated)" in cpu_peak(2, 2.0, flags, "bf16").source
