"""What the machine did while rank 0 trained: the utilization samples (telemetry/sampler.py),
stored as the run's ``samples`` rows on the TTA clock, and the interpreter's garbage
collection pauses (the summary's ``gc``).

A sample's ``t`` is seconds since this process's sampler started; stored, it is put on the
run's clock, which a resumed run continues (else every process's samples would pile up from
t = 0), less the time spent off the clock before it (an evaluation's bootstrap intervals:
train/recorder.py ``off_clock``). A sample taken off the clock is not stored.
"""
from __future__ import annotations

import os
import time

from speechperf.results.progress import Clock
from speechperf.results.rows import Rows
from speechperf.telemetry.device_gpus import RunGpu
from speechperf.telemetry.gc_pauses import GcPauses
from speechperf.telemetry.sampler import Sampler


class MachineRecord:
    """Rank 0's samples and collection pauses, from the TTA clock's start; rows go to ``rows``."""

    def __init__(self, rows: Rows, run_id: str):
        self.rows, self.run_id = rows, run_id
        self.sampler: Sampler | None = None
        self.stored, self.t0 = 0, 0.0  # samples stored so far; the TTA clock at the sampler's start
        self.segment: float | None = None  # unix time this process's sampler started: its samples' segment
        self.p0 = 0.0  # perf_counter() at the sampler's start
        self.off_spans: list[tuple[float, float, float]] = []  # off the clock: (perf start, perf end, unix end)
        self.gc_pauses = GcPauses()  # this process's garbage collections from the clock's start (summary "gc")
        self.gpus: dict | None = None  # the GPUs sampled and, where not the run's alone, why (summary "sampled_gpus")

    def start(self, clock: Clock, run_gpus: list[RunGpu] | None = None) -> None:
        """The sampler and the collection count started; ``clock``: the TTA clock, read once both run;
        ``run_gpus``: the GPUs the run uses on this node (None: every GPU)."""
        self.segment = time.time()  # one per process: its counters are differenced only among its samples
        self.sampler = Sampler(os.getpid(), run_gpus=run_gpus).start()
        self.gpus = {"sources": self.sampler.gpu_sources, "selection": self.sampler.unavailable.get("gpu_selection")}
        self.gc_pauses.start()
        self.p0 = time.perf_counter()  # a sample's t from here (the sampler's start, to a few ms)
        self.t0 = clock.now()

    def store_so_far(self) -> None:
        """Every sample so far, made final now (Sampler.flush) and stored: a killed run keeps its
        samples up to its last checkpoint, all of them."""
        self._store(self.sampler.flush())

    def off_clock(self, start: float, end: float) -> None:
        """A span off the clock (perf_counter ``start`` to ``end``, now): its samples are not
        stored and those after it are shifted back by its length (:meth:`on_clock`)."""
        self.off_spans.append((start, end, time.time()))

    def stop(self) -> None:
        """Both stopped; every sample left stored."""
        self.gc_pauses.stop()
        if self.sampler is not None:
            self.sampler.stop()
            self._store(len(self.sampler.samples))
            self.sampler = None

    def _store(self, upto: int) -> None:
        """The samples not stored yet, up to ``upto``, on the TTA clock."""
        new = [row for row in map(self.on_clock, self.sampler.samples[self.stored: upto]) if row]
        if new:
            self.rows.insert("samples", new)
        self.stored = max(self.stored, upto)

    def on_clock(self, s) -> dict | None:
        """A sample's row: its ``t`` on the TTA clock (the sampler's seconds less the time spent off
        the clock before it), None when taken off the clock. Each stretch of the clock is a
        segment of its own, so a counter is never differenced across time the TTA does not count."""
        at, shift, segment = self.p0 + s.t, 0.0, self.segment
        for start, end, unix_end in self.off_spans:
            if start < at < end:
                return None
            if end <= at:
                shift, segment = shift + end - start, unix_end
        return {"run_id": self.run_id, "t": s.t + self.t0 - shift, "source": s.source, "metric": s.metric,
                "value": s.value, "segment": segment}
