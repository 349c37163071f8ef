"""A checkpoint written on a background thread: the training loop pays only for a host copy.

Writing a checkpoint is a copy of the state (the only part that must hold the loop: the next
optimizer step changes the tensors) and then serializing, writing, fsyncing and renaming the
file, which reads the copy alone and so can run beside the training steps. torch.save releases
the GIL while it writes a tensor's bytes (measured: a 200 MB save on a second thread slows a
main thread's timer wake-ups no more than a GIL-free matmul beside it does).

:class:`CheckpointWriter` holds at most one write in flight: the next write, and every end of a
run (finished, failed, stopped), waits for the previous one first (:meth:`CheckpointWriter.wait`),
and an error of the write is raised there, naming the file, never dropped. The write itself is
atomic (speechperf/atomic.py: a temporary file beside the checkpoint, fsync, rename), so a
process killed while a write is in flight leaves the previous checkpoint whole; the rows and log
lines recorded after that checkpoint are cut on resume (train/admission.py), as they are for a
kill anywhere after it.

The host copies go to buffers kept from one write to the next (pinned for CUDA tensors, so the
device copies run asynchronously and at full bandwidth): a fresh allocation per checkpoint
costs page faults (or cudaHostAlloc) about as long as the copy itself. They hold one more copy
of the checkpoint's tensors in host memory for the run's life.
"""
from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from speechperf import atomic
from speechperf.errors import MachineFault, SpeechperfError, in_words


# Host tensors of these dtypes are copied by numpy, on one thread: a copy is bound by memory
# bandwidth, and torch's intra-op parallel copy waits at every tensor for all its threads, which
# on a busy host stalls (measured on 2 shared cores, the cpu preset's 21 MB state: 0.62 s with 2
# threads, 0.03 s with 1; the gpu preset's 294 MB: numpy 0.31 s, torch on 1 thread 0.32 s).
# Setting torch's thread count instead would touch what the run's rounding depends on.
NUMPY_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                          torch.int8, torch.uint8, torch.bool})


class CheckpointWriteError(MachineFault):
    """A background checkpoint write failed; the message names the file and keeps the cause."""


@dataclass(frozen=True)
class Written:
    """A background write that completed."""

    path: Path  # the checkpoint file, now in place
    iteration: int  # the iteration it was saved at
    write_s: float  # its serialize + write + fsync + rename seconds, on the writer's thread (beside training)


class CheckpointWriter:
    """Writes one checkpoint file at a time on a background thread (see the module's docstring)."""

    def __init__(self, path: Path, save=None):
        self.path = Path(path)  # the checkpoint file every write replaces (named by the Run: Run.checkpoint_writer)
        self._save = save or atomic.atomic_torch_save  # (obj, path): the atomic write (tests slow it down)
        self._buffers = HostBuffers()
        self._thread: threading.Thread | None = None
        self._iteration = 0  # the iteration of the write in flight
        self._error: BaseException | None = None
        self._write_s = 0.0

    def write(self, whole: dict, iteration: int) -> None:
        """Copy ``whole`` (results/checkpoint.py's contents, saved at ``iteration``) to host memory
        now, after the previous write completed; serialize and write it to the writer's ``path``
        on its thread."""
        self.wait()
        snapshot = self._buffers.snapshot(whole)
        self._iteration, self._error = iteration, None
        self._thread = threading.Thread(target=self._run, args=(snapshot, self.path), name="checkpoint-writer")
        self._thread.start()

    def _run(self, snapshot: dict, path: Path) -> None:
        start = time.perf_counter()
        try:
            self._save(snapshot, path)
        except BaseException as e:  # noqa: BLE001 (raised in the loop's thread, at the next wait)
            self._error = e
        self._write_s = time.perf_counter() - start

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def wait(self) -> Written | None:
        """Block until the write in flight (if any) completed; raise its error, naming the
        file; return what was written (None: nothing was in flight)."""
        if self._thread is None:
            return None
        self._thread.join()
        path, error = self.path, self._error
        self._thread, self._error = None, None
        if error is not None:
            named = _named(error, path)
            if named is error:
                raise error
            raise named from error
        return Written(path, self._iteration, self._write_s)


def _named(error: BaseException, path: Path) -> BaseException:
    """The error to raise for a failed write of ``path``: one that already names the file (a
    full disk: atomic_write's DiskFullError), or a CheckpointWriteError naming it and the cause."""
    if isinstance(error, SpeechperfError) and str(path) in str(error):
        return error
    return CheckpointWriteError(f"writing the checkpoint {path} failed ({type(error).__name__}: {in_words(error)}); "
                                "the previous checkpoint is kept: fix the cause and run the same command again to "
                                "continue from it")


class HostBuffers:
    """Host copies of a checkpoint's tensors in buffers reused from one snapshot to the next
    (matched by their order in the state and by shape and dtype; the previous write is done
    with them by the time the next snapshot is taken)."""

    def __init__(self):
        self._kept: list[torch.Tensor] = []
        self._used = 0
        self._devices: set[torch.device] = set()

    @torch.no_grad()
    def snapshot(self, value):
        """``value`` with every tensor copied to host memory and every container rebuilt (the
        loop goes on changing the optimizer's per-parameter dicts), complete on return."""
        self._used, self._devices = 0, set()
        out = self._copy(value, {})
        for device in self._devices:  # the device-to-host copies were queued on the current stream
            torch.cuda.current_stream(device).synchronize()
        return out

    def _copy(self, value, seen: dict):
        if isinstance(value, torch.Tensor):
            if id(value) not in seen:  # a tensor held twice stays one tensor
                seen[id(value)] = self._tensor(value)
            return seen[id(value)]
        if isinstance(value, dict):
            out = copy.copy(value)  # its type and attributes (a module state_dict's _metadata)
            for k, v in value.items():
                out[k] = self._copy(v, seen)
            return out
        if type(value) in (list, tuple):
            return type(value)(self._copy(v, seen) for v in value)
        return copy.deepcopy(value)

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if t.layout != torch.strided or t.is_quantized:
            return t.to("cpu", copy=True)
        cuda = t.device.type == "cuda"
        buf = self._buffer(t, pinned=cuda)
        if cuda:
            buf.copy_(t, non_blocking=True)
            self._devices.add(t.device)
        elif t.dtype in NUMPY_DTYPES and t.device.type == "cpu":
            np.copyto(buf.numpy(), t.numpy())  # one thread (see NUMPY_DTYPES)
        else:
            buf.copy_(t)
        return buf

    def _buffer(self, t: torch.Tensor, pinned: bool) -> torch.Tensor:
        """The next kept buffer when it fits ``t`` (same shape, dtype, pinning), else a new one."""
        i, self._used = self._used, self._used + 1
        if i < len(self._kept):
            kept = self._kept[i]
            if kept.shape == t.shape and kept.dtype == t.dtype and kept.is_pinned() == pinned:
                return kept
        buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pinned)
        if i < len(self._kept):
            self._kept[i] = buf
        else:
            self._kept.append(buf)
        return buf
