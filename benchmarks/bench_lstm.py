"""cuDNN's LSTM at the `gpu` preset's widths against widths cuDNN may run with persistent kernels.

Why: the `gpu` preset's step is launch-bound on an H200 (6,304 launches a step: cuDNN's
standard LSTM algorithm launches kernels per time step per layer; docs/gpu.md). PyTorch asks
cuDNN for its persistent algorithm (a layer's time steps in one kernel) only for half-precision
input that is not packed, one unidirectional layer whose hidden and input sizes are multiples
of 128, on GPUs of compute capability >= 8 (not 8.6) with >= 98 SMs, at batches that are
multiples of 8 up to 128 (aten/src/ATen/native/cudnn/RNN.cpp, get_algo). Under bf16 autocast
the LSTM runs in fp16 (docs/gpu.md). The preset's 600 -> 800 and 800 -> 800 layers never
qualify; 640 -> 768 and 768 -> 768 do, at batch 128 but not 136. What the widths would buy is
a question for a GPU: this times one layer's forward and backward per (input, hidden, batch)
under the preset's autocast, T time steps, CUDA synchronized, median of ``--repeats``, with the
kernels it launched (torch.profiler), each against the preset's widths at the same batch.

    python benchmarks/bench_lstm.py [--device cuda] [--frames 150] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).parent))
from _timing import measure  # noqa: E402

PRESET = [(600, 800), (800, 800)]  # the gpu preset's first and later LSTM layers (input, hidden)
WIDE = [(640, 768), (768, 768)]  # multiples of 128: eligible for cuDNN's persistent algorithm
BATCHES = [120, 128, 136, 256]  # the persistent algorithm's bound is 128 (multiples of 8)


def layer_pass(lstm: torch.nn.LSTM, x: torch.Tensor, dtype: torch.dtype | None):
    """One forward and backward pass of ``lstm`` on ``x`` (T, B, I) under autocast ``dtype``."""
    def run():
        with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
            y, _ = lstm(x)
        y.float().sum().backward()
    return run


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernels(run, device: torch.device) -> int | None:
    """Kernels one pass launches on the device (None on a CPU)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        sync(device)
    names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    return sum(not n.startswith(("Memcpy", "Memset")) for n in names)


def row(inp: int, hidden: int, batch: int, frames: int, device: torch.device, dtype, repeats: int) -> dict:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(inp, hidden).to(device)
    x = torch.randn(frames, batch, inp, device=device)
    run = layer_pass(lstm, x, dtype)
    t = measure(lambda: (run(), sync(device)), repeats=repeats, warmup=2)
    half = dtype is not None and device.type == "cuda"
    eligible = half and inp % 128 == 0 and hidden % 128 == 0 and batch % 8 == 0 and batch <= 128
    return {"input": inp, "hidden": hidden, "batch": batch, "ms": 1000 * t["median"], "min ms": 1000 * t["min"],
            "max ms": 1000 * t["max"], "kernels": kernels(run, device), "persistent eligible": eligible}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None,
                   help="autocast (default: the gpu preset's bf16 on CUDA, fp32 on a CPU)")
    p.add_argument("--frames", type=int, default=150, help="time steps (the demo's 3 s utterances after the conv's stride 2)")
    p.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--scale", type=int, default=1, help="divide every width by this (a quick CPU run)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.frames < 1 or a.repeats < 1 or a.scale < 1 or min(a.batches) < 1:
        print("bench_lstm: --frames, --repeats, --scale and --batches must be >= 1", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    a.precision = a.precision or ("bf16" if device.type == "cuda" else "fp32")
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.precision]
    if device.type == "cpu" and dtype is torch.float16:
        print("bench_lstm: fp16 autocast needs a CUDA device", file=sys.stderr)
        return 2
    rows = [row(i // a.scale, h // a.scale, b, a.frames, device, dtype, a.repeats)
            for b in a.batches for i, h in PRESET + WIDE]
    base = {(r["batch"], r["hidden"] == r["input"]): r["ms"] for r in rows
            if (r["input"] * a.scale, r["hidden"] * a.scale) in PRESET}
    for r in rows:  # against the preset's layer of the same kind (first or later) at the same batch
        r["vs preset"] = base[(r["batch"], r["hidden"] == r["input"])] / r["ms"]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    head = f"one LSTM layer, forward + backward, {a.frames} steps, {a.precision}{' autocast' if dtype else ''}, {gpu}, torch {torch.__version__}"
    if a.json:
        print(json.dumps({"head": head, "rows": rows}, indent=1))
        return 0
    print(head)
    print(f"{'input':>6}{'hidden':>7}{'batch':>6}{'ms':>9}{'kernels':>9}{'eligible':>9}{'preset/this':>12}")
    for r in rows:
        k = "-" if r["kernels"] is None else r["kernels"]
        print(f"{r['input']:>6}{r['hidden']:>7}{r['batch']:>6}{r['ms']:>9.3f}{k:>9}{'yes' if r['persistent eligible'] else 'no':>9}"
              f"{r['vs preset']:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
