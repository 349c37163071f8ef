"""fp8 against bf16: the training step of an at-scale, Linear-heavy workload (FastConformer: its
feed-forward, attention and pointwise-convolution layers are Linear layers, about 97% of its
parameters) in ``train.system.precision=fp8`` (torchao's float8 Linear layers in bf16 autocast,
speechperf/models/fp8.py) and in bf16, alternated step by step in one process.

The step is the run's own (train/step.py's ``train_step``: forward, CTC, backward, clipping, the
preset's AdamW) on one synthetic batch of the preset's typical shape (train/auto_precision.py's
``typical_shape``: ``loader.max_duration`` seconds as utterances of 600 frames), one model per
precision from the same seed, ``--warmup`` untimed steps each (on a GPU torch.compile's, by
default: torchao's casts are fast only fused), then ``--steps`` rounds of one step per precision.

On a GPU with FP8 tensor cores (compute capability 8.9+) the goal is fp8 >= 1.3x bf16's throughput.
Elsewhere fp8 is torchao's emulation (hardware/capability.py says "emulated"): the ratio is what
emulation costs, printed as such, never a verdict on fp8. On a CPU the defaults are small (2 of the
preset's blocks, 60 s batches, 3 rounds) so that it takes under 3 minutes on 2 cores.

Usage: python benchmarks/run.py fp8 [--preset fastconformer-xl] [--device cuda] [--steps 5]
       [--seconds S] [--layers N] [--no-compile] [KEY=VALUE ...]
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from speechperf.config import load_preset
from speechperf.models import build_model, fp8
from speechperf.models.contract import compiled
from speechperf.hardware.capability import NATIVE, model_support
from speechperf.train.auto_precision import synthetic_batch, typical_shape
from speechperf.train.step import make_optimizer, train_step

GOAL = ("docs/bench.md: train.system.precision=fp8 at >= 1.3x bf16's step throughput on an FP8 GPU (H100/H200) for an "
        "at-scale FastConformer; on a CPU (torchao's emulation) the ratio is what emulation costs")
REFERENCE = "the same preset's training step in bf16, alternated with fp8 in this process"
RATIO = "fp8 throughput / bf16 throughput (bf16 step / fp8 step; above 1: fp8 faster)"
DATA = False
GOAL_RATIO = 1.3  # fp8 / bf16 throughput on a GPU with FP8 tensor cores
CPU_LAYERS, CPU_SECONDS = 2, 60.0  # a CPU's defaults: under 3 minutes on 2 cores


def arguments(p) -> None:
    p.add_argument("--preset", default=None, help="default: fastconformer-xl on a GPU, fastconformer-l on a CPU")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=None, help="timed rounds, one step per precision each (5; a CPU: 3)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps per precision first, compilation's (2; a CPU: 1)")
    p.add_argument("--seconds", type=float, default=None,
                   help="audio seconds per batch (loader.max_duration; default: the preset's on a GPU, 60 on a CPU)")
    p.add_argument("--layers", type=int, default=None, help="model.layers (default: the preset's on a GPU, 2 on a CPU)")
    p.add_argument("--no-compile", action="store_true", help="eager on a GPU too (a CPU is always eager)")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of the preset")


def _config(a, dev: torch.device):
    cpu = dev.type == "cpu"
    preset = a.preset or ("fastconformer-l" if cpu else "fastconformer-xl")
    layers = a.layers or (CPU_LAYERS if cpu else None)
    seconds = a.seconds or (CPU_SECONDS if cpu else None)
    over = [*(f"model.layers={layers}",) * bool(layers), *(f"loader.max_duration={seconds}",) * bool(seconds),
            "model.dropout=0", "model.attention_dropout=0", *a.overrides]
    return preset, load_preset(preset, over)


def _kit(cfg, dev: torch.device, precision: str, compile_: bool):
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model).to(dev).train()
    layers = fp8.prepare(model, precision, dev)
    if compile_:
        model = compiled(model)
    tc = dataclasses.replace(cfg.train, system=dataclasses.replace(cfg.train.system, precision=precision))
    return model, make_optimizer(model, tc, dev), tc, layers


def _step_s(kit, batch, dev: torch.device) -> float:
    model, opt, tc, _ = kit
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    float(train_step(model, batch, opt, scaler, dev, tc).loss)  # the step's end, on any device
    return time.perf_counter() - t0


def run(a) -> dict:
    dev = torch.device(a.device)
    preset, cfg = _config(a, dev)
    can = model_support(cfg.model, dev, "fp8")
    shape = typical_shape(cfg)
    compile_ = dev.type == "cuda" and not a.no_compile
    print(f"{preset}: {cfg.model.name} d_model {cfg.model.d_model} x {cfg.model.layers} layers, batch {shape[0]} x "
          f"{shape[1]} frames, {dev}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"compile {compile_}; fp8: {can.level}{f' ({can.note})' if can.note else ''}")
    figures = {"preset": preset, "device": str(dev), "shape": list(shape), "layers": cfg.model.layers,
               "compile": compile_, "fp8_level": can.level, "fp8_note": can.note, "ratio": None}
    if not can.runs:
        print(f"fp8 does not run here: {can.note}")
        return figures
    kits = {p: _kit(cfg, dev, p, compile_) for p in ("bf16", "fp8")}
    batch = synthetic_batch(kits["bf16"][0], shape, dev)
    cpu = dev.type == "cpu"
    for kit in kits.values():
        for _ in range(a.warmup if a.warmup is not None else 1 if cpu else 2):
            _step_s(kit, batch, dev)
    times = {p: [] for p in kits}
    for _ in range(a.steps or (3 if cpu else 5)):
        for p, kit in kits.items():
            times[p].append(_step_s(kit, batch, dev))
    med = {p: statistics.median(ts) for p, ts in times.items()}
    ratio = med["bf16"] / med["fp8"]
    for p in kits:
        print(f"  {p}: median step {med[p]:.3f} s (min {min(times[p]):.3f}, max {max(times[p]):.3f}), "
              f"{shape[0] / med[p]:.2f} utterances/s")
    verdict = (f"goal >= {GOAL_RATIO}: {'met' if ratio >= GOAL_RATIO else 'NOT met'}" if can.level == NATIVE else
               "emulated: what torchao's emulation costs here, not a measure of fp8")
    print(f"fp8/bf16 throughput: {ratio:.3f} ({fp8.summary(kits['fp8'][3])}); {verdict}")
    return {**figures, "step_s": {p: {"median": med[p], "min": min(ts), "max": max(ts)} for p, ts in times.items()},
            "swapped": fp8.summary(kits["fp8"][3]), "ratio": ratio}
