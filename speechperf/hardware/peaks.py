"""Theoretical peak FLOPS of accelerators (vendor figures) and of this CPU (derived).

GPU figures are dense (no structured sparsity) TFLOPS per precision with their source;
``tf32``/``fp16``/``bf16`` on tensor cores where the device has them. The GPUs people rent
and buy today have theirs in their platform profile (``peak_tflops_<dtype>`` in
``config/platforms/``), looked up first by the exact device name; the table here holds the
papers' older GPUs that no profile describes. A CPU's peak is
cores x clock x FLOPs per cycle of its vector FMA units, labelled "derived": it is an
upper bound the hardware may never reach (turbo and AVX clocks differ); the ops benchmark
also reports the best rate it measured, labelled "measured".
"""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.hardware.capability import cpu_flags

# name -> ({dtype: TFLOPS}, source)
DEVICE_PEAKS: dict[str, tuple[dict[str, float], str]] = {
    "V100": ({"fp32": 14.13, "fp16": 112.0}, "paper 002 Tables 2-3 (Tesla V100 PCIe; fp16 on Tensor Cores)"),
    "P100": ({"fp32": 9.526, "fp16": 19.05}, "paper 002 Table 2"),
    "TITAN X": ({"fp32": 10.97}, "paper 002 Table 2 (Titan X Pascal)"),
    "Radeon VII": ({"fp32": 13.44, "fp16": 26.88}, "paper 002 Table 2"),
    "RTX 2070": ({"fp32": 7.46, "fp16": 59.7}, "NVIDIA Turing architecture whitepaper (reference clocks)"),
    "1080 Ti": ({"fp32": 11.34, "fp16": 0.177}, "NVIDIA GTX 1080 Ti specification (fp16 at 1/64 rate)"),
}


@dataclass(frozen=True)
class Peak:
    tflops: float | None  # None: unknown for this device and dtype
    source: str  # where the figure comes from, or why there is none


def gpu_peak(device_name: str, dtype: str) -> Peak:
    """The platform profile naming the device (e.g. 'NVIDIA H100 80GB HBM3') first, else the
    table here by a substring of its name (e.g. 'Tesla V100-SXM2-16GB')."""
    from speechperf.hardware.platforms import gpu_peak_tflops

    found = gpu_peak_tflops(device_name, dtype)
    if found is not None:
        return Peak(*found)
    for key, (peaks, source) in DEVICE_PEAKS.items():
        if key.lower() in device_name.lower():
            if dtype in peaks:
                return Peak(peaks[dtype], source)
            return Peak(None, f"{key}: no {dtype} figure in the table")
    return Peak(None, f"{device_name!r} is not in the peak table")


# AMX's tile multiply (TMUL) on a Sapphire Rapids core: 1024 bf16 operations per cycle (Intel's
# figure: "2048 INT8 / 1024 BF16 operations per cycle per core", Intel AMX overview, 2023)
AMX_BF16_FLOPS_PER_CYCLE = 1024


def bf16_unit(flags: frozenset[str]) -> str | None:
    """What multiplies bf16 natively on this CPU: "AMX-BF16", "AVX512-BF16", or None (emulated)."""
    return "AMX-BF16" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else None


def flops_per_cycle(flags: frozenset[str], dtype: str = "fp32") -> int:
    """fp32 FLOPs per cycle per core, assuming two FMA pipes (an FMA is 2 FLOPs per lane)."""
    if "avx512f" in flags:
        lanes = 16
    elif "avx2" in flags and "fma" in flags:
        lanes = 8
    elif "avx" in flags:
        return 16  # 8 lanes, separate add and multiply pipes
    else:
        return 8  # SSE: 4 lanes, add + multiply
    per = 2 * lanes * 2
    if dtype == "bf16" and "amx_bf16" in flags:
        return AMX_BF16_FLOPS_PER_CYCLE
    if dtype == "bf16" and "avx512_bf16" in flags:
        per *= 2  # VDPBF16PS: two bf16 products per fp32 lane
    return per


def cpu_peak(cores: int, ghz: float, flags: frozenset[str] | None = None, dtype: str = "fp32") -> Peak:
    flags = cpu_flags() if flags is None else flags
    if dtype in ("tf32",):
        return Peak(None, "tf32 is a GPU tensor-core mode")
    fpc = flops_per_cycle(flags, dtype)
    isa = ("AVX-512" if "avx512f" in flags else "AVX2+FMA" if {"avx2", "fma"} <= flags
           else "AVX" if "avx" in flags else "SSE")
    pipes = "AMX tile multiply" if dtype == "bf16" and "amx_bf16" in flags else "2 FMA pipes"
    if dtype == "bf16":
        isa = f"bf16 on {bf16_unit(flags) or f'{isa} (no native bf16: emulated)'}"
    return Peak(cores * ghz * fpc / 1000.0,
                f"derived: {cores} cores x {ghz:.2f} GHz x {fpc} FLOP/cycle ({isa}, {pipes})")
