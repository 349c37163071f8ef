"""``speechperf bench scale``: the at-scale workloads (the models users train on many GPUs, whose
TTA takes days) measured on real shapes: utterances and audio seconds per second, MFU, peak
memory per device beside the estimate made before the run, power and energy per audio hour.

Why not rows of ``bench zoo``: the zoo steps fixed counts of 1-4 s synthetic utterances through
every registered model at several batch sizes and precisions; an at-scale row is batches planned
by seconds of audio (``loader.max_duration``) from LibriSpeech's duration spread by the loader's
own planner (``data.batching.Batching``, over ``data.index.librispeech_like``: 960 h's spread),
trained by the training loop's own step (``train.step.train_step``: the workload's objective,
clipping, the masked AdamW step), with its memory estimated (``hardware.memory``) and measured, and
one row can take minutes on a CPU. The three objective families on the FastConformer encoder are
rows: CTC (``fastconformer-l``, ``fastconformer-xl``), the transducer (``parakeet-rnnt-sizes``) and
the attention encoder-decoder (``canary-aed-sizes``).

Features are random of the planned shapes (throughput does not depend on their values); labels
(random subword units) are of a length CTC can align at 8x subsampling (2 frames per label: LibriSpeech's ~15
characters per second do not fit in 12.5 frames per second, the subword vocabulary NeMo trains
with does).

N devices: under torchrun (``WORLD_SIZE`` = ``--world``) every rank steps its own batches of the
plan (batch i goes to rank i mod N) through the sharded training loop's model (FSDP2,
``algorithms/fsdp.py``, whose step ``train_step`` is the loop's): the row counts the audio of
every rank over the slowest rank's seconds, the peak memory of the rank that used most beside the
estimate for ``fsdp`` at N, MFU against N devices' peak. ``bench/scale_launch.py`` starts the ranks
on one node and measures the device they are compared with (the scaling efficiency).
"""
from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from speechperf.algorithms.fsdp import FSDP, FSDPConfig
from speechperf.config import load_preset
from speechperf.data.batching import Batching
from speechperf.data.index import from_columns, librispeech_like
from speechperf.data.loader import Batch
from speechperf.errors import SpeechperfError, in_words
from speechperf.features.feature_config import FeatureConfig
from speechperf.models import build_model, describe, encdec, fp8, rnnt
from speechperf.models.contract import compiled
from speechperf.models.fastconformer import forward_flops, nemo_parameter_count, training_flops
from speechperf.hardware import memory
from speechperf.hardware.capability import model_support
from speechperf.hardware.measured_peak import cpu_dtype, training_peak
from speechperf.hardware.mfu import achieved, forget_if_beaten
from speechperf.telemetry.device_gpus import run_gpus
from speechperf.telemetry.power import PowerMeter
from speechperf.train.distributed import DistEnv, pick_device, resolve_backend
from speechperf.train.step import make_optimizer, train_step

WORKLOADS = ("fastconformer-l", "fastconformer-xl", "parakeet-rnnt-sizes", "canary-aed-sizes")  # CTC, RNN-T, AED
CPU_BATCH_S, GPU_BATCH_S = (30.0,), (None,)  # seconds of audio per batch: a CPU's smallest; None: the preset's
INDEX_UTTERANCES = 4096  # the generated LibriSpeech-like index the batches are planned over (64 shards)
LONGEST_S = 16.7  # utterances over this are left out:
# NeMo's FastConformer recipe's train_ds.max_duration for LibriSpeech
DOES_NOT_FIT = "does not fit"  # a row's status where the estimate exceeds the memory
FRAME_S = 0.01  # seconds per feature frame (10 ms hop)
FRAMES_PER_LABEL = 2  # labels CTC can align at 8x: one per two output frames
COLUMNS = ("workload", "params_m", "nemo_params_m", "batch_s", "utterances", "padded_s", "device", "precision",
           "world", "utt_per_s", "audio_s_per_s", "step_s", "steps", "tflops", "mfu_pct", "peak_gb", "estimate_gb",
           "estimate_ratio", "power_w", "wh_per_audio_h", "energy", "peak_source", "memory_method", "status",
           "audio_s_per_s_min", "audio_s_per_s_median", "audio_s_per_s_max",  # the timed steps' own rates
           "scaling_efficiency",  # world N: audio s/s over N times one device's (bench/scale_launch.py)
           "comm_s", "comm_gb",  # world N, rank 0, per timed step: collectives' seconds (overlapping) and bytes
           "gpu_busy_pct",  # the driver's utilization over the timed steps, the rows' GPUs on rank 0's node
           "source")  # a one-device row read from this file (--baseline), not measured by this command
SPREAD = {"min": min, "median": statistics.median, "max": max}  # of the timed steps' audio s/s


@dataclass(frozen=True)
class Request:
    """What one ``bench scale`` asks for."""

    workloads: tuple[str, ...] = WORKLOADS  # presets of at-scale workloads
    batch_seconds: tuple[float | None, ...] | None = None  # loader.max_duration per row; None: the device's default
    steps: int = 3  # timed steps per row
    warmup: int = 1  # untimed steps first
    device: str = "cpu"
    precision: str | None = None  # None: fp32 on a CPU, the preset's on a GPU
    world: int = 1  # devices: N > 1 are torchrun's ranks, sharded (FSDP2); bench/scale_launch.py starts them
    memory_limit_gb: float | None = None  # refuse rows whose estimate exceeds this (default: free memory)
    measure_memory: bool = True  # measure the peak (on a CPU one more step, profiled)
    overrides: tuple[str, ...] = ()  # key=value overrides of every workload's preset
    seed: int = 0

    def problems(self) -> list[str]:
        return [f"--{k}={getattr(self, k)} must be >= {lo}" for k, lo in (("steps", 1), ("warmup", 0), ("world", 1))
                if getattr(self, k) < lo]


def planned_batches(cfg, n: int, seed: int) -> list[np.ndarray]:
    """(frames, seconds) of the first ``n`` batches the loader's planner cuts for ``cfg.loader`` from a
    LibriSpeech-like index (epoch 1, the run's order), its utterances up to ``LONGEST_S``."""
    full = librispeech_like(seed, splits=(INDEX_UTTERANCES,))
    keep = np.flatnonzero(full.duration <= LONGEST_S)
    index = from_columns(full.keys, full.shas, full.shard[keep], full.offset[keep], full.frames[keep],
                         full.duration[keep], [full.id(i) for i in keep], ["a"] * len(keep))
    plan = Batching(cfg.loader, seed).plan(index, epoch=1)
    if len(plan) < n:
        raise SpeechperfError(f"loader.max_duration={Batching(cfg.loader).batch_seconds:g} plans {len(plan)} "
                              "batches over "
                              f"{INDEX_UTTERANCES} utterances, fewer than the {n} steps asked")
    return [(index.frames[b], index.duration[b]) for b in plan.batches[:n]]


def synthetic(frames: np.ndarray, seconds: np.ndarray, model, device: torch.device) -> Batch:
    """A batch of random features at the planned lengths, labels that CTC can align (units 2..27)."""
    lens = torch.tensor(frames, dtype=torch.long)
    label_lens = (model.output_lengths(lens) // FRAMES_PER_LABEL).clamp(min=1)
    feats = torch.randn(len(lens), int(lens.max()), FeatureConfig().dim, device=device)  # (B, T, 93)
    labels = torch.randint(2, min(28, model.cfg.num_classes), (int(label_lens.sum()),), device=device)
    return Batch(feats, lens, labels, label_lens, [""] * len(lens), [""] * len(lens), float(seconds.sum()))


def run_scale(req: Request, progress: bool = True, refuse_unfit: bool = True) -> list[dict]:
    """One row per workload and batch duration (see the module docstring). ``refuse_unfit``: when no
    row fits, :class:`memory.DoesNotFit` (exit 2) rather than the rows saying so."""
    bad = req.problems()
    env = DistEnv.from_env()
    if env.world != req.world:
        bad.append(f"--world={req.world} but this process is one of {env.world} (torchrun's WORLD_SIZE): N devices "
                   "are N torchrun ranks (or bench scale --world N without torchrun, which starts them)")
    if bad:
        raise SpeechperfError("; ".join(bad))
    dev = torch.device(req.device) if req.world == 1 else pick_device(req.device, env)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpeechperfError(f"device {req.device!r} requested but no CUDA device is available")
    seconds = req.batch_seconds or (GPU_BATCH_S if dev.type == "cuda" else CPU_BATCH_S)
    todo = [(w, s) for w in req.workloads for s in seconds]
    rows = []
    with _group(env, dev):
        for w, s in tqdm(todo, desc="bench scale", unit="row", file=sys.stderr, disable=not progress or env.rank):
            rows.append(_row(req, w, s, dev))
    if refuse_unfit and all(r["status"].startswith(DOES_NOT_FIT) for r in rows):  # nothing ran: bad input, exit 2
        raise memory.DoesNotFit("; ".join(r["status"] for r in rows))
    return rows


@contextlib.contextmanager
def _group(env: DistEnv, dev: torch.device):
    """torchrun's process group around a world of N rows (nothing for one device)."""
    if env.world == 1:
        yield
        return
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(resolve_backend("auto", dev))
    try:
        yield
    finally:
        dist.destroy_process_group()


def _config(req: Request, workload: str, batch_s: float | None, dev: torch.device):
    over = list(req.overrides) + ([f"loader.max_duration={batch_s}"] if batch_s else [])
    cfg = load_preset(workload, over)
    if not memory.has_rule(cfg.model):
        raise SpeechperfError(f"bench scale: preset {workload!r} trains model {cfg.model.name!r}; its rows are the "
                              f"at-scale workloads' ({', '.join(memory.RULES)})")
    precision = req.precision or ("fp32" if dev.type == "cpu" else cfg.train.system.precision)
    if precision == "fp8":  # torchao's float8 Linear layers: refused where they cannot run (exit 2)
        can = model_support(cfg.model, dev, precision)
        if not can.runs:
            raise SpeechperfError(f"bench scale --precision fp8: {workload}: {can.note}")
    if req.world > 1:  # what the sharded loop refuses (fp16's scaler, compile, graphs): refused here too
        FSDP.check_launch(FSDPConfig(), req.world, replace(cfg.train, system=replace(cfg.train.system,
                                                                                     precision=precision)))
    return cfg, precision


def _row(req: Request, workload: str, batch_s: float | None, dev: torch.device) -> dict:
    cfg, precision = _config(req, workload, batch_s, dev)
    every = planned_batches(cfg, (req.warmup + req.steps) * req.world, req.seed)  # batch i: rank i mod N
    widest = max(every, key=lambda b: len(b[0]) * int(b[0].max()))  # the estimate: the rank given it
    batches = every[DistEnv.from_env().rank::req.world]
    setup = memory.Setup(cfg.train.optim.name, cfg.train.optim.impl, precision, dev.type, req.world,
                         "fsdp" if req.world > 1 else "none", checkpointing=cfg.model.activation_checkpointing)
    est = memory.estimate(cfg.model, memory.Batch(len(widest[0]), int(widest[0].max()),
                                                  int(widest[0].max()) // 8 // FRAMES_PER_LABEL), setup)
    row = {**dict.fromkeys(COLUMNS), "workload": workload, "params_m": describe(cfg.model)["params"] / 1e6,
           "nemo_params_m": nemo_params(cfg.model) / 1e6, "batch_s": Batching(cfg.loader).batch_seconds,
           "utterances": float(np.mean([len(f) for f, _ in every])), "device": str(dev), "precision": precision,
           "padded_s": float(np.mean([len(f) * int(f.max()) for f, _ in every])) * FRAME_S, "world": req.world,
           "estimate_gb": est.peak() / memory.GB, "status": "ok"}
    if dev.type == "cuda":  # the last row's model and optimizer, if a cycle holds them, back to the allocator
        gc.collect()
    try:
        memory.check_fits(est, _free_bytes(req, dev))
        row.update(_measured(cfg, precision, batches, req, dev, est))
    except memory.DoesNotFit as e:
        row["status"] = f"{DOES_NOT_FIT}: {workload} at {Batching(cfg.loader).batch_seconds:g} s: {e}"
    except (torch.cuda.OutOfMemoryError, MemoryError, RuntimeError) as e:
        row["status"] = f"failed: {in_words(e)}"
    return row


def _free_bytes(req: Request, dev: torch.device) -> int:
    """``--memory-limit-gb`` or the device's free memory; on a CPU either is the host's, shared by its ranks."""
    shared = DistEnv.from_env().local_world if dev.type == "cpu" else 1
    if req.memory_limit_gb is not None:
        return int(req.memory_limit_gb * memory.GB) // shared
    return memory.free_bytes(dev, shared)


def _measured(cfg, precision: str, batches, req: Request, dev: torch.device, est) -> dict:
    """Warm-up, the memory step (profiled, untimed), then the timed steps with the power meter; at a
    world of N every rank its own batches, the figures summed (audio, FLOPs) or the worst rank's."""
    tc = replace(cfg.train, system=replace(cfg.train.system, precision=precision))
    model, opt, algo = _built(cfg, tc, req, dev)
    scaler = torch.amp.GradScaler(dev.type, enabled=precision == "fp16")
    data = [synthetic(f, s, model, dev) for f, s in batches]
    step = lambda b: train_step(model, b, opt, scaler, dev, tc)  # noqa: E731
    for b in data[: req.warmup]:
        step(b)
    out = {}
    if req.measure_memory:  # the widest planned batch, the one the estimate is made for
        out.update(_peak(model, opt, max(data, key=lambda b: b.feats.shape[0] * b.feats.shape[1]), step, dev, est,
                         req.world))
    timed = data[req.warmup:]
    if algo:
        algo.comm.take()  # what the warm-up and profiled steps moved: not this row's
    env = DistEnv.from_env()  # rank 0 reads the power of its node's GPUs that the rows use
    with PowerMeter(run_gpus=run_gpus(dev, env.local_world)) if env.rank == 0 else _NoPower() as power:
        _sync(dev, req.world)
        t0, ends = time.perf_counter(), []
        for b in timed:
            step(b)
            if dev.type == "cuda":  # each step's end: its own rate (the spread a cost carries, studies/cost.py)
                torch.cuda.synchronize(dev)
            ends.append(time.perf_counter())
        _sync(dev, req.world)
        ends[-1] = time.perf_counter()  # the slowest rank's end
    # (steps,) each step's audio and seconds, the audio of every rank, the seconds of the slowest
    audio = _total([b.audio_seconds for b in timed], req.world)
    seconds = _worst([end - start for start, end in zip([t0, *ends], ends)], req.world)
    wall = float(seconds.sum())
    rates = (audio / seconds).tolist()
    utts = float(_total([len(b.feat_lens) for b in timed], req.world).sum())
    flops = float(_total([sum(utterance_flops(cfg.model, int(n), int(u)) for n, u in zip(b.feat_lens, b.label_lens))
                          for b in timed], req.world).sum())
    if algo:
        comm = algo.comm.take()
        out.update(comm_s=comm[0] / len(timed), comm_gb=comm[1] / len(timed) / 1e9)
    peak = training_peak(dev, precision, torch.get_num_threads())
    energy = power.result(float(audio.sum()))
    wh = energy["energy_j"] / 3600 / (float(audio.sum()) / 3600) if energy["energy_j"] is not None else None
    return {**out, "utt_per_s": utts / wall, "audio_s_per_s": float(audio.sum()) / wall,
            "step_s": wall / len(timed), "steps": len(timed), **_mfu(flops, wall, peak, req.world, dev, precision),
            **{f"audio_s_per_s_{k}": f(rates) for k, f in SPREAD.items()},
            "power_w": energy["power_w"], "wh_per_audio_h": wh, "energy": energy["energy"],
            "gpu_busy_pct": energy["gpu_util_pct"]}


def _built(cfg, tc, req: Request, dev: torch.device):
    """(model, optimizer, the fsdp algorithm or None): the workload's model on ``dev``, sharded over a
    world of N as the training loop shards it (algo.name=fsdp, its default units)."""
    torch.manual_seed(req.seed)
    model = build_model(cfg.model).to(dev).train()
    fp8.prepare(model, tc.system.precision, dev)  # fp8: torchao's float8 Linear layers (emulated off CUDA)
    algo = None
    if tc.system.compile:  # as the one-device loop does (train/trainer.py); compilation is the warm-up's
        model = compiled(model)
    if req.world > 1:
        algo = FSDP(FSDPConfig(), req.world, DistEnv.from_env().rank, dev, train=tc)
        algo.evaluates = False  # no host copy on rank 0 (the model's size, 4 GB at Canary's): a row evaluates nothing
        model = algo.wrap(model)
    return model, make_optimizer(model, tc, dev), algo


def _sync(dev: torch.device, world: int) -> None:
    """Every rank here, its device's work done (a world of one: the device only)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    if world > 1:
        dist.barrier()


def _reduced(values, world: int, op) -> torch.Tensor:
    """(n,) float64 ``values`` reduced over the ranks by ``op`` (CPU tensors: gloo serves them)."""
    t = torch.tensor(values, dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t, op=op)
    return t


def _total(values, world: int) -> torch.Tensor:
    return _reduced(values, world, dist.ReduceOp.SUM)


def _worst(values, world: int) -> torch.Tensor:
    return _reduced(values, world, dist.ReduceOp.MAX)


class _NoPower(contextlib.AbstractContextManager):
    """Ranks other than 0: no sampler of their own (rank 0's reads the node)."""

    def __exit__(self, *exc) -> None:
        return None

    def result(self, samples) -> dict:
        return {"power_w": None, "energy_j": None, "energy": "rank 0's", "gpu_util_pct": None}


def nemo_params(cfg) -> int:
    """The parameters of NeMo's model at ``cfg``'s sizes and vocabulary: this one's, plus per encoder
    block Transformer-XL attention's positional projection and biases (RoPE here), d^2 + 2 d."""
    if cfg.name == "fastconformer":
        return nemo_parameter_count(cfg)
    return describe(cfg)["params"] + cfg.layers * (cfg.d_model * cfg.d_model + 2 * cfg.d_model)


def utterance_flops(cfg, frames: int, labels: int) -> float:
    """Training FLOPs of one utterance as hardware/mfu.py counts them (tests/hardware/test_model_flops.py):
    the forward by the model's formula x3, but the first convolution's (its input needs no gradient: x2)."""
    if cfg.name == "fastconformer":
        return training_flops(cfg, frames)
    forward = (rnnt.flops if cfg.name == "transducer" else encdec.flops)(cfg, frames, labels)
    return 3 * forward - forward_flops(cfg, frames)["first"]


def _mfu(flops: float, wall: float, peak, world: int = 1, dev: torch.device | None = None,
         precision: str = "fp32") -> dict:
    """MFU of N devices: against N times one device's peak. Steps that beat a CPU's measured peak drop
    its cached entry, as a training run's do (hardware/mfu.py): the next row measures it again."""
    got = achieved(flops, wall, peak.tflops * world if peak.tflops else peak.tflops)
    cpu = (torch.get_num_threads(), cpu_dtype(precision)) if dev is not None and dev.type == "cpu" else None
    got = forget_if_beaten(got, cpu, "row")
    return {"tflops": got["tflops"], "mfu_pct": got["mfu_pct"], "peak_source": got["mfu_note"] or peak.source}


def _peak(model, opt, batch: Batch, step, dev: torch.device, est, world: int = 1) -> dict:
    """The measured peak of one step: on CUDA torch's ``max_memory_allocated``; on a CPU what was
    allocated when the step began (parameters, gradients, optimizer state, the batch) plus the
    profiler's peak above it (``hardware.memory.allocated_peak``, the gradients it frees copied under the
    profiler first, so that their frees are seen)."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        step(batch)
        torch.cuda.synchronize(dev)
        got, how = torch.cuda.max_memory_allocated(dev), "torch.cuda.max_memory_allocated"
    else:
        state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        live = memory.tensor_bytes([*model.parameters(), *(p.grad for p in model.parameters()), *state, batch.feats])
        fresh = lambda: memory.fresh_gradients(model.parameters())  # noqa: E731
        got = live + memory.allocated_peak(lambda: step(batch), before=fresh)
        how = "live tensors + torch.profiler's allocator peak"
    if world > 1:
        got, how = int(_worst([got], world)[0]), how + ", the rank that used most"
    return {"peak_gb": got / memory.GB, "estimate_ratio": est.peak() / got, "memory_method": how}


def notes(rows: list[dict]) -> list[str]:
    """Under the table: what each figure is, the power source, the rows not run and why."""
    lines = ["estimate_gb: hardware/memory.py before the run, the widest planned batch; peak_gb measured "
             f"({rows[0]['memory_method']})" if rows and rows[0].get("memory_method") else
             "estimate_gb: hardware/memory.py before the run, the widest planned batch"]
    lines += sorted({f"MFU peak: {r['peak_source']}" for r in rows if r.get("peak_source")})
    lines += sorted({f"power: {r['energy']}" for r in rows if r.get("energy")})
    lines += [f"GPU busy over the timed steps (the driver's utilization): {r['workload']} {r['precision']} "
              f"x{r['world']}: {r['gpu_busy_pct']:.0f} %" for r in rows if r.get("gpu_busy_pct") is not None]
    lines += [f"{r['workload']} {r['batch_s']:g} s: {r['status']}" for r in rows if r["status"] != "ok"]
    lines += sorted({f"one-device rows read from {r['source']} (--baseline), not measured here" for r in rows
                     if r.get("source")})
    lines += [f"{r['workload']} {r['batch_s']:g} s x{r['world']}: no scaling efficiency: no one-device row of the "
              f"same workload, batch, precision ({r['precision']}) and device measured" for r in rows
              if r["status"] == "ok" and r.get("world", 1) > 1 and r.get("scaling_efficiency") is None]
    lines += sorted({f"{r['workload']}: fp8 on {r['device']} is torchao's emulation: its rates are not fp8's"
                     for r in rows if r["precision"] == "fp8" and not str(r["device"]).startswith("cuda")})
    return lines
