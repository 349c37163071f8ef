"""The contract every acoustic model meets, so that the training loop, evaluation and
``bench zoo`` drive any registered model the same way.

A model reads features ``(B, T, 93)`` (80 log-mel, then 13 MFCC; it uses the first
``cfg.input_dim`` columns) with their lengths ``(B,)`` and returns CTC log-probabilities
``(T', B, C)`` over the 30-symbol alphabet with output lengths ``(B,)``. Its output-length
rule is plain arithmetic on CPU tensors (:meth:`AcousticModel.output_lengths`), so the
step plans the CTC lengths and any index a forward pass needs from the loader's CPU
lengths (:meth:`AcousticModel.plan`): a GPU step never waits for the host. ``forward``
therefore never reads device values on the host (no ``.item()``, no boolean-mask
indexing whose size only the device knows).

Each model has its own frozen config dataclass with ``name`` (its registry key),
``input_dim``, ``num_classes`` and ``problems()`` (one message per invalid value), stored
in every checkpoint and result as a dict tagged with that name.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn as nn

from speechperf.errors import SpeechperfError


def autocast(device: torch.device, precision: str):
    """Mixed-precision context for a model's forward pass (fp32: none): the step, evaluation,
    warm-up and ``bench zoo`` run every model under it."""
    if precision == "fp32":
        return nullcontext()
    if precision not in ("bf16", "fp16", "fp8"):  # "auto" is settled before any step (train/auto_precision.py)
        raise ValueError(f"no autocast for precision {precision!r} (fp32, bf16, fp16 or fp8)")
    # fp8: bf16 around the float8 Linear layers (models/fp8.py swaps them when the model is built)
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


class TooShortError(SpeechperfError):
    """An input shorter than the model's ``min_frames`` cannot be processed."""


class AcousticModel(nn.Module):
    """Base class of the models in ``speechperf.models.MODELS``.

    Subclasses set ``self.cfg`` and ``self.min_frames``, implement :meth:`output_lengths`
    and :meth:`forward`, and override :meth:`plan` when ``forward`` takes host-planned
    tensors (DS2's valid-frame index)."""

    cfg: object
    min_frames: int = 1

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Output frames for input frames ``lengths`` (CPU arithmetic, no device reads)."""
        raise NotImplementedError

    def check_lengths(self, lengths: torch.Tensor) -> None:
        """:class:`TooShortError` for inputs shorter than ``min_frames`` (CPU lengths)."""
        shortest = int(lengths.min())
        if shortest < self.min_frames:
            raise TooShortError(f"an input has {shortest} frames; model {self.cfg.name!r} needs at least "
                                f"{self.min_frames}")

    def plan(self, lengths: torch.Tensor, frames: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """On the CPU, for inputs of CPU ``lengths`` padded to ``frames``: the output lengths
        and the keyword tensors :meth:`forward` takes (moved to the device by the caller)."""
        self.check_lengths(lengths)
        return self.output_lengths(lengths), {}

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, **planned) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, F) features, lengths: (B,) -> log-probs (T', B, C), out lengths (B,)."""
        raise NotImplementedError


def planned_forward(model: nn.Module, x: torch.Tensor, lengths: torch.Tensor,
                    device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass of ``model`` (or its DDP/compiled wrapper) planned on the CPU.

    ``x`` and ``lengths`` may be CPU tensors (moved to ``device``, default x's device);
    returns the log-probabilities and the CPU output lengths."""
    core = unwrap(model)
    lengths_cpu = lengths.cpu()
    out_lens, kw = core.plan(lengths_cpu, x.shape[1])
    device = device or x.device
    kw = {k: to_device(v, device) for k, v in kw.items()}
    log_probs, _ = model(to_device(x, device), to_device(lengths_cpu, device), **kw)
    return log_probs, out_lens


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``, the host never waiting for the device: a CPU tensor bound for a
    CUDA device is pinned first (a copy from pageable memory goes through the driver's
    staging buffer and may wait for the work queued before it); the same values."""
    if torch.device(device).type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def compiled(model: nn.Module, backend: str = "inductor") -> nn.Module:
    """``model`` under torch.compile (``train.system.compile``). A model of repeated blocks (a ``blocks``
    ModuleList: the conformer's 16) has each block compiled in place with dynamic shapes: dynamo
    traces the block's code once and every block reuses it (their parameters are the graph's
    inputs), and one graph of symbolic shapes serves every batch shape, so compilation costs one
    block once, not the whole model at each new batch shape (ledger: train.compile, gpu_check;
    docs/gpu.md). The model itself is
    returned: its parameters keep their names. Other models: torch.compile of the whole model (a
    wrapper, the model its ``_orig_mod``). A submodule whose class sets ``eager_under_compile``
    runs eagerly between the graphs (the conformer's depthwise convolution)."""
    for m in model.modules():
        if getattr(m, "eager_under_compile", False):
            m.forward = torch.compiler.disable(m.forward)  # this instance only; dynamo breaks its graph here
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList) and len(blocks) > 0:
        for block in blocks:
            block.compile(backend=backend, dynamic=True)
        return model
    return torch.compile(model, backend=backend)


def unwrap(model: nn.Module) -> AcousticModel:
    """The model inside DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner
