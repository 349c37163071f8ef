"""Telemetry sampler: CPU utilization, GPU utilization/memory/power/energy (NVML, or amdsmi on
AMD GPUs), CPU package/DRAM energy (RAPL powercap), on a background thread.

CPU utilization is the CPU seconds per wall second of the process and its children (loader
workers), recorded twice, labelled: ``util_machine_pct``, in % of the whole machine (0-100,
the average over all logical cores, as the paper reports it) and ``util_core_pct``, in % of
one core. Each process is read from its kernel CPU clock (nanoseconds, one syscall), and a
sample divides by the span from the start of the previous reads to the end of this one, so
no sample can exceed what the cores could do. A child found later (loader workers start
every epoch) counts from its CPU time when found; what it used before is spread over the
samples since it started, within what each had left of the machine, never landing in one
sample. A process that exits keeps what it used. With each scan for children (every
``children_interval``) it records ``others_pct``: the share of the machine's CPUs that other
processes used since the previous scan (telemetry/contention.py says when that made a shared
machine).

GPUs (NVML, the devices given, by NVML index): every ``gpu_interval`` one call per GPU reads
the instant power field and the total energy counter together; utilization comes from the
driver's own buffered samples (``nvmlDeviceGetSamples``, with the driver's timestamps),
drained with the memory reading every ``gpu_buffer_interval``. Where the driver lacks the
instant field, power is its buffered samples or, failing those, the averaged reading
(``power_avg_w``); the summary says which (``power_field``). AMD GPUs (amdsmi, where NVML
finds none) are polled at the same periods: power, energy counter and utilization every
``gpu_interval``, memory every ``gpu_buffer_interval`` (telemetry/amd_gpu.py). The CPU clocks
are read by telemetry/cpu_clock.py, the GPUs through telemetry/gpu_reader.py's one interface.
Energy comes from counters (NVML total energy; amdsmi's energy accumulator and RAPL energy_uj,
each with its wraps undone); where none is readable the summary
says so, and nothing is estimated from TDP. The achieved period of every series (median
interval and count) is in ``summary()["periods"]``.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from speechperf.telemetry import contention, energy
from speechperf.telemetry.cpu_clock import CpuReader, CpuSeries, process_start
from speechperf.telemetry.device_gpus import RunGpu
from speechperf.telemetry.gpu_reader import GpuReader, open_gpus
from speechperf.telemetry.rapl import DEFAULT_ROOT, RaplCounters
from speechperf.telemetry.sample import Sample, achieved_periods


MIN_OTHERS_SPAN_S = 0.1  # the last others' share at stop, over at least this span (a shorter one is noise)


@dataclass(frozen=True)
class SamplerConfig:
    interval: float = 0.03  # CPU utilization period, s (paper: top every 0.03 s)
    gpu_interval: float = 0.05  # GPU power and energy period (NVML, amdsmi), s (paper 002: 50 ms)
    gpu_buffer_interval: float = 0.5  # draining NVML's buffered utilization (and power) samples and memory, s
    include_children: bool = True  # count loader worker processes
    children_interval: float = 1.0  # looking for new child processes (a /proc scan, ~1.5 ms) and the others' share, s
    gpus: bool = True  # sample GPUs (NVML, else amdsmi) when present
    rapl: bool = True  # read RAPL powercap counters when readable
    rapl_interval: float = 1.0  # RAPL period, s: often enough to undo every counter wrap, cheap


class Sampler:
    """Start, run the workload, stop; ``samples`` and ``summary()`` hold the results.

    ``gpus``: GPU indices to sample (NVML's, or amdsmi's HIP indices; None: every GPU the library
    sees), so that each process of a multi-GPU run can be given its own, or one process all of
    the node's; ``run_gpus``: the GPUs the run uses, by UUID and PCI address (telemetry/device_gpus.py:
    a process's CUDA numbering is not the library's). ``nvml``/``amdsmi``: stand-ins for the libraries
    (tests); None imports them.
    """

    def __init__(self, pid: int | None = None, config: SamplerConfig = SamplerConfig(), nvml=None,
                 rapl_root: Path = DEFAULT_ROOT, gpus: list[int] | None = None, amdsmi=None,
                 run_gpus: list[RunGpu] | None = None):
        self.proc = psutil.Process(pid or os.getpid())
        self.cfg = config
        self.samples: list[Sample] = []
        self.unavailable: dict[str, str] = {}
        self.cores = psutil.cpu_count(logical=True) or 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpus: list[GpuReader] = (open_gpus(self.unavailable, gpus, nvml, amdsmi, run_gpus) if config.gpus
                                       else [])
        self.gpu_sources = [g.source for g in self._gpus]  # the GPUs it reads ("gpu0": the library's index)
        self._rapl = RaplCounters(rapl_root) if config.rapl else None
        if self._rapl is not None:
            self.unavailable.update(self._rapl.unavailable)
        self._own_cpu = 0.0
        self._cpu = CpuSeries(self.cores)
        self._found_s = 0.0  # CPU seconds children used before a scan found them (the others' share leaves them out)
        self._others_last = (0.0, 0.0, 0.0)  # (perf_counter, machine busy s, own s) at the previous scan
        self._flush_asked: threading.Event | None = None  # flush(): set by the sampler thread once done
        self._flushed = 0  # how many samples the last flush made final

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

    def flush(self, timeout: float = 1.0) -> int:
        """Make every sample so far final now and return their count (:meth:`settled` when the
        sampler is not running or does not answer within ``timeout``): the sampler thread reads the
        CPU, scans for child processes (placing a new one's CPU time in the samples it overlaps)
        and drains the GPUs' buffers at once, instead of the up to 1-2 s of samples that
        :meth:`settled` leaves open. A run's checkpoint stores its samples so, up to its moment."""
        if self._thread is None or not self._thread.is_alive():
            return self.settled()
        asked = threading.Event()
        self._flush_asked = asked
        return self._flushed if asked.wait(timeout) else self.settled()

    def _flush(self, reader, last_read: tuple[float, float], first_scan: bool) -> tuple[float, float]:
        """On the sampler thread: what :meth:`flush` asks; returns the new CPU read's span."""
        last_read = self._read_cpu(reader, last_read)
        self._scan_children(reader, first_scan)
        if self._gpus:
            self._drain_gpus()
        self._flushed = len(self.samples)
        asked, self._flush_asked = self._flush_asked, None
        asked.set()
        return last_read

    def _read_cpu(self, reader, last_read: tuple[float, float]) -> tuple[float, float]:
        before = time.perf_counter()
        cpu = reader.seconds()
        after = time.perf_counter()
        self._cpu_sample(last_read, (before, after), cpu)
        return before, after

    def _scan_children(self, reader, first_scan: bool) -> None:
        """The scan for child processes (where children count), then the others' share."""
        found = 0.0
        followed = reader.follow(_children(self.proc), baseline=first_scan) if self.cfg.include_children else []
        for pid, used in followed:
            # started after the previous scan (else that scan would have found it)
            started = process_start(pid, self._t0)
            self._spread(used, max(started, self._cpu.scan_t) if started is not None else self._cpu.scan_t)
            found += used
        self._cpu.new_scan(time.perf_counter() - self._t0)
        self._others_sample(reader, found, first_scan, time.perf_counter())

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        thread_t0 = time.thread_time()
        reader = self._reader
        due, periods = _schedule(self.cfg, bool(self._gpus), self._rapl is not None)
        last_read = (self._t0, time.perf_counter())  # (before, after) the previous reads
        first_scan = True
        # time.sleep, not Event.wait: half the wake-up cost (measured); stop() waits <= interval
        while not self._stop.is_set():
            if self._flush_asked is not None:
                last_read, first_scan = self._flush(reader, last_read, first_scan), False
                continue
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
                    last_read = self._read_cpu(reader, last_read)
                elif task == "children":
                    self._scan_children(reader, first_scan)
                    first_scan = False
                elif task == "gpu":
                    t = time.perf_counter() - self._t0
                    for g in list(self._gpus):
                        self._guard(g, g.tick, t)
                elif task == "buffer":
                    self._drain_gpus()
                elif task == "rapl":
                    self._sample_rapl(now - self._t0)
        self._last_reads(reader, last_read, first_scan)
        self._own_cpu = time.thread_time() - thread_t0

    def _last_reads(self, reader, last_read: tuple[float, float], first_scan: bool) -> None:
        """At stop, one last read: the CPU time since the previous sample (a stretch in which this
        thread was starved of the GIL by a busy Python thread, say) is not lost."""
        before = time.perf_counter()
        cpu = reader.seconds()
        self._cpu_sample(last_read, (before, time.perf_counter()), cpu)
        if not first_scan and time.perf_counter() - self._others_last[0] >= MIN_OTHERS_SPAN_S:
            # and the others' share since the last scan: a run shorter than one scan period has one
            self._others_sample(reader, 0.0, False, time.perf_counter())
        if self._gpus:
            self._drain_gpus()
            for g in list(self._gpus):
                self._guard(g, g.finish)
        reader.close()

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

    def _others_sample(self, reader: CpuReader, found: float, first: bool, t: float) -> None:
        """The share of the machine other processes used since the previous scan
        (telemetry/contention.py): the machine's busy CPU seconds less this process's and its
        children's, ``found`` being what children found by this scan used before it (they
        started after the previous scan, so all of it lies in this span). The first scan only
        starts the count. ``t``: now, on the perf_counter clock."""
        self._found_s += found
        machine, own = _machine_busy_s(), reader.seconds() + self._found_s
        if not first:
            t0, machine0, own0 = self._others_last
            self.samples.append(Sample(t - self._t0, "cpu", contention.METRIC,
                                       contention.others_pct(machine - machine0, own - own0, t - t0, self.cores)))
        self._others_last = (t, machine, own)

    def _spread(self, seconds: float, since: float) -> None:
        """Place ``seconds`` of CPU time a newly found process used since ``since`` (sampler
        time) into the samples of that stretch, in proportion to their overlap with it and
        never past a full machine; what does not fit is counted as unplaced."""
        placed = self._cpu.spread(seconds, since)
        for i, span, used in placed:
            t = self.samples[i].t
            self.samples[i] = Sample(t, "cpu", "util_machine_pct", 100.0 * used / span / self.cores)
            self.samples[i + 1] = Sample(t, "cpu", "util_core_pct", 100.0 * used / span)

    def _drain_gpus(self) -> None:
        for g in list(self._gpus):
            self._guard(g, g.drain, time.perf_counter() - self._t0, self._wall0)

    def _guard(self, g: GpuReader, call, *args) -> None:
        """Samples of one GPU library call; a GPU whose call fails (device lost, driver gone)
        stops being sampled, with the reason, instead of ending the sampler's thread."""
        try:
            self.samples.extend(call(*args))
        except Exception as e:
            self.unavailable[g.source] = f"{g.library} stopped answering ({type(e).__name__}: {e}); sampling stopped"
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
                                          "cpu:util_core_pct": self.cfg.interval,
                                          f"cpu:{contention.METRIC}": self.cfg.children_interval}
        for g in self._gpus:
            asked.update(g.asked(self.cfg.gpu_interval, self.cfg.gpu_buffer_interval))
        return asked


def _schedule(cfg: SamplerConfig, gpus: bool, rapl: bool) -> tuple[dict[str, float], dict[str, float]]:
    """Each task's first deadline and period: the GPU and RAPL tasks only where there are any."""
    now = time.perf_counter()
    due = {"cpu": now + cfg.interval, "children": now, "gpu": now, "buffer": now, "rapl": now + cfg.rapl_interval}
    periods = {"cpu": cfg.interval, "children": cfg.children_interval, "gpu": cfg.gpu_interval,
               "buffer": cfg.gpu_buffer_interval, "rapl": cfg.rapl_interval}
    for task in [*(() if gpus else ("gpu", "buffer")), *(() if rapl else ("rapl",))]:
        del due[task]
    return due, periods


def _children(proc: psutil.Process) -> list[int]:
    try:
        return [c.pid for c in proc.children(recursive=True)]
    except psutil.Error:
        return []


def _mean(xs: list[Sample]) -> float:
    return sum(x.value for x in xs) / len(xs)


def _gpu_summary(by: dict, g: GpuReader) -> dict:
    """Mean utilization, peak memory and which power reading one GPU had."""
    util, mem = by.get((g.source, "util_pct")), by.get((g.source, "mem_mb"))
    return {"util_mean": _mean(util) if util else None, "mem_mb_max": max(x.value for x in mem) if mem else None,
            "power_field": g.power_field() if (g.source, "power_w") in by or (g.source, "power_avg_w") in by else None,
            "util_field": g.util_field() if util else None}


def availability(nvml=None, rapl_root: Path = DEFAULT_ROOT, amdsmi=None) -> dict:
    """What the sampler can measure on this machine: {"gpus": n, "gpu_library": "NVML" |
    "amdsmi" | None, "rapl_zones": {...}, "unavailable": {...}}.

    Recorded in every run's environment, so a report can say why power or energy is missing.
    """
    unavailable: dict[str, str] = {}
    gpus = open_gpus(unavailable, None, nvml, amdsmi)
    rapl = RaplCounters(rapl_root)
    unavailable.update(rapl.unavailable)
    return {"gpus": len(gpus), "gpu_library": gpus[0].library if gpus else None, "rapl_zones": rapl.names(),
            "unavailable": unavailable}


def _machine_busy_s() -> float:
    """CPU seconds every process on the machine has run since boot (steal included: a VM's
    neighbours taking its CPUs are other processes too)."""
    t = psutil.cpu_times()
    return t.user + t.system + sum(getattr(t, k, 0.0) for k in ("nice", "irq", "softirq", "steal"))
