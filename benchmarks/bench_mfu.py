"""MFU of a preset's training step on this CPU, against the GEMM peak measured in the same
process, and where the step's time goes (torch.profiler, grouped by kind of work).

For each preset: its model and optimizer as ``train`` builds them, one real-shaped batch
(``--data FEATS``: the run's own median batch, the one ``precision=auto`` times:
train/auto_precision.median_batch; else ``batch_size`` utterances of 6.0-7.0 s, a bucketed batch of the
embedded corpus's typical length), the real training step (``train.step.train_step``:
forward, CTC, backward, clipping, optimizer). Warm-up steps first, then ``--repeats`` timed
steps: median and spread (min..max). Model FLOPs: hardware/mfu.py (valid frames, forward +
backward; padding, CTC and the optimizer not counted); the GEMM peak: ``bench ops``'
matmul in the step's precision (``--precision``: fp32 against the fp32 product, bf16 against
the bf16 one, hardware/measured_peak.cpu_dtype) at the same thread count, measured here (not
the cache) before and after each preset's timing, the higher of the two used. MFU = achieved /
peak, both in this process: a busy machine lowers both (and at 2 threads on a machine whose cores others use, OpenMP's
barriers make a step of many small ops, an LSTM's, far slower: try --threads 1 there). The breakdown is bench/breakdown.py.

Usage: python benchmarks/run.py mfu [PRESET ...] [--data FEATS] [--repeats 5] [--precision fp32 bf16]
       [--set model.name=conformer ...]
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from _timing import measure
from speechperf.bench.breakdown import step_breakdown
from speechperf.hardware.measured_peak import cpu_dtype, measure_gemm
from speechperf.config import load_preset
from speechperf.data.loader import Batch
from speechperf.features.feature_config import FeatureConfig
from speechperf.hardware.mfu import count_step_flops, flop_model
from speechperf.models import build_model
from speechperf.train.auto_precision import median_batch
from speechperf.train.step import make_optimizer, train_step

GOAL = ("docs/workloads.md: MFU of the training step against the GEMM peak (docs/gpu.md: >= 35% bf16 for "
        "conformer-algoperf-sizes)")
REFERENCE = ("the GEMM peak in the step's precision (bench ops' matmul, the faster of torch's a @ b and oneDNN's) "
             "measured in this process at the same threads")
RATIO = "MFU (achieved model FLOPS / GEMM peak, the first preset in the first precision)"
DATA = False
LABEL_FRAMES = 3  # output frames per label symbol in the made-up transcripts (CTC needs room)


def batch_lengths(cfg, data: Path | None, rng: np.random.Generator) -> list[int]:
    """Frames of each utterance of one real-shaped batch: the run's own median batch (auto's), else
    ``batch_size`` utterances of 600-700 frames."""
    frames = median_batch(cfg, data) if data is not None else None
    if frames is None:
        return sorted(rng.integers(600, 701, cfg.loader.batch_size).tolist())
    return frames.tolist()


def make_batch(lengths: list[int], out_lens: torch.Tensor, rng: np.random.Generator,
               width: int | None = None) -> Batch:
    """Random features padded to ``width`` (default: the longest); labels that fit each utterance's
    output frames."""
    lens = torch.tensor(lengths)
    feats = torch.randn(len(lengths), width or max(lengths), FeatureConfig().dim)  # (B, T, 93)
    label_lens = (out_lens // LABEL_FRAMES).clamp(min=1)
    labels = torch.from_numpy(rng.integers(2, 29, int(label_lens.sum())))
    return Batch(feats, lens, labels, label_lens, [str(i) for i in range(len(lengths))], [""] * len(lengths),
                 float(lens.sum()) / 100.0)


def real_step(cfg, data: Path | None) -> tuple:
    """(model, batch, optimizer, scaler) of ``cfg``'s training step as ``train`` builds them: the model
    from seed 0, in training mode, and one real-shaped batch (:func:`batch_lengths`, :func:`make_batch`)."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = build_model(cfg.model).train()
    lengths = batch_lengths(cfg, data, rng)
    out_lens, _ = model.plan(torch.tensor(lengths), max(lengths))
    batch = make_batch(lengths, out_lens, rng)
    optimizer = make_optimizer(model, cfg.train, torch.device("cpu"))
    return model, batch, optimizer, torch.amp.GradScaler("cuda", enabled=False)


def run_preset(name: str, data: Path | None, warmup: int, repeats: int, precision: str, overrides=()) -> dict:
    cfg = load_preset(name, [f"train.system.precision={precision}", *overrides])  # --set may change it
    precision = cfg.train.system.precision
    if precision not in ("fp32", "bf16"):
        raise SystemExit(f"[{name}] train.system.precision={precision}: this benchmark times fp32 or bf16 "
                         "(auto chooses between them: python benchmarks/run.py precision)")
    dtype = cpu_dtype(precision)
    before = measure_gemm(torch.get_num_threads(), dtype)
    model, batch, optimizer, scaler = real_step(cfg, data)
    params = sum(p.numel() for p in model.parameters())
    lengths = batch.feat_lens.tolist()
    flops = flop_model(cfg.model).batch(batch.feat_lens)  # valid frames
    padded = count_step_flops(model, lengths, FeatureConfig().dim)  # what the padded batch computes
    step = lambda: train_step(model, batch, optimizer, scaler, torch.device("cpu"), cfg.train)  # noqa: E731
    times = measure(step, repeats, warmup)
    med = times["median"]
    again = measure_gemm(torch.get_num_threads(), dtype)["tflops"]  # right after: a shared machine moves it
    rates = ", ".join(f"{k} {1000 * v:.1f}" for k, v in before["rates"].items())
    print(f"[{name}] {dtype} GEMM peak ({before['n']}^3, the faster of {rates} GFLOPS: {before['library']}'s) before "
          f"{before['tflops'] * 1000:.1f}, after {again * 1000:.1f} GFLOPS: the higher is used (others' load only "
          "lowers a measured peak)")
    peak_tflops = max(before["tflops"], again)
    gflops = flops / med / 1e9
    print(f"[{name}] {cfg.model.name}, {params / 1e6:.2f} M parameters, {cfg.train.system.precision}; batch {len(lengths)} x "
          f"{min(lengths)}-{max(lengths)} frames ({'from ' + str(data) if data else 'synthetic lengths'})")
    print(f"[{name}] step: median {med * 1000:.1f} ms (min {times['min'] * 1000:.1f}, max {times['max'] * 1000:.1f}, "
          f"{repeats} steps after {warmup} warm-up)")
    print(f"[{name}] model FLOPs {flops / 1e9:.2f} GFLOP/step (valid frames; the padded batch computes "
          f"{padded / 1e9:.2f}); achieved {gflops:.1f} GFLOPS = MFU {100 * gflops / (1000 * peak_tflops):.1f}% "
          f"of the measured {dtype} GEMM peak")
    shares = step_breakdown(step, steps=2)
    print(f"[{name}] where the step's time goes (torch.profiler, self CPU time): "
          + ", ".join(f"{k} {v:.1f}%" for k, v in shares.items()))
    return {"model": cfg.model.name, "precision": precision, "params": params, "step_s": times,
            "gflop_per_step": flops / 1e9, "peak_gflops": 1000 * peak_tflops, "mfu": gflops / (1000 * peak_tflops),
            "shares_pct": shares}


def arguments(p) -> None:
    p.add_argument("presets", nargs="*", default=["cpu"], help="registered presets (cpu, tiny, paper, ...)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a preset override for every preset (e.g. model.name=conformer model.layers=4)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (training's)")
    p.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32"],
                   help="the step's precision(s), each against the GEMM peak of its own dtype")


def run(a) -> dict:
    """Each preset's figures (keyed PRESET, or PRESET/PRECISION when several precisions are timed);
    the ratio: the first preset's MFU in the first precision."""
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s); each step against the GEMM peak of its precision's dtype "
          "(bench ops timing)")
    several = len(a.precision) > 1
    figures = {f"{name}/{p}" if several else name: run_preset(name, a.data, a.warmup, a.repeats, p, a.set)
               for p in a.precision for name in a.presets}
    return {**figures, "threads": a.threads, "ratio": next(iter(figures.values()))["mfu"]}
