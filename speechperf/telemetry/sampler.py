"""Telemetry sampler: CPU utilization, GPU utilization/memory/power/energy (NVML), CPU
package/DRAM energy (RAPL powercap), on a background thread.

CPU utilization is the CPU seconds per wall second of the process and its children (loader
workers), recorded twice, labelled: ``util_machine_pct``, in % of the whole machine (0-100,
the average over all logical cores, as the paper reports it) and ``util_core_pct``, in % of
one core. Each process is read from its kernel CPU clock (nanoseconds, one syscall), and a
sample divides by the span from the start of the previous reads to the end of this one, so
no sample can exceed what the cores could do. A child found later (loader workers start
every epoch) counts from its CPU time when found; what it used before is spread over the
samples since it started, within what each had left of the machine, never landing in one
sample. A process that exits keeps what it used.

GPUs (NVML, the devices given, by NVML index): every ``gpu_interval`` one call per GPU reads
the instant power field and the total energy counter together; utilization comes from the
driver's own buffered samples (``nvmlDeviceGetSamples``, with the driver's timestamps),
drained with the memory reading every ``gpu_buffer_interval``. Where the driver lacks the
instant field, power is its buffered samples or, failing those, the averaged reading
(``power_avg_w``); the summary says which (``power_field``). Energy comes from counters
(NVML total energy, RAPL energy_uj with wrap-around); where none is readable the summary
says so, and nothing is estimated from TDP. The achieved period of every series (median
interval and count) is in ``summary()["periods"]``.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from speechperf.telemetry import energy
from speechperf.telemetry.rapl import DEFAULT_ROOT, RaplCounters

# nvml constants (pynvml's values; a fake driver may leave them out)
FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT, W x 1000
FI_TOTAL_ENERGY = 83  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ since driver load
POWER_SAMPLES, UTIL_SAMPLES = 0, 1  # NVML_TOTAL_POWER_SAMPLES, NVML_GPU_UTILIZATION_SAMPLES
ERROR_NOT_FOUND = 6  # nvmlDeviceGetSamples: no sample newer than the timestamp given
VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}  # nvmlValueType_t


@dataclass(frozen=True)
class SamplerConfig:
    interval: float = 0.03  # CPU utilization period, s (paper: top every 0.03 s)
    gpu_interval: float = 0.05  # NVML power and energy period, s (paper 002: 50 ms)
    gpu_buffer_interval: float = 0.5  # draining NVML's buffered utilization (and power) samples and memory, s
    include_children: bool = True  # count loader worker processes
    children_interval: float = 1.0  # looking for new child processes (a /proc scan, ~1.5 ms), s
    gpus: bool = True  # sample NVML devices when present
    rapl: bool = True  # read RAPL powercap counters when readable
    rapl_interval: float = 1.0  # RAPL period, s: often enough to undo every counter wrap, cheap


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the sampler started
    source: str  # "cpu", "gpu0" (NVML index), "rapl:intel-rapl:0" (package 0), "rapl:intel-rapl:0:1" (its DRAM)
    metric: str  # "util_machine_pct", "util_core_pct" (cpu); "util_pct", "mem_mb" (gpu); "power_w" (instant),
    #              "power_avg_w" (driver-averaged or buffered), "energy_j"
    value: float


class Sampler:
    """Start, run the workload, stop; ``samples`` and ``summary()`` hold the results.

    ``gpus``: NVML indices to sample (None: every GPU NVML sees), so that each process of a
    multi-GPU run can be given its own, or one process all of the node's.
    """

    def __init__(self, pid: int | None = None, config: SamplerConfig = SamplerConfig(), nvml=None,
                 rapl_root: Path = DEFAULT_ROOT, gpus: list[int] | None = None):
        self.proc = psutil.Process(pid or os.getpid())
        self.cfg = config
        self.samples: list[Sample] = []
        self.unavailable: dict[str, str] = {}
        self.cores = psutil.cpu_count(logical=True) or 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        opened = _open_nvml(nvml, self.unavailable, gpus) if config.gpus else None
        self._gpus = [_Gpu(opened[0], i, h, self.unavailable) for i, h in opened[1]] if opened else []
        self._rapl = RaplCounters(rapl_root) if config.rapl else None
        if self._rapl is not None:
            self.unavailable.update(self._rapl.unavailable)
        self._own_cpu = 0.0
        self._cpu = _CpuSeries(self.cores)

    def start(self) -> "Sampler":
        self._t0 = time.perf_counter()
        self._wall0 = time.time()  # NVML's buffered samples carry wall-clock timestamps
        if self._rapl is not None:
            self._rapl.reset()  # counters count from 0 J at start
            self._sample_rapl(0.0)
        self._reader = CpuReader(self.proc.pid)  # reads its start value now, on the caller's thread
        self._thread = threading.Thread(target=self._run, name="speechperf-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._rapl is not None:
            self._sample_rapl(time.perf_counter() - self._t0)

    def settled(self) -> int:
        """How many of the first samples are final, to be stored while sampling goes on: all
        but the CPU samples that a child process found by the next scan may still add its
        earlier CPU time to (``_spread``), and the newest CPU pair (added to the open ones just
        after it is appended)."""
        n = len(self.samples)
        if not self.cfg.include_children:
            return n
        still_open = [x[3] for x in list(self._cpu.open)]
        newest_cpu = next((i for i in range(n - 1, -1, -1) if self.samples[i].source == "cpu"), n)
        return min([n, newest_cpu - 1 if newest_cpu < n else n, *still_open])

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        thread_t0 = time.thread_time()
        cfg, reader = self.cfg, self._reader
        now = time.perf_counter()
        last_read = (self._t0, now)  # (before, after) the previous reads
        due = {"cpu": now + cfg.interval, "children": now, "gpu": now, "buffer": now, "rapl": now + cfg.rapl_interval}
        periods = {"cpu": cfg.interval, "children": cfg.children_interval, "gpu": cfg.gpu_interval,
                   "buffer": cfg.gpu_buffer_interval, "rapl": cfg.rapl_interval}
        if not cfg.include_children:
            del due["children"]
        if not self._gpus:
            del due["gpu"], due["buffer"]
        if self._rapl is None:
            del due["rapl"]
        first_scan = True
        # time.sleep, not Event.wait: half the wake-up cost (measured); stop() waits <= interval
        while not self._stop.is_set():
            wake = min(due.values())
            now = time.perf_counter()
            if wake > now:
                time.sleep(wake - now)
                continue
            for task in [k for k, v in due.items() if v <= now]:
                # deadlines, not "now + period": a tick late by the loop's own work does not
                # push every later tick back (the 50 ms NVML period had become ~73 ms)
                due[task] += periods[task]
                if due[task] <= now:  # fell behind by more than a period: skip, do not burst
                    due[task] = now + periods[task]
                if task == "cpu":
                    before = time.perf_counter()
                    cpu = reader.seconds()
                    after = time.perf_counter()
                    self._cpu_sample(last_read, (before, after), cpu)
                    last_read = (before, after)
                elif task == "children":
                    for pid, used in reader.follow(self._children(), baseline=first_scan):
                        # started after the previous scan (else that scan would have found it)
                        started = _started(pid, self._t0)
                        self._spread(used, max(started, self._cpu.scan_t) if started is not None else self._cpu.scan_t)
                    self._cpu.new_scan(time.perf_counter() - self._t0)
                    first_scan = False
                elif task == "gpu":
                    t = time.perf_counter() - self._t0
                    for g in list(self._gpus):
                        self._guard(g, g.tick, t)
                elif task == "buffer":
                    self._drain_gpus()
                elif task == "rapl":
                    self._sample_rapl(now - self._t0)
        # one last read: the CPU time since the previous sample (a stretch in which this thread
        # was starved of the GIL by a busy Python thread, say) is not lost at stop
        before = time.perf_counter()
        cpu = reader.seconds()
        self._cpu_sample(last_read, (before, time.perf_counter()), cpu)
        if self._gpus:
            self._drain_gpus()
        reader.close()
        self._own_cpu = time.thread_time() - thread_t0

    def _cpu_sample(self, last: tuple[float, float], this: tuple[float, float], cpu: float) -> None:
        """One CPU sample: the CPU seconds since the previous reads over the span from the start
        of those reads to the end of these (every read lies inside it: an upper bound)."""
        t = this[1] - self._t0
        span = this[1] - last[0]
        used = max(cpu - self._cpu.total_read, 0.0)
        self._cpu.total_read = cpu
        # The kernel's CPU clocks and perf_counter need not tick at one rate: on this project's
        # VM, busy processes gained 3.1-3.2% more CPU time than the cores had wall time (every
        # such sample 103.1-103.2%, steadily). What exceeds the cores x span is no utilization
        # a machine can have: it is counted apart (cpu_seconds_over_wall), never plotted.
        over = max(used - self.cores * span, 0.0)
        self._cpu.over_wall += over
        used -= over
        i = len(self.samples)
        self.samples.append(Sample(t, "cpu", "util_machine_pct", 100.0 * used / span / self.cores))
        self.samples.append(Sample(t, "cpu", "util_core_pct", 100.0 * used / span))
        self._cpu.add(last[0] - self._t0, t, used, i)

    def _spread(self, seconds: float, since: float) -> None:
        """Place ``seconds`` of CPU time a newly found process used since ``since`` (sampler
        time) into the samples of that stretch, in proportion to their overlap with it and
        never past a full machine; what does not fit is counted as unplaced."""
        placed = self._cpu.spread(seconds, since)
        for i, span, used in placed:
            t = self.samples[i].t
            self.samples[i] = Sample(t, "cpu", "util_machine_pct", 100.0 * used / span / self.cores)
            self.samples[i + 1] = Sample(t, "cpu", "util_core_pct", 100.0 * used / span)

    def _children(self) -> list[int]:
        try:
            return [c.pid for c in self.proc.children(recursive=True)]
        except psutil.Error:
            return []

    def _drain_gpus(self) -> None:
        for g in list(self._gpus):
            self._guard(g, g.drain, time.perf_counter() - self._t0, self._wall0)

    def _guard(self, g: "_Gpu", call, *args) -> None:
        """Samples of one NVML call; a GPU whose call fails (device lost, driver gone) stops
        being sampled, with the reason, instead of ending the sampler's thread."""
        try:
            self.samples.extend(call(*args))
        except Exception as e:
            self.unavailable[g.source] = f"NVML stopped answering ({type(e).__name__}: {e}); sampling stopped"
            self._gpus.remove(g)

    def _sample_rapl(self, t: float) -> None:
        for source, joules in self._rapl.read().items():
            self.samples.append(Sample(t, source, "energy_j", joules))
        self.unavailable.update(self._rapl.unavailable)

    def summary(self) -> dict:
        """Means and energies per source; 'energy_method' says counter or integrated power;
        'periods' the achieved period of each series."""
        by: dict[tuple[str, str], list[Sample]] = {}
        for s in self.samples:
            by.setdefault((s.source, s.metric), []).append(s)
        machine, core = by.get(("cpu", "util_machine_pct")), by.get(("cpu", "util_core_pct"))
        out = {"cpu_util_machine_pct_mean": _mean(machine) if machine else None,
               "cpu_util_core_pct_mean": _mean(core) if core else None, "cores": self.cores,
               "cpu_seconds": self._cpu.placed + self._cpu.unplaced + self._cpu.over_wall,
               "cpu_seconds_unplaced": self._cpu.unplaced, "cpu_seconds_over_wall": self._cpu.over_wall,
               "gpus": {}, "power_w": {}, "energy_j": {}, "energy_method": {}, "unavailable": dict(self.unavailable),
               "sampler_cpu_s": self._own_cpu, "samples": len(self.samples),
               "periods": achieved_periods(self.samples, self.asked_periods()),
               "rapl_names": self._rapl.names() if self._rapl is not None else {}}
        for src, (joules, method) in energy.by_source(self.samples).items():  # counter, else integrated power
            out["energy_j"][src], out["energy_method"][src] = joules, method
        for (src, metric), xs in by.items():
            if metric in energy.POWER_METRICS:
                out["power_w"][src] = _mean(xs)
            elif metric == "energy_j" and src.startswith("rapl:") and xs[-1].t > xs[0].t:
                out["power_w"][src] = out["energy_j"][src] / (xs[-1].t - xs[0].t)
        for g in self._gpus:
            out["gpus"][g.source] = _gpu_summary(by, g)
        return out

    def asked_periods(self) -> dict[str, float | None]:
        """The period asked of each series ("source:metric"); None: the driver's own rate."""
        asked: dict[str, float | None] = {"cpu:util_machine_pct": self.cfg.interval,
                                          "cpu:util_core_pct": self.cfg.interval}
        for g in self._gpus:
            asked.update(g.asked(self.cfg))
        return asked


def achieved_periods(samples, asked: dict[str, float | None] | None = None) -> dict[str, dict]:
    """{"source:metric": {"asked_s", "median_s", "count"}} from Samples or sample dicts: the
    median interval between consecutive samples of each series (RAPL's counters excluded:
    they are read as often as needed to undo wraps, not sampled)."""
    times: dict[str, list[float]] = {}
    for s in samples:
        src, metric, t = (s.source, s.metric, s.t) if isinstance(s, Sample) else (s["source"], s["metric"], s["t"])
        if not src.startswith("rapl:"):
            times.setdefault(f"{src}:{metric}", []).append(t)
    out = {}
    for key, ts in sorted(times.items()):
        ts.sort()
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        out[key] = {"asked_s": (asked or {}).get(key), "median_s": statistics.median(gaps) if gaps else None,
                    "count": len(ts)}
    return out


def _mean(xs: list[Sample]) -> float:
    return sum(x.value for x in xs) / len(xs)


def _gpu_summary(by: dict, g: "_Gpu") -> dict:
    """Mean utilization, peak memory and which power reading one GPU had."""
    util, mem = by.get((g.source, "util_pct")), by.get((g.source, "mem_mb"))
    return {"util_mean": _mean(util) if util else None, "mem_mb_max": max(x.value for x in mem) if mem else None,
            "power_field": g.power_field() if (g.source, "power_w") in by or (g.source, "power_avg_w") in by else None,
            "util_field": g.util_field() if util else None}


def availability(nvml=None, rapl_root: Path = DEFAULT_ROOT) -> dict:
    """What the sampler can measure on this machine: {"gpus": n, "rapl_zones": {...}, "unavailable": {...}}.

    Recorded in every run's environment, so a report can say why power or energy is missing.
    """
    unavailable: dict[str, str] = {}
    opened = _open_nvml(nvml, unavailable)
    rapl = RaplCounters(rapl_root)
    unavailable.update(rapl.unavailable)
    return {"gpus": len(opened[1]) if opened else 0, "rapl_zones": rapl.names(), "unavailable": unavailable}


def _open_nvml(nvml, unavailable: dict, indices: list[int] | None = None):
    """(nvml module, [(index, handle), ...]) or None, with the reason in ``unavailable``."""
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
    return nvml, handles


def _nvml_code(e: Exception) -> int | None:
    return getattr(e, "value", None)


def _sample_value(kind: int, v) -> float:
    """A c_nvmlValue_t of NVML value type ``kind`` as a float."""
    return float(getattr(v, VALUE_FIELDS.get(kind, "uiVal")))


class _Gpu:
    """One NVML device: which of its readings exist (found on first use) and its sample cursors."""

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

    def asked(self, cfg: SamplerConfig) -> dict[str, float | None]:
        s = self.source
        out = {f"{s}:mem_mb": cfg.gpu_buffer_interval, f"{s}:util_pct": None if self.buffered[UTIL_SAMPLES]
               else cfg.gpu_interval}
        out[f"{s}:power_w" if self.instant else f"{s}:power_avg_w"] = (
            None if not self.instant and self.buffered[POWER_SAMPLES] else cfg.gpu_interval)
        if self.energy_field or self.energy_call:
            out[f"{s}:energy_j"] = cfg.gpu_interval
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
                        out.append(Sample(t, self.source, "power_w", _sample_value(getattr(v, "valueType", 1), v.value) / 1000.0))
                    else:
                        self.instant = False
                elif ok:
                    out.append(Sample(t, self.source, "energy_j", _sample_value(getattr(v, "valueType", 3), v.value) / 1000.0))
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


def _started(pid: int, t0: float) -> float | None:
    """When ``pid`` started, in seconds since ``t0`` on the perf_counter clock, from its
    start in clock ticks since boot (/proc/PID/stat field 22) against CLOCK_BOOTTIME:
    10 ms resolution (psutil's create_time rounds boot time to whole seconds)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        ticks = int(raw[raw.rindex(b")") + 2:].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.perf_counter() - age - t0
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _CpuSeries:
    """The CPU samples since the last scan for children, kept so that a child found by the
    next scan can have its earlier CPU time placed in them."""

    def __init__(self, cores: int):
        self.cores = cores
        self.total_read = 0.0  # CPU seconds the reader returned last
        self.open: list[list] = []  # [start, end, CPU seconds, index of the util_machine_pct sample]
        self.scan_t = 0.0  # sampler time of the last scan
        self.placed = 0.0  # CPU seconds in samples
        self.unplaced = 0.0  # CPU seconds of found processes that no sample had room for
        self.over_wall = 0.0  # CPU seconds the CPU clocks counted beyond cores x wall time

    def add(self, start: float, end: float, used: float, index: int) -> None:
        self.open.append([start, end, used, index])
        self.placed += used

    def new_scan(self, t: float) -> None:
        """Samples ending before the previous scan cannot receive anything any more."""
        self.open = [x for x in self.open if x[1] > self.scan_t]
        self.scan_t = t

    def spread(self, seconds: float, since: float) -> list[tuple[int, float, float]]:
        """Water-fill ``seconds`` into the open samples overlapping [since, now] by overlap,
        capped at a full machine each: [(index, span, new CPU seconds)] of those changed."""
        if seconds <= 0:
            return []
        room = {}
        weight = {}
        for k, (a, b, used, _) in enumerate(self.open):
            overlap = b - max(a, since)
            if overlap > 0:
                weight[k], room[k] = overlap, max(self.cores * (b - a) - used, 0.0)
        left = seconds
        active = {k for k in weight if room[k] > 0}
        give = dict.fromkeys(weight, 0.0)
        while left > 1e-12 and active:
            share = left / sum(weight[k] for k in active)
            for k in list(active):
                g = min(room[k] - give[k], share * weight[k])
                give[k] += g
                left -= g
                if room[k] - give[k] <= 1e-12:
                    active.discard(k)
        self.unplaced += max(left, 0.0)
        changed = []
        for k, g in give.items():
            if g > 0:
                self.open[k][2] += g
                self.placed += g
                a, b, used, index = self.open[k]
                changed.append((index, b - a, used))
        return changed


class CpuReader:
    """CPU seconds (user + system) of a process and its followed children, each counted from
    when it was first read.

    Reads each process's kernel CPU clock (``clock_getcpuclockid``: nanoseconds, ~0.6 us a
    read); where that is missing, ``/proc/PID/stat`` through a kept descriptor (ticks of
    10 ms), else psutil.
    """

    def __init__(self, pid: int):
        self.root = pid
        self.readers: dict[int, object] = {}
        self.base: dict[int, float] = {}  # CPU seconds when first read
        self.last: dict[int, float] = {}
        self.gone = 0.0  # CPU seconds of followed processes that exited (kept: no drop in the total)
        self._open(pid)

    def _open(self, pid: int) -> float | None:
        """Start following ``pid``; its CPU seconds now (None: already gone)."""
        reader = _clock_reader(pid) or _StatReader(pid)
        value = reader.read()
        if value is None:
            reader.close()
            return None
        self.readers[pid], self.base[pid], self.last[pid] = reader, value, value
        return value

    def follow(self, pids: list[int], baseline: bool = False) -> list[tuple[int, float]]:
        """Follow the new ones among ``pids``: [(pid, CPU seconds it used before now)], for
        the caller to place. ``baseline``: processes already running when the sampler
        started, whose past is not the sampler's to place (returned as [])."""
        found = []
        for pid in pids:
            if pid in self.readers:
                continue
            value = self._open(pid)
            if value is not None and not baseline:
                found.append((pid, value))
        return found

    def seconds(self) -> float:
        total = self.gone
        for pid, reader in list(self.readers.items()):
            value = reader.read()
            if value is not None and value < self.last[pid] - 1e-6:
                value = None  # pid reused by another process (its clock restarted): the one followed is gone
            if value is None:  # exited: keep what it used, stop following it
                if pid != self.root:
                    self.gone += self.last[pid] - self.base[pid]
                    total += self.last[pid] - self.base[pid]
                    reader.close()
                    del self.readers[pid]
                continue
            self.last[pid] = value
            total += value - self.base[pid]
        return total

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()


_libc = None


def _clock_reader(pid: int):
    """A reader of ``pid``'s CPU clock, or None where the C library has no clock_getcpuclockid."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        clock = ctypes.c_int()
        if _libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return _ClockReader(clock.value)


class _ClockReader:
    def __init__(self, clock: int):
        self.clock = clock

    def read(self) -> float | None:
        try:
            return time.clock_gettime(self.clock)  # a zombie still reads; EINVAL once reaped
        except OSError:
            return None

    def close(self) -> None:
        pass


class _StatReader:
    """utime + stime from /proc/PID/stat through a kept descriptor; psutil without /proc."""

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self, pid: int):
        self.pid = pid
        try:
            self.fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:
            self.fd = -1

    def read(self) -> float | None:
        if self.fd < 0:
            try:
                c = psutil.Process(self.pid).cpu_times()
                return c.user + c.system
            except psutil.Error:
                return None
        try:
            raw = os.pread(self.fd, 1024, 0)
        except OSError:
            return None
        fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (comm) ": state is field 0
        if not fields:
            return None
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
