"""The one interface the sampler reads a GPU through, whichever vendor's library answers:
NVML (telemetry/nvml_gpu.py) for NVIDIA GPUs, amdsmi (telemetry/amd_gpu.py) for AMD Instinct
GPUs under ROCm (whose torch build runs the ``cuda`` device API). Both give the same series
(``power_w`` or ``power_avg_w``, ``energy_j``, ``util_pct``, ``mem_mb``) under the same source
names (``gpu0``, ...), so the tables, energy to accuracy, the GPU busy share and the report's
power trace read either alike."""
from __future__ import annotations

from typing import Protocol

from speechperf.telemetry.amd_gpu import AmdGpu, open_amdsmi
from speechperf.telemetry.device_gpus import RunGpu
from speechperf.telemetry.nvml_gpu import NvmlGpu, open_nvml
from speechperf.telemetry.sample import Sample


class GpuReader(Protocol):
    """What the sampler asks of one GPU."""

    source: str  # "gpu0": the vendor library's index
    library: str  # "NVML", "amdsmi"

    def asked(self, interval: float, buffer_interval: float) -> dict[str, float | None]:
        """The period asked of each of its series ("source:metric"); None: the driver's own rate."""

    def tick(self, t: float) -> list[Sample]:
        """The readings of every ``gpu_interval``: power, energy, polled utilization."""

    def drain(self, t: float, wall0: float) -> list[Sample]:
        """The readings of every ``gpu_buffer_interval``: memory, buffered samples."""

    def finish(self) -> list[Sample]:
        """At stop: readings held back until now."""

    def power_field(self) -> str:
        """Which power reading it has: "instant", "buffered" or "average"."""

    def util_field(self) -> str:
        """How utilization is read: "buffered" or "polled"."""


def open_gpus(unavailable: dict, indices: list[int] | None = None, nvml=None, amdsmi=None,
              run_gpus: list[RunGpu] | None = None) -> list[GpuReader]:
    """The readers of the GPUs ``indices`` (None: every GPU) of the first library that finds
    any: NVML, then amdsmi (a machine has one vendor's GPUs; trying NVML first keeps NVIDIA
    machines as they were). None found: [] and, in ``unavailable["gpu"]``, why not in each.
    ``run_gpus``: the run's GPUs, picked by UUID from NVML's and by PCI address from amdsmi's;
    one not found: every GPU, and why in ``unavailable["gpu_selection"]``."""
    reasons = []
    for opener, reader, lib in ((open_nvml, NvmlGpu, nvml), (open_amdsmi, AmdGpu, amdsmi)):
        why: dict[str, str] = {}
        opened = opener(lib, why, indices, run_gpus)
        if opened:
            unavailable.update({k: v for k, v in why.items() if k != "gpu"})
            return [reader(opened[0], i, h, unavailable) for i, h in opened[1]]
        reasons.append(why["gpu"])
    unavailable["gpu"] = "; ".join(reasons)
    return []
