"""CPU seconds of a process and its children, for the sampler's utilization: each process read
from its kernel CPU clock (nanoseconds, one syscall); a child found later counts from its CPU
time when found, and what it used before is placed by :class:`CpuSeries` into the samples since
it started, within what each had left of the machine."""
from __future__ import annotations

import ctypes
import os
import time

import psutil


def process_start(pid: int, t0: float) -> float | None:
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


class CpuSeries:
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
