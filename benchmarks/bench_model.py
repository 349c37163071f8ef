"""Model step cost on this machine, per preset: step time, FLOPs, share of the fp32 peak,
length bucketing vs paper padding, and bf16 autocast vs fp32.

The reference for "% of peak" is this machine's measured fp32 matmul rate (4096^2, same
process). The bucket / pad ratio trains the same utterances (lengths drawn from 1-15 s, as
in the embedded corpus) once padded to 1670 frames and once length-bucketed.
Usage: python benchmarks/bench_model.py [--presets cpu,paper] [--repeats 3]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from _timing import measure, show  # noqa: E402

from speechperf.config import load_preset  # noqa: E402
from speechperf.models import build_model  # noqa: E402
from speechperf.models.ds2 import flops_per_frame  # noqa: E402
from speechperf.telemetry.capability import support  # noqa: E402
from speechperf.models.contract import autocast  # noqa: E402


def matmul_peak(n: int = 4096) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    m = measure(lambda: a @ b, repeats=5)
    return 2 * n**3 / m["median"]


def make_step(model, opt, precision):
    def step(x, lens):
        with autocast(torch.device("cpu"), precision):
            lp, ol = model(x, lens)
        labels = torch.randint(2, 28, (int(ol.sum()) // 3,))
        ll = (ol // 3).clamp(min=1)
        labels = labels[: int(ll.sum())]
        loss = F.ctc_loss(lp.float(), labels, ol, ll, zero_infinity=True)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="cpu,paper")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    peak = matmul_peak()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; measured fp32 matmul peak {peak / 1e9:.0f} GFLOPS")
    rng = np.random.default_rng(0)
    for name in a.presets.split(","):
        cfg = load_preset(name)
        model = build_model(cfg.model)
        opt = torch.optim.AdamW(model.parameters(), 1e-3)
        b = 8 if name == "paper" else cfg.loader.batch_size
        x, lens = torch.randn(b, 1670, 93), torch.full((b,), 1670)
        for precision in ("fp32", "bf16"):
            can = support("cpu", precision, model)  # bf16 on an LSTM without AVX-512 does not run: say so
            if not can.runs:
                print(f"[{name}] {precision}: {can.note}")
                continue
            m = measure(lambda: make_step(model, opt, precision)(x, lens), repeats=a.repeats)
            flops = 3 * flops_per_frame(cfg.model) * int(lens.sum())  # forward + backward (2x)
            print(f"[{name}] {b} x 1670 frames {precision}: " + show("step", m)
                  + f"; {flops / 1e9:.1f} GFLOP/step -> {flops / m['median'] / 1e9:.1f} GFLOPS = "
                  f"{100 * flops / m['median'] / peak:.1f}% of measured peak")
            if precision == "fp32":
                fp32 = m["median"]
            else:
                print(f"[{name}] ratio bf16 / fp32 step time: {m['median'] / fp32:.2f} ({can.note or 'native bf16'})")
        # bucket vs pad on the same utterances (cpu-sized batches keep this quick)
        n_utts = 4 * b
        frames = np.sort(rng.integers(100, 1500, n_utts))
        step = make_step(model, opt, "fp32")
        pad = measure(lambda: [step(torch.randn(b, 1670, 93), torch.tensor(frames[i: i + b]))
                               for i in range(0, n_utts, b)], repeats=1)
        bucket = measure(lambda: [step(torch.randn(b, int(frames[i: i + b].max()), 93), torch.tensor(frames[i: i + b]))
                                  for i in range(0, n_utts, b)], repeats=1)
        print(f"[{name}] {n_utts} utterances: pad {pad['median']:.2f} s, bucket {bucket['median']:.2f} s, "
              f"throughput ratio bucket / pad {pad['median'] / bucket['median']:.2f}")


if __name__ == "__main__":
    main()
