"""The acoustic rows of ``bench zoo``: every model registered in ``speechperf.models`` (DS2,
DNN, CLDNN, and whatever else registers), built and stepped through the model contract
exactly as training steps it: lengths planned on the CPU (``plan``), ``forward`` with the
planned tensors, CTC on the fp32 log-probabilities. A model that registers gets its row
with no code here.

Sizes: DS2 is the paper preset's (27 M parameters, paper 002's Table 5 row); the other
models their config's defaults. A batch of B holds utterances of lengths spread evenly from
400 down to 100 frames (4 to 1 s), the same every step, so that its model FLOPs are one
number: throughput does not depend on the features' values.

MFU beside samples/s (:func:`mfu_columns`) comes from the MFU module,
``speechperf.hardware.mfu`` (``flop_model`` counts a model's training FLOPs per utterance,
``zoo_mfu`` sets them against the device's peak); where that module is absent the columns
are None and ``mfu_note`` says so.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speechperf.features.feature_config import FeatureConfig
from speechperf.models.contract import planned_forward, unwrap
from speechperf.config import load_preset
from speechperf.models import MODELS, build_model, check_contract, model_config
from speechperf.models.external import registered_name
from speechperf.objectives import objective_of

PRESET_OF = {"ds2": "paper"}  # models whose row takes a preset's sizes (the paper's DS2)
FRAMES = (100, 400)  # frames per synthetic utterance, shortest and longest
CPU_BATCHES, GPU_BATCHES = (2, 4), (8, 16, 32)  # defaults of models without a Table 8 entry
FEATURE_DIM = FeatureConfig().dim  # the loader's frames: 80 log-mel then 13 MFCC


def names() -> list[str]:
    """The registered acoustic models, in registry order."""
    return MODELS.names()


def config(name: str):
    """The config of model ``name``'s zoo row: its preset's (``PRESET_OF``) or its defaults."""
    return load_preset(PRESET_OF[name]).model if name in PRESET_OF else model_config({"name": name})


def resolve(name: str) -> str:
    """The registered name of model ``name`` (``MODULE:NAME``: imported and its contract checked)."""
    check_contract(model_config({"name": name}))
    return registered_name(name)


def build(name: str) -> nn.Module:
    return build_model(config(name))


def batches(device: str) -> tuple[int, ...]:
    """Default batch sizes of a model without a Table 8 entry: small on a CPU."""
    return GPU_BATCHES if str(device).startswith("cuda") else CPU_BATCHES


def lengths(batch: int, min_frames: int = 1) -> torch.Tensor:
    """(B,) CPU frame counts of a zoo batch: evenly from the longest down to the shortest."""
    lo = max(FRAMES[0], min_frames)
    return torch.linspace(max(lo, FRAMES[1]), lo, batch).round().long()


def step(model: nn.Module, batch: int, dev: torch.device) -> torch.Tensor:
    """The loss of one synthetic batch under the model's objective (CTC: random letters, a third of
    each utterance's frames), through the contract (lengths planned on the CPU)."""
    lens = lengths(batch, unwrap(model).min_frames)  # on the host, as a loader's
    x = torch.randn(batch, int(lens.max()), FEATURE_DIM, device=dev)  # (B, T, 93)
    out, out_lens = planned_forward(model, x, lens)  # CTC: (T', B, C) on dev; (B,) on the CPU
    return objective_of(model).synthetic_loss(model, out, out_lens, unwrap(model).cfg.num_classes)


MFU_COLUMNS = ("tflops", "mfu_pct", "peak_tflops", "peak_source", "mfu_note")


def mfu_columns(name: str, model: nn.Module, batch: int, step_s: float, dev: torch.device, multiply: str,
                cache: dict) -> dict:
    """Achieved TFLOPS and MFU of a measured acoustic row: the model FLOPs of its batch (valid
    frames; ``speechperf.hardware.mfu.flop_model``, fitted once per model and kept in ``cache``)
    over its median step time, against the peak a training run on ``dev`` in ``multiply``
    precision is measured against (``zoo_mfu``). None, with ``mfu_note`` saying why, where
    the MFU module is not in this version."""
    try:
        from speechperf.hardware.mfu import flop_model, zoo_mfu  # may be absent: this version's guard
    except ImportError:
        return {**dict.fromkeys(MFU_COLUMNS),
                "mfu_note": "not computed: speechperf.hardware.mfu is not in this version"}
    if name not in cache:
        cache[name] = flop_model(config(name))
    flops = cache[name].batch(lengths(batch, unwrap(model).min_frames))
    return {**dict.fromkeys(MFU_COLUMNS), **zoo_mfu(flops, step_s, dev, multiply)}
