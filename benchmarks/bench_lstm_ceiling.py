"""The ceiling the LSTM kernel sets on the ``cpu`` preset's MFU (issue 60, item 5: the CPU step
close to its hardware): one of the preset's LSTM layers, forward and backward, at its training
shape, against a square GEMM in the same precision, alternated in one process.

The ``cpu`` preset is DS2 (conv front end, ``lstm_layers`` unidirectional LSTMs of ``lstm_hidden``,
CTC); its LSTMs are most of its step's time (bench_step_profile: oneDNN's ``mkldnn_rnn_layer`` and
its backward). MFU divides the step's FLOPs by the measured GEMM peak, so the step cannot reach a
larger share of that peak than its LSTMs do: the rate this prints is that bound, from torch's own
kernel (oneDNN's RNN primitive, which torch takes for fp32 and bf16 on x86 CPUs). What the step
adds beside the LSTMs (CTC, dropout masks, the convolution, normalisation, AdamW) only lowers it.

FLOPs are counted by formula, not by torch's counter (which does not see ``mkldnn_rnn_layer``):
a layer's forward is 2 x T x B x 4H x (I + H) (the four gates' input and recurrent GEMMs, the
input's batched over time), its backward twice that (the gradients of the input and of the
weights); the gates' pointwise work is left out (O(T B H), not O(T B H^2)).

T is the frames after the front end's stride (auto_precision's typical 600 input frames / the
conv stride), B the preset's batch. The GEMM is --gemm x --gemm x --gemm (2,048: at the measured
peak on the machines in the ledger), timed as the measured peak's two products (torch's ``a @ b``
and oneDNN's: MKL's float32 product takes its AVX2 code on an AMD CPU), the faster the reference.
Rounds alternate the GEMMs and the layer in each precision so a neighbour's load falls on all
alike; the medians are printed with their spread.

Usage: python benchmarks/run.py lstm_ceiling [--preset cpu] [--rounds 7] [--threads N] [--gemm 2048]
"""
from __future__ import annotations

import statistics
import time

import torch

from speechperf.config import load_preset
from speechperf.hardware.capability import NATIVE, cpu_flags, isa, model_support
from speechperf.hardware.measured_peak import gemm_ops
from speechperf.telemetry.timing import DTYPES

GOAL = ("docs/bench.md: the cpu step at >= 55% of the measured fp32 GEMM peak and >= 30% of the bf16 peak "
        "(issue 60); the step's LSTMs bound what it can reach")
REFERENCE = ("a square GEMM in the same precision, the faster of torch's a @ b and oneDNN's, alternated with the "
             "LSTM layer in this process")
RATIO = "the LSTM layer's fp32 FLOP rate (forward + backward) / the fp32 GEMM's"
DATA = False
FRAMES = 600  # the input frames of auto_precision's typical batch


def arguments(p) -> None:
    p.add_argument("--preset", default="cpu", help="a DS2 preset (its lstm_hidden, batch_size, conv_stride)")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (each: every case once)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (training's)")
    p.add_argument("--gemm", type=int, default=2048, help="the square GEMM's size")


def lstm_flops(frames: int, batch: int, inputs: int, hidden: int) -> float:
    """One LSTM layer's forward + backward GEMM FLOPs (the module docstring's count)."""
    return 3 * 2.0 * frames * batch * 4 * hidden * (inputs + hidden)


def _gemms(n: int, precision: str) -> dict:
    """The measured peak's products in ``precision`` (hardware/measured_peak.gemm_ops: torch's
    ``a @ b`` as "gemm P", oneDNN's as "gemm P oneDNN"): name -> (callable, FLOPs)."""
    return {f"gemm {precision}" + ("" if library == "torch.mm" else f" {library}"):
            (op.make(torch.device("cpu"), DTYPES[precision]), op.flops) for library, op in gemm_ops(n).items()}


def _cases(cfg, n: int) -> dict:
    """name -> (callable, FLOPs): the GEMMs and the LSTM layer, fp32 and (where native) bf16."""
    h, b = cfg.model.lstm_hidden, cfg.loader.batch_size
    t = FRAMES // cfg.model.conv_stride
    lstm = torch.nn.LSTM(h, h)
    x = torch.randn(t, b, h, requires_grad=True)

    def layer(dtype):
        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                y, _ = lstm(x)
            y.float().sum().backward()
        return step
    cases = {**_gemms(n, "fp32"), "lstm fp32": (layer("fp32"), lstm_flops(t, b, h, h))}
    if model_support(cfg.model, torch.device("cpu"), "bf16").level == NATIVE:
        cases |= {**_gemms(n, "bf16"), "lstm bf16": (layer("bf16"), lstm_flops(t, b, h, h))}
    return cases


def run(a) -> dict:
    torch.set_num_threads(a.threads)
    cfg = load_preset(a.preset)
    if cfg.model.name != "ds2":
        raise SystemExit(f"lstm_ceiling: --preset {a.preset} is {cfg.model.name}, not a DS2 (an LSTM) model")
    cases = _cases(cfg, a.gemm)
    for fn, _ in cases.values():
        fn()  # warm-up: oneDNN's primitives made, weights reordered
    rates = {name: [] for name in cases}
    for _ in range(a.rounds):
        for name, (fn, flops) in cases.items():
            t0 = time.perf_counter()
            fn()
            rates[name].append(flops / (time.perf_counter() - t0) / 1e9)
    med = {k: statistics.median(v) for k, v in rates.items()}
    spread = {k: 100.0 * (max(v) - min(v)) / med[k] for k, v in rates.items()}
    print(f"{a.preset}: LSTM {cfg.model.lstm_hidden} x batch {cfg.loader.batch_size} x {FRAMES // cfg.model.conv_stride} "
          f"frames, {a.threads} thread(s), torch {torch.__version__}, CPU {isa(cpu_flags())}")
    for k in cases:
        print(f"  {k}: {med[k]:.1f} GFLOPS (spread {spread[k]:.0f}%)")
    best = {p: max(v for k, v in med.items() if k.startswith(f"gemm {p}")) for p in ("fp32", "bf16")
            if f"gemm {p}" in med}  # the faster of torch's two products: the measured peak's rule
    share = {p: med[f"lstm {p}"] / best[p] for p in best if f"lstm {p}" in med}
    print("  the LSTM's share of its precision's best GEMM rate: "
          + ", ".join(f"{p} {100 * s:.0f}%" for p, s in share.items()))
    return {"preset": a.preset, "threads": a.threads, "gflops": med, "spread_pct": spread, "best_gemm_gflops": best,
            "lstm_share_of_gemm": share, "ratio": share["fp32"]}
