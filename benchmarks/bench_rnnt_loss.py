"""The RNN-T loss (speechperf/objectives/rnnt_loss.py): its kernels against the pure-torch reference.

CPU: the numba kernel and ``rnnt_loss_reference`` (the same loss by autograd through plain torch
operations, speechperf/objectives/rnnt_reference.py) on the same logits, forward + backward with a
sum over the batch, alternated call by call in one process after a warm-up (numba's compile, the
allocator's first pages); the median wall seconds of each, their ratio (the goal: >= 3), and the
process's CPU seconds per call beside (steadier than wall time on a shared machine). Peak memory of
each: the process's resident high-water mark (VmHWM, reset through /proc/self/clear_refs) over its
resident size before one call, so torch's allocations are counted (tracemalloc sees none of them),
with glibc made to map every large block afresh; elsewhere than Linux, the resident size after the
call (a lower bound).

CUDA (where a GPU is present): the CUDA kernel at LibriSpeech train-clean-100 shapes, vocabulary 500,
batch 30 (default 30 x 400 frames after 4x subsampling x 100 tokens: the long end of the corpus's
batches), forward + backward, with torch.cuda.max_memory_allocated, against the published step times
of full-lattice losses at those shapes: 0.38-0.60 s and 13-22 GB a step for torchaudio, warp-transducer
and optimized_transducer (csukuangfj/transducer-loss-benchmarking; their step includes a joiner's
forward and backward, which this one leaves out: a lower bound for ours, so within 2x is a necessary
condition only). The reference runs there too where its memory fits.

TDT (speechperf/objectives/tdt_loss.py, durations 0-4): the same rows for the TDT loss's kernels
against ``tdt_loss_reference``, on the same shapes with 5 duration logits after the V token logits
(``tdt_cpu``, ``tdt_gpu`` in the figures; the headline ratio stays RNN-T's).

Usage: python benchmarks/run.py rnnt_loss [--shapes 8x100x30x128,16x200x50x256] [--repeats 5]
       [--gpu-shapes 30x400x100x500] [--dtype float32] [--threads N]
"""
from __future__ import annotations

import ctypes
import functools
import gc
import re
import statistics
import time
from pathlib import Path

import psutil
import torch

import _timing
from speechperf.objectives.rnnt_loss import joint_bytes, rnnt_loss
from speechperf.objectives.rnnt_reference import rnnt_loss_reference
from speechperf.objectives.tdt_loss import tdt_loss
from speechperf.objectives.tdt_reference import tdt_loss_reference

GOAL = ("docs/workloads.md: the RNN-T loss's CPU kernel >= 3x faster than a pure-torch reference of the same loss "
        "(forward + backward, same shapes, one process); on a GPU within 2x of full-lattice losses' published step "
        "times at LibriSpeech train-clean-100 shapes (vocabulary 500, batch 30: 0.38-0.60 s), peak memory printed")
REFERENCE = "rnnt_loss_reference: the same loss by autograd through plain torch operations, on the same logits"
RATIO = "reference / kernel wall seconds per forward + backward (CPU, the first shape)"
DATA = False
PUBLISHED_S = (0.38, 0.60)  # full-lattice losses' step at the GPU shapes (csukuangfj/transducer-loss-benchmarking)
STATUS = Path("/proc/self/status")
TDT_DURATIONS = (0, 1, 2, 3, 4)  # Parakeet-TDT's
LOSSES = {"rnnt": {"kernel": rnnt_loss, "reference": rnnt_loss_reference},
          "tdt": {"kernel": functools.partial(tdt_loss, durations=TDT_DURATIONS),
                  "reference": functools.partial(tdt_loss_reference, durations=TDT_DURATIONS)}}


def shapes(text: str) -> list[tuple[int, int, int, int]]:
    """'BxTxUxV,...' -> [(B, T, U, V), ...]."""
    return [tuple(int(n) for n in s.split("x")) for s in text.split(",") if s]


def arguments(p) -> None:
    p.add_argument("--shapes", type=shapes, default=shapes("8x100x30x128,16x200x50x256"),
                   help="CPU shapes, batch x frames x labels x vocabulary, comma-separated (default %(default)s)")
    p.add_argument("--gpu-shapes", type=shapes, default=shapes("30x400x100x500"), help="CUDA shapes, the same form")
    p.add_argument("--repeats", type=int, default=5, help="timed calls of each loss per shape")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the logits' dtype")
    p.add_argument("--threads", type=int, default=0,
                   help="torch's threads, which the CPU kernel follows (0: torch's default)")


def inputs(shape, dtype, device, seed=0, extra: int = 0):
    """Random logits (B, T, U+1, V + extra) needing a gradient (``extra``: a TDT's duration logits),
    targets and full lengths."""
    B, T, U, V = shape
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, U + 1, V + extra, generator=g).to(device=device, dtype=dtype).requires_grad_()
    targets = torch.randint(1, V, (B, U), generator=g)
    return logits, targets, torch.full((B,), T), torch.full((B,), U)


def step(loss, args) -> None:
    """One forward + backward of ``loss`` with a sum over the batch, the gradient dropped after."""
    loss(*args).sum().backward()
    args[0].grad = None


def _resident() -> int:
    return psutil.Process().memory_info().rss


def _fresh_pages() -> None:
    """Large blocks mapped and unmapped by glibc on every allocation (M_MMAP_THRESHOLD fixed at 128 kB:
    its default grows past a freed block's size, so a repeated call would reuse resident heap pages
    and add nothing to the high-water mark), freed heap returned (malloc_trim)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 17)  # M_MMAP_THRESHOLD
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the figure is a lower bound
        pass


def peak_bytes(loss, args) -> int:
    """Resident bytes one call adds at its peak (see the module's docstring)."""
    gc.collect()
    _fresh_pages()
    before = _resident()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    except OSError:
        step(loss, args)
        return _resident() - before
    step(loss, args)
    return int(re.search(r"VmHWM:\s+(\d+) kB", STATUS.read_text()).group(1)) * 1024 - before


def timed(loss, args) -> tuple[float, float]:
    """(wall, CPU) seconds of one step."""
    c, t = time.process_time(), time.perf_counter()
    step(loss, args)
    return time.perf_counter() - t, time.process_time() - c


def _extra(kind: str) -> int:
    return len(TDT_DURATIONS) if kind == "tdt" else 0


def cpu_row(shape, dtype, repeats: int, kind: str = "rnnt") -> dict:
    args = inputs(shape, dtype, "cpu", extra=_extra(kind))
    fns = LOSSES[kind]
    for f in fns.values():
        step(f, args)  # warm-up: numba's compile or cache load, first pages
    runs = {k: [] for k in fns}
    for _ in range(repeats):  # alternated: the machine's load falls on both alike
        for k, f in fns.items():
            runs[k].append(timed(f, args))
    row = {"shape BxTxUxV": "x".join(map(str, shape)), "dtype": str(dtype).removeprefix("torch.")}
    for k, f in fns.items():
        row[f"{k}_s"] = _timing.spread([w for w, _ in runs[k]])["median"]
        row[f"{k}_cpu_s"] = statistics.median(c for _, c in runs[k])
        row[f"{k}_peak_mb"] = peak_bytes(f, args) / 1e6
    row["ratio"] = row["reference_s"] / row["kernel_s"]
    row["cpu_ratio"] = row["reference_cpu_s"] / row["kernel_cpu_s"]
    return row


def gpu_row(shape, dtype, repeats: int, kind: str = "rnnt") -> dict:
    dev = torch.device("cuda")
    args = inputs(shape, dtype, dev, extra=_extra(kind))
    row = {"shape BxTxUxV": "x".join(map(str, shape)), "dtype": str(dtype).removeprefix("torch."),
           "joint_bytes_gb": joint_bytes(*shape[:2], shape[2] + 1, shape[3] + _extra(kind), dtype) / 1e9}
    for name, f in LOSSES[kind].items():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        try:
            m = _timing.measure(lambda f=f: step(f, args), repeats=repeats, warmup=1, device=dev)
        except torch.cuda.OutOfMemoryError:
            row[f"{name}_s"] = None
            continue
        row[f"{name}_s"] = m["median"]
        row[f"{name}_peak_gb"] = (torch.cuda.max_memory_allocated(dev) - base) / 1e9
    row["over_published"] = row["kernel_s"] / PUBLISHED_S[0]
    return row


def run(a) -> dict:
    dtype = getattr(torch, a.dtype)
    if a.threads:
        torch.set_num_threads(a.threads)
    figures = {"cpu": [], "gpu": [], "tdt_cpu": [], "tdt_gpu": [], "threads": torch.get_num_threads()}
    for kind, shape in [(k, s) for k in LOSSES for s in a.shapes]:
        r = cpu_row(shape, dtype, a.repeats, kind)
        figures["cpu" if kind == "rnnt" else "tdt_cpu"].append(r)
        print(f"  {kind} cpu {r['shape BxTxUxV']:>16} {r['dtype']}: kernel {r['kernel_s'] * 1e3:.1f} ms "
              f"({r['kernel_cpu_s'] * 1e3:.1f} CPU-ms, peak +{r['kernel_peak_mb']:.0f} MB), reference "
              f"{r['reference_s'] * 1e3:.1f} ms ({r['reference_cpu_s'] * 1e3:.1f} CPU-ms, peak "
              f"+{r['reference_peak_mb']:.0f} MB): {r['ratio']:.2f}x wall, {r['cpu_ratio']:.2f}x CPU", flush=True)
    if torch.cuda.is_available():
        for kind, shape in [(k, s) for k in LOSSES for s in a.gpu_shapes]:
            r = gpu_row(shape, dtype, a.repeats, kind)
            figures["gpu" if kind == "rnnt" else "tdt_gpu"].append(r)
            ref = "out of memory" if r["reference_s"] is None else f"{r['reference_s'] * 1e3:.1f} ms"
            print(f"  {kind} cuda {r['shape BxTxUxV']:>16} {r['dtype']}: kernel {r['kernel_s'] * 1e3:.1f} ms, peak "
                  f"{r['kernel_peak_gb']:.2f} GB (joint_bytes {r['joint_bytes_gb']:.2f} GB); reference {ref}; "
                  f"kernel / published {PUBLISHED_S[0]} s = {r['over_published']:.3f}", flush=True)
    else:
        print("  cuda: no GPU here, the CUDA kernel not timed")
    figures["ratio"] = figures["cpu"][0]["ratio"] if figures["cpu"] else None
    return figures
