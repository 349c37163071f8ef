"""``train.system.precision=auto``: the fastest precision this device runs natively for the run's own
training step, measured, never read from flags alone.

The candidates are the precisions hardware/capability.py calls native for the run's model on
the run's device: fp32 always; bf16 where the CPU has AVX512-BF16 or AMX-BF16 (or a GPU of
compute capability 8.0 or newer); fp16, with its loss scaler, on CUDA only; fp8 (torchao's float8
Linear layers in bf16 autocast, models/fp8.py) on a GPU with FP8 tensor cores (compute capability
8.9 or newer) where torchao is installed and the model has a Linear layer it can swap, never on
a CPU (emulated there). Where fp32 is the
only one, it is chosen without measuring anything, and the choice says why. Otherwise each
candidate trains :data:`STEPS` steps (after one warm-up step) of the run's own step
(train/step.py's ``train_step``: SpecAugment aside, forward, CTC, backward, clipping, the run's
optimizer) on one synthetic batch of the run's median batch shape (:func:`data_shape`: of its own
training splits' planned batches; :func:`typical_shape` where no data is given), the
candidates' steps alternated so that a neighbour's load falls on all of them alike, and the
lowest median step wins.

The answer is the machine's, the torch build's and the workload's, so it is kept like the
measured GEMM peak (hardware/measured_peak.py), in ``precision_choice.json`` of the same cache
folder (``$SPEECHPERF_CACHE``), keyed by device, threads, torch version, the candidates (a CPU
flag forced off changes them), the model's and optimizer's configuration, the batch shape and the
step's code (:func:`step_code_digest`: a speechperf whose models, objectives or training step
changed, as a cheaper dropout mask changed the DS2 step, measures again rather than record another
code's step times).
A measurement while other processes took cores it needed serves its run, said so, and is not
cached; an unreadable file is measured again and rewritten.

The choice is made in initialization (train/loop.py, before the TTA clock; its seconds are an
initialization part), on rank 0, and broadcast. The run's config.json records the precision
chosen, so every reader of a run sees the precision it trained in, and env.json records the
choice (``precision_choice``: chosen, the candidates' step seconds, cached, its cost). A resumed
or restarted run keeps the precision of its start: ``auto`` then means the recorded one
(train/admission.py compares it so).
"""
from __future__ import annotations

import functools
import hashlib
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from speechperf.atomic import atomic_write_text
from speechperf.config import RunConfig
from speechperf.config.training import AUTO_PRECISION
from speechperf.data.batching import Batching
from speechperf.data.check import parse_splits, train_splits_of
from speechperf.data.loader import Batch, load_index
from speechperf.data.plan import batch_frames, plan_epoch
from speechperf.features.feature_config import FeatureConfig
from speechperf.models import build_model, fp8
from speechperf.hardware.capability import NATIVE, model_support
from speechperf.hardware.environment import cpu_model
from speechperf.hardware.measured_peak import busy_seconds, cache_path, contended, others_busy_pct, read_cache
from speechperf.train.step import make_optimizer, train_step

CACHE_FILE = "precision_choice.json"
STEPS = 3  # timed steps per candidate (after one warm-up step each): a CPU step's seconds vary by ~10%
DROP = 1.5  # a candidate this many times slower than the best after a round is timed no more
TYPICAL_FRAMES = 600  # frames of the synthetic batch's longest utterance outside pad mode (6 s, a bucketed batch's)
FRAMES_PER_S = 100  # the features' 10 ms hop
LABEL_FRAMES = 3  # output frames per label symbol of the made-up transcripts (CTC needs room)


def candidates(cfg: RunConfig, device: torch.device) -> tuple[list[str], dict[str, str]]:
    """(the precisions ``device`` runs natively for ``cfg``'s model, fp32 first; {every other
    one: why it is no candidate})."""
    native, others = ["fp32"], {}
    for precision in ("bf16", "fp16", "fp8"):
        if precision == "fp16" and device.type != "cuda":
            others[precision] = "its loss scaler is CUDA's"
            continue
        can = model_support(cfg.model, device, precision)
        if can.level == NATIVE:
            native.append(precision)
        else:
            others[precision] = can.note
    return native, others


def typical_shape(cfg: RunConfig, world: int = 1) -> tuple[int, int]:
    """(utterances, frames of the longest) of one rank's typical batch: pad mode's exact shape;
    else a :data:`TYPICAL_FRAMES` batch of ``loader.batch_size`` over the ranks, or as many as
    ``loader.max_duration`` padded seconds hold."""
    lc = cfg.loader
    frames = lc.pad_frames if lc.mode == "pad" else TYPICAL_FRAMES
    seconds = Batching(lc).batch_seconds
    if seconds > 0:
        return max(1, int(seconds * FRAMES_PER_S // frames)), frames
    return max(1, lc.batch_size // max(world, 1)), frames


def median_batch(cfg: RunConfig, features: Path, world: int = 1) -> np.ndarray | None:
    """Frames of each utterance of the run's own median batch: of rank 0's batches in epoch 2's plan
    of the run's training splits (shuffled, as every epoch after the first), the one of median
    padded frames (utterances x its longest, rounded as the loader pads). None where the plan holds
    none. ``bench mfu`` times these lengths, ``auto`` their shape."""
    splits = parse_splits(cfg.train.train_splits) or train_splits_of(features)
    index = load_index(features, splits)
    batches = plan_epoch(index, cfg.loader, epoch=2, seed=cfg.train.seed, rank=0, world=world).batches
    if not batches:
        return None
    widths = [batch_frames(index.frames[b], cfg.loader) for b in batches]
    # by padded frames (utterances x width); ties by utterances, then width
    order = sorted(range(len(batches)), key=lambda i: (len(batches[i]) * widths[i], len(batches[i]), widths[i]))
    return index.frames[batches[order[len(order) // 2]]]


def data_shape(cfg: RunConfig, features: Path, world: int = 1) -> tuple[int, int]:
    """(utterances, padded frames) of :func:`median_batch`; where the plan holds none,
    :func:`typical_shape`."""
    frames = median_batch(cfg, features, world)
    return typical_shape(cfg, world) if frames is None else (len(frames), batch_frames(frames, cfg.loader))


def synthetic_batch(model, shape: tuple[int, int], device: torch.device) -> Batch:
    """A batch of ``shape`` of random features, lengths from the longest down to 80% of it,
    labels that fit each utterance's output frames (the model's own plan)."""
    b, t = shape
    lens = torch.linspace(t, max(1, int(0.8 * t)), b).round().long()  # (B,) on the host, as a loader's
    lens = lens.clamp(min=model.min_frames)
    out_lens, _ = model.plan(lens, int(lens.max()))
    label_lens = (out_lens // LABEL_FRAMES).clamp(min=1)  # (B,)
    feats = torch.randn(b, int(lens.max()), FeatureConfig().dim)  # (B, T, 93)
    labels = torch.randint(2, 28, (int(label_lens.sum()),))  # letters a..z, concatenated
    if device.type == "cuda":
        feats = feats.pin_memory()
    return Batch(feats, lens, labels, label_lens, [""] * b, [""] * b, float(lens.sum()) / FRAMES_PER_S)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _kit(cfg: RunConfig, device: torch.device, precision: str) -> tuple:
    """(model, optimizer, scaler, train config) of one candidate, as the trainer builds them."""
    model = build_model(cfg.model).to(device).train()
    fp8.prepare(model, precision, device)
    tc = replace(cfg.train, system=replace(cfg.train.system, precision=precision))
    return model, make_optimizer(model, tc, device), torch.amp.GradScaler("cuda", enabled=precision == "fp16"), tc


def _step_s(kit: tuple, batch: Batch, device: torch.device) -> float:
    model, opt, scaler, tc = kit
    _sync(device)
    t0 = time.perf_counter()
    float(train_step(model, batch, opt, scaler, device, tc).loss)  # the step's end, on any device
    return time.perf_counter() - t0


def time_candidates(cfg: RunConfig, device: torch.device, precisions: list[str], shape: tuple[int, int],
                    steps: int = STEPS, drop: float = DROP) -> dict[str, float]:
    """{precision: median seconds of one training step} of ``cfg``'s model on ``device``: one
    model, optimizer and scaler per precision, one warm-up step each, then ``steps`` rounds of
    one step each, alternated; a candidate ``drop`` times slower than the best after a round is
    timed no more (it cannot win). Tests replace this function."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(cfg.train.seed)
        kits = {p: _kit(cfg, device, p) for p in precisions}
        batch = synthetic_batch(kits[precisions[0]][0], shape, device)
        for kit in kits.values():  # oneDNN's primitives, cuDNN's algorithms, the optimizer's state
            _step_s(kit, batch, device)
        times: dict[str, list[float]] = {p: [] for p in precisions}
        live = list(precisions)
        for _ in range(steps):
            for p in live:
                times[p].append(_step_s(kits[p], batch, device))
            best = min(statistics.median(times[p]) for p in live)
            live = [p for p in live if statistics.median(times[p]) <= drop * best]
    return {p: statistics.median(ts) for p, ts in times.items()}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else (cpu_model() or "unknown CPU")


STEP_CODE = ("models", "objectives", "train")  # the speechperf packages whose code a measured step runs


@functools.lru_cache(maxsize=1)
def step_code_digest() -> str:
    """sha256 (12 hex digits) of the source a measured step runs: every module of speechperf's
    models, objectives and train packages, with its path."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in STEP_CODE:
        for path in sorted((root / sub).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def cache_key(cfg: RunConfig, device: torch.device, native: list[str], shape: tuple[int, int]) -> str:
    """The machine, the build, the candidates, the workload (model, optimizer, batch shape) and the step's code."""
    tc = cfg.train
    workload = json.dumps({"model": cfg.to_dict()["model"], "optimizer": tc.optim.name, "impl": tc.optim.impl,
                           "grad_clip": tc.optim.grad_clip > 0, "shape": list(shape)}, sort_keys=True)
    digest = hashlib.sha256(workload.encode()).hexdigest()[:16]
    return (f"{device_name(device)} | {device.type} | {torch.get_num_threads()} threads | torch {torch.__version__} | "
            f"{','.join(native)} | {cfg.model.name} {digest} | code {step_code_digest()}")


def _valid(entry, native: list[str]) -> bool:
    return (isinstance(entry, dict) and entry.get("chosen") in native and isinstance(entry.get("candidates"), dict)
            and all(isinstance(entry["candidates"].get(p), (int, float)) for p in native))


def choose(cfg: RunConfig, device: torch.device, world: int = 1, cache: Path | None = None,
           features: Path | None = None) -> dict:
    """The precision ``auto`` trains ``cfg`` in on ``device``: {"chosen", "candidates": {precision:
    step seconds}, "cached", "seconds" (what choosing cost), "shape", "not_native": {precision:
    why}, "note"} (the note: fp32 chosen unmeasured, or a measurement not cached). ``features``: the
    run's features folder, whose median planned batch is the shape timed (else a typical one)."""
    t0 = time.perf_counter()
    native, others = candidates(cfg, device)
    shape = data_shape(cfg, features, world) if features is not None else typical_shape(cfg, world)
    base = {"shape": list(shape), "not_native": others, "note": None}
    if native == ["fp32"]:
        why = "; ".join(f"{p}: {note}" for p, note in others.items())
        return {**base, "chosen": "fp32", "candidates": {}, "cached": False, "seconds": time.perf_counter() - t0,
                "note": f"fp32: no other precision runs natively here ({why}); chosen without measuring"}
    path, key = (cache or cache_path()) / CACHE_FILE, cache_key(cfg, device, native, shape)
    known = read_cache(path)
    if _valid(known.get(key), native):
        entry = known[key]
        return {**base, "chosen": entry["chosen"], "candidates": {p: entry["candidates"][p] for p in native},
                "cached": True, "seconds": time.perf_counter() - t0, "measured_at": entry.get("at")}
    before, m0 = busy_seconds(), time.perf_counter()
    times = time_candidates(cfg, device, native, shape)
    others_pct = others_busy_pct(before, busy_seconds(), time.perf_counter() - m0)
    chosen = min(native, key=lambda p: times[p])
    entry = {"chosen": chosen, "candidates": times, "at": time.strftime("%Y-%m-%d %H:%M:%S"),
             "others_busy_pct": others_pct}
    if device.type == "cpu" and contended(others_pct, torch.get_num_threads()):
        base["note"] = (f"other processes kept {others_pct:.0f}% of the CPUs busy while the candidates were timed: "
                        "not cached")
    else:
        known[key] = entry
        atomic_write_text(path, json.dumps(known, indent=1, sort_keys=True))
    return {**base, "chosen": chosen, "candidates": times, "cached": False, "seconds": time.perf_counter() - t0,
            "measured_at": entry["at"]}


def with_precision(cfg: RunConfig, precision: str) -> RunConfig:
    """``cfg`` training in ``precision``."""
    return replace(cfg, train=replace(cfg.train, system=replace(cfg.train.system, precision=precision)))


def settled(cfg: RunConfig, device: torch.device) -> RunConfig:
    """``cfg`` in the precision a run on ``device`` would train in: ``auto`` chosen (:func:`choose`,
    from the cache where it holds the answer), any other precision as given (benchmarks, bench feed)."""
    return with_precision(cfg, choose(cfg, device)["chosen"]) if cfg.train.system.precision == AUTO_PRECISION else cfg


def settle(cfg: RunConfig, group, verdict) -> tuple[RunConfig, dict | None]:
    """A run at ``auto`` in a concrete precision (every other run unchanged, no choice): a run
    already in its folder (``verdict.plan`` resume or restart) in its recorded one (rank 0 reads it:
    ``verdict.recorded_precision()``), a new one in the one :func:`choose` measures on rank 0.
    Every rank gets rank 0's answer; returns (the configuration, the choice of a new run)."""
    if cfg.train.system.precision != AUTO_PRECISION:
        return cfg, None
    answer = None
    if group.env.rank == 0:
        if verdict.plan in ("resume", "restart"):
            answer = (verdict.recorded_precision(), None)
        else:
            choice = choose(cfg, group.device, group.world, features=Path(verdict.features))
            answer = (choice["chosen"], choice)
    precision, choice = group.broadcast(answer)
    return with_precision(cfg, precision), choice

