"""``train.system.precision=fp8``: torchao's float8 training of a model's Linear layers, bf16 autocast
around them (every other layer, the loss, the optimizer as in a bf16 run).

torchao's ``convert_to_float8_training`` replaces an ``nn.Linear`` by its ``Float8Linear``: the
same parameters (fp32, the same state-dict keys, so a checkpoint is the plain model's), whose
forward casts the input and the weight, and whose backward casts the output's gradient, to
float8 with one dynamic scale per tensor (``scale = max / amax``: e4m3, max 448, for the input and
weight; e5m2, max 57,344, for the gradient), saturated at the format's max, and multiplies them
with ``torch._scaled_mm`` on FP8 tensor cores (CUDA compute capability 8.9 and newer). On any
other device torchao emulates it (``Float8LinearConfig(emulate=True)``): the same casts, the
products in fp32 of the cast values; its numerics are the GPU's, its speed is not
(hardware/capability.py: ``emulated``).

Only layers whose both dimensions are multiples of :data:`ALIGN` are swapped (the FP8 GEMM's
alignment; torchao's own filter's first rule): :func:`plan` says for each Linear layer whether it
is swapped and why not. A model with none is refused for fp8 (capability: unsupported).

torchao is the ``fp8`` extra (pyproject); without it fp8 is unsupported, said so.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from speechperf.errors import ConfigError

ALIGN = 16  # both dimensions of a swapped Linear: a multiple of this (FP8 tensor cores' GEMM alignment)
E4M3_MAX = 448.0  # the largest finite float8_e4m3fn: 1.75 x 2^8 (the input's and weight's format)
E5M2_MAX = 57344.0  # the largest finite float8_e5m2: 1.75 x 2^15 (the gradient's format)
QUIET_LOGS = ("torchao", "torch.utils._pytree")  # loggers torchao's import warns through
EXTRA = "pip install 'speechperf[fp8]' (torchao)"  # what installs it


@dataclass(frozen=True)
class Layer:
    """One ``nn.Linear`` of a model and what fp8 does with it."""

    name: str  # its qualified name in the model ("blocks.0.ff1.linear1")
    shape: tuple[int, int]  # (in_features, out_features)
    swapped: bool  # replaced by torchao's Float8Linear
    reason: str = ""  # why not (empty when swapped)


def torchao_float8():
    """torchao's ``torchao.float8`` module; ConfigError naming the extra where it is not installed.
    Its import logs warnings that are no user's business (a CUDA extension a CPU-only machine cannot
    load; torch's deprecation of its Enum registration): kept quiet."""
    logs = [logging.getLogger(name) for name in QUIET_LOGS]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    except ImportError as e:
        raise ConfigError(f"train.system.precision=fp8 needs torchao, which is not installed here ({e}): "
                          f"{EXTRA}") from e
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    return float8


def available() -> str | None:
    """None where torchao's float8 training imports, else why not in words."""
    try:
        torchao_float8()
    except ConfigError as e:
        return str(e)
    return None


def why_not(layer: nn.Linear) -> str:
    """Why a Linear layer cannot be swapped ("" when it can)."""
    kind = type(layer).__name__
    if type(layer) is not nn.Linear and not is_float8(layer):  # MultiheadAttention's out_proj, say
        return f"a {kind}, not an nn.Linear: its owner may use its weight without calling it"
    bad = [f"{what} {n}" for what, n in (("in_features", layer.in_features), ("out_features", layer.out_features))
           if n % ALIGN]
    return f"{' and '.join(bad)} not a multiple of {ALIGN}" if bad else ""


def plan(model: nn.Module) -> list[Layer]:
    """Every ``nn.Linear`` of ``model`` (on any device, meta included), in order, swapped or why not."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            reason = why_not(m)
            out.append(Layer(name, (m.in_features, m.out_features), not reason, reason))
    return out


def convert(model: nn.Module, emulate: bool) -> list[Layer]:
    """Swap ``model``'s Linear layers that :func:`plan` allows for torchao's ``Float8Linear`` in place
    (``emulate``: torchao's emulation, for devices without FP8 tensor cores); returns the plan."""
    layers = plan(model)
    float8 = torchao_float8()
    swap = {layer.name for layer in layers if layer.swapped}
    float8.convert_to_float8_training(model, module_filter_fn=lambda m, name: name in swap,
                                      config=float8.Float8LinearConfig(emulate=emulate))
    return layers


def prepare(model: nn.Module, precision: str, device: torch.device) -> list[Layer]:
    """``model`` made ready to train in ``precision`` on ``device``: for fp8 its Linear layers swapped
    (emulated where ``device`` is not CUDA); nothing for any other precision. Returns the swap plan."""
    if precision != "fp8":
        return []
    return convert(model, emulate=torch.device(device).type != "cuda")


def is_float8(module: nn.Module) -> bool:
    """Whether ``module`` is torchao's Float8Linear (FSDP2 makes a subclass of a module it shards)."""
    return any(c.__name__ == "Float8Linear" and c.__module__.startswith("torchao.") for c in type(module).__mro__)


def swapped(model: nn.Module) -> int:
    """How many of ``model``'s layers are torchao's Float8Linear now."""
    return sum(is_float8(m) for m in model.modules())


def summary(layers: list[Layer]) -> str:
    """The swap in words: "12 of 14 Linear layers in float8 (head: in_features 176 ... not a multiple of 16)"."""
    kept = [f"{layer.name or 'the model'}: {layer.reason}" for layer in layers if not layer.swapped]
    text = f"{sum(layer.swapped for layer in layers)} of {len(layers)} Linear layers in float8"
    return text + (f", the others in bf16 ({'; '.join(kept[:3])}{'; ...' if len(kept) > 3 else ''})" if kept else "")
