"""The telemetry sampler's achieved periods and its own CPU cost, against named references
measured in the same process.

- Achieved period / asked period, per series: CPU utilization (asked 0.03 s) and, where a
  GPU is present (NVML, or amdsmi on AMD GPUs), power (asked 0.05 s), the driver's buffered
  utilization samples (NVML) or polled gfx_activity (amdsmi). Goal: CPU and GPU power within
  10% of the period asked (NVML power once came every ~73 ms for 50 ms asked).
- Sampler CPU cost: CPU seconds of the sampler thread per wall second (% of one core),
  against the simplest possible sampler: a thread calling psutil's cpu_times() at the same
  period (reference). Goal: the sampler under 1% of one core at the defaults.
  Measured idle and with 4 child processes to follow (loader workers).
Usage: python benchmarks/bench_sampler.py [--seconds 10]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import psutil

from speechperf.telemetry.sampler import Sampler, SamplerConfig


def bare_loop(seconds: float, interval: float) -> float:
    """CPU seconds of a minimal psutil polling thread (the reference)."""
    proc, stop, used = psutil.Process(os.getpid()), threading.Event(), []

    def run():
        t0 = time.thread_time()
        while not stop.wait(interval):
            proc.cpu_times()
        used.append(time.thread_time() - t0)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return used[0]


def one_run(seconds: float, children: int) -> dict:
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(children)]
    try:
        s = Sampler()
        with s:
            time.sleep(seconds)
        summary = s.summary()
    finally:
        for k in kids:
            k.kill()
            k.wait()
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    a = ap.parse_args()
    cfg = SamplerConfig()
    ref = 100 * bare_loop(a.seconds, cfg.interval) / a.seconds
    print(f"reference: bare psutil loop at {cfg.interval} s: {ref:.2f}% of one core")
    for children in (0, 4):
        runs = [one_run(a.seconds, children) for _ in range(3)]
        shares = sorted(100 * r["sampler_cpu_s"] / a.seconds for r in runs)
        summary = runs[1]
        print(f"\nsampler, {children} child processes followed, {a.seconds:.0f} s, 3 runs:")
        print(f"  own CPU: {shares[1]:.2f}% of one core (median; min {shares[0]:.2f}, max {shares[2]:.2f}); "
              f"ratio sampler / reference {shares[1] / ref:.2f} (goal: sampler < 1%)")
        for key, p in summary["periods"].items():
            if p["median_s"] is None:
                continue
            asked = p["asked_s"]
            ratio = f"achieved / asked {p['median_s'] / asked:.3f}" if asked else "driver's own rate"
            print(f"  {key}: median interval {1000 * p['median_s']:.1f} ms over {p['count']} samples "
                  f"(asked {f'{1000 * asked:.0f} ms' if asked else '-'}; {ratio})")
        if not summary["gpus"]:
            print(f"  GPU: not measured here ({summary['unavailable'].get('gpu', 'no GPU')})")


if __name__ == "__main__":
    main()
