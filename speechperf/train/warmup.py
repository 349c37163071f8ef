"""One-time initialization, done before the TTA clock starts (MLPerf's init_start..init_stop).

What depends on the state a machine happens to be in, rather than on its speed, is paid
here, so that the first epoch and the first evaluation cost what the later ones cost:

- the per-epoch evaluation's decoder is built, once for the run (the dictionary and bigram LM
  are read, or built once beside the features, and turned into the search's tables), and its
  numba kernels are compiled: 13-14 s with a cold cache on both an H100 machine and 2 CPU
  cores, 0 s with a warm one (measured);
- one forward and backward pass of the model (compiled, if ``train.system.compile``), so that the CUDA context exists,
  cuDNN has picked its LSTM/convolution algorithms and oneDNN has built its primitives;
- the evaluation split's batches are read, padded and kept (on the GPU, or in pinned host
  memory; train/evaluate.py ``keep_resident``) up to ``train.eval.resident_mb``: every epoch's
  evaluation then only runs the model on them, instead of starting readers, decompressing the
  split's shards and copying each batch to the device inside the clock.

The warm-up restores the model's batch-norm statistics and gradients and runs in a forked
RNG stream: a run trains identically with or without it.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch

from speechperf.corpus import alphabet
from speechperf.data.batching import Batching
from speechperf.data.units import Units, load_units
from speechperf.features.feature_config import FeatureConfig
from speechperf.models.contract import autocast, planned_forward
from speechperf.config import ConfigError
from speechperf.objectives import OBJECTIVES, ctc_cpu, objective_of
from speechperf.config.training import AUTO_PRECISION
from speechperf.hardware.capability import EMULATED, EMULATED_COST, model_support
from speechperf.train.evaluate import keep_resident, make_decoder

# Past this the initialization is reported with a warning: MLPerf's closed division allows
# 30 minutes of initialization; a DS2 run that needs 10 has something wrong (a cold cache
# on a slow file system, an LM rebuilt on every start) worth looking at.
INIT_WARN_S = 600.0
# Frames of the dummy batch: long enough for the strided convolution and a few recurrent
# steps of every LSTM layer, short enough to cost well under a second on 2 CPU cores.
WARM_FRAMES = 64


def warm_decoder(name: str, beam: int, feats: Path, mode: str = "ngrams", units: Units | None = None) -> None:
    """Build CTC decoder ``name`` for the features folder and the run's ``units`` (None: characters),
    once: every evaluation of the run reuses it, dictionary and LM tables included
    (train/evaluate.py's ``make_decoder``); and decode a small random batch, which compiles every
    kernel the evaluation will call."""
    dec = make_decoder(name, 1 if name == "greedy" else beam, feats, mode, units)
    classes = units.num_classes if units is not None else alphabet.NUM_SYMBOLS
    OBJECTIVES.lookup("ctc").warm_decode(dec, classes, WARM_FRAMES)


FEATURE_DIM = FeatureConfig().dim  # features per frame the loader delivers (80 log-mel + 13 MFCC)


def warm_shape(cfg, device: torch.device) -> tuple[int, int]:
    """(batch, frames) of the warm-up pass: on a GPU with padded batches (the paper's
    mode) every step has one shape, so the warm-up takes exactly it and its kernels are the
    ones training will run; otherwise a small batch (shapes vary from batch to batch)."""
    if device.type == "cuda" and cfg.loader.mode == "pad":
        return cfg.loader.batch_size, cfg.loader.pad_frames
    return 2, WARM_FRAMES


def warm_model(model: torch.nn.Module, cfg, device: torch.device) -> None:
    """One training-mode forward and backward pass of ``model`` on zeros, leaving its
    weights, buffers (batch-norm statistics), gradients and the RNG streams as they were.

    The model itself runs, not a copy, so that a ``torch.compile``d model compiles here
    (its graph is tied to the module it wraps) and no second copy takes GPU memory.
    """
    batch, frames = warm_shape(cfg, device)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    was_training = model.training
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.train()
        x = torch.zeros(batch, frames, FEATURE_DIM, device=device)  # (B, T, 93): the model picks its columns
        lens = torch.full((batch,), frames)
        with autocast(device, cfg.train.system.precision):
            out, out_lens = planned_forward(model, x, lens, device)  # as train_step calls it
        objective_of(model).probe_loss(model, out, out_lens).backward()  # its loss's kernels run (compiled) too
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    for p in model.parameters():
        p.grad = None
    model.train(was_training)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_precision(cfg, device: torch.device, allow_emulated: bool = True) -> str | None:
    """Refuse, before anything is written or timed, a ``train.system.precision`` this device cannot run
    for the run's model (ConfigError, exit 2: why, and the way out), and one this CPU only emulates
    unless ``allow_emulated`` (``train --allow-emulated``); return the note of an emulated one
    ("emulated: no native bf16 on this CPU (AVX2)"), None when it is native. ``auto`` is checked
    by its choice, which takes native precisions only (train/auto_precision.py).

    Every bf16 path of a run (the step, the warm-up, the evaluations) runs the same model under
    the same autocast, so this one check covers them all (hardware/capability.py)."""
    precision = cfg.train.system.precision
    if precision == AUTO_PRECISION:
        return None
    if precision == "fp16" and device.type != "cuda":  # its loss scaler is CUDA's
        raise ConfigError("train.system.precision=fp16 needs a CUDA device; on a CPU use train.system.precision=fp32 "
                          "(or bf16 where this CPU runs it)")
    can = model_support(cfg.model, device, precision)
    if not can.runs:
        raise ConfigError(f"train.system.precision={precision} cannot train model {cfg.model.name} here: {can.note}; "
                          "use train.system.precision=fp32")
    if can.level == EMULATED and device.type == "cpu" and not allow_emulated:
        raise ConfigError(f"train.system.precision={precision} is emulated on this CPU ({can.reason}): "
                          f"{EMULATED_COST[precision]}; use train.system.precision=auto (the fastest native one) or "
                          "fp32, or give --allow-emulated to time it anyway")
    return can.note


def initialize(model: torch.nn.Module, cfg, batching: Batching, feats: Path, device: torch.device) -> dict:
    """Warm the decoders the run evaluates with and the model, keep the evaluation split's
    batches (cut as ``batching``, data/batching.py, cuts them for evaluation); returns seconds per
    part (and the kept batches' MiB)."""
    tc = cfg.train
    parts: dict[str, float] = {}
    t = time.perf_counter()
    if objective_of(cfg.model).name == "ctc":  # a transducer's search is the model's: warmed with it
        units = load_units(feats, cfg.loader.units)  # made by the trainer's build (never trained here)
        warm_decoder("greedy", 1, feats, units=units)  # the sentences logged every ``sentence_every`` steps
        if tc.eval.decoder != "greedy":
            warm_decoder(tc.eval.decoder, tc.eval.beam, feats, tc.eval.mode, units)
    parts["decoder_s"] = time.perf_counter() - t
    t = time.perf_counter()
    warm_model(model, cfg, device)
    ctc_loss = objective_of(cfg.model).name == "ctc" or getattr(cfg.model, "ctc_weight", 0) > 0  # or a CTC head's
    if ctc_loss and tc.system.ctc_kernel == "numba" and (device.type == "cpu" or tc.system.deterministic):
        ctc_cpu.warm()  # compiled (or loaded from numba's cache) before the clock: the CTC loss on the CPU
    parts["model_s"] = time.perf_counter() - t
    t = time.perf_counter()  # after the model: the GPU memory it leaves free decides where the batches go
    kept = keep_resident(feats, tc.eval.split, batching, device, tc.eval.resident_mb)
    parts["eval_data_s"] = time.perf_counter() - t
    parts["eval_data_mb"] = kept.nbytes / 2**20 if kept is not None else 0.0  # 0: streamed every evaluation
    return parts


def warn_if_slow(init_s: float, where: str) -> None:
    """Warn when initialization took longer than ``INIT_WARN_S``."""
    if init_s > INIT_WARN_S:
        warnings.warn(f"{where}: initialization took {init_s:.0f} s (> {INIT_WARN_S:.0f} s); it is reported beside "
                      "the TTA but not counted in it", stacklevel=2)
