"""How ``bench zoo`` and ``bench ops`` time one row: warm up until the step time is stable,
then a timed window of a set length, split into repeats.

Warm-up: at least ``warmup_steps`` steps, then until the median of the last three step
times is within ``stable_pct`` of the three before (cuDNN autotuning, allocator growth and
clock ramp-up are over), or ``warmup_seconds`` are spent; the row records which.
``warmup_steps`` 0 means no warm-up at all.

Timed window: steps until ``seconds`` have passed (or exactly ``iters`` steps). On CUDA no
synchronize between steps: an event is recorded after every ``stride`` steps (stride 1
unless steps are so short that the window would hold more than ``MAX_MARKS`` events) and
the device is synchronized once, after the window; the per-step times come from the
events, so the GPU's queue stays full as in training. On a CPU each step is timed with
``perf_counter``. The steps are then split into ``repeats`` consecutive windows: the rate
is the median over them and ``repeat_iqr_pct`` their interquartile range in % of it;
``spread_pct`` is the interquartile range of the step times. A row whose spread or repeat
range exceeds ``noisy_pct`` is marked ``noisy``.

Power and energy are measured over the timed window (telemetry.power): a window shorter than
``energy_min_seconds`` gives None with the reason, never 0 W.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from speechperf.errors import SpeechperfError
from speechperf.telemetry.device_gpus import run_gpus
from speechperf.telemetry.power import ENERGY_MIN_SECONDS, PowerMeter

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MAX_MARKS = 2000  # events (or clock reads) per timed window at most: bounded memory and overhead


@dataclass(frozen=True)
class Method:
    """How one row is measured (defaults per device and benchmark: ``method()``)."""

    warmup_steps: int = 1  # untimed steps at least
    warmup_seconds: float = 3.0  # warm-up budget, s: past it the row is timed even if not yet stable
    stable_pct: float = 5.0  # warm when the last 3 steps' median is within this % of the 3 before
    seconds: float = 4.5  # timed window, s, over all repeats (at least one step)
    iters: int | None = None  # exactly this many timed steps instead of ``seconds``
    max_steps: int | None = None  # at most this many timed steps (CPU ops: the paper's 300 calls)
    min_steps: int = 1  # at least this many timed steps
    repeats: int = 3  # consecutive windows the timed steps are split into
    noisy_pct: float = 10.0  # mark rows whose step spread or repeat range exceeds this
    energy_min_seconds: float = ENERGY_MIN_SECONDS  # shorter windows get no power or energy


# Defaults. GPU: every row ~8 s at most (3 s warm-up budget, 4.5 s timed; ops 2 s + 3 s), so
# the default sweeps (zoo fp32+amp: 30 rows, ops: 12) fit in about 7 minutes on one GPU. CPU:
# the per-row time of the sweeps before this method (zoo: one warm-up step + 5 s; ops: one
# warm-up call + 3 s, 6 to 300 calls), shared between warm-up and the timed window.
METHODS = {
    ("zoo", "cuda"): Method(warmup_steps=3, warmup_seconds=3.0, seconds=4.5),
    ("zoo", "cpu"): Method(warmup_steps=1, warmup_seconds=1.0, seconds=4.0),
    ("ops", "cuda"): Method(warmup_steps=3, warmup_seconds=2.0, seconds=3.0, min_steps=6),
    ("ops", "cpu"): Method(warmup_steps=1, warmup_seconds=0.5, seconds=2.5, min_steps=6, max_steps=300),
}


def method(bench: str, device: str, **overrides) -> Method:
    """The default method of ``bench`` ("zoo", "ops") on ``device``, with the given fields
    replaced (None values are left at the default)."""
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    return replace(METHODS[(bench, kind)], **{k: v for k, v in overrides.items() if v is not None})


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def warm_up(step, dev: torch.device, m: Method) -> dict:
    """Untimed steps until stable or the budget is spent: {"warmup_steps", "warmup_s", "warm", "step_s"}."""
    times: list[float] = []
    t0 = time.perf_counter()
    warm = False
    while m.warmup_steps > 0:  # 0: no warm-up at all (asked for explicitly)
        if len(times) >= max(m.warmup_steps, 6):
            last, before = statistics.median(times[-3:]), statistics.median(times[-6:-3])
            warm = abs(last - before) <= m.stable_pct / 100 * before
        if len(times) >= m.warmup_steps and (warm or time.perf_counter() - t0 >= m.warmup_seconds):
            break
        _sync(dev)
        t = time.perf_counter()
        step()
        _sync(dev)  # warm-up is untimed: synchronizing here costs nothing measured
        times.append(time.perf_counter() - t)
    return {"warmup_steps": len(times), "warmup_s": time.perf_counter() - t0, "warm": int(warm),
            "step_s": statistics.median(times[-3:]) if times else 0.0}


def timed(step, dev: torch.device, m: Method, step_estimate: float) -> tuple[list[float], int, float, str]:
    """(per-step seconds of every mark, steps per mark, wall seconds, timer) of the window."""
    window = m.seconds
    stride = 1
    if m.iters is None and step_estimate > 0:
        expected = min(window / step_estimate, m.max_steps or math.inf)
        stride = max(1, math.ceil(expected / MAX_MARKS))
    cuda = dev.type == "cuda"
    marks: list = []
    steps = 0
    _sync(dev)
    t0 = time.perf_counter()
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        marks.append(start)
    else:
        marks.append(t0)

    def done() -> bool:
        if m.iters is not None:
            return steps >= m.iters
        if steps < m.min_steps:
            return False
        if m.max_steps is not None and steps >= m.max_steps:
            return True
        return time.perf_counter() - t0 >= window

    while not done():
        for _ in range(stride):
            step()
        steps += stride
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()  # no synchronize: the queue stays full
            marks.append(ev)
        else:
            marks.append(time.perf_counter())
    _sync(dev)
    wall = time.perf_counter() - t0
    if cuda:
        per = [a.elapsed_time(b) / 1000.0 / stride for a, b in zip(marks, marks[1:])]
        return per, stride, wall, "cuda events"
    return [(b - a) / stride for a, b in zip(marks, marks[1:])], stride, wall, "perf_counter"


def spread_pct(times: list[float]) -> float | None:
    """Interquartile range in % of the median: robust to the odd step a shared machine
    stalls (max - min reported 700% for 0.1 GFLOP calls that were steady). None for fewer
    than two values: one time has no spread."""
    if len(times) < 2:
        return None
    q1, _, q3 = statistics.quantiles(times, n=4)
    return 100 * (q3 - q1) / statistics.median(times)


def measure(step, dev: torch.device, m: Method, samples_per_step: float = 1.0, meter=None) -> dict:
    """Warm up, time, and power-meter ``step``: the row's timing and energy columns.

    ``times`` (per-step seconds, in time order) is returned too, for callers that aggregate
    them their own way (ops: the paper's middle third)."""
    warm = warm_up(step, dev, m)
    with (meter or PowerMeter(min_seconds=m.energy_min_seconds, run_gpus=run_gpus(dev))) as power:
        per, stride, wall, timer = timed(step, dev, m, warm["step_s"])
    steps = len(per) * stride
    groups = _split(per, m.repeats)
    rates = [len(g) * samples_per_step / sum(g) for g in groups if sum(g) > 0]  # per-step times: stride cancels
    rate = statistics.median(rates) if rates else None
    repeat_iqr = spread_pct(rates) if len(rates) >= 2 else None
    spread = spread_pct(per)
    noisy = any(x is not None and x > m.noisy_pct for x in (spread, repeat_iqr))
    energy = power.result(samples_per_step * steps)
    return {"times": per, "samples_per_s": rate, "step_s": statistics.median(per), "iters": steps,
            "spread_pct": spread, "repeats": len(rates), "repeat_iqr_pct": repeat_iqr, "noisy": int(noisy),
            "window_s": sum(per) * stride, "warmup_steps": warm["warmup_steps"], "warmup_s": warm["warmup_s"],
            "warm": warm["warm"], "timer": timer + (f", {stride} steps per mark" if stride > 1 else ""),
            "power_w": energy["power_w"], "joules_per_sample": energy["joules_per_sample"], "energy": energy["energy"]}


def _split(times: list[float], repeats: int) -> list[list[float]]:
    """Consecutive groups of (nearly) equal count, as many as ``repeats`` and the steps allow."""
    n = min(repeats, len(times))
    if n <= 0:
        return []
    bounds = [round(k * len(times) / n) for k in range(n + 1)]
    return [times[a:b] for a, b in zip(bounds, bounds[1:])]


TIMING_COLUMNS = ("warmup_steps", "warmup_s", "warm", "window_s", "repeats", "repeat_iqr_pct", "noisy", "timer")


def noisy_notes(rows: list[dict], name, pct: float = Method.noisy_pct) -> list[str]:
    """One line per row marked noisy: what was noisy, by how much."""
    lines = []
    for r in rows:
        if r.get("noisy"):
            parts = [f"step spread {r['spread_pct']:.0f}%" if r.get("spread_pct") is not None else None,
                     f"repeats {r['repeat_iqr_pct']:.0f}%" if r.get("repeat_iqr_pct") is not None else None]
            lines.append(f"noisy (spread over {pct:g}%): {name(r)}: {', '.join(p for p in parts if p)}")
    return lines


@dataclass(frozen=True)
class Op:
    """An operation to time (``bench ops``' rows, the GEMM of a CPU's measured peak)."""

    name: str  # e.g. "matmul", "conv2d", "lstm_input"
    shape: str  # human-readable workload
    flops: float  # by formula
    make: Callable[[torch.device, torch.dtype], Callable[[], torch.Tensor]]  # builds inputs, returns the call


def matmul_op(m: int, k: int, n: int, name: str = "matmul") -> Op:
    def make(dev, dt):
        a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
        return lambda: a @ b
    return Op(name, f"{m}x{k} @ {k}x{n}", 2.0 * m * n * k, make)


def onednn_matmul_op(m: int, k: int, n: int, name: str = "matmul (oneDNN)") -> Op:
    """The same product through oneDNN's inner product (``mkldnn_linear``, CPU tensors only). On a
    CPU torch's float32 ``a @ b`` (and every Linear layer) is MKL's sgemm, which picks its code by
    the CPU's maker as well as its ISA: on an AMD EPYC with AVX-512 it takes the AVX2 code, and
    oneDNN's product runs 2.3x as fast (0.446 against 0.194 TFLOPS at 2 threads; ledger:
    bench_lstm_ceiling)."""
    def make(dev, dt):
        a, w = torch.randn(m, k, dtype=dt).to_mkldnn(), torch.randn(n, k, dtype=dt).to_mkldnn()
        return lambda: torch._C._nn.mkldnn_linear(a, w)  # (m, k) x (n, k)^T
    return Op(name, f"{m}x{k} @ {k}x{n}", 2.0 * m * n * k, make)


def middle_third(times: list[float]) -> float:
    """Mean of the middle third of the calls in time order (the paper: middle 100 of 300)."""
    if not times:
        raise SpeechperfError("no timings to aggregate")
    n = len(times)
    lo, hi = n // 3, n - n // 3
    mid = times[lo:hi] or times
    return sum(mid) / len(mid)
