"""The peak a training run's MFU is measured against, per device and precision.

GPU: the dense vendor peak of the platform profile whose ``gpu_names`` the device matches
(``peak_tflops_<dtype>`` in ``config/platforms/*.toml``), else the older GPUs of
``hardware.peaks.DEVICE_PEAKS``; fp32 counts as tf32 when torch lets matmuls use TF32.

CPU: no vendor figure fits (clocks under vector load vary), so the peak is measured: the
GEMM rate of ``bench ops`` (an N x N matmul in the run's dtype, at the training thread
count, the middle third of the timed calls), the faster of torch's two CPU products, MKL's
``a @ b`` and oneDNN's (MKL takes its AVX2 code on an AMD CPU with AVX-512). It is measured
once per machine and kept in a JSON file under ``$SPEECHPERF_CACHE`` (default
``~/.cache/speechperf``), keyed by CPU model, thread count, dtype and torch version; a run measures it in its initialization
(outside the TTA clock) when the file lacks it. An unreadable file is measured again and
rewritten, never trusted and never fatal.

A busy machine measures a low peak, which raises every MFU against it (a peak cached while a
test suite ran read 0.020 TFLOPS where the idle 2-core EPYC gives 0.068, and a demo reported
MFU 204%). So the measurement records the share of the CPUs other processes used meanwhile
(``others_busy_pct``, from the machine's and this process's CPU seconds): where they took more
than the cores the measurement left free, plus :data:`SLACK` of the machine, the peak serves
the run that measured it, said so, and is not cached; an entry without that figure (an older
release's) is measured again. A run whose steps then
beat the peak anyway gets no MFU (hardware/mfu.py's ``achieved``) and its entry is dropped
(:func:`forget`), so the next run measures again.
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import psutil
import torch

from speechperf.atomic import atomic_write_text
from speechperf.hardware.peaks import Peak, gpu_peak
from speechperf.telemetry.timing import DTYPES, matmul_op, method, middle_third, onednn_matmul_op, timed, warm_up
from speechperf.telemetry import contention
from speechperf.hardware.environment import cpu_model

CACHE_FILE = "gemm_peak.json"
# of the machine's CPUs, what other processes may take beyond the cores a measurement leaves free
SLACK = contention.SLACK


def cache_path() -> Path:
    root = os.environ.get("SPEECHPERF_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "speechperf"


def gemm_size(threads: int) -> int:
    """N of the peak matmul: large enough to keep ``threads`` cores busy, small enough to
    take about a second or less per call (2 AVX2 cores: 1024^3 x 2 FLOPs in ~0.07 s)."""
    return 1024 if threads <= 4 else 2048 if threads <= 32 else 4096


def cache_key(threads: int, dtype: str) -> str:
    cpu = cpu_model() or platform.processor() or "unknown CPU"
    return f"{cpu} | {threads} threads | {dtype} | torch {torch.__version__}"


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds every process on the machine has run, this process's), since boot and start."""
    t, own = psutil.cpu_times(), psutil.Process().cpu_times()
    busy = t.user + t.system + sum(getattr(t, k, 0.0) for k in ("nice", "irq", "softirq", "steal"))
    return busy, own.user + own.system


def others_busy_pct(before: tuple[float, float], after: tuple[float, float], wall_s: float) -> float:
    """The share of the machine's CPUs (%) processes other than this one used between two
    :func:`busy_seconds` readings ``wall_s`` apart."""
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, 100.0 * others / (wall_s * (psutil.cpu_count() or 1))) if wall_s > 0 else 0.0


def gemm_ops(n: int) -> dict:
    """{library: Op} of the N x N products torch can run on a CPU: ``a @ b`` (float32: MKL's
    sgemm, as every Linear layer; bf16: oneDNN's where the CPU has bf16 instructions) and oneDNN's
    inner product, where torch was built with oneDNN. MKL picks its code by the CPU's maker: on an
    AMD EPYC with AVX-512 its float32 product runs at 0.43x oneDNN's (194 against 446 GFLOPS at 2
    threads), so a peak of ``a @ b`` alone is not the machine's, and every MFU against it reads 2.3x
    too high there."""
    ops = {"torch.mm": matmul_op(n, n, n)}
    if torch.backends.mkldnn.is_available():
        ops["oneDNN"] = onednn_matmul_op(n, n, n)
    return ops


def measure_gemm(threads: int, dtype: str = "fp32") -> dict:
    """The measured GEMM rate of this CPU: ``{"tflops", "library", "rates", "n", "threads", "dtype",
    "at", "others_busy_pct"}``: the fastest of :func:`gemm_ops` (``rates``: each one's TFLOPS) and the
    CPUs' share other processes used meanwhile."""
    n, cpu, m = gemm_size(threads), torch.device("cpu"), method("ops", "cpu")
    saved, rates = torch.get_num_threads(), {}
    torch.set_num_threads(threads)
    before, t0 = busy_seconds(), time.perf_counter()
    try:  # bench ops' timing without its power sampler (a thread that would share the cores)
        # random operands from a forked RNG: a run measuring the peak at its initialization (the
        # first on a machine) must draw the same dropout masks and batches as one reading the cache
        with torch.random.fork_rng(devices=[]):
            for library, op in gemm_ops(n).items():
                try:
                    step = op.make(cpu, DTYPES[dtype])
                except RuntimeError:  # oneDNN without this dtype
                    continue
                times, _, _, _ = timed(step, cpu, m, warm_up(step, cpu, m)["step_s"])
                rates[library] = op.flops / middle_third(times) / 1e12
    finally:
        torch.set_num_threads(saved)
    others = others_busy_pct(before, busy_seconds(), time.perf_counter() - t0)
    best = max(rates, key=rates.get)
    return {"tflops": rates[best], "library": best, "rates": rates, "n": n, "threads": threads, "dtype": dtype,
            "at": time.strftime("%Y-%m-%d %H:%M:%S"), "others_busy_pct": others}


def read_cache(path: Path) -> dict:
    """A JSON cache file of measurements as a dict; missing, unreadable or of another shape: empty."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or unreadable: measured again and rewritten


def cpu_gemm_peak(threads: int, dtype: str = "fp32", cache: Path | None = None) -> Peak:
    """This CPU's measured GEMM peak at ``threads`` threads, from the cache or measured now."""
    path = (cache or cache_path()) / CACHE_FILE
    key = cache_key(threads, dtype)
    known = read_cache(path)
    entry = known.get(key)
    valid = (isinstance(entry, dict) and isinstance(entry.get("tflops"), (int, float)) and entry["tflops"] > 0
             and isinstance(entry.get("others_busy_pct"), (int, float))  # measured with the load beside it
             and isinstance(entry.get("library"), str))  # the fastest of torch's GEMMs, not MKL's alone
    kept = f"cached in {path}"
    if not valid:
        entry = measure_gemm(threads, dtype)
        if not contended(entry["others_busy_pct"], threads):
            known[key] = entry
            atomic_write_text(path, json.dumps(known, indent=1, sort_keys=True))
        else:
            kept = (f"other processes kept {entry['others_busy_pct']:.0f}% of the CPUs busy meanwhile: likely low, "
                    f"not cached")
    others = ", ".join(f"{k} {v:.3g}" for k, v in entry.get("rates", {}).items() if k != entry["library"])
    return Peak(entry["tflops"], f"measured {dtype} GEMM {entry['n']}^3 at {threads} thread(s) on {entry['at']} "
                                 f"({entry['library']}'s" + (f"; {others} TFLOPS" if others else "")
                                 + f"; bench ops; {kept})")


def contended(others_pct: float, threads: int, cpus: int | None = None) -> bool:
    """Whether other processes, using ``others_pct`` % of the machine's ``cpus`` (default: this
    machine's), took cores a ``threads``-thread measurement needed: more than the cores it left
    free plus :data:`SLACK` of the machine (2 cores, 1 thread: another process on the other core is
    no contention; 2 threads: it is)."""
    return contention.took_needed(others_pct, threads, cpus or psutil.cpu_count() or 1)  # the rule a run's flag uses


def forget(threads: int, dtype: str = "fp32", cache: Path | None = None) -> bool:
    """Drop the cached peak of ``threads`` and ``dtype`` (a run beat it: it was measured low);
    True where there was one. The next run measures it again."""
    path = (cache or cache_path()) / CACHE_FILE
    known = read_cache(path)
    if known.pop(cache_key(threads, dtype), None) is None:
        return False
    atomic_write_text(path, json.dumps(known, indent=1, sort_keys=True))
    return True


def gpu_dtype(precision: str) -> str:
    """The peak column a run's precision uses: fp32 runs multiply in tf32 when torch allows it; fp8
    runs against the bf16 peak (only their Linear layers multiply in float8; the rest is bf16)."""
    if precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "bf16" if precision == "fp8" else precision


def training_peak(device: torch.device, precision: str, threads: int) -> Peak:
    """The peak TFLOPS of a training run on ``device`` in ``precision`` (None with the reason
    when no figure is known)."""
    if device.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device), gpu_dtype(precision))
    return cpu_gemm_peak(threads, cpu_dtype(precision))


def cpu_dtype(precision: str) -> str:
    """The dtype of a CPU run's measured peak: bf16 runs multiply in bf16, the others in fp32 (fp8's
    emulated products too)."""
    return "bf16" if precision == "bf16" else "fp32"


def recorded_peak(summary: dict, env: dict, precision: str) -> Peak:
    """The peak a recorded run's MFU is measured against: its summary's (a finished run's); for
    a CUDA run stopped before its summary held one, the one :func:`training_peak` gives its
    recorded GPU (env.json) in its ``precision``, said so; for such a CPU run none (a CPU's peak
    is measured on its machine at the run's initialization, not known afterwards)."""
    if summary.get("peak_tflops") is not None:
        return Peak(summary["peak_tflops"], summary.get("peak_source") or "the run's summary")
    gpus = env.get("gpus") or []
    if str(env.get("device", "")).startswith("cuda") and gpus:
        peak = gpu_peak(gpus[0].get("name", "GPU"), gpu_dtype(precision))
        return Peak(peak.tflops, f"{peak.source} (looked up for the recorded GPU: the run recorded no peak)")
    return Peak(None, "the run recorded no peak (a CPU's is measured at a run's initialization)")
