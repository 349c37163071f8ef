"""The suite's shared measuring: warm-up and repeats, the device's synchronize, median and spread,
and the machine and versions a figure was measured on (what the runner prints and the ledger keeps)."""
from __future__ import annotations

import statistics
import time


def sync(device) -> None:
    """Wait for ``device``'s queued work (a CUDA device's kernels run after their launch returns)."""
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)


def spread(seconds: list[float]) -> dict:
    """Median, min, max and the spread (max - min) in % of the median."""
    med = statistics.median(seconds)
    return {"median": med, "min": min(seconds), "max": max(seconds),
            "spread_pct": 100 * (max(seconds) - min(seconds)) / med if med else 0.0}


def measure(fn, repeats: int = 5, warmup: int = 1, device=None) -> dict:
    """Seconds per call of ``fn`` after ``warmup`` untimed calls: :func:`spread` of ``repeats``
    timed calls, each ended by a synchronize of ``device`` (None: the host's work only)."""
    for _ in range(warmup):
        fn()
    sync(device)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t)
    return spread(ts)


def machine() -> dict:
    """The machine in the package's words (hardware.machine's rules over capture_env) and the
    versions that move figures: python, torch, CUDA."""
    import torch

    from speechperf.hardware.environment import capture_env
    from speechperf.hardware.machine import hardware, machine_name

    env = capture_env("cuda" if torch.cuda.is_available() else "cpu")
    return {"name": machine_name(env), "hardware": hardware(env), "python": env["python"],
            "torch": torch.__version__, "cuda": env["cuda"]}
