"""What a device does with a precision: ``native``, ``emulated`` (it runs, slowly) or
``unsupported`` (it does not run), with the reason in words.

Decided from the CPU's feature flags (``/proc/cpuinfo``, else torch's own CPU probe) and,
where the flags are not the whole truth, from a tiny cached probe of the kernel itself:

- bf16 (and fp16) matrix products run on every x86-64 CPU torch supports, natively only with
  AVX512-BF16 or AMX-BF16 (AVX512-FP16 or AMX-FP16); elsewhere they are converted to fp32 and
  back around each product (measured here: a DS2 step 27x slower in bf16 on AVX2).
- torch's CPU ``nn.LSTM`` (without projection) under bf16 or fp16 autocast runs through
  oneDNN, whose LSTM has no kernel for them without AVX-512: on an AVX2 CPU it raises "could
  not create a primitive descriptor". An 8-unit LSTM is run once to confirm (cached).
- on a GPU, from its compute capability: bf16 and tf32 native from 8.0 (Ampere), bf16
  emulated below it, tf32 absent below it. A model with LSTMs under bf16 autocast runs them in
  fp16, whatever the autocast dtype: torch's autocast wrapper of cuDNN's RNN casts the input,
  states and weights to half (aten/src/ATen/cudnn/AutocastRNN.cpp), and no loss scaler guards
  a bf16 run. The precision is native, with that caveat in the run's note.
- fp8 (models/fp8.py: torchao's float8 Linear layers inside bf16 autocast): native on a GPU with
  FP8 tensor cores (compute capability 8.9, Ada, and newer), unsupported on an older GPU
  (``torch._scaled_mm`` refuses it), emulated by torchao on a CPU (as slow as its bf16 and its
  casts, :data:`EMULATED_COST`); unsupported wherever its bf16 is (an LSTM on AVX2), where torchao
  is not installed, and for a model none of whose Linear layers fp8 can swap.

Tests force a feature off with the environment variable ``SPEECHPERF_CPU_WITHOUT``
(comma-separated /proc/cpuinfo flag names, e.g. ``avx512f,avx512_bf16,amx_bf16``) or by
monkeypatching :func:`cpu_flags`, so the emulated and unsupported paths are proven on any
CPU; a feature forced off is never probed (the probe would see the real CPU).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from speechperf.errors import in_words

NATIVE, EMULATED, UNSUPPORTED = "native", "emulated", "unsupported"
FORCE_ENV = "SPEECHPERF_CPU_WITHOUT"  # CPU flags to treat as absent (tests, and "what if" runs)
AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})  # oneDNN's avx512_core
NATIVE_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
# torch.cpu.get_capabilities() names -> /proc/cpuinfo names, for machines without /proc
TORCH_NAMES = {"avx512_f": "avx512f", "avx512_bw": "avx512bw", "avx512_vl": "avx512vl", "avx512_dq": "avx512dq",
               "fma3": "fma"}
KNOWN = ("fp32", "tf32", "bf16", "fp16", "fp8")
FP8_CC = (8, 9)  # the first CUDA compute capability with FP8 tensor cores (Ada; Hopper is 9.0)
# What an emulated bf16 costs, measured (the module's docstring): said where one is refused
EMULATED_SLOWDOWN = "measured: a DS2 step 27x slower in bf16 than in fp32 on an AVX2 CPU (an AMD EPYC, 2 threads)"
# ... and an emulated fp8 (benchmarks/run.py fp8, docs/bench.md): said where one is refused
EMULATED_COST = {"bf16": EMULATED_SLOWDOWN, "fp16": EMULATED_SLOWDOWN,
                 "fp8": "measured: an at-scale FastConformer step 2.3-2.6x slower in emulated fp8 than in bf16 "
                        "on a 2-core AMX Xeon (benchmarks/run.py fp8, docs/bench.md)"}


@dataclass(frozen=True)
class Support:
    """How ``precision`` runs on ``device``: its level and, unless native, why in words."""

    precision: str  # "fp32", "tf32", "bf16", "fp16"
    device: str  # "cpu", "cuda:0"
    level: str  # NATIVE, EMULATED or UNSUPPORTED
    reason: str = ""  # why it is not native (empty when native)
    caveat: str = ""  # what runs in another precision although the level is native (empty: nothing)

    @property
    def runs(self) -> bool:
        return self.level != UNSUPPORTED

    @property
    def where(self) -> str:
        return "CPU" if self.device.startswith("cpu") else "GPU"

    @property
    def note(self) -> str | None:
        """The row's or run's flag: None when native (its caveat where it has one), else
        "emulated: ..." / "unsupported on this CPU: ..."."""
        if self.level == NATIVE:
            return self.caveat or None
        return f"{'emulated' if self.level == EMULATED else f'unsupported on this {self.where}'}: {self.reason}"


# ---- the CPU -----------------------------------------------------------------------------
def forced_off() -> frozenset[str]:
    """The flags ``SPEECHPERF_CPU_WITHOUT`` says to treat as absent."""
    return frozenset(f.strip().lower() for f in os.environ.get(FORCE_ENV, "").split(",") if f.strip())


@functools.lru_cache(maxsize=1)
def _real_cpu_flags() -> frozenset[str]:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:  # no /proc (macOS, Windows): torch's own cpuinfo
        import torch

        return frozenset(TORCH_NAMES.get(k, k) for k, v in torch.cpu.get_capabilities().items() if v is True)
    except (AttributeError, RuntimeError):
        return frozenset()


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (/proc/cpuinfo names), less those forced off."""
    return _real_cpu_flags() - forced_off()


def isa(flags: frozenset[str]) -> str:
    """The widest vector ISA in words: "AVX-512 with AMX", "AVX-512", "AVX2", "AVX", "SSE"."""
    if AVX512_CORE <= flags:
        return "AVX-512 with AMX" if "amx_tile" in flags or "amx_bf16" in flags else "AVX-512"
    return "AVX2" if "avx2" in flags else "AVX" if "avx" in flags else "SSE"


@functools.lru_cache(maxsize=None)
def probe(kernel: str, dtype: str) -> str | None:
    """Run ``kernel`` ("lstm" or "matmul") once on the CPU under ``dtype`` autocast: None if it
    runs, else the error in words. Cached: the answer is the machine's and the build's."""
    import torch


    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    with torch.random.fork_rng(devices=[]):  # the LSTM's initialization draws: the run's stream is untouched
        try:
            if kernel == "lstm":
                with torch.autocast("cpu", dtype=dt):
                    y, _ = torch.nn.LSTM(8, 8)(torch.zeros(3, 2, 8))  # (T, B, H)
                y.float().sum().backward()
            else:
                a = torch.ones(4, 4, dtype=dt)
                (a @ a).sum().item()
        except (RuntimeError, TypeError, NotImplementedError) as e:
            return in_words(e)
    return None


def _cpu(precision: str, lstm: bool) -> Support:
    if precision == "fp8":
        return _cpu_fp8(lstm)
    flags, off = cpu_flags(), forced_off()
    here = f"this CPU: {isa(flags)}"
    if precision == "fp32":
        return Support(precision, "cpu", NATIVE)
    if precision == "tf32":
        return Support(precision, "cpu", UNSUPPORTED, "tf32 is a CUDA tensor-core mode")
    native = any(f in flags for f in NATIVE_FLAGS[precision])
    emulated = Support(precision, "cpu", EMULATED, f"no native {precision} on this CPU ({isa(flags)})")
    failed = probe("matmul", precision)
    if failed:
        return Support(precision, "cpu", UNSUPPORTED, f"torch's {precision} matrix product fails here ({failed})")
    if lstm:
        need = AVX512_CORE if precision == "bf16" else frozenset({"avx512_fp16"})
        missing = sorted(need - flags)
        # bf16: oneDNN's LSTM needs avx512_core (torch's mkldnn bf16 check is the same rule)
        no_kernel = (f"torch's oneDNN LSTM has no {precision} kernel " +
                     ("without AVX-512" if precision == "bf16" else "on this CPU") + f" ({here})")
        if missing and set(missing) & off:  # forced off: the real CPU may have it, so no probe
            return Support(precision, "cpu", UNSUPPORTED, no_kernel)
        failed = probe("lstm", precision)
        if failed:
            return Support(precision, "cpu", UNSUPPORTED, no_kernel if missing else
                           f"torch's oneDNN LSTM fails under {precision} ({failed})")
    return Support(precision, "cpu", NATIVE) if native else emulated


def _cpu_fp8(lstm: bool) -> Support:
    """fp8 on a CPU: torchao's emulation, inside bf16 autocast (so never better than bf16 here)."""
    bf16 = _cpu("bf16", lstm)
    if not bf16.runs:
        return Support("fp8", "cpu", UNSUPPORTED, f"its bf16 autocast does not run: {bf16.reason}")
    return Support("fp8", "cpu", EMULATED, f"no FP8 tensor cores on a CPU ({isa(cpu_flags())}): torchao emulates "
                                           "the float8 casts, its products run in fp32")


# ---- GPUs -------------------------------------------------------------------------------
def cuda_capability(device: str) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (monkeypatched in tests)."""
    import torch

    return torch.cuda.get_device_capability(device)


CUDNN_RNN_FP16 = ("its LSTMs run in fp16 under bf16 autocast (torch's autocast casts cuDNN's RNN to half, "
                  "aten/src/ATen/cudnn/AutocastRNN.cpp), without a loss scaler")


def _cuda(precision: str, device: str, lstm: bool = False) -> Support:
    major, minor = cuda_capability(device)
    cc = f"compute capability {major}.{minor}"
    if precision == "fp32":
        return Support(precision, device, NATIVE)
    if precision == "tf32":
        return (Support(precision, device, NATIVE) if major >= 8 else
                Support(precision, device, UNSUPPORTED, f"tf32 needs compute capability 8.0 or newer (this GPU: {cc})"))
    if precision == "fp8":
        return (Support(precision, device, NATIVE, caveat=CUDNN_RNN_FP16 if lstm else "") if (major, minor) >= FP8_CC
                else Support(precision, device, UNSUPPORTED, f"no FP8 tensor cores on this GPU ({cc}; 8.9 or newer "
                                                             "has them)"))
    if precision == "bf16":
        return (Support(precision, device, NATIVE, caveat=CUDNN_RNN_FP16 if lstm else "") if major >= 8 else
                Support(precision, device, EMULATED, f"no native bf16 on this GPU ({cc}; 8.0 or newer has it)"))
    fast_fp16 = major >= 7 or (major, minor) == (6, 0)  # tensor cores; P100 at twice fp32
    return (Support(precision, device, NATIVE) if fast_fp16 else
            Support(precision, device, EMULATED, f"fp16 runs at a fraction of the fp32 rate on this GPU ({cc})"))


# ---- the question ------------------------------------------------------------------------
def has_lstm(model) -> bool:
    """Whether a module (or any of its children) is an ``nn.LSTM`` (cuDNN's RNN on a GPU)."""
    import torch

    return any(isinstance(m, torch.nn.LSTM) for m in model.modules())


def onednn_lstm(model) -> bool:
    """Whether a module (or any of its children) is an ``nn.LSTM`` that torch runs through
    oneDNN on a CPU: one without a projection (``proj_size`` 0; a projected LSTM, CLDNN's,
    takes torch's own kernel, which runs under bf16 everywhere)."""
    import torch

    return any(isinstance(m, torch.nn.LSTM) and not m.proj_size for m in model.modules())


def support(device, precision: str, model=None) -> Support:
    """How ``precision`` ("fp32", "tf32", "bf16", "fp16", "fp8") runs on ``device`` for ``model``
    (an ``nn.Module``, on any device including meta; None: plain matrix products)."""
    if precision not in KNOWN:
        raise ValueError(f"unknown precision {precision!r} (one of {', '.join(KNOWN)})")
    device = str(device)
    if precision == "fp8":
        return _fp8(device, model)
    if device.startswith("cuda"):
        return _cuda(precision, device, model is not None and has_lstm(model))
    if device.startswith("cpu"):
        return _cpu(precision, model is not None and onednn_lstm(model))
    return Support(precision, device, UNSUPPORTED, f"device {device!r} is neither a CPU nor a CUDA GPU")


def _fp8(device: str, model) -> Support:
    """fp8 for ``model`` on ``device``: refused where torchao or a swappable layer is missing; else the
    device's answer, its note saying which layers train in float8 (models/fp8.py)."""
    from speechperf.models import fp8

    refused = _fp8_refused(model)
    if refused:
        return Support("fp8", device, UNSUPPORTED, refused)
    if device.startswith("cuda"):
        can = _cuda("fp8", device, model is not None and has_lstm(model))
    elif device.startswith("cpu"):
        can = _cpu("fp8", model is not None and onednn_lstm(model))
    else:
        return Support("fp8", device, UNSUPPORTED, f"device {device!r} is neither a CPU nor a CUDA GPU")
    if model is None or not can.runs:
        return can
    swap = fp8.summary(fp8.plan(model))
    if can.level == NATIVE:
        return dataclasses.replace(can, caveat="; ".join(filter(None, (swap, can.caveat))))
    return dataclasses.replace(can, reason=f"{can.reason}; {swap}")


def _fp8_refused(model) -> str | None:
    """Why fp8 cannot train ``model`` anywhere (torchao missing, no Linear layer it can swap), else None."""
    from speechperf.models import fp8

    missing = fp8.available()
    if missing:
        return missing
    if model is None:
        return None
    layers = fp8.plan(model)
    if not any(layer.swapped for layer in layers):
        why = "; ".join(f"{layer.name or 'the model'}: {layer.reason}" for layer in layers[:3]) or "it has none"
        return f"no Linear layer of this model can train in float8 ({why}): it would train in bf16"
    return None


def model_support(model_cfg, device, precision: str) -> Support:
    """:func:`support` for a model config, built on the meta device (no memory, no weights)."""
    import torch

    from speechperf.models import build_model

    with torch.device("meta"), torch.random.fork_rng(devices=[]):
        model = build_model(model_cfg)
    return support(device, precision, model)
