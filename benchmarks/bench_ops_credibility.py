"""Credibility of ``speechperf bench ops``: our timing of an op vs torch.utils.benchmark's
blocked_autorange on the same op and dtype, in the same process; and run-to-run spread.

Goal (issue 5): ours / reference within 5%; repeated sweeps within 10%.
Usage: python benchmarks/bench_ops_credibility.py [--n 2048] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.utils.benchmark as tb

from speechperf.bench import ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    for op in (ops.matmul_op(a.n, a.n, a.n), ops.conv_op(32, 56, 128, 3, 256, 1)):
        call = op.make(torch.device("cpu"), torch.float32)
        ours = [ops.middle_third(ops.time_call(call, torch.device("cpu"), None, 3.0)) for _ in range(a.repeats)]
        ref = tb.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads()).blocked_autorange(
            min_run_time=3.0).median  # Timer defaults to 1 thread: match ours
        spread = 100 * (max(ours) - min(ours)) / min(ours)
        mid = statistics.median(ours)  # of the repeats: one noisy repeat on a shared machine does not decide
        print(f"{op.name} {op.shape}: ours {1000 * mid:.2f} ms ({op.flops / mid / 1e9:.1f} GFLOPS), "
              f"blocked_autorange {1000 * ref:.2f} ms; ratio ours / reference {mid / ref:.3f} (goal within 5%); "
              f"{a.repeats} repeats spread {spread:.1f}% (goal < 10%)")


if __name__ == "__main__":
    main()
