"""Credibility of ``speechperf bench ops``: our timing of an op vs torch.utils.benchmark's
blocked_autorange on the same op and dtype, in the same process; and run-to-run spread.

Goal: ours / reference within 5%; repeated sweeps within 10%.
``--sweeps K`` also runs the default operator sweep (all threads) K times in this process
and prints, per op, each sweep's TFLOPS over the first sweep's, and the largest deviation.
Usage: python benchmarks/bench_ops_credibility.py [--n 2048] [--repeats 3] [--sweeps 2]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.utils.benchmark as tb

from speechperf.bench import ops
from speechperf.telemetry.timing import measure, method


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sweeps", type=int, default=0)
    a = ap.parse_args()
    for op in (ops.matmul_op(a.n, a.n, a.n), ops.conv_op(32, 56, 128, 3, 256, 1)):
        call = op.make(torch.device("cpu"), torch.float32)
        m = method("ops", "cpu", seconds=3.0, max_steps=10_000)  # the sweep's method, with no 300-call cap
        ours = [ops.middle_third(measure(call, torch.device("cpu"), m)["times"]) for _ in range(a.repeats)]
        ref = tb.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads()).blocked_autorange(
            min_run_time=3.0).median  # Timer defaults to 1 thread: match ours
        spread = 100 * (max(ours) - min(ours)) / min(ours)
        mid = statistics.median(ours)  # of the repeats: one noisy repeat on a shared machine does not decide
        print(f"{op.name} {op.shape}: ours {1000 * mid:.2f} ms ({op.flops / mid / 1e9:.1f} GFLOPS), "
              f"blocked_autorange {1000 * ref:.2f} ms; ratio ours / reference {mid / ref:.3f} (goal within 5%); "
              f"{a.repeats} repeats spread {spread:.1f}% (goal < 10%)")

    if a.sweeps > 1:
        repeat_sweeps(a.sweeps)


def repeat_sweeps(k: int) -> None:
    """The default sweep at all threads ``k`` times: TFLOPS of each op relative to sweep 1."""
    runs = [ops.run_ops("cpu", threads=[torch.get_num_threads()]) for _ in range(k)]
    worst = 0.0
    for i, first in enumerate(runs[0]):
        if not first["tflops"]:
            continue
        ratios = [r[i]["tflops"] / first["tflops"] for r in runs[1:]]
        worst = max(worst, *(abs(x - 1) for x in ratios))
        print(f"{first['op']} {first['shape']}: {1000 * first['tflops']:.1f} GFLOPS; later sweeps / first "
              + ", ".join(f"{x:.3f}" for x in ratios))
    print(f"largest deviation between {k} sweeps: {100 * worst:.1f}% (goal < 10%)")


if __name__ == "__main__":
    main()
