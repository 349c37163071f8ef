"""The training loop's step time against its floor: the same step on data already on the device.

Goal: on a GPU the loop's step (real loader, host-to-device copies, losses read
every ``train.system.sync_every`` steps) within 5% of the floor (the same batches, in the same
order, resident on the device before timing; the same step function, the same reads). The
reference is measured in the same process, on the same model and optimizer, both after one
untimed pass over the same batches (so neither pays first-use allocations the other does not). Works on the
CPU too (there the copies are no-ops and the ratio measures the loader's share). A run measures
its own (train.floor.steps: train/floor.py, after training, against its rows); this bench measures
a preset apart, before any run.

Usage: python benchmarks/run.py step_floor [--data FEATS] [--preset cpu] [--device auto]
           [--precision fp32|bf16|fp16] [--steps 30] [--warmup 5] [key=value ...]
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from _timing import sync
from speechperf.config import load_preset
from speechperf.data.loader import make_loader
from speechperf.errors import SpeechperfError
from speechperf.models import build_model, fp8
from speechperf.models.contract import compiled
from speechperf.train.distributed import DistEnv, configure_determinism, pick_device
from speechperf.train.floor import resident
from speechperf.train.step import StepMeter, make_optimizer, read_point, train_step
from speechperf.train.graphs import graphed
from speechperf.train.warmup import FEATURE_DIM
from speechperf.train.warmup import check_precision
from speechperf.train.auto_precision import settled

GOAL = ("docs/mlperf.md, docs/gpu.md: on a GPU the training loop's step within 5% of its floor "
        "(loop / floor <= 1.05)")
REFERENCE = "the floor: the same step on the same batches resident on the device"
RATIO = "loop / floor"
DATA = True


def splits(feats: Path) -> list[str]:
    return sorted(p.name for p in feats.iterdir() if p.name.startswith("train") and (p / "index.json").exists())


def run_steps(batches, model, opt, scaler, device, tc, warmup: int, augment=None) -> tuple[float, int]:
    """Seconds per step after ``warmup`` steps, the loop's reads included; steps timed.
    ``augment``: the preset's SpecAugment, which the loop's step applies (train/step.py)."""
    meter, t0, n = StepMeter(), None, 0
    for i, batch in enumerate(batches, 1):
        if i == warmup + 1:
            meter.read()
            sync(device)
            t0 = time.perf_counter()
        meter.add(i, train_step(model, batch, opt, scaler, device, tc, augment))
        if read_point(i, tc):
            meter.read()
        n = i
    meter.read()
    sync(device)
    return (time.perf_counter() - t0) / (n - warmup), n - warmup


def load(preset: str, device: str, precision: str | None, overrides: list[str], who: str):
    """The preset's config on ``device`` (``auto``: a GPU where torch sees one), the device, and the
    precision note (None where native); a precision this device cannot run is refused, naming why."""
    over = [*overrides, f"train.system.device={device}"] + ([f"train.system.precision={precision}"] if precision else [])
    cfg = load_preset(preset, over)
    configure_determinism(cfg.train.system.deterministic)
    dev = pick_device(cfg.train.system.device, DistEnv())
    if cfg.train.system.threads > 0:  # before the choice: it is the machine's at the run's threads
        torch.set_num_threads(cfg.train.system.threads)
    cfg = settled(cfg, dev)  # train.system.precision=auto (the preset's): what a run here would train in
    try:
        note = check_precision(cfg, dev)
    except SpeechperfError as e:
        raise SystemExit(f"{who}: {e}") from None
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if cfg.train.system.threads > 0:
        torch.set_num_threads(cfg.train.system.threads)
    return cfg, dev, note


def setup(cfg, device: torch.device, batches=()):
    """A fresh model (the run's seed; fp8's float8 layers; compiled with ``train.system.compile``; with ``train.system.cuda_graphs``,
    trained from CUDA graphs, every shape of ``batches`` captured now, as a run captures its
    planned shapes before its clock), its optimizer and scaler."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    core = model = build_model(cfg.model).to(device).train()
    fp8.prepare(core, tc.system.precision, device)  # fp8: torchao's float8 Linear layers, as a run has them
    if tc.system.compile:
        model = compiled(model)
    if tc.system.cuda_graphs:
        model = graphed(core, tc, device)
        model.prepare({model.shape(*b.feats.shape[:2]) for b in batches}, FEATURE_DIM, device)
    return (model, make_optimizer(core, tc, device),
            torch.amp.GradScaler("cuda", enabled=tc.system.precision == "fp16"))


def batching(lc) -> str:
    """How the loader cut the batches: the mode and the bound that sized them (``max_duration``
    padded seconds, else ``batch_size`` utterances), for the header beside the mean it gave."""
    bound = f"max_duration {lc.max_duration:g} s" if lc.max_duration > 0 else f"batch_size {lc.batch_size}"
    return f"{lc.mode}, {bound}"


def first_batches(feats: Path, cfg, total: int, device: torch.device | None = None):
    """The loader's first ``total`` training batches of epoch 1 (the run's seed), as the loop reads
    them: pinned for a CUDA ``device``, as the trainer's loader pins them."""
    it = make_loader(feats, splits(feats), cfg.loader, epoch=1, seed=cfg.train.seed,
                     pin_memory=device is not None and device.type == "cuda")
    return (b for _, b in zip(range(total), it))


def cached_batches(feats: Path, cfg, device: torch.device, total: int) -> list:
    """:func:`first_batches` resident on ``device``; refused when the split holds fewer."""
    cached = [resident(b, device) for b in first_batches(feats, cfg, total)]
    if len(cached) < total:
        raise SystemExit(f"{feats} gives {len(cached)} batches of {cfg.loader.batch_size}; "
                         f"need {total} (fewer --steps or a smaller batch_size=)")
    return cached


def arguments(p) -> None:
    p.add_argument("--preset", default="cpu")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None, help="default: the preset's")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("overrides", nargs="*")


def run(a) -> dict:
    cfg, device, note = load(a.preset, a.device, a.precision, a.overrides, "bench_step_floor")
    tc = cfg.train
    total = a.warmup + a.steps
    cached = cached_batches(a.data, cfg, device, total)
    # one untimed pass over the same batches first: on a GPU a first pass over new shapes pays
    # first-use costs a second does not (the caching allocator's cudaMallocs while epoch 1's
    # batches grow); the H200 check timed a floor run first 8% slower than the loop run after it
    # (0.1037 against 0.0961 s; the conformer's 0.303 against 0.181)
    run_steps(cached, *setup(cfg, device, cached), device, tc, a.warmup, cfg.augment)
    floor, n = run_steps(cached, *setup(cfg, device, cached), device, tc, a.warmup, cfg.augment)
    loop, _ = run_steps(first_batches(a.data, cfg, total, device), *setup(cfg, device, cached), device, tc, a.warmup,
                        cfg.augment)
    utts = sum(len(b.feat_lens) for b in cached[a.warmup:]) / n
    print(f"preset {a.preset}, {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"{tc.system.precision}, batch {utts:.0f} utt ({batching(cfg.loader)}), readers {cfg.loader.readers}, "
          f"sync_every {tc.system.sync_every}, {n} steps after {a.warmup} warm-up" + (f"; {note}" if note else "")
          + ("; CUDA graphs" if tc.system.cuda_graphs else ""))
    print(f"{'':<34}{'s/step':>9}{'utt/s':>9}")
    print(f"{'floor (batches on the device)':<34}{floor:>9.4f}{utts / floor:>9.1f}")
    print(f"{'loop (loader, copies, reads)':<34}{loop:>9.4f}{utts / loop:>9.1f}")
    return {"preset": a.preset, "device": str(device), "precision": tc.system.precision, "utterances_per_step": utts,
            "steps": n, "floor_s": floor, "loop_s": loop, "ratio": loop / floor}
