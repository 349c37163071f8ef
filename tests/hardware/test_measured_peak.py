"""The peak behind a run's MFU: a measured CPU GEMM peak cached per machine, GPU peaks from
the platform profiles (the GPU path with the device name forced, on any CPU)."""
import json
import time

import pytest
import torch

from speechperf.hardware import measured_peak as mp
from speechperf.telemetry.timing import Method

FAST = Method(warmup_steps=1, warmup_seconds=0.01, seconds=0.05)  # a measurement's timing, shortened


def test_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    calls = []

    def fake(threads, dtype="fp32"):
        calls.append((threads, dtype))
        return {"tflops": 0.05, "n": 64, "threads": threads, "dtype": dtype, "at": "2026-11-23 10:00:00",
                "others_busy_pct": 0.0, "library": "torch.mm"}

    monkeypatch.setattr(mp, "measure_gemm", fake)
    first = mp.cpu_gemm_peak(2, cache=tmp_path)
    assert first.tflops == 0.05 and first.source.startswith("measured fp32 GEMM 64^3 at 2 thread(s)")
    assert calls == [(2, "fp32")]
    stored = json.loads((tmp_path / mp.CACHE_FILE).read_text())
    assert list(stored) == [mp.cache_key(2, "fp32")] and torch.__version__ in mp.cache_key(2, "fp32")
    assert mp.cpu_gemm_peak(2, cache=tmp_path) == first and len(calls) == 1  # read, not measured again
    mp.cpu_gemm_peak(1, cache=tmp_path)  # another thread count is another key
    assert calls[-1] == (1, "fp32") and len(json.loads((tmp_path / mp.CACHE_FILE).read_text())) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"%s": {"tflops": -1}}'])
def test_unreadable_cache_is_measured_again_and_rewritten(tmp_path, monkeypatch, content):
    monkeypatch.setattr(mp, "measure_gemm", lambda threads, dtype="fp32": {
        "tflops": 0.07, "n": 64, "threads": threads, "dtype": dtype, "at": "now", "others_busy_pct": 0.0,
        "library": "torch.mm"})
    path = tmp_path / mp.CACHE_FILE
    path.write_text(content.replace("%s", mp.cache_key(2, "fp32")) if "%s" in content else content)
    assert mp.cpu_gemm_peak(2, cache=tmp_path).tflops == 0.07
    assert json.loads(path.read_text())[mp.cache_key(2, "fp32")]["tflops"] == 0.07


def test_contention_is_other_processes_on_the_cores_the_measurement_needed():
    assert not mp.contended(50.0, threads=1, cpus=2)  # another process on the other core
    assert mp.contended(50.0, threads=2, cpus=2)  # on a core the 2-thread GEMM needed
    assert not mp.contended(9.0, threads=2, cpus=2) and mp.contended(11.0, threads=2, cpus=2)  # 10% slack
    assert not mp.contended(84.0, threads=4, cpus=16) and mp.contended(86.0, threads=4, cpus=16)  # 12 free + 1.6


def test_others_busy_share_from_cpu_seconds(monkeypatch):
    monkeypatch.setattr(mp.psutil, "cpu_count", lambda: 4)
    # the machine ran 6 CPU-seconds in 2 s, this process 2 of them: others 4 of 8 core-seconds
    assert mp.others_busy_pct((100.0, 10.0), (106.0, 12.0), 2.0) == pytest.approx(50.0)
    assert mp.others_busy_pct((100.0, 10.0), (101.0, 12.0), 2.0) == 0.0  # counters' jitter: never below 0
    before = mp.busy_seconds()
    assert before[0] >= before[1] > 0


def test_a_peak_measured_on_busy_cores_is_used_once_and_not_cached(tmp_path, monkeypatch):
    busy = {"tflops": 0.02, "n": 64, "threads": 2, "dtype": "fp32", "at": "then", "others_busy_pct": 60.0,
            "library": "torch.mm"}
    monkeypatch.setattr(mp, "measure_gemm", lambda threads, dtype="fp32": dict(busy, threads=threads))
    monkeypatch.setattr(mp.psutil, "cpu_count", lambda: 2)
    peak = mp.cpu_gemm_peak(2, cache=tmp_path)
    assert peak.tflops == 0.02 and "other processes kept 60% of the CPUs busy meanwhile: likely low, not cached" in peak.source
    assert not (tmp_path / mp.CACHE_FILE).exists()
    assert "cached in" in mp.cpu_gemm_peak(1, cache=tmp_path).source  # 1 thread beside them: cached


def test_an_entry_without_the_load_beside_it_is_measured_again(tmp_path, monkeypatch):
    """An older release cached peaks measured on a busy machine (0.020 TFLOPS where the idle 2-core
    EPYC gives 0.068: a demo's MFU read 204%): such an entry is not trusted."""
    path = tmp_path / mp.CACHE_FILE
    path.write_text(json.dumps({mp.cache_key(2, "fp32"): {"tflops": 0.02, "n": 1024, "threads": 2, "dtype": "fp32",
                                                          "at": "2026-11-26 05:39:37"}}))
    monkeypatch.setattr(mp, "measure_gemm", lambda threads, dtype="fp32": {
        "tflops": 0.068, "n": 64, "threads": threads, "dtype": dtype, "at": "now", "others_busy_pct": 1.0,
        "library": "torch.mm"})
    assert mp.cpu_gemm_peak(2, cache=tmp_path).tflops == 0.068
    assert json.loads(path.read_text())[mp.cache_key(2, "fp32")]["tflops"] == 0.068
    assert mp.forget(2, "fp32", cache=tmp_path) and not mp.forget(2, "fp32", cache=tmp_path)
    assert json.loads(path.read_text()) == {}


def test_real_measurement_and_environment_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(mp, "gemm_size", lambda threads: 128)  # seconds, not a real peak
    monkeypatch.setenv("SPEECHPERF_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    peak = mp.training_peak(torch.device("cpu"), "fp32", 1)
    assert 0 < peak.tflops < 100
    # cached, unless other processes took the cores it needed (the suite's other worker on a 1-core machine)
    assert (tmp_path / mp.CACHE_FILE).is_file() or "not cached" in peak.source
    assert torch.get_num_threads() == threads  # measured at 1 thread, the training thread count restored


def test_measuring_leaves_the_run_rng_alone(monkeypatch):
    """A run that measures the peak at its initialization (the first on a machine) draws the
    same numbers afterwards as a run that reads the cache."""
    monkeypatch.setattr(mp, "gemm_size", lambda threads: 64)
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    mp.measure_gemm(1)
    assert torch.equal(torch.rand(4), expected)


def test_gpu_peak_from_the_platform_profile(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cuda = torch.device("cuda", 0)
    assert mp.training_peak(cuda, "bf16", 1).tflops == 989.5
    # allow_tf32 is a property of torch's cuBLAS module, not an instance attribute: pytest's
    # monkeypatch (9.x) would restore it with delattr, so the test sets and restores it itself.
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        assert mp.training_peak(cuda, "fp32", 1).tflops == 67.0
        matmul.allow_tf32 = True  # fp32 matmuls on tensor cores
        tf32 = mp.training_peak(cuda, "fp32", 1)
        assert tf32.tflops == 494.5 and "dense tf32" in tf32.source
    finally:
        matmul.allow_tf32 = before
    assert matmul.allow_tf32 == before
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 NVL")
    unknown = mp.training_peak(cuda, "bf16", 1)
    assert unknown.tflops is None and "NVL" in unknown.source  # never a guessed peak


def test_the_peak_of_a_recorded_run():
    h100 = {"device": "cuda:0", "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}
    # a finished run: its summary's peak, whatever the machine it is read on
    assert mp.recorded_peak({"peak_tflops": 5.0, "peak_source": "measured"}, h100, "bf16") == mp.Peak(5.0, "measured")
    # a CUDA run stopped before its summary held one: the recorded GPU's, in the run's precision, said so
    cut = mp.recorded_peak({"status": "failed: interrupted (SIGTERM)"}, h100, "bf16")
    assert cut.tflops == 989.5 and cut.source.endswith("(looked up for the recorded GPU: the run recorded no peak)")
    assert mp.recorded_peak({}, {**h100, "device": "cpu"}, "bf16").tflops is None  # a CPU's is not known afterwards


def test_the_peak_is_the_fastest_of_torchs_cpu_products_and_says_which(tmp_path, monkeypatch):
    """MKL's float32 product takes its AVX2 code on an AMD EPYC with AVX-512, where oneDNN's runs
    2.3x as fast: the peak is the faster of the two, named, with the other's rate beside it."""
    from speechperf.telemetry.timing import Op

    def op(name, seconds):
        def make(dev, dt):
            return lambda: time.sleep(seconds)
        return Op(name, "64x64 @ 64x64", 2.0 * 64 ** 3, make)

    monkeypatch.setattr(mp, "gemm_size", lambda threads: 64)
    monkeypatch.setattr(mp, "method", lambda bench, device: FAST)
    monkeypatch.setattr(mp, "gemm_ops", lambda n: {"torch.mm": op("mm", 0.004), "oneDNN": op("dnnl", 0.001)})
    got = mp.measure_gemm(1)
    assert got["library"] == "oneDNN" and set(got["rates"]) == {"torch.mm", "oneDNN"}
    assert got["tflops"] == got["rates"]["oneDNN"] > 2 * got["rates"]["torch.mm"]
    monkeypatch.setattr(mp, "measure_gemm", lambda threads, dtype="fp32": got)
    monkeypatch.setattr(mp, "contended", lambda *a, **k: False)  # the suite's other worker: still cached
    source = mp.cpu_gemm_peak(1, cache=tmp_path).source
    assert "(oneDNN's; torch.mm " in source and " TFLOPS; bench ops; cached in" in source


def test_an_entry_that_names_no_library_is_measured_again(tmp_path, monkeypatch):
    """Entries cached before the peak was the faster of MKL and oneDNN hold MKL's alone (on an AMD
    EPYC 0.43x the machine's): not trusted."""
    path = tmp_path / mp.CACHE_FILE
    path.write_text(json.dumps({mp.cache_key(2, "fp32"): {"tflops": 0.18, "n": 1024, "threads": 2, "dtype": "fp32",
                                                          "at": "then", "others_busy_pct": 0.0}}))
    monkeypatch.setattr(mp, "measure_gemm", lambda threads, dtype="fp32": {
        "tflops": 0.44, "n": 64, "threads": threads, "dtype": dtype, "at": "now", "others_busy_pct": 0.0,
        "library": "oneDNN", "rates": {"torch.mm": 0.18, "oneDNN": 0.44}})
    assert mp.cpu_gemm_peak(2, cache=tmp_path).tflops == 0.44


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_onednn_product_is_the_same_product(dtype, monkeypatch):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    from speechperf.telemetry.timing import matmul_op, onednn_matmul_op

    torch.manual_seed(3)
    mm, dnnl = matmul_op(48, 40, 24), onednn_matmul_op(48, 40, 24)
    assert mm.flops == dnnl.flops
    torch.manual_seed(3)
    out = dnnl.make(torch.device("cpu"), dtype)().to_dense().float()
    torch.manual_seed(3)
    a, w = torch.randn(48, 40, dtype=dtype), torch.randn(24, 40, dtype=dtype)
    assert out.shape == (48, 24)
    torch.testing.assert_close(out, a.float() @ w.float().t(), rtol=2e-2, atol=2e-1 if dtype == torch.bfloat16 else 1e-4)
    monkeypatch.setattr(mp, "gemm_size", lambda threads: 128)
    monkeypatch.setattr(mp, "method", lambda bench, device: FAST)
    got = mp.measure_gemm(1, "fp32" if dtype == torch.float32 else "bf16")  # both products, each timed
    assert set(got["rates"]) == {"torch.mm", "oneDNN"} and got["tflops"] == max(got["rates"].values())
