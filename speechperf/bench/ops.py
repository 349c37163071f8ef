"""``speechperf bench ops``: achieved FLOPS of single operators against the device's peak.

Operators (docs/spec.md E): matmul N x N for N = 2048, 4096, 8192; the three conv2d workloads of
paper 002; and the GEMMs of the DS2 LSTM at the paper's per-GPU batch sizes (24, 60, 150):
the input projection of all 830 frames at once and one recurrent step. Timing (telemetry.timing):
warm-up until the call time is stable, then a timed window of calls (on a GPU timed with
CUDA events, no synchronize between calls; on a CPU at most the paper's 300 calls), the
middle third of the call times (in time order: the paper's middle 100 of 300) averaged;
median, spread and the range over repeats too. A dtype the device cannot run, or an
allocation that fails, gives a row that says why, and the sweep goes on. Every row goes to
the database the moment it is measured.
"""
from __future__ import annotations

import json
import statistics
import sys

import psutil
import torch
import torch.nn.functional as F
from tqdm import tqdm

from speechperf.hardware.peaks import Peak, cpu_peak, gpu_peak
from speechperf.bench.store import SweepStore
from speechperf.telemetry.timing import (DTYPES, TIMING_COLUMNS, Method, Op, matmul_op, measure, method,
                                         middle_third, noisy_notes, onednn_matmul_op)
from speechperf.errors import SpeechperfError, in_words
from speechperf.results import schema
from speechperf.tables import write_csv
from speechperf.hardware.capability import NATIVE, cpu_flags, support
from speechperf.hardware.peaks import bf16_unit
from speechperf.hardware.environment import capture_env

LSTM_FRAMES = 830  # output frames of a 1670-frame utterance after the stride-2 conv
PAPER_BATCHES = (24, 60, 150)  # per GPU on Sys1$, Sys2$, Sys10$


def conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def conv_op(n: int, hw: int, c: int, r: int, k: int, stride: int) -> Op:
    """F(n, hw, hw, c) K(r, r, c, k) S(stride): 2 N K C R S P Q FLOPs, 'same'-style padding."""
    pad = r // 2
    p = conv_out(hw, r, stride, pad)

    def make(dev, dt):
        x = torch.randn(n, c, hw, hw, device=dev, dtype=dt)
        w = torch.randn(k, c, r, r, device=dev, dtype=dt)
        return lambda: F.conv2d(x, w, stride=stride, padding=pad)
    return Op("conv2d", f"F({n},{hw},{hw},{c}) K({r},{r},{c},{k}) S({stride},{stride})",
              2.0 * n * k * c * r * r * p * p, make)


def default_ops(quick: bool = False, cpu: bool = False) -> list[Op]:
    """The sweep's ops (``quick``: three small ones); on a CPU (``cpu``) also the 2048 product
    through oneDNN beside torch's ``a @ b`` (MKL's in float32, which takes its AVX2 code on an AMD
    CPU: the measured peak is the faster of the two, hardware/measured_peak.py)."""
    if quick:  # smoke test: seconds on any CPU
        return [matmul_op(256, 256, 256), conv_op(2, 32, 3, 3, 8, 1), matmul_op(24, 800, 3200, "lstm_recurrent")]
    ops = [matmul_op(n, n, n) for n in (2048, 4096, 8192)]
    if cpu and torch.backends.mkldnn.is_available():
        ops.append(onednn_matmul_op(2048, 2048, 2048))
    ops += [conv_op(256, 224, 3, 7, 64, 2), conv_op(128, 112, 64, 3, 128, 1), conv_op(256, 56, 128, 3, 256, 1)]
    for b in PAPER_BATCHES:
        ops.append(matmul_op(b * LSTM_FRAMES, 800, 4 * 800, "lstm_input"))
        ops.append(matmul_op(b, 800, 4 * 800, "lstm_recurrent"))
    return ops


def device_peak(dev: torch.device, dtype: str, threads: int) -> Peak:
    if dev.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(dev), dtype)
    freq = psutil.cpu_freq()
    ghz = (freq.max or freq.current) / 1000.0 if freq else 0.0
    return cpu_peak(threads, ghz, dtype=dtype)


# The columns the text table shows (--json, --csv and the database hold every column)
COLUMNS = ("device", "dtype", "accumulate", "threads", "op", "shape", "gflop", "iters", "ms_mid", "ms_median",
           "spread_pct", "repeat_iqr_pct", "noisy", "tflops", "pct_peak", "pct_measured_peak", "power_w", "status")


def notes(rows: list[dict]) -> list[str]:
    """What the text table leaves out: the peak behind each %, the power source, and every
    row that was not measured, with why."""
    lines, seen = [], set()
    for r in rows:
        key = (r["device"], r["dtype"], r["threads"])
        if key not in seen:
            seen.add(key)
            vendor = "NA" if r["peak_tflops"] is None else f"{r['peak_tflops']:.4g}"
            best = "NA" if r["measured_peak_tflops"] is None else f"{r['measured_peak_tflops']:.4g}"
            lines.append(f"peak {r['device']} {r['dtype']} {r['threads']} thread(s): {vendor} TFLOPS "
                         f"({r['peak_source']}); best measured {best} TFLOPS")
    lines += precision_lines(rows)
    lines += sorted({f"power: {r['energy']}" for r in rows if r.get("energy")})
    lines += list(dict.fromkeys(f"{r['dtype']} on {r['device']}: {r['precision_note']}" for r in rows
                                if r.get("precision_note") and r["status"] == "ok"))
    lines += noisy_notes(rows, lambda r: f"{r['op']} {r['shape']} {r['dtype']} {r['threads']} thread(s)")
    lines += [f"not measured: {r['op']} {r['shape']} {r['dtype']} {r['threads']} thread(s): {r['status']}"
              for r in rows if r["status"] != "ok"]
    return lines


def precision_lines(rows: list[dict]) -> list[str]:
    """Each precision's best measured rate beside fp32's at the same device and threads: "bf16
    beside fp32 on cpu, 2 thread(s): best measured 2.81 vs 0.433 TFLOPS (6.49x); native (AMX-BF16)"
    (or the row's emulated note)."""
    best: dict[tuple, float] = {}
    notes_of: dict[tuple, str | None] = {}
    for r in rows:
        if r["status"] == "ok" and r["tflops"]:
            key = (r["device"], r["dtype"], r["threads"])
            best[key] = max(best.get(key, 0.0), r["tflops"])
            notes_of[key] = r.get("precision_note")
    lines = []
    for (device, dtype, threads), top in best.items():
        base = best.get((device, "fp32", threads))
        if dtype == "fp32" or not base:
            continue
        unit = bf16_unit(cpu_flags()) if device == "cpu" and dtype == "bf16" else None
        how = notes_of[(device, dtype, threads)] or ("native" + (f" ({unit})" if unit else ""))
        lines.append(f"{dtype} beside fp32 on {device}, {threads} thread(s): best measured {top:.3g} vs {base:.3g} "
                     f"TFLOPS ({top / base:.3g}x); {how}")
    return lines


def default_dtypes(device: str) -> list[str]:
    """What ``bench ops`` measures unless ``--dtype`` says: fp32, and bf16 where the device runs it
    natively (AMX or AVX512-BF16 on a CPU; compute capability 8.0 or newer), so its peak shows
    beside fp32's. An emulated bf16 is measured only when asked (27x slower on AVX2)."""
    return ["fp32"] + (["bf16"] if support(device, "bf16").level == NATIVE else [])


def _row(dev, dtype, threads, op, peak, measured=None, status="ok") -> dict:
    """One result row; ``measured`` is run_op's (telemetry.timing.measure with the call times)."""
    m = measured or {}
    times = m.get("times")
    row = {"device": str(dev), "dtype": dtype, "accumulate": "fp32", "threads": threads, "op": op.name,
           "shape": op.shape,
           "gflop": op.flops / 1e9, "iters": m.get("iters", 0), "ms_mid": None, "ms_median": None,
           "spread_pct": m.get("spread_pct"), "tflops": None, "pct_peak": None, "peak_tflops": peak.tflops,
           "peak_source": peak.source, "torch": torch.__version__, "libraries": libraries(dev),
           "power_w": m.get("power_w"), "joules_per_call": m.get("joules_per_sample"), "gflops_per_w": None,
           "energy": m.get("energy"), "status": status, "precision_note": None,
           **{k: m.get(k) for k in TIMING_COLUMNS}}
    if times:
        mid = middle_third(times)
        row.update(ms_mid=1000 * mid, ms_median=1000 * statistics.median(times), tflops=op.flops / mid / 1e12)
        if peak.tflops:
            row["pct_peak"] = 100 * row["tflops"] / peak.tflops
        if row["power_w"]:
            row["gflops_per_w"] = 1000 * row["tflops"] / row["power_w"]
    return row


def libraries(dev: torch.device) -> str:
    """The math libraries behind the op (the GPU driver is in the DB row's env_json)."""
    if dev.type == "cuda":
        return f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    blas = "MKL" if torch.backends.mkl.is_available() else "OpenBLAS/other BLAS"
    return f"{blas}, oneDNN {'on' if torch.backends.mkldnn.is_available() else 'off'}"


def add_measured_peak(rows: list[dict]) -> list[dict]:
    """The best rate of each (device, dtype, threads) as a measured peak beside the vendor or
    derived one, for CPUs whose clock under vector load the derivation can only guess."""
    best: dict[tuple, float] = {}
    for r in rows:
        if r["tflops"]:
            key = (r["device"], r["dtype"], r["threads"])
            best[key] = max(best.get(key, 0.0), r["tflops"])
    for r in rows:
        top = best.get((r["device"], r["dtype"], r["threads"]))
        r["measured_peak_tflops"] = top
        r["pct_measured_peak"] = 100 * r["tflops"] / top if r["tflops"] and top else None
    return rows


def run_op(op: Op, dev: torch.device, dtype: str, m: Method) -> dict:
    """Call times of ``op`` and the power and energy (per call) the sampler saw meanwhile."""
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    return measure(op.make(dev, DTYPES[dtype]), dev, m)


def sweep(dev: torch.device, dtypes, threads_list, ops, m: Method, scaling_max_gflop=None, store=None,
          bar=None) -> list[dict]:
    """Every op x dtype x thread count; below the largest CPU thread count, ops above
    ``scaling_max_gflop`` per call are skipped (rows say so). Each row goes to ``store``
    (a SweepStore) as soon as it is measured, and advances ``bar`` (tqdm)."""
    rows = []

    def done(row):
        rows.append(row)
        if store is not None:
            store.add(row)  # committed now: an interrupted sweep keeps what it measured
        if bar is not None:
            bar.update(1)

    for threads in threads_list:
        big = scaling_max_gflop is not None and dev.type == "cpu" and threads < max(threads_list)
        if dev.type == "cpu":
            torch.set_num_threads(threads)
        for dtype in dtypes:
            peak = device_peak(dev, dtype, threads)
            can = support(dev, dtype)  # native, emulated (flagged) or unsupported (not run, says why)
            for op in ops:
                if bar is not None:
                    bar.set_postfix_str(f"{op.name} {op.shape} {dtype} {threads} thread(s)")
                if not can.runs:
                    done(_row(dev, dtype, threads, op, peak, status=can.note))  # the status says why
                    continue
                if big and op.flops > 1e9 * scaling_max_gflop:
                    done(_row(dev, dtype, threads, op, peak, status=f"skipped: over {scaling_max_gflop:g} GFLOP "
                              f"per call; the thread-scaling pass keeps to smaller shapes (--threads to run)"))
                    continue
                done({**_op_row(op, dev, dtype, threads, peak, m), "precision_note": can.note})
    return rows


def _op_row(op: Op, dev: torch.device, dtype: str, threads: int, peak: Peak, m: Method) -> dict:
    """One op measured, or the failure in words (an allocation that fails: out of memory)."""
    try:
        return _row(dev, dtype, threads, op, peak, run_op(op, dev, dtype, m))
    except (torch.cuda.OutOfMemoryError, MemoryError) as e:
        return _row(dev, dtype, threads, op, peak, status=f"out of memory: {in_words(e)}")
    except RuntimeError as e:
        status = "out of memory" if "out of memory" in str(e).lower() else "failed"
        return _row(dev, dtype, threads, op, peak, status=f"{status}: {in_words(e)}")
    finally:
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def _device(device: str, dtypes) -> torch.device:
    """The device named, refused (exit 2, naming it) when torch cannot run the sweep on it; and
    the dtypes, each known."""
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise SpeechperfError(f"unknown device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpeechperfError(f"device {device!r} requested but no CUDA device is available")
    if dev.type not in ("cpu", "cuda"):
        raise SpeechperfError(f"device {device!r} is not supported (cpu or cuda:N)")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise SpeechperfError(f"unknown dtype(s) {unknown} (one of {', '.join(DTYPES)})")
    return dev


def run_ops(device: str = "cpu", dtypes=None, threads=None, iters: int | None = None, db_path=None,
            quick: bool = False, seconds: float | None = None, scaling_max_gflop: float = 300.0,
            csv_path=None, warmup_seconds: float | None = None, repeats: int | None = None,
            energy_min_seconds: float | None = None, progress: bool = True) -> list[dict]:
    """The whole sweep; every row also goes to the results DB when ``db_path`` is given (as
    it is measured) and to a CSV file when ``csv_path`` is.

    The method (telemetry.timing) is the device's default with any of ``iters``, ``seconds``
    (timed window per op), ``warmup_seconds``, ``repeats`` and ``energy_min_seconds``
    replaced. On CPU by default: 1 thread and all threads, and the 1-thread pass without the
    ops over ``scaling_max_gflop`` (at 1 thread the 8192 matmul alone takes minutes).
    Explicit ``threads`` run every op at every count. ``dtypes`` None: :func:`default_dtypes`.
    A progress bar goes to stderr.
    """
    dev = _device(device, dtypes or ())  # a device torch cannot use refused before its capability is asked
    dtypes = default_dtypes(str(dev)) if dtypes is None else dtypes
    if threads is None:
        threads = sorted({1, torch.get_num_threads()}) if dev.type == "cpu" else [torch.get_num_threads()]
    else:
        scaling_max_gflop = None
    m = method("ops", device, iters=iters, seconds=seconds, warmup_seconds=warmup_seconds, repeats=repeats,
               energy_min_seconds=energy_min_seconds)
    ops = default_ops(quick, cpu=dev.type == "cpu")
    saved = torch.get_num_threads()
    store = None
    if db_path:
        example = _row(dev, "fp32", 1, ops[0], Peak(None, ""))
        example.update(measured_peak_tflops=None, pct_measured_peak=None)
        store = SweepStore(db_path, "bench_ops", OPS_SCHEMA, example, {"env_json": json.dumps(capture_env(str(dev)))})
    bar = tqdm(total=len(threads) * len(dtypes) * len(ops), desc="bench ops", unit="row", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    try:
        rows = add_measured_peak(sweep(dev, list(dtypes), threads, ops, m, scaling_max_gflop, store, bar))
        if store is not None:
            store.replace(rows)  # with the sweep's measured peak
    finally:
        bar.close()
        torch.set_num_threads(saved)
        if store is not None:
            store.close()
    if csv_path:
        write_csv(csv_path, rows)
    return rows


OPS_SCHEMA = schema.BENCH_OPS  # every table's DDL lives in results/schema.py
