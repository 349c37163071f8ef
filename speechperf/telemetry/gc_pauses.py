"""Python's garbage collections in this process while a run trains: how many, and how long the
interpreter stood still for them, by generation.

A full (generation 2) collection walks every object the process tracks, and a training process
holds many (the model's modules and parameters, the split indexes, the decoder's tables, the
recorder's rows): on a CPU it stops every Python thread for ~0.1 s per few hundred thousand
objects (tiny preset: 325,000 objects, 0.10-0.12 s), the thread that launches a GPU's kernels
included. A run's summary holds these figures (``gc``), so that a stall in its steps or
evaluations (the H200 runs' scoring took 0.28-0.41 s in two epochs each, 0.02-0.08 s in the
others) can be set against them.
``gc.callbacks`` costs a function call per collection, nothing while none runs.
"""
from __future__ import annotations

import gc
import time


class GcPauses:
    """Collections by generation since :meth:`start` until :meth:`stop`: count, seconds, longest."""

    def __init__(self):
        self.count, self.seconds, self.longest = [0, 0, 0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
        self._began: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            g, took = info["generation"], time.perf_counter() - self._began
            self.count[g] += 1
            self.seconds[g] += took
            self.longest[g] = max(self.longest[g], took)
            self._began = None

    def start(self) -> GcPauses:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def figures(self) -> dict:
        """{collections, seconds, full collections, full seconds, longest full s}: every generation's
        collections and seconds summed, and the full (generation 2) ones apart."""
        return {"collections": sum(self.count), "seconds": round(sum(self.seconds), 4),
                "full collections": self.count[2], "full seconds": round(self.seconds[2], 4),
                "longest full s": round(self.longest[2], 4)}
