"""A GPU as the sampler reads it through NVML: every period one call reads the instant power
field and the total energy counter together; utilization comes from the driver's own buffered
samples (``nvmlDeviceGetSamples``, with the driver's timestamps), drained with the memory
reading. Where the driver lacks the instant field, power is its buffered samples or, failing
those, the averaged reading (``power_avg_w``); ``power_field`` says which. Which readings a
device has is found on first use."""
from __future__ import annotations

import time

from speechperf.telemetry.device_gpus import RunGpu, pick_runs
from speechperf.telemetry.sample import Sample

# nvml constants (pynvml's values; a fake driver may leave them out)
FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT, W x 1000
FI_TOTAL_ENERGY = 83  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ since driver load
POWER_SAMPLES, UTIL_SAMPLES = 0, 1  # NVML_TOTAL_POWER_SAMPLES, NVML_GPU_UTILIZATION_SAMPLES
ERROR_NOT_FOUND = 6  # nvmlDeviceGetSamples: no sample newer than the timestamp given
VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}  # nvmlValueType_t


def open_nvml(nvml, unavailable: dict, indices: list[int] | None = None, run_gpus: list[RunGpu] | None = None):
    """(nvml module, [(index, handle), ...]) or None, with the reason in ``unavailable``.
    ``run_gpus``: only these GPUs, by UUID (the run's, telemetry/device_gpus.py); where one is
    not found, every GPU and why, in ``unavailable["gpu_selection"]``."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        wanted = list(range(count)) if indices is None else list(indices)
        missing = [i for i in wanted if not 0 <= i < count]
        if missing:
            unavailable["gpu"] = f"NVML has {count} GPU(s); asked for index(es) {missing}"
            return None
        handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in wanted]
    except Exception as e:  # no driver, no library, no device
        unavailable["gpu"] = f"NVML unavailable ({type(e).__name__}: {e})"
        return None
    if not handles:
        unavailable["gpu"] = "NVML found no GPU"
        return None
    return nvml, handles if run_gpus is None else _the_runs(nvml, handles, run_gpus, unavailable)


def _the_runs(nvml, handles: list, run_gpus: list[RunGpu], unavailable: dict) -> list:
    """The handles of ``run_gpus``' UUIDs. A process sees only the GPUs CUDA_VISIBLE_DEVICES
    leaves it, under its own numbering, while NVML sees the node's: the UUID is the name both share."""
    want = None if any(g.uuid is None for g in run_gpus) else {bare_uuid(g.uuid) for g in run_gpus}
    return pick_runs(handles, want, lambda h: bare_uuid(nvml.nvmlDeviceGetUUID(h)), "NVML", ("UUID", "UUID"),
                     unavailable)


def bare_uuid(uuid) -> str:
    """A GPU's UUID as torch and NVML both can give it: NVML's ``GPU-`` prefix (and bytes, from an
    old pynvml) taken off, lower case."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return text.lower().removeprefix("gpu-")


def _nvml_code(e: Exception) -> int | None:
    return getattr(e, "value", None)


def _sample_value(kind: int, v) -> float:
    """A c_nvmlValue_t of NVML value type ``kind`` as a float."""
    return float(getattr(v, VALUE_FIELDS.get(kind, "uiVal")))


class NvmlGpu:
    """One NVML device: which of its readings exist (found on first use) and its sample cursors."""

    library = "NVML"

    def __init__(self, nv, index: int, handle, unavailable: dict):
        self.nv, self.index, self.h, self.unavailable = nv, index, handle, unavailable
        self.source = f"gpu{index}"
        self.instant = self.energy_field = True  # until the driver says otherwise
        self.energy_call = False  # nvmlDeviceGetTotalEnergyConsumption where the field is missing
        self.fields_answered = False  # nvmlDeviceGetFieldValues has worked once
        self.buffered = {UTIL_SAMPLES: True, POWER_SAMPLES: True}
        self.seen = {UTIL_SAMPLES: 0, POWER_SAMPLES: 0}  # last driver timestamp drained, us
        self.offset: float | None = None  # wall clock - driver clock, s (0 when the driver's is the wall clock)

    def power_field(self) -> str:
        return "instant" if self.instant else "buffered" if self.buffered[POWER_SAMPLES] else "average"

    def util_field(self) -> str:
        return "buffered" if self.buffered[UTIL_SAMPLES] else "polled"

    def asked(self, interval: float, buffer_interval: float) -> dict[str, float | None]:
        """The period asked of each of its series ("source:metric"), given the sampler's period
        of the polled readings and of the buffer drains; None: the driver's own rate."""
        s = self.source
        out = {f"{s}:mem_mb": buffer_interval, f"{s}:util_pct": None if self.buffered[UTIL_SAMPLES] else interval}
        out[f"{s}:power_w" if self.instant else f"{s}:power_avg_w"] = (
            None if not self.instant and self.buffered[POWER_SAMPLES] else interval)
        if self.energy_field or self.energy_call:
            out[f"{s}:energy_j"] = interval
        return out

    def tick(self, t: float) -> list[Sample]:
        """The per-period readings: one nvmlDeviceGetFieldValues call where the driver has the
        instant power field and the energy counter; the polled fallbacks where it has not."""
        nv, out = self.nv, []
        fields = ([FI_POWER_INSTANT] if self.instant else []) + ([FI_TOTAL_ENERGY] if self.energy_field else [])
        if fields:
            try:
                values = nv.nvmlDeviceGetFieldValues(self.h, fields)
                self.fields_answered = True
            except Exception:
                if self.fields_answered:  # it worked before: the device is in trouble, not the driver lacking it
                    raise
                values = [None] * len(fields)  # the call itself is missing: neither field
            for field, v in zip(fields, values):
                ok = v is not None and getattr(v, "nvmlReturn", 0) == 0
                if field == FI_POWER_INSTANT:
                    if ok:
                        watts = _sample_value(getattr(v, "valueType", 1), v.value) / 1000.0  # NVML: milliwatts
                        out.append(Sample(t, self.source, "power_w", watts))
                    else:
                        self.instant = False
                elif ok:
                    joules = _sample_value(getattr(v, "valueType", 3), v.value) / 1000.0  # NVML: millijoules
                    out.append(Sample(t, self.source, "energy_j", joules))
                else:
                    self.energy_field = False
                    self.energy_call = self._energy_call(t, out)
        elif self.energy_call:
            self._energy_call(t, out)
        if not self.instant and not self.buffered[POWER_SAMPLES]:
            out.append(Sample(t, self.source, "power_avg_w", nv.nvmlDeviceGetPowerUsage(self.h) / 1000.0))
        if not self.buffered[UTIL_SAMPLES]:
            out.append(Sample(t, self.source, "util_pct", float(nv.nvmlDeviceGetUtilizationRates(self.h).gpu)))
        return out

    def _energy_call(self, t: float, out: list) -> bool:
        try:
            out.append(Sample(t, self.source, "energy_j", self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h) / 1000.0))
            return True
        except Exception:  # NVMLError_NotSupported on older boards
            self.unavailable.setdefault(f"{self.source}:energy", "driver has no total-energy counter")
            return False

    def finish(self) -> list[Sample]:
        """At stop: nothing held back (the last drain has read the buffers)."""
        return []

    def drain(self, t: float, wall0: float) -> list[Sample]:
        """Memory now, and the driver's buffered utilization (and, without the instant field,
        power) samples since the last drain, at their own timestamps."""
        out = [Sample(t, self.source, "mem_mb", self.nv.nvmlDeviceGetMemoryInfo(self.h).used / 2**20)]
        kinds = [UTIL_SAMPLES] + ([POWER_SAMPLES] if not self.instant else [])
        for kind in kinds:
            if not self.buffered[kind]:
                continue
            metric, scale = ("util_pct", 1.0) if kind == UTIL_SAMPLES else ("power_avg_w", 1e-3)
            try:
                vtype, samples = self.nv.nvmlDeviceGetSamples(self.h, kind, self.seen[kind])
            except Exception as e:
                if _nvml_code(e) != ERROR_NOT_FOUND:  # not found: nothing new; anything else: not supported
                    self.buffered[kind] = False
                continue
            if samples and self.offset is None:
                # NVML stamps samples in us of the wall clock; should a driver use another
                # clock, its newest sample is taken as now (off by at most one driver period)
                newest = max(s.timeStamp for s in samples) / 1e6
                self.offset = 0.0 if abs(time.time() - newest) < 60 else time.time() - newest
            for s in samples:
                if s.timeStamp > self.seen[kind]:
                    t = s.timeStamp / 1e6 + self.offset - wall0
                    if t >= 0:  # the buffer holds samples from before the sampler started
                        out.append(Sample(t, self.source, metric, _sample_value(vtype, s.sampleValue) * scale))
            self.seen[kind] = max([self.seen[kind]] + [s.timeStamp for s in samples])
        return out
