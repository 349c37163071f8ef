"""The telemetry sampler's own CPU cost at its default rates, against a bare psutil loop.

Goal (issue 4): under 1% of one core at the default 0.03 s period. The reference is the
simplest possible sampler: a thread calling psutil's cpu_times() at the same period.
Usage: python benchmarks/bench_sampler.py [--seconds 20]
"""
from __future__ import annotations

import argparse
import os
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    cfg = SamplerConfig()
    shares = []
    for _ in range(3):
        s = Sampler(config=cfg)
        with s:
            time.sleep(a.seconds)
        shares.append(100 * s.summary()["sampler_cpu_s"] / a.seconds)
    ref = 100 * bare_loop(a.seconds, cfg.interval) / a.seconds
    shares.sort()
    print(f"sampler at {cfg.interval}s (CPU) / {cfg.gpu_interval}s (GPU): {shares[1]:.2f}% of one core "
          f"(median of 3; min {shares[0]:.2f}, max {shares[2]:.2f}); {len(s.samples)} samples in {a.seconds:.0f} s")
    print(f"reference bare psutil loop at {cfg.interval}s: {ref:.2f}% of one core; ratio sampler / reference "
          f"{shares[1] / ref:.2f} (goal: sampler < 1%)")


if __name__ == "__main__":
    main()
